"""What an export costs, and what it saves per step.

    python scripts/bench_export.py [--steps 2000] [--batches 1 64 1024]

A short built-in run of a 256x256x3 MLP policy; ``rlrec.export.export`` of its checkpoint timed per
format (read and verification included; target under 5 s) and ``python -m rlrec.export`` in a fresh
interpreter. Then the per-step latency on one CPU thread of the checkpoint's eager model, policy.pt
and policy.onnx (``rlrec.load_policy``): the median of ``--steps`` calls per batch size.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import torch

from rlrec.export import export, load_policy
from rlrec.train.runner import Runner
from tests.helpers import FAST, make_config


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    b.parser.add_argument("--steps", type=int, default=2000)
    b.parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    a = b.args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        over = [*FAST, "recorder=none", "eval_env.enabled=false", "total_steps=128"]
        Runner(make_config([*over, "algo.hidden_sizes=[256,256,256]"]), run_dir).run()
        for fmt in ("torchscript", "onnx"):
            t0 = time.perf_counter()
            export(run_dir, fmt=fmt)
            rows.append([f"export {fmt} (target under 5 s)", f"{time.perf_counter() - t0:.2f}"])
        cli = [
            sys.executable,
            "-m",
            "rlrec.export",
            run_dir,
            "export.format=both",
            "export.verify=0",
        ]
        rows.append(["python -m rlrec.export, both formats", f"{bl.timed(cli)[0]:.2f}"])
        files = {"checkpoint": "checkpoints/last.pt", "torchscript": "exported/policy.pt"}
        files["onnx"] = "exported/policy.onnx"
        policies = {name: load_policy(run_dir / f) for name, f in files.items()}
        latency = []
        for batch in a.batches:
            obs = torch.randn(batch, 6)
            row = [batch]
            for policy in policies.values():
                for _ in range(50):  # warm-up (TorchScript profiles its first calls)
                    policy(obs)
                times = [bl.per_call(lambda p=policy, o=obs: p(o), 1)[0] for _ in range(a.steps)]
                row.append(f"{statistics.median(times) * 1e6:.1f}")
            latency.append(row)
    b.table(["", "seconds"], rows)
    b.out(f"\nper-step latency on the CPU, us (median of {a.steps} calls, 1 thread)")
    b.table(["batch", *policies], latency)
    b.finish()


if __name__ == "__main__":
    main()
