#!/usr/bin/env python
"""Env steps/s of one rank and of two ranks of the same run, side by side (weak scaling: each
rank steps ``--envs`` envs, so two ranks collect twice the batch per iteration).

    python scripts/bench_distributed.py                 # CPU: 1 rank vs 2 gloo ranks
    python scripts/bench_distributed.py --envs 256 --steps 400000   # larger batches

With CUDA it also runs the built-in env on one GPU with one rank, and with two ranks sharing
that GPU (``sim=gpu distributed.share_gpus=true``, gloo: NCCL needs a GPU per rank).

Each run is ``torchrun --nproc-per-node N train.py`` (``python train.py`` for one rank) with no
evaluation, no recorder and no logger, on the built-in env; the figure is the last
``sps/total`` of rank 0's ``metrics.jsonl`` (global env steps over the wall time of the training
loop: collection, update and the all-reduces, start-up excluded). Scaling efficiency =
steps/s with N ranks / (N x steps/s with one rank). On a machine with fewer free cores than
ranks, the ranks share cores and the efficiency says so, not what the code can do.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ranks: int, overrides: List[str], timeout: float) -> float:
    """Global env steps/s of one run of ``ranks`` ranks."""
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-dist-") as tmp:
        run_dir = Path(tmp) / "run"
        args = [
            str(ROOT / "train.py"),
            *overrides,
            "eval_env.enabled=false",
            "recorder=none",
            "logger=none",
            "logger.progress=false",
            f"hydra.run.dir={run_dir}",
        ]
        if ranks > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
            cmd += ["--master-port", str(_port()), *args]
        else:
            cmd = [sys.executable, *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return float(json.loads(lines[-1])["sps/total"])


def _flag_worker(rank: int, port: int, n: int, out: str) -> None:
    """Rank ``rank`` of two: ``n`` all-reduces of the stop flag, as the runner does once per
    rollout (rlrec.distributed.agree_signal); rank 0 writes the mean seconds per call."""
    import time

    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    sys.path.insert(0, str(ROOT))
    from rlrec import distributed
    from rlrec.distributed import DistributedConfig

    distributed.init(DistributedConfig(timeout_sec=60), torch.device("cpu"))
    for _ in range(50):  # warm-up
        distributed.agree_signal(None)
    t0 = time.perf_counter()
    for _ in range(n):
        distributed.agree_signal(None)
    seconds = (time.perf_counter() - t0) / n
    distributed.shutdown()
    if rank == 0:
        Path(out).write_text(str(seconds))


def flag_cost(n: int = 2000) -> float:
    """Seconds per stop-flag all-reduce between two gloo ranks on this machine."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="rlrec-bench-flag-") as tmp:
        out = str(Path(tmp) / "seconds")
        ctx = mp.start_processes(
            _flag_worker, args=(_port(), n, out), nprocs=2, join=False, start_method="spawn"
        )
        while not ctx.join(timeout=120):
            pass
        return float(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, default=64, help="env.num_envs per rank")
    ap.add_argument("--steps", type=int, default=100_000, help="total_steps of the 1-rank run")
    ap.add_argument("--num-steps", type=int, default=32, help="algo.num_steps")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--no-cuda", action="store_true", help="CPU rows only")
    args = ap.parse_args()
    import torch

    base = [f"env.num_envs={args.envs}", f"algo.num_steps={args.num_steps}"]
    rows = [("cpu", "sim=cpu", [])]
    if torch.cuda.is_available() and not args.no_cuda:
        rows.append(("1 GPU", "sim=gpu", ["distributed.share_gpus=true"]))
    print(
        f"built-in env, env.num_envs={args.envs} per rank, algo.num_steps={args.num_steps}, "
        f"{os.cpu_count()} CPU cores visible, torch {torch.__version__}",
        flush=True,
    )
    print(f"{'device':<8} {'1 rank steps/s':>15} {'2 ranks steps/s':>16} {'efficiency':>11}")
    measured = {}
    for name, sim, extra in rows:
        one = run(1, [*base, sim, f"total_steps={args.steps}"], args.timeout)
        two = run(2, [*base, sim, *extra, f"total_steps={2 * args.steps}"], args.timeout)
        measured[name] = two
        print(f"{name:<8} {one:>15,.0f} {two:>16,.0f} {two / (2 * one):>10.0%}", flush=True)
    per_call = flag_cost()
    iteration = args.envs * args.num_steps * 2 / measured["cpu"]  # seconds per 2-rank iteration
    print(
        f"stop-flag agreement (one all-reduce per rollout, 2 gloo ranks): {per_call * 1e6:.0f} us "
        f"per call = {per_call / iteration:.2%} of a CPU iteration of the 2-rank run "
        f"({iteration * 1e3:.1f} ms); per env step it would be {args.num_steps}x that",
        flush=True,
    )


if __name__ == "__main__":
    main()
