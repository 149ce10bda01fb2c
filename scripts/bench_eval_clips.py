#!/usr/bin/env python
"""What per-episode eval clips cost an evaluation: ``Evaluator.run`` wall time on the built-in env
with ``eval_env.clips`` = none (the evaluation's one clip only), failed and all, side by side in
one process, rounds interleaved (the machine's load then weighs on each alike).

    python scripts/bench_eval_clips.py                     # 16 eval envs, 64x64, 5 rounds
    python scripts/bench_eval_clips.py --envs 16 --size 128 --rounds 5

The policy stands still, so every episode runs to the time limit (100 steps) and fails: ``failed``
then records and keeps every clip, as ``all`` does (the most work the option can ask for).
Printed: the median seconds per evaluation of each setting and its ratio to ``none``, in wall time
and in CPU time (this process and its ffmpeg processes: on a shared machine the steadier figure).

Then the floor of any per-episode encoding: ``none`` plus the encoding alone of the frames those
clips hold (every env's 101 frames, drawn ahead, clip after clip), by ONE ffmpeg process at the
eval recorder's settings: one process start, one x264 set-up, no render, no copy, no thread.
No way of encoding those clips costs less CPU, so no setting can get below that CPU ratio here;
in wall time, an encoding that ran entirely beside the evaluation (on another core) would still
take as long as the encoding alone, also printed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlrec.envs.builtin import make  # noqa: E402
from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings  # noqa: E402
from rlrec.train.evaluation import Evaluator  # noqa: E402
from tests.helpers import make_config  # noqa: E402


def _evaluator(rule: str, envs: int, size: int, root: Path) -> Evaluator:
    cfg = make_config(
        [
            f"eval_env.num_envs={envs}",
            f"env.render_width={size}",
            f"env.render_height={size}",
            f"eval_env.clips={rule}",
            "logger=none",
        ]
    )
    run = root / rule
    run.mkdir()
    video_dir = str(run / "videos" / "eval")
    return Evaluator(cfg.env, cfg.sim, cfg.eval_env, run, video_dir=video_dir)


def _cpu() -> float:
    """CPU seconds of this process and of its ended children (the ffmpeg processes)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _frames(envs: int, size: int) -> np.ndarray:
    """Every env's frames of one evaluation (the reset and 100 steps standing still), clip after
    clip: uint8 ``[envs * 101, size, size, 3]``."""
    cfg = make_config([f"env.render_width={size}", f"env.render_height={size}"])
    env = make(cfg.env, cfg.sim, envs, torch.device("cpu"), seed=0)
    env.reset()
    every = list(range(envs))
    frames = [env.render(every)]
    for _ in range(100):
        env.step(torch.zeros(envs, 2))
        frames.append(env.render(every))
    return torch.stack(frames, 1).reshape(-1, size, size, 3).numpy()


def _encode_once(frames: np.ndarray, path: Path, encoding: dict) -> None:
    """``frames`` as one clip, by one ffmpeg process (x264 on one thread, as each clip's)."""
    size = frames.shape[1]
    ffmpeg = FFmpegProcess(str(path), size, size, 10.0, encoding, threads=1)
    ffmpeg.write(list(frames))
    ffmpeg.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rules = ("none", "failed", "all")
    times = {r: [] for r in rules + ("encoding",)}
    cpus = {r: [] for r in rules + ("encoding",)}
    frames = _frames(args.envs, args.size)
    rec = make_config([]).eval_env.recorder  # its default settings
    encoding = encoder_settings(rec.quality, rec.lossless, rec.preset)
    with tempfile.TemporaryDirectory() as tmp:
        evaluators = {r: _evaluator(r, args.envs, args.size, Path(tmp)) for r in rules}
        try:
            for i in range(args.rounds + 1):
                for rule, ev in evaluators.items():
                    c0, t0 = _cpu(), time.perf_counter()
                    ev.run(lambda obs: torch.zeros(obs.shape[0], 2), tag=i)
                    ev.flush()  # the evaluation's own clip too, so each setting waits for all
                    if i:  # the first round warms up
                        times[rule].append(time.perf_counter() - t0)
                        cpus[rule].append(_cpu() - c0)
                c0, t0 = _cpu(), time.perf_counter()
                _encode_once(frames, Path(tmp) / f"floor{i}.mp4", encoding)
                if i:
                    times["encoding"].append(time.perf_counter() - t0)
                    cpus["encoding"].append(_cpu() - c0)
        finally:
            for ev in evaluators.values():
                ev.env.close()
    print(f"{args.envs} eval envs, {args.size}x{args.size}, 100 steps, {args.rounds} rounds")
    for what, figures in (("wall", times), ("CPU", cpus)):
        base = statistics.median(figures["none"])
        for rule in rules:
            med = statistics.median(figures[rule])
            print(f"clips={rule:<7} {med:7.3f} {what} s per evaluation   x{med / base:.2f} of none")
        encoding = statistics.median(figures["encoding"])
        floor = base + encoding
        print(
            f"floor   {floor:7.3f} {what} s: none + one ffmpeg encoding the {len(frames):,} frames "
            f"alone   x{floor / base:.2f} of none"
        )
        if what == "wall":  # an encoding entirely beside the evaluation, on another core
            print(
                f"        the encoding alone: {encoding:.3f} wall s   "
                f"x{encoding / base:.2f} of none"
            )


if __name__ == "__main__":
    main()
