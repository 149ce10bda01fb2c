"""One clip per env: an env wrapper that records the first episode of every env after each full
reset as a clip of its own, and keeps those a caller's rule selects.

It composes one :class:`~rlrec.record.engine.ClipEngine` per env (``env_idx=[i]``, trigger
``eval``), so each clip has exactly the frames, the sidecar and the encoding of a clip of that
env recorded alone: the reset state first, a frame every ``steps_per_frame`` steps, the terminal
frame last. What it adds:

- one batched render per frame step for all the envs whose clip is open (not one per env): the
  first engine to ask renders them together and copies them to the host at once, the others
  take their row;
- one read of a step's values (reward, done flags, success) for all the engines whose clip is
  open: they get host tensors, which they read in place (not one device read per env);
- ``keep(env, success, ret)``, asked as each clip ends (its episode's success, None where the env
  reports none, and its return): False drops the clip before it is written;
- the encoding memory of all its engines together is about one recorder's: each engine gets
  ``max(2, queue_size // num_envs)`` frame buffers.

Sitting above rlrec's :class:`~rlrec.record.wrappers.adapter.Recorder` (or the adapter) and below
AutoReset, it sees every reset and every step before AutoReset resets the envs that finished.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional

import torch

from rlrec.envs.base import EnvAdapter, EnvWrapper
from rlrec.record import names
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Keep, Schedule
from rlrec.record.settings import RecorderConfig, Trigger

__all__ = ["EpisodeClips"]


class EpisodeClips(EnvWrapper):
    """Records every env's first episode after each full reset as its own clip (see the module
    docstring). ``on_clip(env, clip)``: called with each clip on disk; ``keep``: see the module
    docstring (None: keep every clip). ``tag`` (set it before a
    full reset) goes onto the clips, as a recorder's ``engine.tag`` does, and an int tag into
    their names: ``{kind}-step{tag:09d}-env{env:03d}.mp4`` (``{kind}-env{env:03d}.mp4`` without)."""

    def __init__(
        self,
        env: EnvAdapter,
        cfg: RecorderConfig,
        video_dir: Optional[str],
        kind: str = "eval",
        key: str = "eval_env.recorder",
        on_clip: Optional[Callable[[int, ClipInfo], None]] = None,
        keep: Optional[Keep] = None,
    ):
        super().__init__(env)
        n = env.num_envs
        self._step = 0  # the render cache's clock: one batched render per step
        self._cached: Optional[tuple] = None  # (clock, env indices, frames)
        self.engines: List[ClipEngine] = []
        horizon = getattr(env, "max_episode_steps", None)
        source = Source(n, env.dt, env.device, self._render, horizon)
        for i in range(n):
            one = dataclasses.replace(
                cfg,
                enabled=True,
                trigger=Trigger.eval,
                every=None,
                env_idx=[i],
                filename=None,
                record_final_episode=False,
                queue_size=max(2, cfg.queue_size // n),
            )
            engine = ClipEngine(
                one, source, video_dir, kind=kind, key=key,
                on_clip=None if on_clip is None else (lambda c, i=i: on_clip(i, c)),
                schedule=Schedule.of(one, keep=keep),
                name=lambda s, i=i: names.episode_clip(kind, s.tag, i),
            )  # fmt: skip
            self.engines.append(engine)

    @property
    def tag(self):
        return self.engines[0].tag

    @tag.setter
    def tag(self, value) -> None:
        for engine in self.engines:
            engine.tag = value

    def _render(self, env_idx: List[int]) -> torch.Tensor:
        """The frame of ``env_idx[0]`` now, from one render of every env whose clip is open."""
        i = env_idx[0]
        cached = self._cached
        if cached is None or cached[0] != self._step or i not in cached[1]:
            idx = [j for j, e in enumerate(self.engines) if e.recording or j == i]
            # one copy to the host for all of them (each engine's encoder would copy its own row)
            cached = self._cached = (self._step, idx, self.env.render(idx).cpu())
        pos = cached[1].index(i)
        return cached[2][pos : pos + 1]

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        self._step += 1
        if env_idx is None:  # a full reset: every engine starts its clip, rendered together
            every = list(range(self.num_envs))
            self._cached = (self._step, every, self.env.render(every).cpu())
        for engine in self.engines:
            engine.on_reset(env_idx, seed)
        self._cached = None
        return out

    def step(self, action):
        out = self.env.step(action)
        self._step += 1
        reward, terminated, truncated, info = out[1], out[2], out[3], out[4]
        if any(engine.recording for engine in self.engines):
            reward, terminated, truncated, info = _on_host(reward, terminated, truncated, info)
        for engine in self.engines:
            engine.on_step(reward, terminated, truncated, info)
        self._cached = None  # frames are not kept past their step
        return out

    def end_clips(self) -> None:
        """Ends (and saves) the clips still open, e.g. when an evaluation stops early."""
        for engine in self.engines:
            engine.end_clip()

    def flush(self) -> None:
        """Waits (bounded) until every ended clip is on disk and reported through ``on_clip``."""
        for engine in self.engines:
            engine.flush()

    def losses(self) -> Dict[str, int]:
        """What its engines lost, summed (see :meth:`ClipEngine.losses`)."""
        out: Dict[str, int] = {}
        for engine in self.engines:
            for k, v in engine.losses().items():
                out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        try:
            for engine in self.engines:
                engine.close()
        finally:
            self.env.close()


def _on_host(reward, terminated, truncated, info):
    """The step's per-env values (and ``info["success"]``) as CPU tensors, in one copy from
    wherever they are (on a device: the step's one read back, for every engine)."""
    success = info.get("success") if info else None
    values = [reward, terminated, truncated] + ([] if success is None else [success])
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    # one [rows, num_envs] tensor, one copy: bools become 0/1, rewards keep their values
    rows = torch.stack([torch.as_tensor(v, device=device).double() for v in values]).cpu()
    host = rows.unbind(0)
    info = info if success is None else {**info, "success": host[3].bool()}
    return host[0], host[1].bool(), host[2].bool(), info
