"""``algo.norm_reward`` and ``algo.clip_reward``: the rewards PPO stores, against a reference
written out with numpy (Gymnasium's NormalizeReward: each reward divided by the running std of
its env's discounted return; here that return restarts at every episode end)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.config import validate
from rlrec.envs.builtin import PointReach
from rlrec.ppo.ppo import PPO
from tests.helpers import make_config
from tests.ppo import make_ppo

GAMMA = 0.9


def _steps(seed: int, n: int, envs: int = 2):
    """``n`` steps of (reward, terminated, truncated) for ``envs`` envs, with episode ends."""
    gen = np.random.default_rng(seed)
    for _ in range(n):
        yield (
            torch.tensor(gen.normal(2.0, 3.0, envs), dtype=torch.float32),
            torch.tensor(gen.random(envs) < 0.15),
            torch.tensor(gen.random(envs) < 0.1),
        )


def _stored(ppo: PPO, steps) -> torch.Tensor:
    """The rewards PPO stores for ``steps`` (one rollout of ``num_steps``)."""
    with torch.inference_mode():
        for reward, term, trunc in steps:
            ppo.act(torch.zeros(2, 6))
            ppo.process_env_step(reward, term, trunc, {})
    rewards = ppo.storage.rewards.clone()
    ppo.storage.clear()
    return rewards


def _ppo(**kw) -> PPO:
    ppo = make_ppo(PointReach(2), num_steps=40, gamma=GAMMA, **kw)
    ppo.init_storage(2)
    return ppo


def test_rewards_are_divided_by_the_running_std_of_the_discounted_return():
    got = _stored(_ppo(norm_reward=True, reward_scale=0.5), _steps(0, 40))
    returns, seen, want = np.zeros(2), [], []
    for reward, term, trunc in _steps(0, 40):
        r = reward.double().numpy() * 0.5
        returns = returns * GAMMA + r
        seen.extend(returns)
        want.append(r / np.sqrt(np.var(seen) + 1e-8))
        returns[(term | trunc).numpy()] = 0.0
    np.testing.assert_allclose(got.numpy(), np.array(want), rtol=1e-4)
    raw = torch.stack([r for r, _, _ in _steps(0, 40)]) * 0.5
    assert not torch.allclose(got, raw)


def test_clip_reward_clips_last_and_alone():
    steps = list(_steps(1, 40))
    raw = torch.stack([r for r, _, _ in steps])
    assert raw.abs().max() > 4.0
    torch.testing.assert_close(_stored(_ppo(), steps), raw)
    torch.testing.assert_close(_stored(_ppo(clip_reward=4.0), steps), raw.clamp(-4.0, 4.0))
    norm = _stored(_ppo(norm_reward=True), steps)
    clipped = _stored(_ppo(norm_reward=True, clip_reward=0.5), steps)
    torch.testing.assert_close(clipped, norm.clamp(-0.5, 0.5))
    assert (norm.abs() > 0.5).any()


def test_a_loaded_state_continues_the_statistics_and_each_envs_return():
    steps = list(_steps(2, 80))
    whole = _ppo(norm_reward=True)
    _stored(whole, steps[:40])
    state = copy.deepcopy(whole.state_dict())  # as a checkpoint file holds it
    second = _stored(whole, steps[40:])
    resumed = _ppo(norm_reward=True)
    resumed.load_state_dict(state)
    torch.testing.assert_close(_stored(resumed, steps[40:]), second)
    assert not torch.equal(_stored(_ppo(norm_reward=True), steps[40:]), second)


def test_a_clip_reward_that_is_not_positive_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="algo.clip_reward"):
        validate(make_config(["algo.clip_reward=0"]))
