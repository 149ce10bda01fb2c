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
user's code named in the config), :class:`VectorEnvAdapter` (sub-envs held on their end by
:class:`HoldOnDone` in a gymnasium vector env without autoreset: ``env=gymnasium`` and ManiSkill's
CPU sim) and :class:`SubEnv` / :func:`render_sub_envs` (frames of the named sub-envs of a
gymnasium vector env, and of no others).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.envs.config import ObsMode, is_image
from rlrec.obs import RGB, STATE, Obs, map_obs

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

    _closed = False
    _seed: Optional[int] = None  # the construction's seed, for the first reset without one

    def _seeds(self, seed):
        """The seeds of a reset's sub-envs, ``seed + i`` (the construction's seed for the first
        reset that gets none)."""
        seed, self._seed = (self._seed if seed is None else seed), None
        return None if seed is None else [int(seed) + i for i in range(self.num_envs)]

    def close(self) -> None:
        """Releases simulator resources (:meth:`_release`), once: a second call does nothing."""
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self):
        """What :meth:`close` releases; adapters that hold resources override it."""
        return None  # deliberately not abstract: most adapters hold nothing to release

    @property
    def unwrapped(self) -> "EnvAdapter":
        return self


def _forward(name):
    """A wrapper's attribute that is its env's."""
    return property(lambda self: getattr(self.env, name))


class EnvWrapper(EnvAdapter):
    """Forwards everything to ``env``; subclasses override what they change."""

    def __init__(self, env: EnvAdapter):
        self.env = env

    num_envs = _forward("num_envs")
    device = _forward("device")
    dt = _forward("dt")
    max_episode_steps = _forward("max_episode_steps")
    single_observation_space = _forward("single_observation_space")
    single_action_space = _forward("single_action_space")
    seed_per_env = _forward("seed_per_env")

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
        """The first layer of type ``cls`` at or below this one (following ``.env`` down to the
        adapter), or None."""
        layer: Any = self
        while layer is not None and not isinstance(layer, cls):
            layer = getattr(layer, "env", None)
        return layer


# --------------------------------------------------------------------------- time limit


class EpisodeClock:
    """Steps since each env's reset, and the truncation they imply: the one time limit of the
    adapters that count steps themselves (built-in, ManiSkill on the GPU, Genesis); the sub-envs of
    a :class:`VectorEnvAdapter` count theirs in :class:`HoldOnDone` (or gymnasium's TimeLimit).

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

    def finish(self, adapter: EnvAdapter, obs: Obs, reward, terminated, info: Optional[Info]):
        """The step of ``adapter`` (whose clock this is) from its simulator's ``obs``, ``reward``,
        ``terminated`` and ``info``: owned on its device, truncated at its time limit."""
        terminated = owned(terminated, adapter.device, torch.bool)
        truncated = self.step(terminated, adapter.max_episode_steps)
        reward = owned(reward, adapter.device, torch.float32)
        info = owned_info(info, adapter.num_envs, adapter.device)
        return obs, reward, terminated, truncated, info


# --------------------------------------------------------------------------- info


def owned(x: Any, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x`` (a tensor, a simulator's tensor subclass, an array) as a plain tensor of its own on
    ``device``: one copy, so that it never aliases a buffer the simulator reuses."""
    return torch.as_tensor(x).as_subclass(torch.Tensor).to(device=device, dtype=dtype, copy=True)


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
        numeric = isinstance(v, np.ndarray) and v.dtype.kind in "biufc"
        if (numeric or isinstance(v, torch.Tensor)) and (masks or not k.startswith("_")):
            if v.ndim >= 1 and v.shape[0] == num_envs:
                out[k] = owned(v, device, torch.bool if k in ("success", "fail") else None)
    if "is_success" in out and "success" not in out:
        out["success"] = out["is_success"].bool()
    return out


