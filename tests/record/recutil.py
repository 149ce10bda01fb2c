"""Shared helpers of the recorder tests: a spy below the recorder, decoding, small configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import imageio_ffmpeg
import numpy as np
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.testing import FrameSpy as Spy  # noqa: F401  (the recorder tests call it Spy)
from rlrec.testing import decode  # noqa: F401  (re-exported for the recorder tests)


def rec_cfg(**kw) -> RecorderConfig:
    """A recorder config for tests: lossless, so decoded frames equal rendered ones exactly."""
    kw.setdefault("lossless", True)
    if isinstance(kw.get("trigger"), str):
        kw["trigger"] = Trigger(kw["trigger"])
    return RecorderConfig(**kw)


def make_stack(
    tmp_path, num_envs=1, size=32, max_steps=10, seed=0, dt=0.05, kind="train", watch=0,
    keep_frames=True, **cfg,
):  # fmt: skip
    """``AutoReset(Recorder(Spy(PointReach)))`` plus the list ``on_clip`` fills."""
    env = PointReach(
        num_envs,
        max_episode_steps=max_steps,
        render_width=size,
        render_height=size,
        seed=seed,
        dt=dt,
    )
    spy = Spy(env, watch=watch, keep_frames=keep_frames)
    clips: list = []
    rec = Recorder(spy, rec_cfg(**cfg), str(tmp_path), kind=kind, on_clip=clips.append)
    return AutoReset(rec), rec, spy, clips


def zeros(env) -> torch.Tensor:
    return torch.zeros(env.num_envs, 2)


def random_actions(env, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(env.num_envs, 2, generator=gen) * 2 - 1


def listing(path) -> List[str]:
    return sorted(os.listdir(path))


def decode_many(paths: List[str], size: Tuple[int, int], workdir) -> List[np.ndarray]:
    """Decodes many small clips of one frame ``size`` (W, H) with a single ffmpeg process (one
    process start instead of one per clip), every frame passed through (no fps resampling)."""
    import subprocess

    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-loglevel", "error"]
    for p in paths:  # one decoder thread per input: dozens of inputs would start hundreds
        cmd += ["-threads", "1", "-i", p]
    outs = []
    for i in range(len(paths)):
        out = os.path.join(str(workdir), f"decoded-{i}.rgb")
        cmd += [
            "-map",
            f"{i}:v:0",
            "-fps_mode",
            "passthrough",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
        ]
        cmd += ["-threads", "1", out]
        outs.append(out)
    subprocess.run(cmd, check=True)
    w, h = size
    return [np.fromfile(out, np.uint8).reshape(-1, h, w, 3) for out in outs]


def python_c(code: str) -> str:
    """The output of ``python -c code`` in a fresh interpreter started in the repo root; fails the
    test when it exits non-zero."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
