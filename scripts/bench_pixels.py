#!/usr/bin/env python
"""PPO from pixels on the built-in env: env steps and wall time to an eval success of 0.9, and
the steps/s of the pixel path against the state path on the same env, side by side.

    python scripts/bench_pixels.py                 # seed 1: one run of each path, in turn
    python scripts/bench_pixels.py --seeds 1 2 3

Each run is a fresh ``train.py`` process, timed from just before it starts (imports included):

- pixels: ``python train.py +experiment=builtin_pixels seed=S logger=none``: the image (and the
  agent's position and velocity; the goal is only in the image) through NatureCNN;
- state: the same preset with ``env.obs_mode=state algo.encoder=mlp``: the 6 state values through
  the MLP, every other setting the same.

Its evaluations are read from ``metrics.jsonl`` as they are written; a run stops (SIGTERM: it
checkpoints and exits) at its first evaluation with success >= ``--target``, or at the preset's
``total_steps``. Reported per run: env steps and seconds (from process start) to that evaluation;
training steps/s = env steps over the summed ``time/collect + time/learn`` of the iterations
(start-up and evaluations excluded), and collection steps/s (``time/collect`` alone).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from metrics_tail import MetricsTail, RunDirs

ROOT = Path(__file__).resolve().parent.parent
RUNS = RunDirs()
PATHS = {
    "pixels": [],
    "state": ["env.obs_mode=state", "algo.encoder=mlp"],
}


def run(path: str, seed: int, args) -> dict:
    """One ``train.py`` run of ``path``; its figures."""
    run_dir = RUNS.new(f"bench_pixels_{path}_s{seed}_")
    cmd = [
        sys.executable,
        "train.py",
        "+experiment=builtin_pixels",
        f"seed={seed}",
        "logger=none",
        f"torch_threads={args.threads}",
        f"hydra.run.dir={run_dir}",
        *PATHS[path],
        *args.override,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    tail = MetricsTail(run_dir / "metrics.jsonl", t0)
    hit: Optional[dict] = None
    train: List[dict] = []
    last: Optional[dict] = None
    while True:
        done = proc.poll() is not None
        for now, rec in tail.read():
            if "time/collect" in rec:
                train.append(rec)
            if "eval/success" in rec:
                last = {"t": now, "step": rec["step"], "success": rec["eval/success"]}
                if hit is None and rec["eval/success"] >= args.target:
                    hit = last
                    proc.send_signal(signal.SIGTERM)
        if done:
            break
        time.sleep(0.01)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode not in (0, 128 + signal.SIGTERM):
        raise RuntimeError(f"{path} run failed (seed {seed}):\n{out[-3000:]}")
    steps = train[-1]["step"] - train[0]["step"] if len(train) > 1 else 0
    learn = sum(r["time/collect"] + r["time/learn"] for r in train[1:])
    collect = sum(r["time/collect"] for r in train[1:])
    return {
        "hit": hit,
        "last": last,
        "train_sps": steps / learn if learn else float("nan"),
        "collect_sps": steps / collect if collect else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--target", type=float, default=0.9, help="eval success to reach")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--override", nargs="*", default=[], help="more train.py overrides")
    RunDirs.add_argument(parser)
    args = parser.parse_args()
    RUNS.start(args.keep_runs)
    results = {p: [run(p, s, args) for s in args.seeds] for p in PATHS}
    print(f"\nbuilt-in env, +experiment=builtin_pixels, seeds {args.seeds}, target {args.target}")
    print(f"{'':34}{'pixels (NatureCNN)':>20}{'state (MLP)':>20}")

    def row(label: str, fn) -> None:
        cells = []
        for p in PATHS:
            values = [fn(r) for r in results[p]]
            known = [v for v in values if v is not None]
            cell = "not reached" if not known else f"{statistics.median(known):,.0f}"
            if known and len(known) < len(values):
                cell += f" ({len(known)}/{len(values)})"
            cells.append(f"{cell:>20}")
        print(f"{label:34}{''.join(cells)}")

    row(f"env steps to success >= {args.target}", lambda r: r["hit"] and r["hit"]["step"])
    row(f"wall s to success >= {args.target}", lambda r: r["hit"] and r["hit"]["t"])
    row("training steps/s (collect + update)", lambda r: r["train_sps"])
    row("collection steps/s", lambda r: r["collect_sps"])
    for p in PATHS:
        for seed, r in zip(args.seeds, results[p]):
            end = r["last"]
            if r["hit"] is None and end is not None:
                print(f"{p} seed {seed}: last eval success {end['success']:.2f} at {end['step']}")


if __name__ == "__main__":
    main()
