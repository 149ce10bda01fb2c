"""What rlrec's own tests use to check an env stack, for your adapters and wrappers too.

- :class:`EnvContract`: the adapter contract as a pytest suite. Subclass it in a test module and
  provide ``make_env``::

      from rlrec.testing import EnvContract

      class TestMyEnvContract(EnvContract):
          num_envs = 3
          def make_env(self, num_envs, seed=None):
              return MyAdapter(num_envs, seed=seed)

  Observations may be state tensors or pixel dicts (rlrec/obs.py). Class attributes tune it for
  slow simulators (``num_envs``, ``max_steps_to_truncation``) and for
  renderers that are not bit-exact (``render_atol``: the largest allowed mean absolute pixel
  difference between two renders of the same state).
- :class:`FrameSpy`: a layer put right below the recorder,
  ``AutoReset(Recorder(FrameSpy(adapter)))``. It keeps, for env ``watch``, every frame of every
  episode as the env showed it (the reset frame, then one per step), and the render requests the
  recorder made, so a test can compare each clip with the frames it must hold, frame for frame.
- :func:`decode`: every frame of an mp4, and the fps written in it.

Needs pytest (the ``testing`` extra).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

try:
    import pytest
except ImportError as e:
    raise ImportError(f"rlrec.testing needs pytest ({e}): pip install 'rlrec[testing]'") from None

from rlrec.envs.base import EnvAdapter, EnvWrapper, as_env_index
from rlrec.obs import RGB, map_obs, shape_of


def sample_actions(env: EnvAdapter, seed: int = 0) -> torch.Tensor:
    """A batch of random valid actions as a tensor on the env's device."""
    space = env.single_action_space
    space.seed(seed)
    return torch.as_tensor(
        np.stack([space.sample() for _ in range(env.num_envs)]), device=env.device
    )


def _parts(obs):
    """The tensors (or shapes) of an observation by key: ``{None: x}`` for a state tensor."""
    return obs if isinstance(obs, dict) else {None: obs}


def _rows(obs, idx):
    return map_obs(lambda x: x[idx].cpu(), obs)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(_parts(a).values(), _parts(b).values()))


