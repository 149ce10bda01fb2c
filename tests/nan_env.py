"""A small gymnasium env that returns a non-finite observation or reward at a chosen step, for the
divergence tests: ``env=gymnasium env.id=tests.nan_env:rlrec-test/NaNAt-v0``.

kwargs: ``seed`` (the sub-env whose first reset has this seed goes bad: sub-env ``i`` of a reset
with seed ``s`` gets ``s + i``), ``step`` (its step count since it was made, from 1, at which it
returns the bad value; None: never), ``what`` ("obs" or "reward"), ``value`` ("nan" or "inf"),
``discrete`` (two discrete actions instead of one continuous one). Actions are ignored, so a
policy whose outputs went non-finite still steps it.
"""

from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

ID = "rlrec-test/NaNAt-v0"


class NaNAt(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        render_mode: Optional[str] = None,
        seed: int = -1,
        step: Optional[int] = None,
        what: str = "obs",
        value: str = "nan",
        discrete: bool = False,
    ):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = (
            gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        )
        self.bad_seed, self.bad_step, self.what = seed, step, what
        self.bad = float(value)
        self.first_seed: Optional[int] = None
        self.steps = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / 10.0, np.sin(self.t), 1.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.first_seed is None and seed is not None:
            self.first_seed = int(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.t += 1
        obs, reward = self._obs(), float(self.np_random.normal())
        if self.first_seed == self.bad_seed and self.steps == self.bad_step:
            if self.what == "obs":
                obs[1] = self.bad
            else:
                reward = self.bad
        return obs, reward, False, False, {}

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)


if ID not in gym.registry:
    gym.register(ID, entry_point=NaNAt, max_episode_steps=10)
