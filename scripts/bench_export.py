"""What an export costs, and what it saves per step.

1. A short built-in run of a 256x256x3 MLP policy (``algo.hidden_sizes=[256,256,256]``), then
   ``rlrec.export.export`` of its last checkpoint, timed per format (TorchScript, ONNX), the
   checkpoint's read and verification included (target: under 5 s; the first ONNX export of a
   process imports onnx, most of its time), and the command in a fresh interpreter.
2. The per-step latency on the CPU (one thread, as a run has) of ``rlrec.load_policy`` of the
   checkpoint (the eager model), of policy.pt and of policy.onnx, for batches of ``--batches``
   observations: the median of ``--steps`` calls each, side by side.

    python scripts/bench_export.py [--steps 2000] [--batches 1 64 1024]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlrec.export import export, load_policy  # noqa: E402
from rlrec.train.runner import Runner  # noqa: E402
from tests.helpers import FAST, make_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        overrides = [*FAST, "recorder=none", "eval_env.enabled=false", "total_steps=128"]
        Runner(make_config([*overrides, "algo.hidden_sizes=[256,256,256]"]), run_dir).run()
        for fmt in ("torchscript", "onnx"):
            t0 = time.perf_counter()
            export(run_dir, fmt=fmt)
            print(f"export {fmt:<11}: {time.perf_counter() - t0:6.2f} s (target: under 5 s)")
        t0 = time.perf_counter()
        cli = [
            sys.executable,
            "-m",
            "rlrec.export",
            str(run_dir),
            "export.format=both",
            "export.verify=0",
        ]
        subprocess.run(cli, cwd=REPO, check=True, capture_output=True)
        print(
            f"python -m rlrec.export, both formats, a fresh interpreter: "
            f"{time.perf_counter() - t0:.2f} s"
        )
        paths = {
            "checkpoint": run_dir / "checkpoints" / "last.pt",
            "torchscript": run_dir / "exported" / "policy.pt",
            "onnx": run_dir / "exported" / "policy.onnx",
        }
        policies = {name: load_policy(p) for name, p in paths.items()}
        print(f"\nper-step latency on the CPU (median of {args.steps} calls, 1 thread), us")
        print(f"{'batch':>6} " + " ".join(f"{n:>12}" for n in policies))
        for batch in args.batches:
            obs = torch.randn(batch, 6)
            row = []
            for policy in policies.values():
                for _ in range(50):  # warm-up (TorchScript profiles its first calls)
                    policy(obs)
                times = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    policy(obs)
                    times.append(time.perf_counter() - t0)
                row.append(sorted(times)[len(times) // 2] * 1e6)
            print(f"{batch:>6} " + " ".join(f"{t:>12.1f}" for t in row))


if __name__ == "__main__":
    main()
