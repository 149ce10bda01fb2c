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

Every evaluation writes one line per episode to ``eval_episodes.jsonl`` in the run dir: the step,
the env, the seed its reset used, return, length, success, how it ended, its clip and the frames
of that clip that show it. The lines of an evaluation are appended together once its clips are on
disk (or known lost), before any checkpoint that covers the step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from rlrec.config import EvalEnvConfig
from rlrec.envs.config import EnvConfig, SimConfig
from rlrec.layout import RunDir
from rlrec.record import ClipInfo
from rlrec.record.wrappers.episodes import ClipChoice, env_seed
from rlrec.train.logger import Held
from rlrec.train.stack import make_env_stack

Policy = Callable[[torch.Tensor], torch.Tensor]  # raw observations -> actions


class Evaluator:
    """Composes the eval env stack (``rlrec.train.stack.make_env_stack``: ``cfg.recorder``'s clip
    of each evaluation, and with ``cfg.clips`` per-episode clips kept by one
    :class:`~rlrec.record.wrappers.episodes.ClipChoice`), resets it, runs the policy, returns
    the eval figures, and writes the episodes' records to ``run_dir/eval_episodes.jsonl`` (no
    file when ``run_dir`` is None). ``on_clip``: called with each evaluation clip on disk (the
    runner logs it); ``video_dir``: where clips go; ``device``: the eval env's."""

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
        self.cfg = cfg
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._on_clip = on_clip
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

    @torch.inference_mode()
    def run(
        self,
        policy: Policy,
        tag: int,
        stop: Callable[[], bool] = lambda: False,
        iteration: int = 0,
        on_step: Callable[[tuple], None] = lambda out: None,
    ) -> Dict[str, float]:
        """One evaluation. ``tag`` (the training step) goes onto its clip; ``stop()`` cuts it short
        (an evaluation cut short still gets its clip, but no per-episode clip; its figures are of
        fewer episodes, so the runner logs none, no episode line is written, and a resumed run
        redoes it). Empty when no episode finished. ``on_step``: given each step's outcome."""
        cfg, env = self.cfg, self.env
        n = env.num_envs
        target = cfg.episodes or n
        started = 0
        if self.recorder is not None:
            self.recorder.engine.tag = tag
            started = self.recorder.engine.clips_started
        if self.clips is not None:
            self.clips.tag = tag
        obs, _ = env.reset(seed=cfg.seed)
        first_done = torch.zeros(n, dtype=torch.bool, device=env.device)
        success_once = torch.zeros(n, dtype=torch.bool, device=env.device)
        # per step that ended counted episodes: [6, k] rows env, first episode?, return, length,
        # success, terminated
        parts: List[torch.Tensor] = []
        has_success = False
        count = 0
        limit = (env.max_episode_steps or 10_000) * (math.ceil(target / n) + 1)
        for _ in range(limit):
            obs, _, terminated, _, info = out = env.step(policy(obs))
            on_step(out)
            if "success" in info:
                has_success = True
                success_once |= info["success"].to(torch.bool)
            if "_final" in info:
                done = info["_final"]
                take = done & ~first_done if cfg.episodes is None else done
                idx = take.nonzero().flatten()[: target - count]
                ret, length = info["episode"]["return"][idx], info["episode"]["length"][idx]
                cols = (idx, ~first_done[idx], ret, length, success_once[idx], terminated[idx])
                parts.append(torch.stack([c.to(torch.float64) for c in cols]))
                count += idx.numel()
                first_done |= done
                success_once &= ~done
            if count >= target or stop():
                break
        cut = stop()
        if self.recorder is not None:
            # the clip is encoded while training goes on and reported through on_clip once on disk
            self.recorder.end_clip()
            self.recorded = self.recorder.engine.clips_started > started
        rows = torch.cat(parts, 1).tolist() if parts else [[]] * 6  # one read-back
        # the per-episode clips: of the first episodes it counted (success, return), by env
        counted = {
            int(r[0]): (bool(r[4]) if has_success else None, r[2]) for r in zip(*rows) if r[1]
        }
        placed = {} if self.clips is None else self.clips.settle({} if cut else counted)
        if count == 0:
            return {}
        out = {"eval/return": sum(rows[2]) / count, "eval/length": sum(rows[3]) / count}
        out["eval/episodes"] = count
        if has_success:
            out["eval/success"] = sum(rows[4]) / count
        if not cut:
            self._records(tag, iteration, rows, has_success, placed)
        return out

    # ------------------------------------------------------------------ episode records
    def _records(self, step, iteration, rows: List[List[float]], has_success, placed) -> None:
        """The evaluation's records, each first episode's naming its own clip where one was
        placed; written now, or once the evaluation's clip is on disk."""
        records: List[Dict[str, Any]] = []
        for k, (env, first, ret, length, success, term) in enumerate(zip(*rows)):
            env, first = int(env), bool(first)
            # began at the full reset (the env's own seed); later ones began at an autoreset
            seed = env_seed(self.env, self.cfg.seed, env) if first else None
            clip = placed.get(env) if first else None
            records.append(
                {
                    "step": int(step),
                    "iteration": int(iteration),
                    "env": env,
                    "episode": k,
                    "seed": seed,
                    "return": ret,
                    "length": int(length),
                    "success": bool(success) if has_success else None,
                    "ended": "terminated" if term else "truncated",
                    "clip": None if clip is None else self._rel(clip.path),
                    "frames": None if clip is None else [0, clip.num_frames - 1],
                    "_first": first,
                }
            )
        if not self.recorded:
            self._write(records)
        else:  # written once its clip is reported (or lost)
            self._held.hold(int(step), records)

    def clip_saved(self, clip: ClipInfo) -> None:
        """The evaluation clip of step ``clip.tag`` is on disk: the caller's ``on_clip``, then its
        records name it, and go out."""
        if self._on_clip is not None:
            self._on_clip(clip)
        if clip.tag is not None:
            self._held.clip(int(clip.tag), clip)

    def _name_clip(self, records: List[Dict[str, Any]], clip: Optional[ClipInfo]) -> None:
        """Names the evaluation clip in the records of the episodes it shows."""
        if clip is None or self.recorder is None:  # lost: the records name none
            return
        env_idx = list(self.recorder.engine.env_idx)
        spf = self.recorder.engine.steps_per_frame
        last = clip.num_frames - 1
        for r in records:
            if r["_first"] and r["env"] in env_idx and r["clip"] is None:
                r["clip"] = self._rel(clip.path)
                # the clip ends with env_idx[0]'s episode; another tile's episode shows until
                # its terminal step's frame (or the clip's end)
                end = last if r["env"] == env_idx[0] else min(last, r["length"] // spf)
                r["frames"] = [0, end]

    def close(self) -> None:
        """Writes the records still waiting for their clips, naming none (the clip was lost): the
        runner closes it after the eval env's recorder, when no clip comes any more."""
        self._held.lost()

    def _rel(self, path: str) -> str:
        return path if self.run_dir is None else os.path.relpath(path, self.run_dir)

    def _write(self, records: List[Dict[str, Any]]) -> None:
        if self.run_dir is None or not records:
            return
        text = "".join(
            json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n"
            for r in records
        )
        # one write in append mode: the evaluation's lines go out together
        path = RunDir(self.run_dir).eval_episodes
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
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
