#!/usr/bin/env python
"""Start-up of ``python train.py``: three commands timed end to end (a fresh process each, imports
included), side by side for this tree and, optionally, another git revision.

    python scripts/bench_startup.py                     # this tree, 5 rounds
    python scripts/bench_startup.py --against HEAD~3    # and HEAD~3, rounds interleaved

The commands: ``--cfg job`` (compose and print the config), a refused bad input
(``recorder.trigger=bogus``) and a run of one PPO iteration of the default config
(``total_steps`` = env.num_envs x algo.num_steps, read from ``--cfg job``; its evaluations,
videos and report as the defaults make them). ``--against REV`` checks REV out into a temporary
``git worktree`` (removed at the end); each round runs every command in both trees, alternating
which tree goes first, so a machine's load falls on both alike. Printed: the median wall and CPU
seconds (user + system, the process and its children: ffmpeg too) of each command per tree, and
this tree's over REV's; on a loaded machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import yaml

ROOT = Path(__file__).resolve().parents[1]


def one_iteration(tree: Path) -> int:
    """The smallest total_steps that is one iteration of ``tree``'s default config."""
    job = subprocess.run(
        [sys.executable, "train.py", "--cfg", "job"],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    cfg = yaml.safe_load(job.stdout)
    return int(cfg["env"]["num_envs"]) * int(cfg["algo"]["num_steps"])


def commands(steps: int, out: Path) -> List[Tuple[str, List[str], bool]]:
    """(label, train.py's arguments, whether it is refused) of each command; ``out``: the run
    dir of the one-iteration run."""
    return [
        ("--cfg job", ["--cfg", "job"], False),
        ("refused (recorder.trigger=bogus)", ["recorder.trigger=bogus"], True),
        (
            f"one iteration (total_steps={steps})",
            [f"total_steps={steps}", f"hydra.run.dir={out}"],
            False,
        ),
    ]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(tree: Path, args: List[str], refused: bool) -> Tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and its children) of one
    command."""
    start, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run(
        [sys.executable, "train.py", *args], cwd=tree, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start, _cpu() - cpu
    if (proc.returncode != 0) != refused:
        raise SystemExit(
            f"{tree}: python train.py {' '.join(args)} exited with {proc.returncode}:\n"
            f"{proc.stderr[-2000:]}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-startup-") as tmp:
        if args.against:
            other = Path(tmp) / "against"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(other), args.against],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            trees[args.against] = other
        try:
            steps = one_iteration(ROOT)
            times: Dict[str, Dict[str, List[Tuple[float, float]]]] = {name: {} for name in trees}
            for r in range(args.rounds):
                order = list(trees.items())[:: -1 if r % 2 else 1]  # alternate who goes first
                for j, (name, tree) in enumerate(order):
                    for label, argv, refused in commands(steps, Path(tmp) / f"run-{r}-{j}"):
                        times[name].setdefault(label, []).append(timed(tree, argv, refused))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(trees[args.against])],
                    cwd=ROOT,
                    check=False,
                )
    for i, what in enumerate(("wall", "CPU (user + system)")):
        print(f"\n{what} seconds, median of {args.rounds} rounds")
        ratio = f"  ratio this/{args.against}" if args.against else ""
        print(f"{'command':<40}" + "".join(f"{name:>14}" for name in trees) + ratio)
        for label in times["this tree"]:
            medians = [statistics.median(t[i] for t in times[name][label]) for name in trees]
            row = f"{label:<40}" + "".join(f"{m:>13.2f}s" for m in medians)
            print(row + (f"{medians[0] / medians[1]:>12.2f}" if args.against else ""))


if __name__ == "__main__":
    main()