def frame_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute pixel difference of two uint8 frames (0 = identical)."""
    return (a.float() - b.float()).abs().mean().item()


class EnvContract:
    num_envs: int = 3
    render_atol: float = 0.0
    max_steps_to_truncation: int = 1000  # the test steps at most this many times
    seed: int = 123

    def make_env(self, num_envs: int, seed: Optional[int] = None) -> EnvAdapter:  # pragma: no cover
        raise NotImplementedError

    @pytest.fixture
    def env(self):
        env = self.make_env(self.num_envs, seed=self.seed)
        yield env
        env.close()

    def _frames(self, env, idx=None):
        return env.render(list(range(self.num_envs)) if idx is None else idx)

    def _alike(self, a, b):
        return frame_diff(a, b) <= self.render_atol

    # ------------------------------------------------------------------ shapes and types
    def test_reset_and_step_shapes(self, env):
        """The attributes; a state tensor or a pixel dict (rlrec/obs.py: "rgb" uint8, "state"
        float) of the space's shapes, on the env's device; per-env rewards and flags."""
        n, device = self.num_envs, env.device.type
        assert env.num_envs == n and isinstance(env.device, torch.device)
        assert isinstance(env.dt, float) and env.dt > 0
        assert isinstance(env.single_observation_space, gym.Space)
        assert isinstance(env.single_action_space, gym.Space)
        space = _parts(shape_of(env.single_observation_space))
        obs, info = env.reset(seed=self.seed)
        assert isinstance(info, dict)
        stepped, rew, term, trunc, info = env.step(sample_actions(env))
        for o in (obs, stepped):
            assert {k: tuple(v.shape) for k, v in _parts(o).items()} == {
                k: (n, *shape) for k, shape in space.items()
            }
            for k, v in _parts(o).items():
                floats = v.dtype in (torch.float32, torch.float64)
                assert v.dtype == torch.uint8 if k == RGB else floats, k
        assert rew.shape == term.shape == trunc.shape == (n,) and rew.dtype.is_floating_point
        assert term.dtype == trunc.dtype == torch.bool
        per_env = [v for v in info.values() if isinstance(v, torch.Tensor) and v.shape[:1] == (n,)]
        for t in (*_parts(obs).values(), *_parts(stepped).values(), rew, term, trunc, *per_env):
            assert t.device.type == device

    # ------------------------------------------------------------------ resets
    def test_seeded_reset_is_reproducible(self, env):
        obs_a, _ = env.reset(seed=7)
        frames_a = self._frames(env)
        env.step(sample_actions(env))
        obs_b, _ = env.reset(seed=7)
        torch.testing.assert_close(obs_a, obs_b)
        assert self._alike(frames_a, self._frames(env))
        other = self.make_env(self.num_envs, seed=self.seed)
        try:
            torch.testing.assert_close(
                _rows(obs_a, slice(None)), _rows(other.reset(seed=7)[0], slice(None))
            )
        finally:
            other.close()

    def test_sub_env_i_is_seeded_seed_plus_i(self, env):
        """``reset(seed=s)``: sub-env ``i`` starts as sub-env 0 of a reset with seed ``s + i``, and
        a partial reset with seed ``s`` starts it there again. A batched simulator whose one seed
        seeds the whole batch (``seed_per_env`` False) promises less: its seed still decides
        the starts, and its sub-envs start apart."""
        s, n = 40, self.num_envs
        full, _ = env.reset(seed=s)
        for i in range(n):
            for j in range(i):
                assert not _same(_rows(full, i), _rows(full, j)), f"sub-envs {j}, {i} start alike"
        assert not _same(env.reset(seed=s + n)[0], full), "the seed does not change the starts"
        if not env.seed_per_env:
            return
        for i in range(1, n):
            alone, _ = env.reset(seed=s + i)
            torch.testing.assert_close(
                _rows(alone, 0), _rows(full, i), msg=f"sub-env {i} is not seeded s + {i}"
            )
        env.step(sample_actions(env))
        again, _ = env.reset(seed=s, env_idx=[n - 1])
        torch.testing.assert_close(
            _rows(again, n - 1), _rows(full, n - 1), msg="a partial seeded reset differs"
        )

    def test_partial_reset_touches_only_named_envs(self, env):
        env.reset(seed=self.seed)
        for i in range(3):
            before, *_ = env.step(sample_actions(env, seed=i))
        before_frames = self._frames(env)
        after, _ = env.reset(env_idx=torch.tensor([1], device=env.device))
        after_frames = self._frames(env)
        others = [i for i in range(self.num_envs) if i != 1]
        torch.testing.assert_close(_rows(after, others), _rows(before, others))
        assert all(self._alike(after_frames[i], before_frames[i]) for i in others)
        assert not _same(_rows(after, 1), _rows(before, 1))
        assert not self._alike(after_frames[1], before_frames[1])

    # ------------------------------------------------------------------ rendering
    def test_render_is_owned_copy_of_current_state(self, env):
        env.reset(seed=self.seed)
        first = env.render([0])
        kept = first.clone()
        assert first.dtype == torch.uint8 and first.shape[:1] + first.shape[3:] == (1, 3)
        for i in range(3):
            env.step(sample_actions(env, seed=i))
        now = env.render([0])
        assert torch.equal(first, kept), "render() returned a view that a later step overwrote"
        assert not self._alike(now, first), "render() shows a stale state after step"
        env.reset(env_idx=[0])
        assert torch.equal(first, kept)
        assert not self._alike(env.render([0]), now), "render() shows a stale state after reset"

    def test_render_selects_envs(self, env):
        env.reset(seed=self.seed)
        every = self._frames(env)
        some = env.render([self.num_envs - 1, 0])
        assert len(every) == self.num_envs and len(some) == 2
        assert self._alike(some[0], every[-1]) and self._alike(some[1], every[0])

    # ------------------------------------------------------------------ time limit
    def test_truncation_at_time_limit(self, env):
        limit = env.max_episode_steps
        if limit is None or limit > self.max_steps_to_truncation:
            pytest.skip("no time limit short enough to reach in this test")
        env.reset(seed=self.seed)
        zero = torch.zeros_like(sample_actions(env))
        ended = torch.zeros(self.num_envs, dtype=torch.bool, device=env.device)
        for t in range(1, limit + 1):
            _, _, term, trunc, _ = env.step(zero)
            assert t == limit or not bool((trunc & ~ended).any()), f"truncated early at step {t}"
            ended |= term | trunc
        assert bool(ended.all()), "some env neither terminated nor truncated at the time limit"


class FrameSpy(EnvWrapper):
    """Records every frame of env ``watch`` and every render request from above (module doc)."""

    def __init__(self, env, watch: int = 0, keep_frames: bool = True, close_inner: bool = True):
        super().__init__(env)
        self.watch, self.keep_frames, self.close_inner = watch, keep_frames, close_inner
        # one list per episode of env `watch`; frames are None when keep_frames is False
        self.episodes: List[List[Optional[np.ndarray]]] = []
        self.render_requests: List[List[int]] = []  # env indices of each render() from above

    def _frame(self):
        return self.env.render([self.watch])[0].cpu().numpy().copy() if self.keep_frames else None

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        if self.watch in as_env_index(env_idx, self.num_envs, "cpu").tolist():
            self.episodes.append([self._frame()])
        return out

    def step(self, action):
        out = self.env.step(action)
        if self.episodes:
            self.episodes[-1].append(self._frame())
        return out

    def render(self, env_idx):
        self.render_requests.append(as_env_index(env_idx, self.num_envs, "cpu").tolist())
        return self.env.render(env_idx)

    def close(self):
        if self.close_inner:
            self.env.close()


def decode(path: str) -> Tuple[np.ndarray, float]:
    """All frames of an mp4 as uint8 ``[n, H, W, 3]`` and the fps written in the file."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(path, pix_fmt="rgb24")
    meta = next(gen)
    w, h = meta["size"]
    frames = [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in gen]
    return np.stack(frames) if frames else np.zeros((0, h, w, 3), np.uint8), float(meta["fps"])