# --------------------------------------------------------------------------- the user's code


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
    obj: Any = None
    for i, part in enumerate(parts):
        name = ".".join(parts[: i + 1])
        if i and not (isinstance(obj, ModuleType) and not hasattr(obj, part)):
            try:  # an attribute (of a module, or of a class or other object)
                obj = getattr(obj, part)
                continue
            except AttributeError as e:
                raise ConfigError(f"{where} cannot be imported: {e}") from e
        try:  # a module, or a submodule of the module before it
            obj = importlib.import_module(name)
        except ImportError as e:
            why = f"cannot import module {name!r} ({e})"
            if i and isinstance(e, ModuleNotFoundError) and e.name == name:  # nothing of that name
                why = f"module {'.'.join(parts[:i])!r} has no attribute {part!r}"
            raise ConfigError(f"{where} cannot be imported: {why}") from e
    return obj


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
            self.terminal_frame = np.array(self.render(), dtype=np.uint8)
        return out

    def rlrec_render(self, idx: Tuple[int, ...], terminal: bool = False) -> Optional[np.ndarray]:
        if self.index not in idx:
            return None
        if terminal and self.terminal_frame is not None:
            return self.terminal_frame
        return self.render()


DONE_KEY = "rlrec_done"  # info key carrying a held sub-env's end: 1 terminated, 2 truncated


class HoldOnDone(SubEnv):
    """Sub-env ``index``, frozen on its terminal state until ``reset``.

    The done flags travel to the adapter in ``info["rlrec_done"]`` (1 terminated, 2 truncated)
    while the vector env itself is always told ``terminated=truncated=False``: so it never
    autoresets, and stepping a finished env (which disabled-autoreset vector envs refuse) is a
    no-op that repeats the terminal observation with reward 0 and the same flag. ``limit``: a
    time limit of its own, in steps since the last reset or since it was built (None: the env's).
    """

    def __init__(self, env: gym.Env, index: int = 0, limit: Optional[int] = None):
        super().__init__(env, index)
        self.limit = limit
        self.elapsed = 0
        self._held: Optional[tuple] = None  # (obs, done code) once finished

    def reset(self, **kwargs):
        self._held = None
        self.elapsed = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        if self._held is not None:
            obs, code = self._held
            return obs, 0.0, False, False, {DONE_KEY: code}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.elapsed += 1
        truncated = truncated or (self.limit is not None and self.elapsed >= self.limit)
        if terminated or truncated:
            code = 1 if terminated else 2
            self._held = (obs, code)
            info = {**info, DONE_KEY: code}
        return obs, reward, False, False, info


