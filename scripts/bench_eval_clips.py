"""What per-episode eval clips cost an evaluation: ``Evaluator.run`` on the built-in env with
``eval_env.clips`` none, failed and all, in rounds that take turns.

    python scripts/bench_eval_clips.py [--envs 16] [--size 64] [--rounds 5]

The policy stands still: every episode runs to the time limit and fails, so ``failed`` keeps every
clip (the most work it can ask for). Median seconds per evaluation, wall and CPU (this process and
its ffmpeg), over ``none``; and the floor no setting's CPU can go below: ``none`` plus ONE ffmpeg
process encoding the frames those clips hold, drawn ahead (in wall time: that encoding alone).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

import benchlib as bl
import torch

from rlrec.envs.builtin import make
from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings
from rlrec.train.evaluation import Evaluator
from tests.helpers import make_config


def frames(envs: int, size: int):
    """Every env's frames of one evaluation (the reset and 100 steps standing still), clip after
    clip: uint8 ``[envs * 101, size, size, 3]``."""
    cfg = make_config([f"env.render_width={size}", f"env.render_height={size}"])
    env = make(cfg.env, cfg.sim, envs, torch.device("cpu"), seed=0)
    env.reset()
    shots = [env.render(range(envs))]
    for _ in range(100):
        env.step(torch.zeros(envs, 2))
        shots.append(env.render(range(envs)))
    return torch.stack(shots, 1).reshape(-1, size, size, 3).numpy()


def timed(fn):
    """``fn`` as a call returning its (wall, CPU) seconds (CPU: this process and its ffmpeg)."""

    def once():
        c0, t0 = bl.cpu(), time.perf_counter()
        fn()
        return time.perf_counter() - t0, bl.cpu() - c0

    return once


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    b.parser.add_argument("--envs", type=int, default=16)
    b.parser.add_argument("--size", type=int, default=64)
    b.parser.add_argument("--rounds", type=int, default=5)
    a = b.args()
    torch.set_num_threads(1)
    shots, tags = frames(a.envs, a.size), itertools.count()
    rec = make_config([]).eval_env.recorder  # its default settings
    encoding = encoder_settings(rec.quality, rec.lossless, rec.preset)
    configs, made = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for rule in ("none", "failed", "all"):
            over = [f"eval_env.num_envs={a.envs}", f"eval_env.clips={rule}", "logger=none"]
            cfg = make_config([*over, f"env.render_width={a.size}", f"env.render_height={a.size}"])
            run = Path(tmp) / rule
            run.mkdir()
            ev = Evaluator(cfg.env, cfg.sim, cfg.eval_env, run, video_dir=f"{run}/videos/eval")
            made.append(ev)

            def evaluate(ev=ev):
                ev.run(lambda obs: torch.zeros(obs.shape[0], 2), tag=next(tags))
                ev.flush()  # the evaluation's own clip too: each setting waits for all its clips

            configs[f"clips={rule}"] = timed(evaluate)

        def encode():  # one ffmpeg process, x264 on one thread as each clip's
            path = f"{tmp}/floor-{next(tags)}.mp4"
            ffmpeg = FFmpegProcess(path, a.size, a.size, 10.0, encoding, threads=1)
            ffmpeg.write(list(shots))
            ffmpeg.finish()

        configs["encoding"] = timed(encode)
        try:
            times = bl.rounds(configs, a.rounds, warmup=1)
        finally:
            for ev in made:
                ev.env.close()
    b.out(f"{a.envs} eval envs, {a.size}x{a.size}, 100 steps, medians of {a.rounds} rounds")
    rows = []
    for i, what in enumerate(("wall", "CPU")):
        med = {k: bl.median(t[i] for t in v) for k, v in times.items()}
        none, enc = med["clips=none"], med.pop("encoding")
        med[f"floor: none + one ffmpeg encoding the {len(shots):,} frames"] = none + enc
        if what == "wall":  # an encoding entirely beside the evaluation, on another core
            med["the encoding alone"] = enc
        rows += [[k, what, f"{s:.3f}", f"{s / none:.2f}"] for k, s in med.items()]
    b.table(["", "", "s per evaluation", "over clips=none"], rows)
    b.finish()


if __name__ == "__main__":
    main()
