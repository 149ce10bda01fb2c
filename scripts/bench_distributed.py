"""Env steps/s of one rank and of two ranks of the same run, side by side (weak scaling: each rank
steps ``--envs`` envs), and what the stop-flag all-reduce costs an iteration.

    python scripts/bench_distributed.py [--envs 256 --steps 400000]   # CPU: 1 rank, 2 gloo ranks

Each run: ``python train.py`` or ``torchrun --nproc-per-node 2 train.py`` on the built-in env with
no evaluation, recorder or logger; its figure is rank 0's last ``sps/total`` (the loop's global
steps/s, start-up excluded). With CUDA also one GPU, one rank and two sharing it (gloo). Efficiency:
two ranks' steps/s over twice one rank's (ranks sharing cores measure the machine, not the code).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import benchlib as bl


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ranks: int, overrides: list, timeout: float) -> float:
    """Global env steps/s of one run of ``ranks`` ranks."""
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-dist-") as tmp:
        cmd = [sys.executable] + ["-m", "torch.distributed.run"] * (ranks > 1)
        if ranks > 1:
            cmd += ["--nproc-per-node", str(ranks), "--master-port", str(_port())]
        cmd += [str(bl.ROOT / "train.py"), *overrides, "eval_env.enabled=false", "recorder=none"]
        cmd += ["logger=none", "logger.progress=false", f"hydra.run.dir={tmp}/run"]
        bl.timed(cmd, env=bl.env(1, PYTHONPATH=str(bl.ROOT)), timeout=timeout)
        lines = (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        return float(json.loads(lines[-1])["sps/total"])


def _flag_worker(rank: int, port: int, n: int, out: str) -> None:
    """Rank ``rank`` of two: ``n`` all-reduces of the stop flag (rlrec.distributed.agree_signal);
    rank 0 writes the mean seconds per call."""
    import torch

    from rlrec import distributed
    from rlrec.distributed import DistributedConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ["WORLD_SIZE"] = "2"
    distributed.init(DistributedConfig(timeout_sec=60), torch.device("cpu"))
    for _ in range(50):  # warm-up
        distributed.agree_signal(None)
    seconds = bl.per_call(lambda: distributed.agree_signal(None), n)[0]
    distributed.shutdown()
    if rank == 0:
        Path(out).write_text(str(seconds))


def flag_cost(n: int = 2000) -> float:
    """Seconds per stop-flag all-reduce between two gloo ranks on this machine."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="rlrec-bench-flag-") as tmp:
        out = str(Path(tmp) / "seconds")
        mp.start_processes(_flag_worker, (_port(), n, out), nprocs=2, start_method="spawn")
        return float(Path(out).read_text())


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    b.parser.add_argument("--envs", type=int, default=64, help="env.num_envs per rank")
    b.parser.add_argument("--steps", type=int, default=100_000, help="total_steps of one rank")
    b.parser.add_argument("--num-steps", type=int, default=32, help="algo.num_steps")
    b.parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    b.parser.add_argument("--no-cuda", action="store_true", help="CPU rows only")
    a = b.args()
    import torch

    base = [f"env.num_envs={a.envs}", f"algo.num_steps={a.num_steps}"]
    devices = [("cpu", "sim=cpu", [])]
    if torch.cuda.is_available() and not a.no_cuda:
        devices.append(("1 GPU", "sim=gpu", ["distributed.share_gpus=true"]))
    rows, two = [], {}
    for name, sim, extra in devices:
        one = run(1, [*base, sim, f"total_steps={a.steps}"], a.timeout)
        two[name] = run(2, [*base, sim, *extra, f"total_steps={2 * a.steps}"], a.timeout)
        rows.append([name, f"{one:,.0f}", f"{two[name]:,.0f}", f"{two[name] / (2 * one):.0%}"])
    per_call = flag_cost()
    iteration = a.envs * a.num_steps * 2 / two["cpu"]  # seconds per 2-rank CPU iteration
    b.out(f"built-in env, env.num_envs={a.envs} per rank, algo.num_steps={a.num_steps}")
    b.table(["device", "1 rank steps/s", "2 ranks steps/s", "efficiency"], rows)
    b.out(
        f"\nstop-flag agreement (one all-reduce per rollout, 2 gloo ranks): {per_call * 1e6:.0f} "
        f"us per call = {per_call / iteration:.2%} of a 2-rank CPU iteration "
        f"({iteration * 1e3:.1f} ms)"
    )
    b.finish()


if __name__ == "__main__":
    main()
