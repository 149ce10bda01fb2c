"""The eval loop: a full reset of the eval env with its own seed, then deterministic actions until
every eval env finished an episode (or ``eval_env.episodes`` episodes in all).

Success is "succeeded at any step of the episode". The eval env's recorder (trigger ``eval`` by
default) records the first episode after the full reset: one clip per evaluation, tagged with the
env step of the evaluation that recorded it, so the clip is logged at that step even though it
finishes encoding while training goes on.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List

import torch

from rlrec.config import EvalEnvConfig
from rlrec.envs.autoreset import AutoReset
from rlrec.train.stack import recorder_of

Policy = Callable[[torch.Tensor], torch.Tensor]  # raw observations -> actions


class Evaluator:
    """Owns the eval env stack's episodes: resets it, runs the policy, returns the eval figures."""

    def __init__(self, env: AutoReset, cfg: EvalEnvConfig):
        self.env = env
        self.cfg = cfg
        self.recorder = recorder_of(env)
        self.recorded = False  # whether the last evaluation started a clip

    @torch.inference_mode()
    def run(
        self, policy: Policy, tag: int, stop: Callable[[], bool] = lambda: False
    ) -> Dict[str, float]:
        """One evaluation. ``tag`` (the training step) goes onto its clip; ``stop()`` cuts it short
        (an evaluation cut short still gets its clip; its figures are of fewer episodes, so the
        runner logs none and a resumed run redoes it). Empty when no episode finished."""
        cfg, env = self.cfg, self.env
        n = env.num_envs
        target = cfg.episodes or n
        started = 0
        if self.recorder is not None:
            self.recorder.engine.tag = tag
            started = self.recorder.engine.clips_started
        obs, _ = env.reset(seed=cfg.seed)
        first_done = torch.zeros(n, dtype=torch.bool, device=env.device)
        success_once = torch.zeros(n, dtype=torch.bool, device=env.device)
        returns: List[torch.Tensor] = []
        lengths: List[torch.Tensor] = []
        successes: List[torch.Tensor] = []
        has_success = False
        count = 0
        limit = (env.max_episode_steps or 10_000) * (math.ceil(target / n) + 1)
        for _ in range(limit):
            obs, _, _, _, info = env.step(policy(obs))
            if "success" in info:
                has_success = True
                success_once |= info["success"].to(torch.bool)
            if "_final" in info:
                done = info["_final"]
                take = done & ~first_done if cfg.episodes is None else done
                idx = take.nonzero().flatten()[: target - count]
                returns.append(info["episode"]["return"][idx])
                lengths.append(info["episode"]["length"][idx].float())
                successes.append(success_once[idx].float())
                count += idx.numel()
                first_done |= done
                success_once &= ~done
            if count >= target or stop():
                break
        if self.recorder is not None:
            # the clip is encoded while training goes on and reported through on_clip once on disk
            self.recorder.end_clip()
            self.recorded = self.recorder.engine.clips_started > started
        if count == 0:
            return {}
        out = {
            "eval/return": float(torch.cat(returns).mean()),
            "eval/length": float(torch.cat(lengths).mean()),
            "eval/episodes": count,
        }
        if has_success:
            out["eval/success"] = float(torch.cat(successes).mean())
        return out

    def flush(self) -> None:
        """Waits (bounded) until the eval clips are on disk, and reports them."""
        if self.recorder is not None:
            self.recorder.flush()

    def poll(self) -> None:
        """Reports eval clips that finished encoding since the evaluation (the env is not stepped
        between evaluations, so nothing else would)."""
        if self.recorder is not None and self.recorder.engine.pending:
            self.recorder.poll()
