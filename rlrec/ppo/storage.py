"""Preallocated rollout storage and generalised advantage estimation."""

from __future__ import annotations

from operator import itemgetter
from typing import Iterator, Tuple

import torch

from rlrec.obs import RGB, Shape, map_obs

# a minibatch's tensors, in the order PPO._loss_eager takes them
BATCH = ("obs", "actions", "logprobs", "values", "advantages", "returns")


class RolloutStorage:
    """``[num_steps, num_envs, ...]`` tensors on the sim device, filled in place one step at a
    time by :meth:`add` (the algorithm's ``process_env_step``). An image observation is kept as
    uint8 (a quarter of float32's bytes), its state part as float32 (rlrec/obs.py)."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: Shape,
        action_shape: Tuple[int, ...],
        action_dtype: torch.dtype,
        device: torch.device,
    ):
        t, n = num_steps, num_envs
        self.num_steps, self.num_envs = t, n
        if isinstance(obs_shape, dict):
            self.obs = {
                k: torch.zeros(t, n, *v, device=device, dtype=torch.uint8 if k == RGB else None)
                for k, v in obs_shape.items()
            }
        else:
            self.obs = torch.zeros(t, n, *obs_shape, device=device)
        self.actions = torch.zeros(t, n, *action_shape, dtype=action_dtype, device=device)
        zeros = lambda: torch.zeros(t, n, device=device)  # noqa: E731
        # dones: the episode ended at this step (terminated or truncated)
        self.logprobs, self.rewards, self.dones = zeros(), zeros(), zeros()
        self.values, self.advantages, self.returns = zeros(), zeros(), zeros()
        self.step = 0  # the next row add() writes

    def add(self, obs, actions, logprobs, values, rewards, dones) -> None:
        """Writes one env step of every env into the next row."""
        if self.step >= self.num_steps:
            raise IndexError(f"rollout storage is full ({self.num_steps} steps): clear() it first")
        t = self.step
        map_obs(lambda row, x: row[t].copy_(x), self.obs, obs)
        self.actions[t], self.logprobs[t] = actions, logprobs
        self.values[t], self.rewards[t], self.dones[t] = values, rewards, dones
        self.step += 1

    def clear(self) -> None:
        """The next rollout starts at row 0 (after an update, or to drop an interrupted rollout)."""
        self.step = 0

    def compute_gae(self, next_value, gamma: float, lam: float) -> None:
        """GAE(lambda). Every episode end is terminal here: the bootstrapping of the ends that
        ``algo.bootstrap_at`` names is already folded into ``rewards``
        (``PPO.process_env_step``)."""
        last = torch.zeros_like(next_value)
        for t in reversed(range(self.num_steps)):
            nxt = next_value if t == self.num_steps - 1 else self.values[t + 1]
            nonterminal = 1.0 - self.dones[t]
            delta = self.rewards[t] + gamma * nxt * nonterminal - self.values[t]
            last = delta + gamma * lam * nonterminal * last
            self.advantages[t] = last
        self.returns.copy_(self.advantages + self.values)

    def minibatches(self, num_minibatches: int) -> Iterator[dict]:
        """Shuffled minibatches over the flattened ``num_steps * num_envs`` batch: one permutation
        and one gather per field per call (an epoch), each minibatch a view of the gathered
        batch, so a minibatch costs no indexing of its own. Its tensors: :data:`BATCH`."""
        size = self.num_steps * self.num_envs
        flat = {k: map_obs(lambda v: v.reshape(size, *v.shape[2:]), vars(self)[k]) for k in BATCH}
        if num_minibatches == 1:  # the whole batch: its losses are means, order does not matter
            yield flat
            return
        perm = torch.randperm(size, device=self.values.device)
        mb = size // num_minibatches
        idx = perm[: mb * num_minibatches]
        shuffled = {
            k: map_obs(lambda v: v.index_select(0, idx).view(num_minibatches, mb, *v.shape[1:]), v)
            for k, v in flat.items()
        }
        for i in range(num_minibatches):
            yield {k: map_obs(itemgetter(i), v) for k, v in shuffled.items()}
