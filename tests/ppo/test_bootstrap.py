"""``algo.bootstrap_at``: which episode ends PPO bootstraps from ``V(final_obs)``.

ManiSkill's tasks terminate on success under a normalised dense reward that pays nearly as much
beside the goal as at it. Bootstrapping only time-outs (``truncated``) then values a success at
its reward alone (1.0), while lingering beside the goal is worth ``0.6 / (1 - 0.8) = 3.0`` at
gamma 0.8: PPO learns to avoid success. ManiSkill's PPO baselines bootstrap every done row from
its final observation (``done``), and success becomes worth more than lingering.

``GoalLine`` is that situation in its smallest form: a walk on the positions 0..4 of a line, the
goal at 4, dense reward ``0.2 * position`` (0.6 beside the goal), 1.0 and termination on reaching
the goal, truncation after 20 steps. Both rules train here from the same seed in a few seconds.
"""

from __future__ import annotations

from typing import Optional, Tuple

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.base import EnvAdapter, EpisodeClock, as_env_index
from rlrec.ppo.config import BootstrapAt
from rlrec.ppo.ppo import PPO
from tests.hostsync import HostReads
from tests.ppo import make_ppo, rollout


@pytest.fixture(autouse=True)
def one_thread():
    """A 32x32 MLP trains fastest on one thread (and does not fight other processes for cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class GoalLine(EnvAdapter):
    """Positions 0..GOAL on a line; actions 0: left, 1: stay, 2: right. Observation: position /
    GOAL. Reward: ``NEAR * position`` after a step that stays short of the goal, ``SUCCESS`` on
    reaching it, which terminates the episode (``info["success"]``)."""

    GOAL = 4
    NEAR = 0.2  # 0.6 per step beside the goal: worth 0.6 / (1 - 0.8) = 3.0 at gamma 0.8
    SUCCESS = 1.0

    def __init__(self, num_envs: int, max_episode_steps: Optional[int] = 20, seed: int = 0):
        self.num_envs, self.device, self.dt = num_envs, torch.device("cpu"), 1.0
        self.max_episode_steps = max_episode_steps
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self._gen = torch.Generator().manual_seed(seed)
        self.pos = torch.zeros(num_envs, dtype=torch.long)
        self.clock = EpisodeClock(num_envs, self.device)

    def _obs(self) -> torch.Tensor:
        return (self.pos.float() / self.GOAL)[:, None]

    def reset(self, seed=None, env_idx=None):
        if seed is not None:
            self._gen.manual_seed(int(seed))
        idx = as_env_index(env_idx, self.num_envs, self.device)
        self.pos[idx] = torch.randint(0, self.GOAL, (idx.numel(),), generator=self._gen)
        self.clock.reset(idx)
        return self._obs(), {"success": torch.zeros(self.num_envs, dtype=torch.bool)}

    def step(self, action: torch.Tensor):
        self.pos.copy_((self.pos + action.long().flatten() - 1).clamp(0, self.GOAL))
        success = self.pos == self.GOAL
        reward = torch.where(success, self.SUCCESS, self.NEAR * self.pos.float())
        truncated = self.clock.step(success, self.max_episode_steps)
        return self._obs(), reward, success.clone(), truncated, {"success": success}

    def render(self, env_idx):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        return torch.zeros(idx.numel(), 1, 1, 3, dtype=torch.uint8)


def train(bootstrap_at: BootstrapAt, iterations: int = 25, seed: int = 0) -> PPO:
    torch.manual_seed(seed)
    env = AutoReset(GoalLine(16, seed=seed))
    cfg = dict(num_steps=16, learning_rate=3e-3, gamma=0.8, gae_lambda=0.9, target_kl=None)
    ppo = make_ppo(env, **cfg, norm_obs=False, hidden_sizes=[32, 32], bootstrap_at=bootstrap_at)
    obs = None
    for _ in range(iterations):
        obs = rollout(ppo, env, obs)
        ppo.update()
    return ppo


@torch.inference_mode()
def evaluate(ppo: PPO, num_envs: int = 64, seed: int = 123) -> Tuple[float, float]:
    """Deterministic policy, one episode per env from random starts (as rlrec's evaluation):
    the fraction of episodes that reached the goal, and the fraction that ended beside it."""
    env = GoalLine(num_envs, max_episode_steps=20, seed=seed)
    obs, _ = env.reset(seed=seed)
    reached = torch.zeros(num_envs, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        obs, _, terminated, _, _ = env.step(ppo.act_inference(obs, deterministic=True))
        reached |= terminated
        env.pos[reached] = GoalLine.GOAL  # a finished episode stays at its end
    beside = ~reached & (env.pos == GoalLine.GOAL - 1)
    return float(reached.float().mean()), float(beside.float().mean())


def test_bootstrapping_only_time_outs_learns_to_avoid_success_and_done_reaches_it():
    """The old rule (``truncated``) learns to stop beside the goal; ManiSkill's rule (``done``)
    learns to reach it. Same seed, same settings, a few seconds each."""
    success, beside = evaluate(train(BootstrapAt.truncated))
    # it learned the dense reward (it walks up to the goal) and to stop short of success
    assert success <= 0.1, f"bootstrap_at=truncated reached the goal in {success:.0%} of episodes"
    assert beside >= 0.9, f"bootstrap_at=truncated ended beside the goal in only {beside:.0%}"
    success, _ = evaluate(train(BootstrapAt.done))
    assert success >= 0.9, f"bootstrap_at=done reached the goal in only {success:.0%} of episodes"


@pytest.mark.parametrize("rule", list(BootstrapAt))
def test_the_ended_rows_alone_are_bootstrapped_as_the_rule_says_without_a_host_sync(rule):
    """Envs 0 and 1 reach the goal (terminated), env 2 hits its time limit (truncated), the others
    go on: ``truncated`` bootstraps env 2 alone, ``done`` all three, from V(final_obs) of the ended
    rows alone (AutoReset's host index: the critic sees 3 rows of 6), and the step reads nothing
    back from the device (a GPU would wait for none)."""
    env = AutoReset(GoalLine(6, max_episode_steps=20))
    torch.manual_seed(0)
    ppo = make_ppo(env, gamma=0.8, bootstrap_at=rule)
    ppo.init_storage(6)
    rows = []
    ppo.agent.critic.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    with torch.inference_mode():
        obs, _ = env.reset(seed=0)
        env.env.pos.copy_(torch.tensor([3, 3, 0, 0, 0, 0]))
        env.env.clock.elapsed[2] = 19
        ppo.act(obs)
        rows.clear()
        step = env.step(torch.tensor([2, 2, 1, 1, 1, 1]))
        _, reward, term, trunc, info = step
        assert term.tolist() == [True, True, False, False, False, False] and trunc.tolist()[2]
        with HostReads() as reads:
            ppo.process_env_step(*step[1:])
        assert rows == [3] and reads.count == 0, reads.where
        value = ppo.agent.value(ppo.normalize(info["final_obs"]))
    ends = (term | trunc) if rule == BootstrapAt.done else trunc
    torch.testing.assert_close(ppo.storage.rewards[0], reward + 0.8 * value * ends.float())
