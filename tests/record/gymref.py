"""Independent reference renders of Gymnasium vector envs, for the RecordVectorVideo tests.

A second vector env with the same seed, driven with the same actions, renders the watched sub-envs
after every reset and step itself. In SAME_STEP the terminal state is gone after ``step``, so the
reference of a SAME_STEP run is the same env in DISABLED mode, reset by mask right after each done
step (what a same-step autoreset does: the same reset, with no seed); NEXT_STEP and DISABLED runs
are their own reference.

For each watched env ``i`` and step ``t`` (``t = 0``: the first reset), ``post[i][t]`` is the frame
right after step ``t`` (the terminal state on a done step) and ``after[i][t]`` after any reset that
followed it in the same step (``post`` itself when there was none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

os.environ.setdefault("MUJOCO_GL", "egl")

CARTPOLE_SIZE = (150, 100)  # (width, height) of CartPole's frames in these tests


def make_vec(
    env_id: str,
    num_envs: int,
    mode: AutoresetMode,
    vectorization: str = "sync",
    wrappers: Optional[Sequence] = None,
    **kwargs,
) -> gym.vector.VectorEnv:
    """``gym.make_vec`` with ``render_mode="rgb_array"``, the autoreset mode, small frames."""
    vec = gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode=vectorization,
        vector_kwargs={"autoreset_mode": mode},
        wrappers=wrappers,
        render_mode="rgb_array",
        **kwargs,
    )
    if env_id.startswith("CartPole"):
        width, height = CARTPOLE_SIZE
        vec.set_attr("screen_width", width)
        vec.set_attr("screen_height", height)
    return vec


def actions_for(vec: gym.vector.VectorEnv, steps: int, seed: int = 0) -> List[np.ndarray]:
    """``steps`` batches of random valid actions (the same list drives both envs)."""
    space = vec.action_space
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def drive(vec, mode: AutoresetMode, actions: Sequence[np.ndarray], seed: int, on_step=None):
    """Seeded reset, then one step per action; in DISABLED mode done envs are reset by mask."""
    vec.reset(seed=seed)
    for t, action in enumerate(actions, start=1):
        out = vec.step(action)
        if on_step is not None:
            on_step(t, out)
        done = np.logical_or(out[2], out[3])
        if mode is AutoresetMode.DISABLED and done.any():
            vec.reset(options={"reset_mask": done})


@dataclass
class Reference:
    post: Dict[int, List[np.ndarray]] = field(default_factory=dict)
    after: Dict[int, List[np.ndarray]] = field(default_factory=dict)
    # per watched env: the steps at which its episodes began, their returns and lengths
    starts: Dict[int, List[int]] = field(default_factory=dict)
    ends: Dict[int, List[Optional[int]]] = field(default_factory=dict)  # None: still running
    returns: Dict[int, List[float]] = field(default_factory=dict)
    lengths: Dict[int, List[int]] = field(default_factory=dict)

    def episode_frames(self, i: int, episode: int) -> np.ndarray:
        """Every frame of env ``i``'s ``episode``: its reset frame, then one per step to its
        terminal frame (or to the last step, for the episode still running)."""
        start, end = self.starts[i][episode], self.ends[i][episode]
        end = len(self.post[i]) - 1 if end is None else end
        return np.stack([self.after[i][start], *self.post[i][start + 1 : end + 1]])

    def timeline(self, i: int, start: int, n: int) -> np.ndarray:
        """``n`` frames of env ``i`` from the state after step ``start`` (resets included)."""
        return np.stack([self.after[i][start], *self.post[i][start + 1 : start + n]])


def reference(env_id, num_envs, mode, actions, seed, watch, **kwargs) -> Reference:
    """Renders the watched envs of an independent vector env at every moment (module doc)."""
    ref_mode = AutoresetMode.DISABLED if mode is AutoresetMode.SAME_STEP else mode
    vec = make_vec(env_id, num_envs, ref_mode, **kwargs)
    ref = Reference()
    for d in (ref.post, ref.after, ref.starts, ref.ends, ref.returns, ref.lengths):
        d.update({i: [] for i in watch})

    def begin(i: int, t: int) -> None:
        ref.starts[i].append(t)
        ref.ends[i].append(None)
        ref.returns[i].append(0.0)
        ref.lengths[i].append(0)

    try:
        vec.reset(seed=seed)
        done = np.zeros(num_envs, dtype=bool)  # the last step's (autoreset at this step)
        for t in range(len(actions) + 1):
            if t:
                autoreset = done
                _, reward, term, trunc, _ = vec.step(actions[t - 1])
                done = np.logical_or(term, trunc)
            for i in watch:
                ref.post[i].append(np.array(vec.envs[i].render()))
                if t == 0 or (ref_mode is AutoresetMode.NEXT_STEP and autoreset[i]):
                    begin(i, t)  # the first reset, or this step reset it
                else:
                    ref.returns[i][-1] += float(reward[i])
                    ref.lengths[i][-1] += 1
                if done[i]:
                    ref.ends[i][-1] = t
            reset = ref_mode is AutoresetMode.DISABLED and done.any()
            if reset:
                vec.reset(options={"reset_mask": done})
            for i in watch:
                ref.after[i].append(
                    np.array(vec.envs[i].render()) if reset and done[i] else ref.post[i][-1]
                )
                if reset and done[i]:
                    begin(i, t)
    finally:
        vec.close()
    return ref


class CountRenders(gym.Wrapper):
    """Counts this sub-env's renders (``renders``), to check who renders what."""

    def __init__(self, env):
        super().__init__(env)
        self.renders = 0

    def render(self):
        self.renders += 1
        return self.env.render()


def render_counts(vec) -> List[int]:
    return list(vec.unwrapped.call("get_wrapper_attr", "renders"))
