"""The env adapter interface every backend implements, and the layers stacked on top of it.

Stack (see docs/architecture.md)::

    AutoReset      same-step autoreset: on done, keep the final obs/info, reset only the done envs
      Recorder     sees every reset (full or partial) and every step, so clips start on the reset
                   state and end on the terminal state
        EnvAdapter one object for all envs, batched torch tensors, NO autoreset inside

Everything is batched over envs as torch tensors on ``adapter.device``.

Besides the interface, this module holds what several adapters share, each once:
:class:`EpisodeClock` (the time limit of the adapters that count steps themselves),
:func:`owned_info` (a backend's info as owned per-env tensors), :func:`import_object` (the
user's code named in the config), :func:`vector_env` / :func:`reset_options` (a gymnasium vector
env without autoreset, and a reset of some of its sub-envs) and :class:`SubEnv` /
:func:`render_sub_envs` (frames of the named sub-envs of a gymnasium vector env, and of no
others).
"""

from __future__ import annotations

import importlib
import sys
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError

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
    # Host indices (a list, or AutoReset's CPU tensor) go to an accelerator without waiting for
    # it: a blocking host-to-device copy synchronises the stream (torch's copy_kernel_cuda, in
    # aten/src/ATen/native/cuda/Copy.cu, calls at::cuda::memcpy_and_sync), while a non-blocking
    # one from pageable memory is staged by CUDA before it returns, so the source may change
    # right after.
    non_blocking = env_idx.device.type == "cpu" and torch.device(device).type != "cpu"
    return env_idx.to(device=device, dtype=torch.long, non_blocking=non_blocking).flatten()


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
    - ``seed``: ``reset(seed=s)`` gives sub-env ``i`` the seed ``s + i`` (each named env, in a
      partial reset too), so it starts as sub-env 0 of a reset with seed ``s + i``, whatever the
      batch size and whichever other envs reset with it (the envs of two ranks of ``n`` envs are
      then those of one process of ``2n``). The ``seed`` an adapter is built with makes its
      first reset without a seed start as ``reset(seed=seed)`` would; later resets without a
      seed draw as the backend draws. A batched simulator whose one seed seeds the whole batch
      (``seed_per_env = False``) promises less, and says what in its docstring: a full reset
      with seed ``s`` repeats exactly for the same ``num_envs`` and device, and its sub-envs
      start apart.
    """

    num_envs: int
    device: torch.device
    dt: float  # seconds of simulated time per env step
    max_episode_steps: Optional[int]
    single_observation_space: gym.Space
    single_action_space: gym.Space
    # True: sub-env i of a reset with seed s is seeded s + i (see the class docstring)
    seed_per_env: bool = True

    @abstractmethod
    def reset(
        self, seed: Optional[int] = None, env_idx: EnvIdx = None
    ) -> Tuple[torch.Tensor, Info]:
        """Resets the named envs (all if None); with ``seed``, env ``i`` is seeded ``seed + i``."""

    @abstractmethod
    def step(
        self, action: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Info]:
        """Advances all envs by one step: ``obs, reward, terminated, truncated, info``."""

    @abstractmethod
    def render(self, env_idx: EnvIdx) -> torch.Tensor:
        """uint8 ``[k, H, W, 3]`` frames of the current state of ``env_idx``, owned by the
        caller."""

    def close(self) -> None:
        """Releases simulator resources. Idempotent."""
        # a no-op hook, deliberately not abstract: adapters override it when they hold resources
        return None

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
    seed_per_env = property(lambda self: self.env.seed_per_env)  # type: ignore[assignment]

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


# --------------------------------------------------------------------------- time limit


class EpisodeClock:
    """Steps since each env's reset, and the truncation they imply: the one time limit of the
    adapters that count steps themselves (built-in, ManiSkill, Genesis; gymnasium keeps its own).

    ``elapsed`` (long ``[num_envs]`` on the adapter's device) is all of its state. The limit is
    passed to :meth:`step`, so an adapter's ``max_episode_steps`` stays the one place it is set.
    """

    def __init__(self, num_envs: int, device: torch.device):
        self.elapsed = torch.zeros(num_envs, dtype=torch.long, device=device)

    def reset(self, env_idx: EnvIdx = None) -> None:
        """Restarts the clocks of the named envs (all if None)."""
        self.elapsed[as_env_index(env_idx, self.elapsed.numel(), self.elapsed.device)] = 0

    def step(self, terminated: torch.Tensor, max_episode_steps: Optional[int]) -> torch.Tensor:
        """Advances every clock by one; ``truncated``: at the limit and not terminated (never
        without a limit)."""
        self.elapsed += 1
        if max_episode_steps is None:
            return torch.zeros_like(terminated)
        return (self.elapsed >= max_episode_steps) & ~terminated


# --------------------------------------------------------------------------- info


def _per_env_tensor(value: Any, num_envs: int) -> Optional[torch.Tensor]:
    """``value`` as a tensor if it is a numeric array or tensor with leading dim ``num_envs``."""
    if isinstance(value, torch.Tensor):
        value = value.as_subclass(torch.Tensor)  # simulators hand out tensor subclasses (Genesis)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        value = torch.tensor(value)  # a copy: vector envs reuse their info arrays
    else:
        return None
    return value if value.ndim >= 1 and value.shape[0] == num_envs else None


def owned_info(
    info: Optional[Dict[str, Any]], num_envs: int, device: torch.device, masks: bool = True
) -> Info:
    """A backend's info as owned tensors on ``device``: every numeric array or tensor with leading
    dim ``num_envs`` is copied (other values are dropped), nested dicts recurse, ``success`` and
    ``fail`` become bool, and gymnasium's ``is_success`` is also reported as ``success``.
    ``masks=False`` drops the ``_key`` masks a gymnasium vector env adds to its info."""
    out: Info = {}
    for k, v in (info or {}).items():
        if isinstance(v, dict):
            out[k] = owned_info(v, num_envs, device, masks)
            continue
        if not masks and k.startswith("_"):
            continue
        t = _per_env_tensor(v, num_envs)
        if t is not None:
            dtype = torch.bool if k in ("success", "fail") else None
            out[k] = t.to(device=device, dtype=dtype, copy=True)
    if "is_success" in out and "success" not in out:
        out["success"] = out["is_success"].bool()
    return out


# --------------------------------------------------------------------------- the user's code


def _first_unimported(path: str) -> str:
    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            return name
    return path


def import_object(path: str, key: str, value: Optional[str] = None) -> Any:
    """The module or attribute at the dotted ``path`` (a module, then attributes or submodules).

    Failures are a :class:`~rlrec.config.ConfigError` naming the config key (``key=value``,
    ``value`` defaulting to ``path``) and the module that cannot be imported or the attribute a
    module lacks. An error that the imported code itself raises (other than an ImportError)
    propagates unchanged.
    """
    where = f"{key}={path if value is None else value!r}"
    parts = path.split(".")
    if not all(parts):  # "", "a..b", ".a"
        raise ConfigError(f"{where} is invalid: an invalid dotstring (no relative imports)")
    try:
        obj = importlib.import_module(parts[0])
        for i, part in enumerate(parts[1:], 2):
            if isinstance(obj, ModuleType) and not hasattr(obj, part):  # a submodule, maybe
                obj = importlib.import_module(".".join(parts[:i]))
            else:
                obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError) as e:
        cause = e
    missing = cause.name if isinstance(cause, ModuleNotFoundError) else None
    if missing and (path == missing or path.startswith(missing + ".")):
        parent, _, attr = missing.rpartition(".")
        if parent in sys.modules:  # neither an attribute nor a submodule of an imported module
            why = f"module {parent!r} has no attribute {attr!r}"
        else:
            why = f"cannot import module {missing!r} ({cause})"
    elif isinstance(cause, AttributeError):  # of a class or other non-module object
        why = str(cause)
    else:  # the module was found, and importing it failed (e.g. a missing dependency)
        why = f"cannot import module {_first_unimported(path)!r} ({cause})"
    raise ConfigError(f"{where} cannot be imported: {why}") from cause


# --------------------------------------------------------------------------- gymnasium sub-envs

RENDER_METHOD = "rlrec_render"


class SubEnv(gym.Wrapper):
    """A sub-env of a gymnasium vector env that knows its index, so that only named envs render.

    :func:`render_sub_envs` calls ``rlrec_render(idx)`` on every sub-env (the public
    ``VectorEnv.call``); each renders when its own index is in ``idx`` and returns None otherwise.
    ``index`` None: set later (``VectorEnv.set_attr("index", ...)``, as a recorder does).

    ``armed`` (set by a recorder while a clip is open): a terminal step renders the terminal state
    at once, before a same-step autoreset of the vector env replaces it, and
    ``rlrec_render(idx, terminal=True)`` answers with that frame until the next step.
    """

    def __init__(self, env: gym.Env, index: Optional[int] = None):
        super().__init__(env)
        self.index = index
        self.armed = False
        self.terminal_frame: Optional[np.ndarray] = None

    def step(self, action):
        self.terminal_frame = None
        out = self.env.step(action)
        if self.armed and (out[2] or out[3]):
            self.terminal_frame = np.array(self.frame(), dtype=np.uint8)
        return out

    def frame(self) -> np.ndarray:
        """This env's current frame, ``uint8 [H, W, 3]``."""
        return self.render()

    def rlrec_render(self, idx: Tuple[int, ...], terminal: bool = False) -> Optional[np.ndarray]:
        if self.index not in idx:
            return None
        if terminal and self.terminal_frame is not None:
            return self.terminal_frame
        return self.frame()


def vector_env(fns, vectorization: str, context: Optional[str] = None, **kwargs):
    """A gymnasium vector env of the sub-envs ``fns`` (``sync``: in this process, ``async``: a
    worker process each, started by ``context``) whose autoreset is disabled: the adapter resets
    finished envs by name (:func:`reset_options`)."""
    mode = gym.vector.AutoresetMode.DISABLED
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context=context, **kwargs)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode, **kwargs)


def reset_options(idx: torch.Tensor, num_envs: int) -> Dict[str, Any]:
    """The ``options`` of a vector env reset of the envs ``idx`` alone (its ``reset_mask``)."""
    mask = np.zeros(num_envs, dtype=np.bool_)
    mask[idx.cpu().numpy()] = True
    return {"reset_mask": mask}


def render_sub_envs(vec: gym.vector.VectorEnv, env_idx: Sequence[int]) -> torch.Tensor:
    """uint8 ``[k, H, W, 3]`` frames of the sub-envs ``env_idx`` (in that order) of a vector env of
    :class:`SubEnv` s, as a new CPU tensor; no other sub-env renders."""
    idx = [int(i) for i in env_idx]
    if isinstance(vec, gym.vector.SyncVectorEnv):  # in this process: ask the named envs only
        frames = [getattr(vec.envs[i], RENDER_METHOD)((i,)) for i in idx]
    else:  # every worker answers; the others return None without rendering
        got = vec.call(RENDER_METHOD, tuple(sorted(set(idx))))
        frames = [got[i] for i in idx]
    return torch.from_numpy(np.stack(frames))  # np.stack: a new array, owned by the caller
