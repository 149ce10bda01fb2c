"""AutoReset on its own: over a scripted fake adapter (episode lengths chosen per env) and over the
built-in PointReach (checkpoint round trip)."""

from typing import List

import gymnasium as gym
import numpy as np
import torch

from rlrec.envs import AutoReset, EnvAdapter, as_env_index
from rlrec.envs.builtin import PointReach


class Scripted(EnvAdapter):
    """Env ``i`` ends after ``lengths[i]`` steps (terminated where ``terminate[i]``, else
    truncated). The observation is ``[episode number, step in episode]``, the reward of a step
    is ``i + 1``, and info holds ``step`` and ``success`` (= terminated)."""

    def __init__(self, lengths: List[int], terminate: List[bool]):
        self.num_envs = len(lengths)
        self.device = torch.device("cpu")
        self.dt = 0.1
        self.max_episode_steps = None
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.lengths = torch.tensor(lengths)
        self.terminate = torch.tensor(terminate)
        self.state = torch.zeros(self.num_envs, 2)
        self.resets: List[List[int]] = []

    def reset(self, seed=None, env_idx=None):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        self.resets.append(idx.tolist())
        self.state[idx, 0] += 1
        self.state[idx, 1] = 0
        return self.state.clone(), {"step": self.state[:, 1].clone()}

    def step(self, action):
        self.state[:, 1] += 1
        ended = self.state[:, 1] >= self.lengths
        terminated, truncated = ended & self.terminate, ended & ~self.terminate
        reward = torch.arange(1, self.num_envs + 1, dtype=torch.float32)
        info = {"step": self.state[:, 1].clone(), "success": terminated.clone()}
        return self.state.clone(), reward, terminated, truncated, info

    def render(self, env_idx):
        raise NotImplementedError


def _act(env):
    return torch.zeros(env.num_envs, 1)


def test_only_done_envs_are_reset_and_final_obs_info_are_kept():
    inner = Scripted([2, 3, 2], [True, False, False])
    env = AutoReset(inner)
    env.reset()
    obs, reward, term, trunc, info = env.step(_act(env))  # no env ends: the step as it was
    assert set(info) == {"step", "success"} and not (term | trunc).any()
    assert obs[:, 1].tolist() == [1, 1, 1] and inner.resets == [[0, 1, 2]]
    # envs 0 (terminated) and 2 (truncated) end
    obs, reward, term, trunc, info = env.step(_act(env))
    assert term.tolist() == [True, False, False] and trunc.tolist() == [False, False, True]
    assert inner.resets == [[0, 1, 2], [0, 2]]  # only the done envs, in the same step
    # obs is already the next episode's first observation for the done envs
    assert obs.tolist() == [[2, 0], [1, 2], [2, 0]]
    assert info["_final"].tolist() == [True, False, True]
    # final_obs: the terminal observations, untouched by the reset that followed
    assert info["final_obs"].tolist() == [[1, 2], [1, 2], [1, 2]]
    # final_info: the terminal step's info (no AutoReset keys inside)
    assert set(info["final_info"]) == {"step", "success"}
    assert info["final_info"]["step"].tolist() == [2, 2, 2]
    assert info["final_info"]["success"].tolist() == [True, False, False]
    # the final obs is a copy: later steps and resets never change it
    kept = info["final_obs"].clone()
    for _ in range(3):
        env.step(_act(env))
    assert torch.equal(info["final_obs"], kept)


def test_episode_return_length_and_mask():
    env = AutoReset(Scripted([2, 3], [True, True]))
    env.reset()
    lengths, returns = [], []
    for _ in range(6):
        *_, info = env.step(_act(env))
        if "episode" in info:
            ep = info["episode"]
            mask = ep["_mask"]
            assert torch.equal(mask, info["_final"])
            lengths += ep["length"][mask].tolist()
            returns += ep["return"][mask].tolist()
    # env 0 ends at steps 2, 4, 6 (reward 1 a step); env 1 at steps 3, 6 (reward 2 a step)
    assert lengths == [2, 3, 2, 2, 3] and returns == [2.0, 6.0, 2.0, 2.0, 6.0]


def test_reset_clears_the_accumulators_of_the_named_envs_only():
    env = AutoReset(Scripted([4, 4], [True, True]))
    env.reset()
    env.step(_act(env))
    env.reset(env_idx=[1])  # env 1 starts over: its return and length restart from zero
    for _ in range(3):
        *_, info = env.step(_act(env))
    assert info["_final"].tolist() == [True, False]
    assert info["episode"]["length"][0] == 4 and info["episode"]["return"][0] == 4.0
    *_, info = env.step(_act(env))
    assert info["_final"].tolist() == [False, True]
    assert info["episode"]["length"][1] == 4 and info["episode"]["return"][1] == 8.0


def test_state_dict_round_trip_resumes_bit_exactly():
    """AutoReset's accumulators and PointReach's state (step counter included) saved mid-episode
    and loaded into a fresh stack: it continues exactly as the original."""

    def stack():
        return AutoReset(
            PointReach(4, max_episode_steps=7, render_width=16, render_height=16, seed=1)
        )

    def run(env, steps):
        gen = torch.Generator().manual_seed(5)
        out = []
        for _ in range(steps):
            obs, reward, term, trunc, info = env.step(torch.rand(4, 2, generator=gen) * 2 - 1)
            ep = info.get("episode", {})
            ret, length = ep.get("return"), ep.get("length")
            out.append((obs, reward, term, trunc, ret, length, env.render([0, 3])))
        return out

    a = stack()
    a.reset(seed=3)
    run(a, 5)
    saved = {"adapter": a.unwrapped.state_dict(), "autoreset": a.state_dict()}
    assert saved["adapter"]["t"].tolist() == [5, 5, 5, 5]
    expected = run(a, 12)  # through truncations at step 7 and 14

    b = stack()
    b.reset(seed=99)  # a different state, all of it overwritten by the load
    b.unwrapped.load_state_dict(saved["adapter"])
    b.load_state_dict(saved["autoreset"])
    got = run(b, 12)
    assert any(e[4] is not None for e in expected)
    for e, g in zip(expected, got):
        for x, y in zip(e, g):
            assert (x is None and y is None) or torch.equal(x, y)
