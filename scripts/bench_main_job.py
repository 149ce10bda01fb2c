"""train.py timed end to end, side by side: checkouts (``--trees``, ``--against REV``) times
settings (``--sides``), alternated round by round (a before/after pair measured in one sitting).

    python scripts/bench_main_job.py                     # this checkout: start-up, the main job
    python scripts/bench_main_job.py --against HEAD~3    # and HEAD~3 (a temporary git worktree)
    python scripts/bench_main_job.py --only job --sides "" algo.compile=true   # two settings

Each command is a fresh process timed from just before its start (imports included). Start-up:
``--cfg job``, a refused input and one PPO iteration of the side's config, in wall and CPU seconds
(user + system, children too: the steadier figure on a loaded machine). The job: ``python train.py
logger=none`` with the side's settings (evaluations, clips and report on): seconds and env steps to
its first evaluation with eval/success 1.0, training steps/s (env steps over time/collect +
time/learn: start-up and evaluations left out), collection steps/s, seconds to its end and its
report's own. Medians per side; each over the first.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib as bl
import yaml


def startup(tree: Path, over: list, run_dir: Path) -> dict:
    """(wall, CPU) seconds of each start-up command in ``tree``."""
    cmd = [sys.executable, "train.py", *over]
    cfg = yaml.safe_load(bl.timed([*cmd, "--cfg", "job"], tree)[2])
    steps = int(cfg["env"]["num_envs"]) * int(cfg["algo"]["num_steps"])
    commands = {
        "--cfg job": (["--cfg", "job"], False),
        "refused (recorder.trigger=bogus)": (["recorder.trigger=bogus"], True),
        "one iteration": ([f"total_steps={steps}", f"hydra.run.dir={run_dir}"], False),
    }
    return {k: bl.timed(cmd + argv, tree, no)[:2] for k, (argv, no) in commands.items()}


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    p = b.parser
    p.add_argument("--trees", nargs="+", type=Path, default=[bl.ROOT], help="checkouts")
    p.add_argument("--against", metavar="REV", help="also this git revision (a temporary worktree)")
    p.add_argument("--sides", nargs="+", default=[""], help="settings: overrides each, quoted")
    p.add_argument("--override", nargs="*", default=[], help="overrides of every side")
    p.add_argument("--only", choices=["startup", "job"], help="default: both")
    p.add_argument("--runs", type=int, default=3, help="rounds: each side once per round")
    p.add_argument("--seeds", type=int, nargs="+", help="round i: the i-th (default: the config's)")
    a = b.args()
    a.bench = b
    trees = [t.resolve() for t in a.trees]
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-main-job-") as tmp:
        if a.against:
            trees.append(Path(tmp) / "against")
            git = ["git", "worktree", "add", "--detach", str(trees[-1]), a.against]
            subprocess.run(git, cwd=bl.ROOT, check=True, capture_output=True)
        try:
            sides = measure(a, trees, Path(tmp))
        finally:
            if a.against:
                git = ["git", "worktree", "remove", "--force", str(trees[-1])]
                subprocess.run(git, cwd=bl.ROOT, check=False)
    report(b, a, sides)
    b.finish()


def measure(a, trees: list, tmp: Path) -> dict:
    names = {t: a.against if a.against and t == trees[-1] else str(t) for t in trees}
    sides = {}
    for tree, setting in itertools.product(trees, a.sides):
        label = " ".join(n for n in (names[tree] * (len(trees) > 1), setting) if n) or "this tree"
        sides[label] = (tree, [*setting.split(), *a.override], [], [])
    for r in range(a.runs):
        order = list(sides.items())[:: -1 if r % 2 else 1]  # alternate who goes first
        for i, (label, (tree, over, starts, jobs)) in enumerate(order):
            if a.only != "job":
                starts.append(startup(tree, over, tmp / f"run-{r}-{i}"))
            if a.only != "startup":
                seed = [f"seed={a.seeds[r % len(a.seeds)]}"] if a.seeds else []
                jobs.append(bl.job(a.bench.runs, over + seed, cwd=tree))
                print(f"{label} run {r + 1}: {jobs[-1]}", flush=True)
    return sides


def report(b: bl.Bench, a, sides: dict) -> None:
    first = next(iter(sides.values()))
    if a.only != "job":
        b.out(f"start-up, medians of {a.runs} rounds (wall and CPU seconds; over the first side)")
        rows = []
        for label, (_, _, starts, _) in sides.items():
            for cmd in starts[0]:
                w, c = (bl.median(s[cmd][i] for s in starts) for i in (0, 1))
                w0, c0 = (bl.median(s[cmd][i] for s in first[2]) for i in (0, 1))
                rows.append([cmd, label, f"{w:.2f}", f"{c:.2f}", bl.ratio(w, w0), bl.ratio(c, c0)])
        b.table(["command", "side", "wall s", "CPU s", "wall ratio", "CPU ratio"], rows)
    if a.only != "startup":
        b.out(f"\ntrain.py {' '.join(a.override)}, medians of {a.runs} runs")
        columns = bl.columns("success 1.0", "t", "step", "train", "collect", "wall", "report")
        runs = {label: jobs for label, (_, _, _, jobs) in sides.items()}
        bl.compare(b, runs, columns, tuple(list(runs)[1::-1]) if len(runs) > 1 else ())


if __name__ == "__main__":
    main()
