"""How long the run report takes, and what it adds to a run's wall time.

1. A synthetic run dir of ``--evals`` evaluations (real small H.264 clips of a moving dot, with
   their sidecars; metrics.jsonl with train lines between the eval lines; eval_episodes.jsonl
   with ``--eval-envs`` episodes per evaluation, a third of them failed): the time of
   ``write_run_report`` (report.html and videos/progress.mp4), in
   this process, and of the command ``python -m rlrec.report DIR`` (a fresh interpreter).
2. The main job, ``python train.py`` (``--preset``: its overrides), with ``report.enabled=false``
   and ``=true``, alternated ``--runs`` times each: the wall times, their ratio, and the report's
   own seconds within each run with it (the report runs after training, when every env and
   encoder is closed; on a shared machine the share within one run is the steadier figure).

    python scripts/bench_report.py [--evals 200] [--runs 1] [--skip-train | --only-train]
                                   [--preset "+experiment=smoke"]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings  # noqa: E402
from rlrec.record.sidecar import write_sidecar  # noqa: E402


def make_run(run_dir: Path, evals: int, eval_envs: int, size: int = 64) -> None:
    rng = np.random.default_rng(0)
    clips = run_dir / "videos" / "eval"
    clips.mkdir(parents=True)
    lines, episodes = [], []
    step = 0
    for k in range(evals):
        for _ in range(5):  # train lines between evaluations
            step += 1024
            lines.append({"step": step, "train/return": float(rng.normal(k / 10, 1)),
                          "train/success": float(rng.random()), "loss/policy": float(rng.normal()),
                          "loss/value": float(rng.random()), "loss/entropy": 2.8,
                          "loss/approx_kl": 1e-3, "sps/total": 1e3,
                          "sps/collect": 2e3})  # fmt: skip
        frames = int(rng.integers(20, 101))
        name = f"eval-step{step:09d}.mp4"
        encoding = encoder_settings(7, False, "ultrafast")
        proc = FFmpegProcess(str(clips / name), size, size, 20.0, encoding)
        images = []
        for t in range(frames):
            image = np.full((size, size, 3), 20, np.uint8)
            y, x = (t * 3 + k) % (size - 6), (t * 5 + 2 * k) % (size - 6)
            image[y : y + 6, x : x + 6] = (240, 120, 40)
            images.append(image)
        proc.write(images)
        proc.finish()
        success = frames < 100
        write_sidecar(str(clips / name), {
            "frames": frames, "fps": 20.0, "width": size, "height": size,
            "encoder": {"codec": "libx264", "crf": 15, "pix_fmt": "yuv420p", "quality": 7,
                        "lossless": False},
            "tag": step, "kind": "eval", "env_idx": [0], "episodes": [k], "seed": 1_000_000,
            "envs": [{"env": 0, "episode": k, "return": float(k), "length": frames,
                      "success": success, "end": "terminated" if success else "truncated"}],
        })  # fmt: skip
        lines.append({"step": step, "eval/return": float(k), "eval/success": 0.66,
                      "eval/length": 50.0, "eval/episodes": eval_envs,
                      "eval/clip": f"videos/eval/{name}"})  # fmt: skip
        for env in range(eval_envs):
            failed = env % 3 == 0
            episodes.append({"step": step, "iteration": (k + 1) * 5, "env": env, "episode": k,
                             "seed": 1_000_000 + env, "return": float(k - failed),
                             "length": 100 if failed else 40, "success": not failed,
                             "ended": "truncated" if failed else "terminated",
                             "clip": f"videos/eval/{name}" if env == 0 else None,
                             "frames": [0, frames - 1] if env == 0 else None})  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "eval_episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in episodes))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- +experiment=smoke\n")
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")


def _cpu() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def time_train(tmp: Path, runs: int, preset: list) -> None:
    """The main job with the report off and on, alternated; the report's own seconds from the
    line the run ends with (``rlrec: report PATH (written in S s)``), as a share of that run."""
    walls: dict = {"false": [], "true": []}
    shares = []
    for i in range(runs):
        for enabled in ("false", "true"):
            run_dir = tmp / f"train-{enabled}-{i}"
            cmd = [sys.executable, str(REPO / "train.py"), *preset, "logger=none",
                   "logger.progress=false", f"report.enabled={enabled}",
                   f"hydra.run.dir={run_dir}"]  # fmt: skip
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            walls[enabled].append(wall)
            assert (run_dir / "report.html").is_file() == (enabled == "true")
            if enabled == "true":
                secs = float(re.search(r"\(written in ([\d.]+) s\)", proc.stdout)[1])
                shares.append((secs, wall))
    off, on = np.median(walls["false"]), np.median(walls["true"])
    name = " ".join(["train.py", *preset])
    print(f"{name} wall time (median of {runs}, alternated):")
    print(f"  report.enabled=false {off:6.2f} s  {['%.2f' % w for w in walls['false']]}")
    print(f"  report.enabled=true  {on:6.2f} s  {['%.2f' % w for w in walls['true']]}")
    print(f"  ratio of the medians {on / off:.3f}")
    for secs, wall in shares:
        print(f"  the report within its run: {secs:.2f} s of {wall:.2f} s: the run is "
              f"{100 * secs / (wall - secs):.1f}% longer than without it")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evals", type=int, default=200)
    parser.add_argument("--eval-envs", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--only-train", action="store_true")
    parser.add_argument(
        "--preset", default="", help="overrides of the main job (default: none, python train.py)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-report-") as tmp:
        tmp = Path(tmp)
        if args.only_train:
            return time_train(tmp, args.runs, args.preset.split())
        run_dir = tmp / "run"
        t0 = time.perf_counter()
        make_run(run_dir, args.evals, args.eval_envs)
        print(f"synthetic run dir: {args.evals} evaluations, clips written in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip

        from rlrec.report.html import write_run_report

        cpu0, t0 = _cpu(), time.perf_counter()
        write_run_report(run_dir)
        inproc, cpu = time.perf_counter() - t0, _cpu() - cpu0
        size = (run_dir / "report.html").stat().st_size
        load = os.getloadavg()[0]
        print(f"report + progress video, in process: {inproc:.2f} s wall, {cpu:.2f} s CPU of this "
              f"process and its ffmpeg children (target < 5 s; report.html {size / 1e3:.0f} kB; "
              f"load average {load:.1f} on {os.cpu_count()} cores)")  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlrec.report", str(run_dir)], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
        print(f"python -m rlrec.report DIR (a fresh interpreter): {time.perf_counter() - t0:.2f} s")
        if not args.skip_train:
            time_train(tmp, args.runs, args.preset.split())


if __name__ == "__main__":
    main()