class VectorEnvAdapter(EnvAdapter):
    """The sub-envs ``fns`` (each a :class:`HoldOnDone`, time limit included) in a gymnasium
    vector env whose autoreset is disabled (``sync``: in this process, ``async``: a worker process
    each, started by ``context``), batched as torch tensors on ``device``: ``env=gymnasium`` and
    ManiSkill's CPU sim.

    A partial reset is the vector env's ``reset_mask`` reset; ``seed`` (None: unseeded) is given
    to the first reset that gets no seed of its own; ``render`` renders the named sub-envs only
    (:func:`render_sub_envs`). Actions: ``long [N]`` for Discrete, ``float [N, *shape]`` for Box
    (clipped to its bounds when ``clip_actions``); observations ``float32 [N, *shape]``, an
    image (:func:`is_image`) and a dict of observations as rlrec/obs.py has them (uint8 "rgb").
    ``info_masks``: keep the ``_key`` masks a vector env adds to its info.
    """

    def __init__(
        self, fns, device, vectorization, context, seed, clip_actions=True, info_masks=True, **kw
    ):
        self.num_envs, self.device, self._seed = len(fns), torch.device(device), seed
        self.clip_actions, self.info_masks = clip_actions, info_masks
        kw["autoreset_mode"] = gym.vector.AutoresetMode.DISABLED
        if vectorization == "async":
            self.vec = gym.vector.AsyncVectorEnv(fns, context=context, **kw)
        else:
            self.vec = gym.vector.SyncVectorEnv(fns, **kw)
        space = self.vec.single_observation_space
        # an image (Box of uint8, HxWxC) is observed as {"rgb": ...} (rlrec/obs.py)
        self._image = is_image(space)
        self.single_observation_space = gym.spaces.Dict({RGB: space}) if self._image else space
        self.single_action_space = self.vec.single_action_space
        self.dt = float(self.vec.get_attr("dt")[0])  # each sub-env's dt (seconds per step)
        self._obs: Obs = None  # the last observation (a reset that names no env returns it)

    def _observe(self, obs, reset=None):
        """The vector env's observation as tensors of rlrec's own (:meth:`_tensors`), and an owned
        copy of them; ``reset``: the envs a reset named (None: a step)."""
        self._obs = self._tensors({RGB: obs} if self._image else obs, reset)
        return map_obs(torch.clone, self._obs)

    def _tensors(self, obs, reset):
        # torch.tensor copies: the vector env may reuse its buffer (copy=False); an image stays
        # uint8, the rest becomes float32
        def tensor(v, key=None):
            return torch.tensor(v, dtype=None if key == RGB else torch.float32, device=self.device)

        return {k: tensor(v, k) for k, v in obs.items()} if isinstance(obs, dict) else tensor(obs)

    def _np_action(self, action):
        a, space = torch.as_tensor(action).detach().to("cpu"), self.single_action_space
        if isinstance(space, gym.spaces.Discrete):
            return a.reshape(self.num_envs).to(torch.int64).numpy()
        a = a.reshape(self.num_envs, *space.shape).numpy()
        a = np.clip(a, space.low, space.high) if self.clip_actions else a
        return a.astype(space.dtype, copy=False)

    def reset(self, seed=None, env_idx=None):
        seeds, idx = self._seeds(seed), as_env_index(env_idx, self.num_envs, "cpu")
        if env_idx is not None and not idx.numel():
            return map_obs(torch.clone, self._obs), {}
        mask = np.isin(np.arange(self.num_envs), idx.numpy())
        obs, info = self.vec.reset(
            seed=seeds, options=None if env_idx is None else {"reset_mask": mask}
        )
        return self._observe(obs, idx), owned_info(
            info, self.num_envs, self.device, self.info_masks
        )

    def step(self, action):
        obs, reward, _, _, info = self.vec.step(self._np_action(action))
        # no sub-env ended this step: the vector env's info has no done codes at all
        code = torch.as_tensor(info.pop(DONE_KEY, np.zeros(self.num_envs)), device=self.device)
        info.pop("_" + DONE_KEY, None)
        rew = torch.tensor(reward, dtype=torch.float32, device=self.device)
        info = owned_info(info, self.num_envs, self.device, self.info_masks)
        return self._observe(obs), rew, code == 1, code == 2, info

    def render(self, env_idx: EnvIdx) -> torch.Tensor:
        return render_sub_envs(self.vec, as_env_index(env_idx, self.num_envs, "cpu").tolist())

    def _release(self):
        self.vec.close()


def pixel_space(obs_mode: ObsMode, size: Tuple[int, int], state: gym.Space) -> gym.Space:
    """The observation space of an env observing ``obs_mode`` (rlrec/obs.py): ``state``, or a
    ``uint8 [*size, 3]`` image with ``state`` beside it for ``rgb_state``."""
    if obs_mode == ObsMode.state:
        return state
    spaces = {RGB: gym.spaces.Box(0, 255, (*size, 3), np.uint8), STATE: state}
    return gym.spaces.Dict(spaces if obs_mode == ObsMode.rgb_state else {RGB: spaces[RGB]})


def resize_images(images: torch.Tensor, size: Optional[Tuple[int, int]]) -> torch.Tensor:
    """uint8 ``[N, H, W, C]`` images at ``size`` = (height, width) (bilinear, antialiased), all at
    once on their device; as they are where they have that size already (or ``size`` is None)."""
    if size is None or tuple(images.shape[1:3]) == tuple(size):
        return images
    x = torch.nn.functional.interpolate(
        images.permute(0, 3, 1, 2).float(), size=tuple(size), mode="bilinear", antialias=True
    )
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


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
