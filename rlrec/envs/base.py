"""The env adapter interface every backend implements, and the layers stacked on top of it.

Stack (see docs/architecture.md)::

    AutoReset      same-step autoreset: on done, keep the final obs/info, reset only the done envs
      Recorder     sees every reset (full or partial) and every step, so clips start on the reset
                   state and end on the terminal state
        EnvAdapter one object for all envs, batched torch tensors, NO autoreset inside

Everything is batched over envs as torch tensors on ``adapter.device``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

import gymnasium as gym
import torch

Info = Dict[str, Any]
EnvIdx = Union[torch.Tensor, Sequence[int], None]


def as_env_index(env_idx: EnvIdx, num_envs: int, device: torch.device) -> torch.Tensor:
    """Normalises ``env_idx`` (None, list, bool mask or index tensor) to a long index tensor."""
    if env_idx is None:
        return torch.arange(num_envs, device=device)
    if not isinstance(env_idx, torch.Tensor):
        env_idx = torch.as_tensor(list(env_idx), dtype=torch.long)
    if env_idx.dtype == torch.bool:
        env_idx = env_idx.nonzero().flatten()
    return env_idx.to(device=device, dtype=torch.long).flatten()


class EnvAdapter(ABC):
    """A batch of ``num_envs`` envs behind one torch interface, without autoreset.

    Guarantees every adapter must keep (checked by :class:`rlrec.testing.EnvContract`):

    - ``reset(seed, env_idx)`` resets only the named envs (all when ``env_idx`` is None) and
      returns observations for all envs; the others keep their state.
    - ``step`` never resets; after a terminal step the envs stay in their terminal state until
      ``reset`` names them. Truncation at ``max_episode_steps`` is reported by ``step``.
    - ``render(env_idx)`` returns uint8 ``[k, H, W, 3]`` frames of the CURRENT state of the named
      envs, an owned copy that later steps, resets or renders never overwrite.
    - Tensors handed upward (obs, rewards, info values) are owned, not views into sim buffers.
    """

    num_envs: int
    device: torch.device
    dt: float  # seconds of simulated time per env step
    max_episode_steps: Optional[int]
    single_observation_space: gym.Space
    single_action_space: gym.Space

    @abstractmethod
    def reset(self, seed: Optional[int] = None, env_idx: EnvIdx = None) -> Tuple[torch.Tensor, Info]:
        """Resets the named envs (all if None). ``seed`` reseeds the adapter's RNG first."""

    @abstractmethod
    def step(
        self, action: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Info]:
        """Advances all envs by one step: ``obs, reward, terminated, truncated, info``."""

    @abstractmethod
    def render(self, env_idx: EnvIdx) -> torch.Tensor:
        """uint8 ``[k, H, W, 3]`` frames of the current state of ``env_idx``, owned by the caller."""

    def close(self) -> None:
        """Releases simulator resources. Idempotent."""

    @property
    def unwrapped(self) -> "EnvAdapter":
        return self


class EnvWrapper(EnvAdapter):
    """Forwards everything to ``env``; subclasses override what they change."""

    def __init__(self, env: EnvAdapter):
        self.env = env

    num_envs = property(lambda self: self.env.num_envs)  # type: ignore[assignment]
    device = property(lambda self: self.env.device)  # type: ignore[assignment]
    dt = property(lambda self: self.env.dt)  # type: ignore[assignment]
    max_episode_steps = property(lambda self: self.env.max_episode_steps)  # type: ignore[assignment]
    single_observation_space = property(lambda self: self.env.single_observation_space)  # type: ignore[assignment]
    single_action_space = property(lambda self: self.env.single_action_space)  # type: ignore[assignment]

    def reset(self, seed=None, env_idx=None):
        return self.env.reset(seed=seed, env_idx=env_idx)

    def step(self, action):
        return self.env.step(action)

    def render(self, env_idx):
        return self.env.render(env_idx)

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> EnvAdapter:
        return self.env.unwrapped

    def find(self, cls: type):
        """The first layer of type ``cls`` at or below this one, or None."""
        return next((layer for layer in layers(self) if isinstance(layer, cls)), None)


def layers(env: EnvAdapter) -> Iterator[EnvAdapter]:
    """``env``, then every layer below it (following ``.env``) down to the adapter."""
    layer: Any = env
    while layer is not None:
        yield layer
        layer = getattr(layer, "env", None)


class AutoReset(EnvWrapper):
    """Same-step autoreset above the recorder.

    When envs finish in ``step``, their final observation and info are cloned into
    ``info["final_obs"]`` / ``info["final_info"]`` (full-batch tensors; rows valid where
    ``info["_final"]`` is True) and then only those envs are reset, so the returned ``obs`` is
    already the first observation of the next episode. Episode returns and lengths of finished
    envs are reported in ``info["episode"]``.
    """

    def __init__(self, env: EnvAdapter):
        super().__init__(env)
        self._return = torch.zeros(env.num_envs, device=env.device)
        self._length = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)

    def reset(self, seed=None, env_idx=None):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        self._return[idx] = 0.0
        self._length[idx] = 0
        return self.env.reset(seed=seed, env_idx=env_idx)

    def state_dict(self) -> dict:
        return {"return": self._return.clone(), "length": self._length.clone()}

    def load_state_dict(self, state: dict) -> None:
        self._return.copy_(state["return"])
        self._length.copy_(state["length"])

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += reward
        self._length += 1
        done = terminated | truncated
        if bool(done.any()):
            info = dict(info)
            info["final_obs"] = obs.clone()
            info["final_info"] = {k: v for k, v in info.items() if k not in ("final_obs",)}
            info["_final"] = done.clone()
            info["episode"] = {
                "return": self._return.clone(),
                "length": self._length.clone(),
                "_mask": done.clone(),
            }
            idx = done.nonzero().flatten()
            obs, reset_info = self.env.reset(env_idx=idx)
            self._return[idx] = 0.0
            self._length[idx] = 0
        return obs, reward, terminated, truncated, info


def env_state(env: EnvAdapter) -> dict:
    """``state_dict()`` of every layer of the stack that has one (recorder counters, AutoReset
    accumulators, and the simulator state where the backend can save it)."""
    return {f"{depth}:{type(layer).__name__}": layer.state_dict()
            for depth, layer in enumerate(layers(env)) if hasattr(layer, "state_dict")}


def load_env_state(env: EnvAdapter, states: dict) -> None:
    """Restores what :func:`env_state` saved, layer by layer (layers that differ are skipped)."""
    for depth, layer in enumerate(layers(env)):
        key = f"{depth}:{type(layer).__name__}"
        if key in states and hasattr(layer, "load_state_dict"):
            layer.load_state_dict(states[key])
