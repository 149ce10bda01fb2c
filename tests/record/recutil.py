"""Shared helpers of the recorder tests: a spy below the recorder, decoding, small configs, jobs
and frames for the encoder on its own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import List, Tuple

import imageio_ffmpeg
import numpy as np
import psutil
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from rlrec.record.encoder import ClipInfo, ClipJob
from rlrec.record.ffmpeg import encoder_settings
from rlrec.record.settings import RecorderConfig
from rlrec.record.sidecar import sidecar_path
from rlrec.testing import FrameSpy as Spy  # noqa: F401  (the recorder tests call it Spy)
from rlrec.testing import decode


def rec_cfg(**kw) -> RecorderConfig:
    """A recorder config for tests: lossless, so decoded frames equal rendered ones exactly."""
    return RecorderConfig(**{"lossless": True, **kw})


def point_reach(num_envs=1, size=16, max_steps=10, seed=0, **kw) -> PointReach:
    kw = dict(render_width=size, render_height=size, seed=seed, **kw)
    return PointReach(num_envs, max_episode_steps=max_steps, **kw)


def make_stack(tmp_path, num_envs=1, size=32, max_steps=10, dt=0.05, kind="train", **cfg):
    """``AutoReset(Recorder(Spy(PointReach)))`` plus the list ``on_clip`` fills; ``watch``,
    ``keep_frames``: the spy's."""
    spy_kw = {k: cfg.pop(k) for k in ("watch", "keep_frames") if k in cfg}
    spy = Spy(point_reach(num_envs, size, max_steps, dt=dt), **spy_kw)
    clips: list = []
    rec = Recorder(spy, rec_cfg(**cfg), str(tmp_path), kind=kind, on_clip=clips.append)
    return AutoReset(rec), rec, spy, clips


def zeros(env) -> torch.Tensor:
    return torch.zeros(env.num_envs, 2)


def random_actions(env, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(env.num_envs, 2, generator=gen) * 2 - 1


def run_steps(stack, n, actions=zeros) -> None:
    for _ in range(n):
        stack.step(actions(stack))


def listing(path) -> List[str]:
    return sorted(os.listdir(path))


def assert_only_clips(directory, clips) -> None:
    """``directory`` holds exactly ``clips`` and their sidecars (no temporary, no dropped clip)."""
    names = [os.path.basename(p) for c in clips for p in (c.path, c.sidecar)]
    assert listing(directory) == sorted(names)


def assert_frames(path, expected) -> np.ndarray:
    """The clip at ``path`` holds exactly the frames ``expected`` (a list or an array)."""
    frames = decode(str(path))[0]
    assert np.array_equal(frames, np.stack(expected)), (path, len(frames), len(expected))
    return frames


def sidecar(clip_path) -> dict:
    return json.loads(Path(sidecar_path(str(clip_path))).read_text())


def job(path, episode=3, step=42, tag=None, **kw) -> ClipJob:
    """The encoder's job of one lossless clip at ``path`` (10 fps)."""
    info = ClipInfo(str(path), "train", episode, step, 0, 10.0, tag)
    return ClipJob(
        info, **{"fixed_name": False, "encoding": encoder_settings(7, True, "ultrafast"), **kw}
    )


def frames(n, k=1, size=16, seed=0) -> torch.Tensor:
    """``n`` distinct random frames of ``k`` tiles, uint8 ``[n, k, size, size, 3]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, k, size, size, 3), generator=gen, dtype=torch.uint8)


def is_ffmpeg(pid: int) -> bool:
    """Whether ``pid`` is an ffmpeg process, stopped (SIGSTOP) or running (not a zombie)."""
    try:
        proc = psutil.Process(pid)
        return "ffmpeg" in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@contextlib.contextmanager
def stopped(pid, resume_after=8.0):
    """SIGSTOPs ``pid``; SIGCONTs it after ``resume_after`` s if it is still there (so that code
    which waits on it for good ends the test late instead of hanging it), and at the end."""

    def resume():
        if is_ffmpeg(pid):
            os.kill(pid, signal.SIGCONT)

    os.kill(pid, signal.SIGSTOP)
    guard = threading.Timer(resume_after, resume)
    guard.start()
    try:
        yield
    finally:
        guard.cancel()
        resume()


def start_clip(enc, path, n, **job_kw):
    """Opens a clip at ``path`` in encoder ``enc``, sends it ``frames(n)`` and waits until they
    are in its ffmpeg (flush); returns ``enc``."""
    enc.open(job(path, **job_kw))
    for f in frames(n):
        enc.frame(f)
    enc.flush()
    return enc


def decode_many(paths: List[str], size: Tuple[int, int], workdir) -> List[np.ndarray]:
    """Decodes many small clips of one frame ``size`` (W, H) with a single ffmpeg process (one
    process start instead of one per clip), every frame passed through (no fps resampling)."""
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-loglevel", "error"]
    for p in paths:  # one decoder thread per input: dozens of inputs would start hundreds
        cmd += ["-threads", "1", "-i", p]
    outs = [os.path.join(str(workdir), f"decoded-{i}.rgb") for i in range(len(paths))]
    for i, out in enumerate(outs):
        cmd += ["-map", f"{i}:v:0", "-fps_mode", "passthrough", "-f", "rawvideo"]
        cmd += ["-pix_fmt", "rgb24", "-threads", "1", out]
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
