"""The PPO algorithm: it acts, stores the transitions of its rollout, computes returns, and
updates with the clipped objective over minibatches and epochs (target-KL early stop per epoch)."""

from __future__ import annotations

from typing import Dict, Optional

import gymnasium as gym
import torch
from torch import nn

from rlrec.config import PPOConfig
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.ppo.storage import RolloutStorage


class PPO:
    """Owns the model, the optional observation normaliser, the optimizer and the rollout storage;
    knows nothing of envs. The runner's collection loop is ``act`` -> env step ->
    ``process_env_step``, then ``compute_returns`` and ``update``."""

    def __init__(
        self, cfg: PPOConfig, obs_space: gym.Space, action_space: gym.Space, device: torch.device
    ):
        self.cfg = cfg
        self.device = device
        self.obs_shape, self.action_space = tuple(obs_space.shape), action_space
        self.agent = ActorCritic(
            obs_space, action_space, list(cfg.hidden_sizes), cfg.activation, cfg.init_log_std
        ).to(device)
        self.obs_norm = ObsNormalizer(tuple(obs_space.shape)).to(device) if cfg.norm_obs else None
        # torch's fused Adam: one kernel for all parameters instead of ~10 ops per parameter
        # tensor, the larger part of an update step for the small MLPs of PPO
        fused = device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.Adam(
            self.agent.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=fused or None
        )
        self.clip_coef = cfg.clip_coef
        self.storage: Optional[RolloutStorage] = None
        self._transition: Optional[tuple] = None  # (obs, action, logprob, value) of the last act()

    def init_storage(self, num_envs: int) -> RolloutStorage:
        """Preallocates the ``[num_steps, num_envs]`` rollout tensors on the device."""
        self.storage = RolloutStorage(
            self.cfg.num_steps,
            num_envs,
            tuple(self.obs_shape),
            tuple(self.agent.action_shape),
            action_dtype(self.action_space),
            self.device,
        )
        return self.storage

    # ------------------------------------------------------------------ acting
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Collection: normalises ``obs`` (updating the statistics), samples an action and keeps
        what the transition needs until :meth:`process_env_step`."""
        nobs = self.normalize(obs, update=True)
        action, logprob, value = self.agent.act(nobs)
        self._transition = (nobs, action, logprob, value)
        return action

    def process_env_step(
        self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, info: dict
    ) -> None:
        """Stores the transition of the last :meth:`act`: the reward scaled, and an episode cut by
        the time limit bootstrapped from its real final observation (``info["final_obs"]``)."""
        reward = reward.float() * self.cfg.reward_scale
        if "_final" in info:
            reward = self.bootstrap_truncated(reward, terminated, truncated, info["final_obs"])
        obs, action, logprob, value = self._transition  # type: ignore[misc]
        self.storage.add(obs, action, logprob, value, reward, (terminated | truncated).float())  # type: ignore[union-attr]

    def compute_returns(self, last_obs: torch.Tensor) -> None:
        """GAE over the filled storage, bootstrapped from the value of the observation after it."""
        last_value = self.agent.value(self.normalize(last_obs))
        self.storage.compute_gae(last_value, self.cfg.gamma, self.cfg.gae_lambda)  # type: ignore[union-attr]

    def act_inference(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Evaluation: the action for raw observations (statistics untouched, no critic pass)."""
        return self.agent.action(self.normalize(obs), deterministic=deterministic)

    def normalize(self, obs: torch.Tensor, update: bool = False) -> torch.Tensor:
        obs = obs.float()
        if self.obs_norm is None:
            return obs
        if update:
            self.obs_norm.update(obs)
        return self.obs_norm(obs)

    def set_schedule(self, frac_remaining: float) -> float:
        """Anneals the learning rate (and, with ``anneal_clip``, the clip range) linearly to 0
        over training; returns the learning rate."""
        lr = self.cfg.learning_rate * (frac_remaining if self.cfg.anneal_lr else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.clip_coef = self.cfg.clip_coef * (frac_remaining if self.cfg.anneal_clip else 1.0)
        return lr

    def bootstrap_truncated(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        final_obs: torch.Tensor,
    ) -> torch.Tensor:
        """``reward + gamma * V(final_obs)`` where an episode was cut by the time limit (not where
        it terminated): the return it would have had continues past the cut, so GAE can treat
        every episode end as terminal."""
        cut = (truncated & ~terminated).float()
        return reward + self.cfg.gamma * self.agent.value(self.normalize(final_obs)) * cut

    # ------------------------------------------------------------------ learning
    def update(self, storage: Optional[RolloutStorage] = None) -> Dict[str, float]:
        """Runs the PPO epochs on a filled storage (its own by default); returns mean losses and
        diagnostics. With ``target_kl``, the epochs stop once the last minibatch's approximate KL
        exceeds it: checked once per epoch, as CleanRL and ManiSkill's baseline do, so the device is
        synchronised at most once per epoch, never per minibatch."""
        storage = self.storage if storage is None else storage
        assert storage is not None, "init_storage() first, or pass a storage"
        cfg, clip = self.cfg, self.clip_coef
        names = ("loss/policy", "loss/value", "loss/entropy", "loss/approx_kl", "loss/clipfrac")
        totals = torch.zeros(
            len(names), device=self.device
        )  # summed on the device: no sync per step
        n_updates = 0
        for _epoch in range(cfg.update_epochs):
            for mb in storage.minibatches(cfg.num_minibatches):
                logprob, entropy, value = self.agent.evaluate(mb["obs"], mb["actions"])
                logratio = logprob - mb["logprobs"]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
                adv = mb["advantages"]
                if cfg.norm_adv and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                if cfg.clip_vloss:
                    v_clipped = mb["values"] + (value - mb["values"]).clamp(-clip, clip)
                    v_loss = (
                        0.5
                        * torch.max(
                            (value - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2
                        ).mean()
                    )
                else:
                    v_loss = 0.5 * ((value - mb["returns"]) ** 2).mean()
                ent = entropy.mean()
                loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                n_updates += 1
                with torch.no_grad():
                    totals += torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac])
            if cfg.target_kl is not None and float(approx_kl) > cfg.target_kl:
                break
        out = dict(zip(names, (totals / max(1, n_updates)).tolist()))
        y, pred = storage.returns.flatten(), storage.values.flatten()
        var_y = y.var()
        out["loss/explained_variance"] = (
            float("nan") if var_y == 0 else float(1 - (y - pred).var() / var_y)
        )
        out["loss/updates"] = float(n_updates)
        if not self.agent.discrete:
            out["policy/std"] = float(self.agent.log_std.detach().exp().mean())
        storage.clear()
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_norm": None if self.obs_norm is None else self.obs_norm.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.obs_norm is not None and state.get("obs_norm") is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])


def action_dtype(space: gym.Space) -> torch.dtype:
    """Storage dtype of actions from ``space``."""
    return torch.long if isinstance(space, gym.spaces.Discrete) else torch.float32
