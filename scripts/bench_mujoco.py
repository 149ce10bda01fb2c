#!/usr/bin/env python
"""MuJoCo returns of ``+experiment=mujoco`` beside CleanRL's published ``ppo_continuous_action.py``
table (MuJoCo v4, 1M env steps, 3 seeds; CleanRL's docs/rl-algorithms/ppo.md, tag pr-424).

    pip install -c scripts/constraints.txt -e '.[bench]' # gymnasium[mujoco]
    python scripts/bench_mujoco.py                        # Hopper, HalfCheetah, Walker2d x 3 seeds
    python scripts/bench_mujoco.py --tasks InvertedPendulum-v4 --seeds 1 --steps 200000
    python scripts/bench_mujoco.py --tasks Hopper-v4 -- recorder=none eval_env.enabled=false
    python scripts/bench_mujoco.py --tasks Walker2d-v4 --seeds 1 2 -- hydra/launcher=joblib \
        hydra.launcher.n_jobs=2                           # two runs at a time (1 thread each)
    python scripts/bench_mujoco.py --table-of SWEEP_DIR [SWEEP_DIR ...]  # several sweeps' runs

One Hydra multirun (``python train.py -m +experiment=mujoco env.id=... seed=...``, the basic
launcher: one job after another; Hydra's joblib launcher runs several at once) in
``--sweep-dir``; then the sweep's report page (``python -m rlrec.report``: each run's return
curves and last eval clip) and, per task, the mean +- std
over seeds of the final training return (the mean of the last 10 training episodes, from the last
``train/return`` lines of metrics.jsonl weighted by their ``train/episodes``, as CleanRL's table
averages its last episodes) and of rlrec's last deterministic eval return, beside CleanRL's
figure, with each run's wall time (its run dir's ``.hydra/config.yaml`` to its last
metrics.jsonl line) and steps/s. Extra overrides after ``--`` go to every run (the line above
times a run with neither recorder nor evaluation, against the preset's defaults).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlrec.layout import RunDir  # noqa: E402
from rlrec.report.html import write_report  # noqa: E402
from rlrec.report.rundata import read_jsonl, read_rows  # noqa: E402

# CleanRL ppo_continuous_action.py, MuJoCo v4, 1M steps, 3 seeds: mean, std of the episodic return
CLEANRL = {
    "HalfCheetah-v4": (1442.64, 46.03),
    "Walker2d-v4": (2287.95, 571.78),
    "Hopper-v4": (2382.86, 271.74),
    "InvertedPendulum-v4": (963.09, 22.20),
    "Humanoid-v4": (716.11, 49.08),
    "Pusher-v4": (-40.38, 7.15),
}
LAST_EPISODES = 10


def final_train_return(lines: List[dict], episodes: int = LAST_EPISODES) -> float:
    """The mean return of the last ``episodes`` training episodes: the last ``train/return``
    lines, each weighted by how many episodes it is the mean of (the oldest one in part)."""
    total = weight = 0.0
    for line in reversed([x for x in lines if "train/return" in x]):
        take = min(float(line.get("train/episodes", 1.0)), episodes - weight)
        total, weight = total + line["train/return"] * take, weight + take
        if weight >= episodes:
            break
    return total / weight if weight else float("nan")


def run_figures(run_dir: Path) -> Dict[str, Any]:
    """What one job's run dir says: final training return, last eval return, steps, wall s."""
    paths = RunDir(run_dir)
    lines = read_jsonl(paths.metrics)
    evals = [x["eval/return"] for x in lines if "eval/return" in x]
    wall = paths.metrics.stat().st_mtime - paths.hydra_config.stat().st_mtime
    return {
        "train": final_train_return(lines),
        "eval": evals[-1] if evals else float("nan"),
        "steps": float(max((int(x.get("step", 0)) for x in lines), default=0)),
        "wall": wall,
        "run_dir": str(run_dir),
    }


def _pm(values: List[float]) -> str:
    values = [v for v in values if v == v]  # NaN: no such figure (eval_env.enabled=false)
    if not values:
        return "-"
    return f"{statistics.fmean(values):.2f} +- {statistics.pstdev(values):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", nargs="+", default=["Hopper-v4", "HalfCheetah-v4", "Walker2d-v4"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=1_000_000, help="total_steps of each run")
    ap.add_argument("--sweep-dir", type=Path, help="default: outputs/bench_mujoco/<time>")
    ap.add_argument(
        "--table-of",
        nargs="+",
        type=Path,
        metavar="SWEEP_DIR",
        help="run nothing: the table of these sweeps' completed runs together",
    )
    ap.add_argument("overrides", nargs="*", help="extra overrides for every run (after --)")
    a = ap.parse_args()
    if a.table_of:
        a.tasks = sorted({str(row["env.id"]) for d in a.table_of for row in read_rows(d)})
        sys.exit(print_table(a.tasks, a.table_of))
    sweep = a.sweep_dir or ROOT / "outputs" / "bench_mujoco" / time.strftime("%Y%m%d-%H%M%S")
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "+experiment=mujoco",
        f"env.id={','.join(a.tasks)}",
        f"seed={','.join(map(str, a.seeds))}",
        f"total_steps={a.steps}",
        "logger=none",
        f"hydra.sweep.dir={sweep.resolve()}",
        *a.overrides,
    ]
    print(" ".join(command[1:]), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(command, cwd=ROOT).returncode
    elapsed = time.perf_counter() - t0
    report = write_report(sweep)
    print_table(a.tasks, [sweep])
    print(f"\nsweep {sweep} in {elapsed:.0f} s (exit {code}); report {report}", flush=True)
    sys.exit(code)


def print_table(tasks: List[str], sweeps: List[Path]) -> int:
    """Per task, the completed runs of ``sweeps``: mean +- std over seeds, beside CleanRL."""
    by_task: Dict[str, List[Dict[str, Any]]] = {}
    for row in (row for sweep in sweeps for row in read_rows(sweep)):
        if row.get("status") == "COMPLETED":
            by_task.setdefault(str(row["env.id"]), []).append(run_figures(Path(row["run_dir"])))
    head = ("task", "seeds", f"train return (last {LAST_EPISODES} ep)", "eval return")
    print(f"\n{' | '.join(head)} | CleanRL | wall s per run | steps/s")
    for task in tasks:
        runs = by_task.get(task, [])
        if not runs:
            print(f"{task} | 0 | no completed run")
            continue
        clean = "%.2f +- %.2f" % CLEANRL[task] if task in CLEANRL else "-"
        wall = statistics.fmean(r["wall"] for r in runs)
        sps = statistics.fmean(r["steps"] / r["wall"] for r in runs)
        train, evals = _pm([r["train"] for r in runs]), _pm([r["eval"] for r in runs])
        print(f"{task} | {len(runs)} | {train} | {evals} | {clean} | {wall:.0f} | {sps:.0f}")
        for r in runs:
            print(
                f"  {r['run_dir']}: train {r['train']:.2f}, eval {r['eval']:.2f}, {r['wall']:.0f} s"
            )
    return 0


if __name__ == "__main__":
    main()
