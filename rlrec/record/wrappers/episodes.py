"""Per-episode clips (``eval_env.clips``): one clip per env of its first episode after each full
reset, of which an evaluation keeps those its rule selects (:class:`ClipChoice`).

:class:`EpisodeClips` composes one :class:`~rlrec.record.engine.ClipEngine` per env
(``env_idx=[i]``, trigger ``eval``), so each clip has exactly the frames, the sidecar and the
encoding of a clip of that env recorded alone: the reset state first, a frame every
``steps_per_frame`` steps, the terminal frame last; its sidecar's ``seed`` is that env's own
(:func:`env_seed`). What it adds:

- one batched render per frame step for all the envs whose clip is open (not one per env): the
  first engine to ask renders them together and copies them to the host at once, the others
  take their row;
- one read of a step's values (reward, done flags, success) for all the engines whose clip is
  open: they get host tensors, which they read in place (not one device read per env);
- the rule, decided by :class:`ClipChoice` alone and applied once, at :meth:`EpisodeClips.settle`:
  every clip is finished, encoded, into its temporary file and waits there until ``settle`` is
  told the episodes the evaluation counted; then those the rule selects are placed under their
  names and reported, the others' temporary files removed (under ``failed`` a successful
  episode's clip is encoded too, and never named);
- the encoding cost of many small clips at once: each engine gets ``max(2 * BATCH, queue_size //
  num_envs)`` frame buffers (whole batches: with fewer, its encoder thread and ffmpeg wake every
  other frame), and each clip one x264 thread (the clips run side by side already).

Sitting above rlrec's :class:`~rlrec.record.wrappers.adapter.Recorder` (or the adapter) and below
AutoReset, it sees every reset and every step before AutoReset resets the envs that finished.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from rlrec.envs.base import EnvAdapter, EnvWrapper
from rlrec.record import names
from rlrec.record.encoder import BATCH, ClipInfo
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Schedule
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.record.wrappers.view import viewed

Counted = Mapping[int, Tuple[Optional[bool], float]]  # env -> its first episode's success, return


def env_seed(env, seed, i: int):
    """The seed env ``i``'s episode began with at ``env.reset(seed)`` (rlrec.envs.base's rule):
    ``seed + i`` where the backend seeds each env (``seed_per_env``), else the batch's ``seed``;
    None without one."""
    if not isinstance(seed, int) or not getattr(env, "seed_per_env", True):
        return seed
    return seed + i


@dataclasses.dataclass(frozen=True)
class ClipChoice:
    """Which per-episode clips stay: ``rule`` (``eval_env.clips``: ``all``, ``failed`` (every
    episode where the env reports no success), ``worst`` / ``best``: the ``k`` lowest / highest
    returns), of the episodes the evaluation counted only."""

    rule: str = "all"
    k: int = 3

    def chosen(self, counted: Counted) -> List[int]:
        """The envs whose clip is placed, of ``counted``."""
        envs = [e for e, (success, _) in counted.items() if self.rule != "failed" or not success]
        if self.rule in ("worst", "best"):
            sign = 1 if self.rule == "worst" else -1
            envs = sorted(envs, key=lambda e: (sign * counted[e][1], e))[: self.k]
        return envs


class EpisodeClips(EnvWrapper):
    """Records every env's first episode after each full reset as its own clip, of which
    :meth:`settle` places those ``choice`` selects (see the module docstring). ``tag`` (set it
    before a full reset) goes onto the clips, as a recorder's ``engine.tag`` does, and an int tag
    into their names: ``{kind}-step{tag:09d}-env{env:03d}.mp4`` (``{kind}-env{env:03d}.mp4``
    without)."""

    def __init__(
        self,
        env: EnvAdapter,
        cfg: RecorderConfig,
        video_dir: Optional[str],
        kind: str = "eval",
        key: str = "eval_env.recorder",
        choice: ClipChoice = ClipChoice(),
    ):
        super().__init__(viewed(env, cfg, key))  # cfg.view: rlrec.record.wrappers.view
        n = env.num_envs
        self.choice = choice
        self.tag = None  # each engine's at a reset, so its clip's (ClipEngine.tag)
        # (env indices, frames) of this step's one batched render, dropped with the step
        self._cached = None
        self._placed = {}
        source = Source(n, env.dt, env.device, self._render, env.max_episode_steps)
        each = dataclasses.replace(
            cfg,
            enabled=True,
            trigger=Trigger.eval,
            every=None,
            filename=None,
            record_final_episode=False,
            queue_size=max(2 * BATCH, cfg.queue_size // n),
        )
        self.engines = [
            ClipEngine(
                dataclasses.replace(each, env_idx=[i]),
                source,
                video_dir,
                kind=kind,
                key=key,
                on_clip=lambda clip, i=i: self._placed.update({i: clip}),
                schedule=Schedule.of(each, hold=True),  # placed by settle()
                name=lambda s, i=i: names.episode_clip(kind, s.tag, i),
            )
            for i in range(n)
        ]

    def _render(self, env_idx):
        """The frame of ``env_idx[0]`` now, from one render of every env whose clip is open."""
        i = env_idx[0]
        if self._cached is None or i not in self._cached[0]:
            idx = [j for j, e in enumerate(self.engines) if e.recording or j == i]
            # one copy to the host for all of them (each engine's encoder would copy its own row)
            self._cached = (idx, self.env.render(idx).cpu())
        idx, frames = self._cached
        return frames[idx.index(i)][None]

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        # a full reset: every engine starts its clip, rendered together (none cached from before)
        every = list(range(self.num_envs))
        self._cached = (every, self.env.render(every).cpu()) if env_idx is None else None
        for i, engine in enumerate(self.engines):
            engine.tag = self.tag
            engine.on_reset(env_idx, env_seed(self.env, seed, i))
        self._cached = None
        return out

    def step(self, action):
        out = self.env.step(action)
        self._cached = None  # none from before (a step that raised)
        values = out[1:]
        if any(engine.recording for engine in self.engines):
            values = _on_host(*values)
        for engine in self.engines:
            engine.on_step(*values)
        self._cached = None  # frames are not kept past their step
        return out

    def settle(self, counted: Counted) -> Dict[int, ClipInfo]:
        """The clips of the last full reset, once the evaluation knows the first episodes it
        counted (``counted``, env -> success and return; empty for none): a clip still open is
        of an episode not counted, as is any clip of an env not in ``counted``; those clips are
        dropped, and of the rest those :meth:`ClipChoice.chosen` selects are placed under their
        names, after a bounded wait for their encoding. Returns the placed clips, by env (a clip
        whose encoding failed is reported as the engines report losses)."""
        chosen = set(self.choice.chosen(counted))
        self._placed = {}
        for engine in self.engines:
            engine.end_clip(keep=False)  # not counted: dropped
        for i, engine in enumerate(self.engines):
            engine.flush()
            engine.encoder.release(lambda clip, i=i: i in chosen)
            engine.poll()
        return self._placed

    def losses(self) -> Dict[str, int]:
        """What its engines lost, summed (see :meth:`ClipEngine.losses`)."""
        out = Counter()
        for engine in self.engines:
            out.update(engine.losses())  # zeros kept
        return dict(out)

    def close(self):
        """Closes the engines; clips never settled are dropped."""
        try:
            for engine in self.engines:
                engine.close()
                engine.encoder.release(lambda clip: False)
        finally:
            self.env.close()


def _on_host(reward, terminated, truncated, info):
    """The step's per-env values (and ``info["success"]``) as numpy arrays, in one copy from
    wherever they are (on a device: the step's one read back, for every engine; each engine
    reads its entry of an array far cheaper than of a tensor)."""
    success = info.get("success") if info else None
    values = [reward, terminated, truncated] + ([] if success is None else [success])
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    # one [rows, num_envs] tensor, one copy: bools become 0/1, rewards keep their values
    host = torch.stack([torch.as_tensor(v, device=device).double() for v in values]).cpu().numpy()
    info = info if success is None else {**info, "success": host[3] != 0}
    return host[0], host[1] != 0, host[2] != 0, info
