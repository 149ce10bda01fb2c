#!/usr/bin/env python
"""The main job (``python train.py``) in wall time: to its first evaluation at success 1.0, and to
its end, for one or more checkouts, run alternately (these machines are noisy: a before/after pair
measured side by side in one run, not two runs at different times).

    python scripts/bench_main_job.py                          # this checkout, 3 runs
    python scripts/bench_main_job.py --trees /tmp/before .    # two checkouts, alternated

Each run is a fresh process started in the checkout's root, timed from just before it starts
(imports included): ``python train.py logger=none`` (plus ``seed=S`` with ``--seed``, and the
``--override``s), the main job's settings otherwise (evaluations, their clips and the report stay
on). ``metrics.jsonl`` is polled
every 10 ms; an evaluation is timed when its line appears. Printed per run: seconds and env steps
to the first evaluation with ``eval/success`` 1.0, seconds to the end, the last evaluation's
success; then per checkout the medians and, with two checkouts, the ratios second/first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from metrics_tail import MetricsTail, RunDirs

ROOT = Path(__file__).resolve().parent.parent
RUNS = RunDirs()  # the runs' folders, removed at exit unless --keep-runs


def run(tree: Path, overrides: List[str]) -> dict:
    run_dir = RUNS.new("bench_main_job_")
    metrics = run_dir / "metrics.jsonl"
    cmd = [
        sys.executable,
        "train.py",
        "logger=none",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    env = dict(os.environ, RLREC_PROGRESS="", PYTHONPATH=str(tree))
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    first: Optional[dict] = None
    last: Optional[dict] = None
    tail = MetricsTail(metrics, t0)

    def read_new() -> None:
        nonlocal first, last
        for now, rec in tail.read():
            if "eval/success" not in rec:
                continue
            last = {"t": now, "step": rec["step"], "success": rec["eval/success"]}
            if first is None and rec["eval/success"] >= 1.0:
                first = last

    while proc.poll() is None:
        read_new()
        time.sleep(0.01)
    wall = time.time() - t0
    read_new()
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: train.py {' '.join(overrides)} failed:\n{out[-3000:]}")
    return {"first": first, "last": last, "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trees", nargs="+", default=[str(ROOT)], help="checkouts to compare")
    p.add_argument("--runs", type=int, default=3, help="runs per checkout, alternated")
    p.add_argument("--seed", type=int, default=None, help="default: the main job's own seed")
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    RUNS.add_argument(p)
    args = p.parse_args()
    RUNS.start(args.keep_runs)
    trees = [Path(t).resolve() for t in args.trees]
    results = {t: [] for t in trees}
    for i in range(args.runs):
        for tree in trees:
            seed = [] if args.seed is None else [f"seed={args.seed}"]
            r = run(tree, seed + list(args.override))
            results[tree].append(r)
            f = r["first"]
            print(
                f"{tree}  run {i + 1}: success 1.0 at "
                + ("-" if f is None else f"{f['t']:.2f} s, step {f['step']:,}")
                + f" | end {r['wall']:.2f} s, last eval success {r['last']['success']:.3f}",
                flush=True,
            )
    medians = {}
    for tree in trees:
        firsts = [r["first"]["t"] for r in results[tree] if r["first"] is not None]
        walls = [r["wall"] for r in results[tree]]
        medians[tree] = (statistics.median(firsts) if firsts else None, statistics.median(walls))
        first = medians[tree][0]
        print(
            f"{tree}: median to success 1.0 "
            + ("-" if first is None else f"{first:.2f} s")
            + f" ({len(firsts)}/{len(walls)} runs reached it), median to the end "
            f"{medians[tree][1]:.2f} s"
        )
    if len(trees) == 2:
        (a1, a2), (b1, b2) = medians[trees[0]], medians[trees[1]]
        ratio = "-" if a1 is None or b1 is None else f"{b1 / a1:.3f}"
        print(f"ratio second/first: to success 1.0 {ratio}, to the end {b2 / a2:.3f}")


if __name__ == "__main__":
    main()
