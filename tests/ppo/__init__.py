"""Helpers of the PPO tests."""

import torch

from rlrec.envs.builtin import PointReach
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO

CPU = torch.device("cpu")


def make_ppo(env=None, **cfg) -> PPO:
    """PPO with ``PPOConfig(**cfg)`` on the CPU, for the spaces of ``env`` (default: the
    built-in env's)."""
    env = PointReach(4) if env is None else env
    return PPO(PPOConfig(**cfg), env.single_observation_space, env.single_action_space, CPU)


def rollout(ppo: PPO, env, obs=None):
    """One rollout of ``algo.num_steps`` steps on ``env`` (an AutoReset stack) into ``ppo``'s
    storage (made first if need be), as the runner collects, then its returns; from ``obs`` (None:
    a reset with seed 0). Returns the next observation."""
    if ppo.storage is None:
        ppo.init_storage(env.num_envs)
    with ppo.rollout_mode():
        if obs is None:
            obs, _ = env.reset(seed=0)
        for _ in range(ppo.cfg.num_steps):
            obs, reward, terminated, truncated, info = env.step(ppo.act(obs))
            ppo.process_env_step(reward, terminated, truncated, info)
        ppo.compute_returns(obs)
    return obs
