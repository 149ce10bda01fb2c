"""The eval loop: a full reset of the eval env with its own seed, then deterministic actions until
every eval env finished an episode (or ``eval_env.episodes`` episodes in all).

Success is "succeeded at any step of the episode". The eval env's recorder (trigger ``eval`` by
default) records the first episode after the full reset: one clip per evaluation, named and tagged
by the training step it evaluates (``eval-step{step:09d}.mp4``), so the clip is logged at that
step even though it finishes encoding while training goes on. With ``eval_env.clips`` the first
episode of every eval env is also recorded as its own clip
(``eval-step{step:09d}-env{env:03d}.mp4``), and of the episodes the evaluation counted, those
the rule selects are kept (all, the failed ones, the k worst or best by return):
:mod:`rlrec.record.wrappers.episodes` owns them.

:func:`run_episodes` is the loop alone (a full seeded reset, the episodes counted, a callback per
step), for any caller that runs eval episodes as an evaluation does.

Every evaluation writes one line per episode to ``eval_episodes.jsonl`` in the run dir: the step,
the env, the seed its reset used, return, length, success, how it ended, its clip and the frames
of that clip that show it. The lines of an evaluation are appended together once its clips are on
disk (or known lost), before any checkpoint that covers the step.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, NamedTuple, Optional

import torch

from rlrec.config import EvalEnvConfig
from rlrec.envs.config import EnvConfig, SimConfig
from rlrec.layout import RunDir
from rlrec.record import ClipInfo
from rlrec.record.wrappers.episodes import ClipChoice, env_seed
from rlrec.train.logger import Held
from rlrec.train.stack import make_env_stack

Policy = Callable[[Any], torch.Tensor]  # raw observations -> actions


class Episode(NamedTuple):
    """An episode :func:`run_episodes` counted."""

    env: int
    first: bool  # the env's first since the full reset (its seed is the env's own)
    ret: float
    length: int
    success: Optional[bool]  # at any step; None where the env reports no success
    terminated: bool  # else truncated


@torch.inference_mode()
def run_episodes(env, policy: Policy, seed, episodes=None, stop=lambda: False, on_step=None):
    """Episodes of ``policy`` on ``env`` (an ``AutoReset`` stack) from a full reset with ``seed``
    (env i's episode seeded by :func:`env_seed`; later ones begin at autoresets), until each env
    finished one (``episodes`` None) or ``episodes`` ended in all, or ``stop()``.
    ``on_step(obs, action, result)`` after each step: the observation the action was taken on
    and what ``env.step`` returned. The counted :class:`Episode` list, in the order they ended."""
    n = env.num_envs
    target, out = episodes or n, []
    obs, _ = env.reset(seed=seed)
    first_done = torch.zeros(n, dtype=torch.bool, device=env.device)
    success_once = torch.zeros(n, dtype=torch.bool, device=env.device)
    has_success = False
    for _ in range((env.max_episode_steps or 10_000) * (math.ceil(target / n) + 1)):
        action = policy(obs)
        result = env.step(action)
        if on_step is not None:
            on_step(obs, action, result)
        obs, _, terminated, _, info = result
        if "success" in info:
            has_success = True
            success_once |= info["success"].to(torch.bool)
        if "_final" in info:
            done = info["_final"]
            take = done & ~first_done if episodes is None else done
            idx = take.nonzero().flatten()[: target - len(out)]
            ep = info["episode"]
            cols = (idx, ~first_done[idx], ep["return"][idx], ep["length"][idx])
            cols += (success_once[idx], terminated[idx])
            # one read back per step that ended counted episodes
            for e, f, r, k, s, t in torch.stack([c.double() for c in cols], 1).tolist():
                out.append(
                    Episode(int(e), bool(f), r, int(k), bool(s) if has_success else None, bool(t))
                )
            first_done |= done
            success_once &= ~done
        if len(out) >= target or stop():
            break
    return out


class Evaluator:
    """Composes the eval env stack (``rlrec.train.stack.make_env_stack``: ``cfg.recorder``'s clip
    of each evaluation, and with ``cfg.clips`` per-episode clips kept by one
    :class:`~rlrec.record.wrappers.episodes.ClipChoice`), runs evaluations (:meth:`run`) and
    writes the episodes' records to ``run_dir/eval_episodes.jsonl`` (no file when ``run_dir`` is
    None). ``on_clip``: called with each evaluation clip on disk (the runner logs it);
    ``video_dir``: where clips go (default: the run dir's); ``device``: the eval env's."""

    def __init__(
        self,
        env_cfg: EnvConfig,
        sim: SimConfig,
        cfg: EvalEnvConfig,
        run_dir: Optional[Path] = None,
        *,
        video_dir: Optional[str] = None,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        device: Optional[torch.device] = None,
    ):
        self.cfg, self.run_dir, self._on_clip = cfg, run_dir and Path(run_dir), on_clip
        if video_dir is None and run_dir is not None:
            video_dir = str(RunDir(run_dir).videos("eval"))
        choice = None if cfg.clips == "none" else ClipChoice(cfg.clips, cfg.clips_k)
        stack = make_env_stack(
            env_cfg,
            sim,
            cfg.num_envs,
            cfg.seed,
            cfg.recorder,
            video_dir,
            "eval",
            self.clip_saved,
            device,
            choice,
        )
        self.env, self.recorder, self.clips = stack.env, stack.recorder, stack.clips
        self.recorded = False  # whether the last evaluation started a clip
        # the records of evaluations whose clip is still being encoded
        self._held = Held(self._name_clip, self._write)

    def run(
        self,
        policy: Policy,
        tag: int,
        stop: Callable[[], bool] = lambda: False,
        iteration: int = 0,
        on_step=None,
    ) -> Dict[str, float]:
        """One evaluation: its figures (empty when no episode finished) and ``time/eval``. ``tag``
        (the training step) goes onto its clips; ``stop()`` cuts it short (an evaluation cut
        short still gets its clip, but no per-episode clip; its figures are of fewer episodes,
        so the runner logs none, no episode line is written, and a resumed run redoes it).
        ``on_step``: as :func:`run_episodes` calls it."""
        t0, started = time.perf_counter(), 0
        if self.recorder is not None:
            self.recorder.engine.tag = tag
            started = self.recorder.engine.clips_started
        if self.clips is not None:
            self.clips.tag = tag
        counted = run_episodes(self.env, policy, self.cfg.seed, self.cfg.episodes, stop, on_step)
        cut = stop()
        if self.recorder is not None:
            # the clip is encoded while training goes on and reported through on_clip once on disk
            self.recorder.end_clip()
            self.recorded = self.recorder.engine.clips_started > started
        # the per-episode clips: of the first episodes it counted (success, return), by env
        firsts = {e.env: (e.success, e.ret) for e in counted if e.first}
        placed = {} if self.clips is None else self.clips.settle({} if cut else firsts)
        if not counted:
            return {}
        if not cut:
            self._records(tag, iteration, counted, placed)
        n = len(counted)
        out = {"eval/return": sum(e.ret for e in counted) / n}
        out.update({"eval/length": sum(e.length for e in counted) / n, "eval/episodes": n})
        if counted[0].success is not None:
            out["eval/success"] = sum(e.success for e in counted) / n
        return {**out, "time/eval": time.perf_counter() - t0}

    # ------------------------------------------------------------------ episode records
    def _records(self, step, iteration, counted, placed):
        """The evaluation's records, each first episode's naming its own clip where one was
        placed; written now, or once the evaluation's clip is on disk."""
        records = []
        for k, e in enumerate(counted):
            # a first episode began at the full reset (the env's own seed), a later one at an
            # autoreset
            clip = placed.get(e.env) if e.first else None
            records.append(
                {
                    "step": step,
                    "iteration": iteration,
                    "env": e.env,
                    "episode": k,
                    "seed": env_seed(self.env, self.cfg.seed, e.env) if e.first else None,
                    "return": e.ret,
                    "length": e.length,
                    "success": e.success,
                    "ended": "terminated" if e.terminated else "truncated",
                    "clip": clip and self._rel(clip.path),
                    "frames": clip and [0, clip.num_frames - 1],
                    "_first": e.first,
                }
            )
        if self.recorded:  # written once its clip is reported (or lost)
            self._held.hold(step, records)
        else:
            self._write(records)

    def clip_saved(self, clip: ClipInfo) -> None:
        """The evaluation clip of step ``clip.tag`` is on disk: the caller's ``on_clip``, then its
        records name it, and go out."""
        if self._on_clip is not None:
            self._on_clip(clip)
        if clip.tag is not None:
            self._held.clip(int(clip.tag), clip)

    def _name_clip(self, records, clip):
        """Names the evaluation clip in the records of the episodes it shows."""
        if clip is None or self.recorder is None:  # lost: the records name none
            return
        engine = self.recorder.engine
        last = clip.num_frames - 1
        for r in records:
            if r["_first"] and r["env"] in engine.env_idx and r["clip"] is None:
                r["clip"] = self._rel(clip.path)
                # the clip ends with env_idx[0]'s episode; another tile's episode shows until
                # its terminal step's frame (or the clip's end)
                end = (
                    last if r["env"] == engine.env_idx[0] else r["length"] // engine.steps_per_frame
                )
                r["frames"] = [0, min(last, end)]

    def close(self) -> None:
        """Writes the records still waiting for their clips, naming none (the clip was lost): the
        runner closes it after the eval env's recorder, when no clip comes any more."""
        self._held.lost()

    def _rel(self, path):
        return path if self.run_dir is None else os.path.relpath(path, self.run_dir)

    def _write(self, records):
        if self.run_dir is None or not records:
            return
        lines = [json.dumps({k: v for k, v in r.items() if k[0] != "_"}) + "\n" for r in records]
        # one write in append mode: the evaluation's lines go out together
        fd = os.open(
            RunDir(self.run_dir).eval_episodes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            os.write(fd, "".join(lines).encode())
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ clips
    def flush(self) -> None:
        """Waits (bounded) until the eval clips are on disk, and reports them; then writes the
        episode records whose clip was lost."""
        if self.recorder is not None:
            self.recorder.flush()
        self.close()

    def poll(self) -> None:
        """Reports eval clips that finished encoding since the evaluation (the env is not stepped
        between evaluations, so nothing else would)."""
        if self.recorder is not None and self.recorder.engine.pending:
            self.recorder.poll()
