"""Divergence: a run stops at the first non-finite value, before anything is written from it.

After every update, once (one read back to the host, and with several ranks one all-reduce, so
that every rank stops at the same iteration), :class:`Watch` checks that

- the env gave finite observations and rewards during the rollout (each step's values are summed
  per env in float64 into ``[num_steps, num_envs]`` tensors on the device, two kernels a step,
  read with the rest: no host sync per step);
- the update's losses and its gradient norm (what ``PPO.update`` returns) are finite;
- the parameters (and the observation normaliser's statistics) are finite.

On the first non-finite one it raises :class:`Diverged`, whose message is one line: the
iteration, the global step, what went non-finite (the env, its index and whether it was the
observation or the reward, when the env is the source), the checkpoint to continue from and how to
continue from it with other settings. The runner writes no checkpoint, no metrics line and no
evaluation of that state; the process exits with :data:`EXIT_STATUS`.

A blow-up is usually under way before anything is non-finite: an update that moves the policy by
nats (its ``loss/approx_kl``; a healthy PPO update moves it by about 0.01), or whose KL, value
loss, gradient norm or policy std is far outside the run's own recent range (:data:`SPIKE`),
begins one. From then on the checkpoint before it is the one the line names, and
``checkpoint_keep`` does not remove it: every checkpoint written since holds finite but ruined
values, and says so itself (its ``blowup`` entry, :attr:`Watch.under_way`), so that ``resume=auto``
passes over it (to the newest one from before, or refuses saying why) and ``checkpoint=`` of it
trains nothing. A run whose figures come back into range for :data:`SETTLED` updates survived the
spike and goes on as before.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from rlrec import distributed
from rlrec.obs import RGB, STATE

log = logging.getLogger(__name__)

EXIT_STATUS = 3  # docs/runs.md, "Exit statuses"

# an update's figure begins a blow-up above this many times the largest of its last WINDOW
# values (asked once HISTORY of them are known); the KL also above KL_LIMIT nats, from the first
SPIKE = {"loss/approx_kl": 100.0, "policy/std": 100.0, "loss/value": 1e3, "train/grad_norm": 1e3}
KL_LIMIT = 1.0
WINDOW, HISTORY, SETTLED = 20, 3, 3

_NONE = "no checkpoint was written before it"

# what PPO.update returns that must be finite (loss/explained_variance is NaN for constant
# returns, legitimately)
CHECKED = ("loss/policy", "loss/value", "loss/entropy", "loss/approx_kl", "train/grad_norm")


class Diverged(RuntimeError):
    """The run met a non-finite value; the message is the one line the run ends with."""


class Watch:
    """The finite check of one rank's run (see the module docstring). The runner wraps each
    rollout in :meth:`rollout`, calls :meth:`step` after each env step and :meth:`check` after each
    update. ``last()``: the last checkpoint written or started from with no blow-up under way
    (``ResumePoint.last``: its path, its step, whether ``resume=auto`` in the run dir finds it,
    and the file of it that the next checkpoint does not write again), or None."""

    def __init__(self, num_steps: int, num_envs: int, device, run_dir: Path, last=lambda: None):
        self.num_envs, self.run_dir, self.last = num_envs, Path(run_dir), last
        self.rank, self.world = distributed.rank(), distributed.world_size()
        # per env, in float64 (no finite float32 values overflow it), so each is non-finite
        # exactly when a value summed into it was. Row 0: the observation a rollout starts from;
        # row t + 1: the observation step t returned (plus, where an episode ended, its final one)
        f64 = torch.float64
        self._obs = torch.zeros(num_steps + 1, num_envs, dtype=f64, device=device)
        self._reward = torch.zeros(num_steps, num_envs, dtype=f64, device=device)
        self._obs_rows, self._reward_rows = self._obs.unbind(0), self._reward.unbind(0)
        self._t = 0
        self._recent = {k: deque(maxlen=WINDOW) for k in SPIKE}
        # the blow-up under way: where it began, what, and the checkpoint before it (file, step)
        self.blowup = None
        self._settled = 0  # updates in range since the blow-up's last spike

    # ------------------------------------------------------------------ collection
    def step(self, obs, reward: torch.Tensor, info: dict) -> None:
        """After env step ``t`` of the rollout: its observation, its reward and, where an
        episode ended, the final observation (AutoReset's ``final_obs``: the other envs' rows are
        their returned observations). Two kernels, four on a step where an episode ended, and
        no host read."""
        self._t += 1
        row = _sum_rows(obs, self._obs_rows[self._t])  # (the row itself, summed into)
        self._reward_rows[self._t - 1].copy_(reward)
        final = _sum_rows(info["final_obs"]) if "final_obs" in info else None
        if final is not None:
            row += final

    # ------------------------------------------------------------------ checks
    def check(self, losses: Dict[str, float], tensors: List[Tuple[str, torch.Tensor]], at: str):
        """After an update: raises :class:`Diverged` (on every rank) when the rollout's env
        values, ``losses`` or the named ``tensors`` (parameters, statistics) hold a non-finite
        value. ``at``: "iteration I (step S)". One host read; with several ranks one
        all-reduce."""
        bad_losses = [k for k in CHECKED if k in losses and not math.isfinite(losses[k])]
        bad = [
            ~torch.isfinite(t).all() for t in (self._obs, self._reward, *(t for _, t in tensors))
        ]
        lost = torch.tensor(bool(bad_losses), device=self._obs.device)
        flags = torch.stack([bad[0], bad[1], torch.stack(bad[2:]).any(), lost]).long()
        if self.world > 1:  # any rank's non-finite value stops every rank, here
            distributed.all_reduce_(flags, "max")
        env_obs, env_reward, params, n_losses = flags.tolist()  # the one host read
        if env_obs or env_reward:
            what = self._env_source(agree=True)
        elif n_losses:
            what = "non-finite " + (", ".join(bad_losses) or "losses on another rank")
        elif params:
            names = [name for name, t in tensors if not bool(torch.isfinite(t).all())]
            what = f"non-finite parameters ({', '.join(names[:4])}{', ...' * (len(names) > 4)})"
        else:
            return self._spikes(losses, at)
        raise Diverged(self._message(at, what))

    @contextmanager
    def rollout(self, obs, at: str) -> Iterator[None]:
        """A rollout from ``obs``, whose env steps :meth:`step` follows. One that raises (a policy
        fed non-finite observations may, e.g. a categorical head's sampling) raises the
        :class:`Diverged` naming the env instead, when its values went non-finite first: this
        rank's own values only (the others may not be there to ask). Not where that look itself
        fails: after a sticky CUDA error (a device-side assert, an illegal address) every later
        CUDA call raises again, and the original error is the one to see. ``at``: "iteration I
        (step S)"."""
        self._t = 0
        _sum_rows(obs, self._obs[0])
        try:
            yield
        except Exception as exc:
            try:
                went_bad = not bool(
                    torch.isfinite(self._obs).all() & torch.isfinite(self._reward).all()
                )
            except Exception:  # the device is unusable: the original error stands
                went_bad = False
            if went_bad:
                raise Diverged(self._message(at, self._env_source(agree=False))) from exc
            raise

    def _spikes(self, losses, at):
        """Whether this finite update begins (or continues) a blow-up; see the module docstring."""
        values = {k: losses[k] for k in SPIKE if losses.get(k) is not None}
        out = []
        for k, v in values.items():
            recent = self._recent[k]
            limit = SPIKE[k] * max(recent) if len(recent) >= HISTORY else math.inf
            if k == "loss/approx_kl":  # KL_LIMIT from the first update on, whatever the history
                limit = KL_LIMIT if limit == math.inf else max(KL_LIMIT, limit)
            if v > limit:
                out.append(
                    f"{k} {v:.3g}" + (f" (up to {max(recent):.3g} before)" if recent else "")
                )
        if out:
            self._settled = 0
            if self.blowup is None:
                saved = self.last()
                kept = None if saved is None else (saved[3], saved[1])
                self.blowup = (at, ", ".join(out), kept)
                named = f"{kept[0]}, the checkpoint before it, is kept" if kept else _NONE
                log.warning(
                    f"rlrec: {at}: {self.blowup[1]}, far outside the run's recent range: a "
                    f"blow-up may be under way ({named} until the run is back in range for "
                    f"{SETTLED} updates)"
                )
            return
        for k, v in values.items():
            self._recent[k].append(v)
        self._settled += 1
        if self.blowup is not None and self._settled >= SETTLED:
            log.warning("rlrec: the run came back into range after the spike at %s", self.blowup[0])
            self.blowup = None

    @property
    def under_way(self) -> Optional[str]:
        """The blow-up under way, "iteration I (step S) with WHAT", which every checkpoint written
        during it holds (``rlrec.train.checkpoint.blowup``); None."""
        return None if self.blowup is None else f"{self.blowup[0]} with {self.blowup[1]}"

    @property
    def protected(self) -> Optional[str]:
        """The file name (in checkpoints/) of the checkpoint before the blow-up under way, which
        ``checkpoint_keep`` must not remove; None when none is under way."""
        kept = self.blowup and self.blowup[2]
        return Path(kept[0]).name if kept else None

    # ------------------------------------------------------------------ the message
    def _env_source(self, agree):
        """The first non-finite env value of the rollout (the earliest step, then the lowest
        env index, over every rank), named as coming from the env."""
        n = self.num_envs
        # one key per (row, rank, env, kind), in the order of time: the smallest bad one wins
        span = self._obs.shape[0] * self.world * n * 2
        key = torch.full((), span, dtype=torch.long, device=self._obs.device)
        for kind, sums in enumerate((self._obs, self._reward)):  # reward t: the row t + 1
            bad = (~torch.isfinite(sums)).nonzero()
            if len(bad):
                keys = (((bad[:, 0] + kind) * self.world + self.rank) * n + bad[:, 1]) * 2 + kind
                key = torch.minimum(key, keys.min())
        if self.world > 1 and agree:
            key = span - distributed.all_reduce_(span - key, "max")
        k, kind = divmod(int(key), 2)
        (row, rank), env = divmod(k // n, self.world), k % n
        which = f"env {rank * n + env}" + (f" (rank {rank}'s env {env})" if self.world > 1 else "")
        when = "at the rollout's start" if row == 0 else f"at step {row} of the rollout"
        value = "reward" if kind else "observation"
        return f"{which} returned a non-finite {value} {when} (the env is the source)"

    def _message(self, at, what):
        other = "with other settings (a lower algo.learning_rate or algo.max_grad_norm, say)"
        if "the env is the source" in what:
            other = "once the env gives finite values (or with other settings)"
        saved, began, none = self.last(), "", _NONE
        kept = None if self.blowup is None else self.blowup[2]
        if self.blowup is not None:
            began = f"the blow-up began at {self.under_way}; "
            # last.pt, when it was the one before the blow-up, is written again by each checkpoint
            if kept and saved is None:
                kept, none = None, "the checkpoint before it (last.pt) was written over since"
        if kept is not None:  # the checkpoints since are finite but ruined: a new run dir
            path, step = kept
            last = (
                f"the checkpoint before it is {path} (step {step}); to continue from it "
                f"{other}: the same command + resume=null checkpoint={path} "
                f"hydra.run.dir={self.run_dir}-from-step{step}"
            )
        elif saved is None or self.blowup is not None:
            last = f"{none}; to start again {other}: the same command"
        else:
            path, step, in_run_dir, _ = saved
            how = (
                f"resume=auto hydra.run.dir={self.run_dir}" if in_run_dir else f"checkpoint={path}"
            )
            last = (
                f"last finite checkpoint {path} (step {step}); to continue from it {other}: the "
                f"same command + {how}"
            )
        head = f"rlrec: diverged at {at}: {what}; nothing was written from that state"
        return f"{head} | {began}{last}"


def _sum_rows(x, out=None):
    """Per env (row), the float64 sum of its values: non-finite exactly where one of them is.
    Integer observations (images) are always finite: nothing is summed (``out`` stays 0); of a
    pixel observation (rlrec/obs.py) its state part."""
    x = x.get(STATE, x[RGB]) if isinstance(x, dict) else x
    if not x.is_floating_point():
        return out
    return torch.sum(x.reshape(x.shape[0], -1), dim=1, dtype=torch.float64, out=out)


def state_tensors(ppo) -> List[Tuple[str, torch.Tensor]]:
    """What an update leaves that must stay finite: the parameters and the observation
    normaliser's statistics, by name."""
    named = [(name, p.detach()) for name, p in ppo.agent.named_parameters()]
    if ppo.obs_norm is not None:
        named += [(f"obs_norm.{n}", b) for n, b in ppo.obs_norm.named_buffers()]
    return named
