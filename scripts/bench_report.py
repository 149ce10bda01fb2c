"""How long the run report takes, and what it adds to a run's wall time.

    python scripts/bench_report.py [--evals 200] [--runs 1] [--skip-train] [--preset OVERRIDES]

1. ``write_run_report`` (report.html and videos/progress.mp4) of a synthetic run dir in this process
(wall, and CPU with its ffmpeg; target under 5 s) and ``python -m rlrec.report DIR`` in a fresh
interpreter. The run dir: ``--evals`` evaluations, each a small real H.264 clip with its sidecar,
train lines between them, ``--eval-envs`` episodes each in eval_episodes.jsonl (a third failed).
2. The main job (``--preset``: its overrides) with ``report.enabled=false`` and ``=true``,
alternated ``--runs`` times: wall times, their ratio, and the report's own seconds in its runs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import numpy as np

from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings
from rlrec.record.sidecar import write_sidecar


def eval_clip(path: Path, k: int, frames: int, size: int = 64) -> None:
    """A clip of a dot moving over ``frames`` frames, and its sidecar."""
    proc = FFmpegProcess(str(path), size, size, 20.0, encoder_settings(7, False, "ultrafast"))
    images = np.full((frames, size, size, 3), 20, np.uint8)
    for t, image in enumerate(images):
        y, x = (t * 3 + k) % (size - 6), (t * 5 + 2 * k) % (size - 6)
        image[y : y + 6, x : x + 6] = (240, 120, 40)
    proc.write(list(images))
    proc.finish()
    ok = frames < 100
    env = {"env": 0, "episode": k, "return": float(k), "length": frames, "success": ok}
    env["end"] = "terminated" if ok else "truncated"
    encoder = {"codec": "libx264", "crf": 15, "pix_fmt": "yuv420p", "quality": 7, "lossless": False}
    sidecar = {"frames": frames, "fps": 20.0, "width": size, "height": size, "encoder": encoder}
    sidecar.update(tag=int(path.stem[9:]), kind="eval", env_idx=[0], episodes=[k], envs=[env])
    write_sidecar(str(path), {**sidecar, "seed": 1_000_000})


def make_run(run_dir: Path, evals: int, eval_envs: int) -> None:
    rng = np.random.default_rng(0)
    (run_dir / "videos" / "eval").mkdir(parents=True)
    lines, episodes, step = [], [], 0
    fixed = {"loss/entropy": 2.8, "loss/approx_kl": 1e-3, "sps/total": 1e3, "sps/collect": 2e3}
    for k in range(evals):
        for _ in range(5):  # train lines between evaluations
            step += 1024
            keys = ("train/return", "train/success", "loss/policy", "loss/value")
            draws = (rng.normal(k / 10, 1), rng.random(), rng.normal(), rng.random())
            lines.append({"step": step, **dict(zip(keys, map(float, draws))), **fixed})
        name, frames = f"eval-step{step:09d}.mp4", int(rng.integers(20, 101))
        clip = f"videos/eval/{name}"
        eval_clip(run_dir / clip, k, frames)
        lines.append({"step": step, "eval/return": float(k), "eval/success": 0.66})
        lines[-1].update({"eval/length": 50.0, "eval/episodes": eval_envs, "eval/clip": clip})
        for env in range(eval_envs):
            failed = env % 3 == 0
            ep = {"step": step, "iteration": (k + 1) * 5, "env": env, "episode": k}
            ep.update(seed=1_000_000 + env, success=not failed, length=100 if failed else 40)
            ep.update({"return": float(k - failed), "clip": clip if env == 0 else None})
            ep.update(ended="truncated" if failed else "terminated")
            episodes.append({**ep, "frames": [0, frames - 1] if env == 0 else None})
    for name, rows in (("metrics.jsonl", lines), ("eval_episodes.jsonl", episodes)):
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in rows))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- +experiment=smoke\n")
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    b.parser.add_argument("--evals", type=int, default=200)
    b.parser.add_argument("--eval-envs", type=int, default=16)
    b.parser.add_argument("--runs", type=int, default=1, help="main jobs of each, alternated")
    b.parser.add_argument("--skip-train", action="store_true", help="part 1 only")
    b.parser.add_argument("--preset", default="", help="overrides of the main job")
    a = b.args()
    from rlrec.report.html import write_run_report

    with tempfile.TemporaryDirectory(prefix="rlrec-bench-report-") as tmp:
        run_dir = Path(tmp) / "run"
        make_run(run_dir, a.evals, a.eval_envs)
        cpu0, t0 = bl.cpu(), time.perf_counter()
        write_run_report(run_dir)
        wall, cpu = time.perf_counter() - t0, bl.cpu() - cpu0
        size = (run_dir / "report.html").stat().st_size / 1e3
        fresh = bl.timed([sys.executable, "-m", "rlrec.report", str(run_dir)])[0]
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    b.out(f"the report of {a.evals} evaluations, {a.eval_envs} eval envs each ({load}):")
    rows = [[f"in process (target < 5 s; report.html {size:.0f} kB)", f"{wall:.2f}", f"{cpu:.2f}"]]
    rows.append(["python -m rlrec.report DIR (a fresh interpreter)", f"{fresh:.2f}", "-"])
    b.table(["write_run_report", "wall s", "CPU s"], rows)
    if not a.skip_train:
        sides = {
            f"report.enabled={k}": a.preset.split() + [f"report.enabled={k}"]
            for k in ("false", "true")
        }
        jobs = bl.rounds({k: lambda o=o: bl.job(b.runs, o) for k, o in sides.items()}, a.runs)
        b.out(f"\ntrain.py {a.preset}, medians of {a.runs} runs, alternated")
        bl.compare(b, jobs, bl.columns("", "wall", "report"), tuple(sides)[::-1])
    b.finish()


if __name__ == "__main__":
    main()
