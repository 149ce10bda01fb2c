"""``env=gymnasium``: any registered gymnasium id behind rlrec's batched torch interface.

The sub-envs run in a gymnasium vector env (``SyncVectorEnv`` or ``AsyncVectorEnv``, chosen by
``env.vectorization``) whose autoreset is disabled: rlrec's ``AutoReset`` resets finished envs by
``reset(env_idx=...)`` (a ``reset_mask`` reset of the vector env), so the recorder below it sees the
terminal frame of every episode and the first frame of the next.

Each sub-env is ``gym.make(env.id, render_mode="rgb_array", **env.kwargs)`` (with gymnasium's own
``TimeLimit``; ``env.max_episode_steps`` replaces its limit), wrapped in :class:`HoldOnDone`, which
keeps a finished sub-env frozen on its terminal state until it is reset. That is the adapter
contract ("step never resets; a finished env stays in its terminal state") and it never asks the
vector env to step a finished env, which gymnasium's disabled-autoreset mode forbids. It also
knows its index, so ``render(env_idx)`` renders the named sub-envs only
(:func:`rlrec.envs.base.render_sub_envs`, through the public ``VectorEnv.call`` when async).

``dt`` (seconds per env step, used for video fps): ``env.unwrapped.dt`` if the env has it
(Pendulum: 0.05, MuJoCo: timestep * frame_skip), else ``env.unwrapped.tau`` (CartPole: 0.02),
else ``1 / metadata["render_fps"]``, else 1/30.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.envs.base import (
    EnvAdapter,
    EnvIdx,
    SubEnv,
    as_env_index,
    import_object,
    owned_info,
    render_sub_envs,
    reset_options,
    vector_env,
)
from rlrec.envs.config import EnvConfig, StartMethod, Vectorization


@dataclass
class GymnasiumEnvConfig(EnvConfig):
    """Any registered gymnasium id, vectorized with gymnasium's vector API."""

    name: str = "gymnasium"
    num_envs: int = 8
    id: str = "CartPole-v1"  # a registered id, or MODULE:ID to import the module that registers it
    # max_episode_steps None: the id's own TimeLimit (CartPole-v1: 500, Pendulum-v1: 200)
    vectorization: Vectorization = Vectorization.sync  # sync: one process | async: a worker per env
    async_context: Optional[StartMethod] = None  # async only: start method (None: the platform's)
    resize_frames: bool = (
        False  # false: frames at the env's own size; true: render_height x render_width
    )
    kwargs: Any = field(default_factory=dict)  # passed to gymnasium.make (+env.kwargs.g=9.81)

    def frame_size(self) -> Optional[Tuple[int, int]]:
        return super().frame_size() if self.resize_frames else None


_DONE_KEY = "rlrec_done"  # info key carrying a held sub-env's end: 1 terminated, 2 truncated
_DEFAULT_DT = 1.0 / 30.0


class HoldOnDone(SubEnv):
    """Sub-env ``index``, frozen on its terminal state until ``reset``.

    The done flags travel to the adapter in ``info["rlrec_done"]`` (1 terminated, 2 truncated)
    while the vector env itself is always told ``terminated=truncated=False``: so it never
    autoresets, and stepping a finished env (which disabled-autoreset vector envs refuse) is a
    no-op that repeats the terminal observation with reward 0 and the same flag.
    """

    def __init__(self, env: gym.Env, index: int = 0):
        super().__init__(env, index)
        self._held: Optional[tuple] = None  # (obs, done code) once finished

    def reset(self, **kwargs):
        self._held = None
        return self.env.reset(**kwargs)

    def step(self, action):
        if self._held is not None:
            obs, code = self._held
            return obs, 0.0, False, False, {_DONE_KEY: code}
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            code = 1 if terminated else 2
            self._held = (obs, code)
            info = {**info, _DONE_KEY: code}
        return obs, reward, False, False, info


# --------------------------------------------------------------------------- config checks


def resolve_spec(env_cfg) -> gym.envs.registration.EnvSpec:
    """The registry entry of ``env.id``; a ConfigError with close matches when it does not exist.
    ``MODULE:ID`` imports ``MODULE`` (which registers ``ID``) first."""
    env_id = str(env_cfg.id)
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        import_object(module, "env.id", env_cfg.id)
    if env_id in gym.registry:
        return gym.registry[env_id]
    known = list(gym.registry.keys())
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
    lower = {k.lower(): k for k in known}
    if env_id.lower() in lower and lower[env_id.lower()] not in close:
        close.insert(0, lower[env_id.lower()])
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"env.id={env_cfg.id!r} is not a registered gymnasium id.{hint} "
        "(Ids from other packages need their module imported first: write env.id=MODULE:ID.)"
    )


@contextlib.contextmanager
def construction_errors(env_id: Any):
    """Turns the env's own "a dependency is missing" error (gymnasium's DependencyNotInstalled,
    an ImportError of its entry point) into one ConfigError line naming ``env.id`` and, in
    gymnasium's words, what to install."""
    try:
        yield
    except gym.error.DependencyNotInstalled as err:
        text = " ".join(str(err).split())
        raise ConfigError(
            f"env.id={env_id!r} cannot be built, a dependency of the env is missing: {text}"
        ) from None
    except ImportError as err:
        text = " ".join(str(err).split())
        missing = f" (install the package that provides {err.name})" if err.name else ""
        raise ConfigError(
            f"env.id={env_id!r} cannot be built, importing the env failed: {text}{missing}"
        ) from None


def _creator(spec, env_id: Any):
    """The class or function that builds ``spec``'s env (importing its module)."""
    creator = spec.entry_point
    if isinstance(creator, str):
        with construction_errors(env_id):
            creator = gym.envs.registration.load_env_creator(creator)
    return creator


# gym.make's own keyword arguments (besides the env's): max_episode_steps, disable_env_checker
_MAKE_KWARGS = tuple(
    name
    for name, p in inspect.signature(gym.make).parameters.items()
    if name != "id" and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
)


def check_kwargs(env_cfg, spec=None) -> None:
    """ConfigError naming the key and the env's keyword arguments when ``env.kwargs`` has a key
    the env's class (or function) does not take; nothing is built. An env that takes
    ``**kwargs`` accepts any key."""
    kwargs = dict(env_cfg.kwargs or {})
    if not kwargs:
        return
    spec = spec if spec is not None else resolve_spec(env_cfg)
    creator = _creator(spec, env_cfg.id)
    try:
        params = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the env itself will say
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    own = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = [k for k in kwargs if k not in own and k not in _MAKE_KWARGS]
    if unknown:
        name = getattr(creator, "__qualname__", str(spec.entry_point))
        raise ConfigError(
            f"env.kwargs.{unknown[0]} is not a keyword argument of env.id={env_cfg.id!r} "
            f"({name}): its keyword arguments are {', '.join(own) or 'none'} "
            f"(and gym.make's {', '.join(_MAKE_KWARGS)})"
        )


def _render_modes(env_cfg) -> Tuple[gym.envs.registration.EnvSpec, Optional[List[str]]]:
    """The registry entry of ``env.id``, once ``env.kwargs`` is checked against it, and the render
    modes its class declares, without building it (None: not declared)."""
    spec = resolve_spec(env_cfg)
    check_kwargs(env_cfg, spec)  # before any env is built
    meta = getattr(_creator(spec, env_cfg.id), "metadata", None)
    return spec, list(meta.get("render_modes") or []) if isinstance(meta, dict) else None


def check_renderable(env_cfg) -> None:
    """Raises ConfigError unless ``env.id`` renders ``rgb_array`` frames (call when recording)."""
    spec, modes = _render_modes(env_cfg)
    if modes is None:  # metadata only on instances: build one and ask it
        kwargs = dict(env_cfg.kwargs or {})
        with construction_errors(env_cfg.id):
            probe = gym.make(spec.id, render_mode="rgb_array", disable_env_checker=True, **kwargs)
        try:
            ok = probe.render_mode == "rgb_array"
            modes = [probe.render_mode] if probe.render_mode else []
        finally:
            probe.close()
    else:
        ok = "rgb_array" in modes
    if not ok:
        raise ConfigError(
            f"env.id={env_cfg.id!r} cannot be recorded: it has no render_mode='rgb_array' "
            f"(its render modes: {modes or 'none'}). Turn recording off with recorder=none and "
            "eval_env.recorder.enabled=false, or pick an env that renders rgb_array frames."
        )


# --------------------------------------------------------------------------- adapter


def _dt_of(env: gym.Env) -> float:
    base = env.unwrapped
    for attr in ("dt", "tau"):
        value = getattr(base, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    fps = (base.metadata or {}).get("render_fps")
    if isinstance(fps, (int, float)) and fps > 0:
        return 1.0 / float(fps)
    return _DEFAULT_DT


class GymnasiumEnv(EnvAdapter):
    """A gymnasium vector env of ``num_envs`` copies of ``env_id``, batched as torch tensors.

    Actions: ``long [N]`` for Discrete, ``float [N, *shape]`` for Box (clipped to the bounds).
    Observations: ``float32 [N, *shape]`` on ``device`` (non-Box observation spaces are
    flattened with gymnasium's ``FlattenObservation``; Discrete becomes one-hot).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        vectorization: str = "sync",
        max_episode_steps: Optional[int] = None,
        kwargs: Optional[Dict[str, Any]] = None,
        render: bool = True,
        resize: Optional[tuple] = None,
        async_context: Optional[str] = None,
        seed: Optional[int] = None,
    ):
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self._resize = resize  # (H, W) or None for the env's own frame size
        self._seed = seed  # used by the first reset when it gets no seed
        self._closed = False
        make_kwargs: Dict[str, Any] = dict(kwargs or {}, disable_env_checker=True)
        if max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = int(max_episode_steps)
        if render:
            make_kwargs["render_mode"] = "rgb_array"
            if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
                # headless: pygame-drawn envs (classic control, Box2D) need no display for rgb_array
                os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

        def make_one(index: int) -> gym.Env:
            env = gym.make(env_id, **make_kwargs)
            if not isinstance(env.observation_space, gym.spaces.Box):
                env = gym.wrappers.FlattenObservation(env)
            return HoldOnDone(env, index)

        # one env in this process: spaces, dt, time limit and clear errors before any workers start
        with construction_errors(env_id):
            probe = make_one(0)
        try:
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            self.dt = _dt_of(probe)
            self.max_episode_steps = (
                probe.spec.max_episode_steps if probe.spec else max_episode_steps
            )
            self.render_mode = probe.render_mode
        finally:
            probe.close()
        space = self.single_action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        if not (self._discrete or isinstance(space, gym.spaces.Box)):
            raise ConfigError(
                f"env.id={env_id!r} has action space {space}: rlrec's gymnasium adapter supports "
                "Box and Discrete action spaces"
            )
        self.env_id = env_id

        fns = [functools.partial(make_one, i) for i in range(self.num_envs)]
        self.vec = vector_env(fns, vectorization, async_context, copy=False)
        self._obs = torch.zeros(
            self.num_envs, *self.single_observation_space.shape, device=self.device
        )

    # ------------------------------------------------------------------ conversions
    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        # torch.tensor copies: the vector env reuses its buffer (copy=False)
        return torch.tensor(obs, dtype=torch.float32, device=self.device)

    def _np_action(self, action: torch.Tensor) -> np.ndarray:
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(np.asarray(action))
        a = action.detach().to("cpu")
        if self._discrete:
            return a.reshape(self.num_envs).to(torch.int64).numpy()
        space = self.single_action_space
        a = a.reshape(self.num_envs, *space.shape).numpy()
        return np.clip(a, space.low, space.high).astype(space.dtype, copy=False)

    # ------------------------------------------------------------------ interface
    def reset(self, seed: Optional[int] = None, env_idx: EnvIdx = None):
        seed, self._seed = (self._seed if seed is None else seed), None
        seeds = None if seed is None else [int(seed) + i for i in range(self.num_envs)]
        if env_idx is None:
            obs, info = self.vec.reset(seed=seeds)
        else:
            idx = as_env_index(env_idx, self.num_envs, torch.device("cpu"))
            if idx.numel() == 0:
                return self._obs.clone(), {}
            obs, info = self.vec.reset(seed=seeds, options=reset_options(idx, self.num_envs))
        self._obs = self._obs_tensor(obs)
        return self._obs.clone(), owned_info(info, self.num_envs, self.device)

    def step(self, action: torch.Tensor):
        obs, reward, _, _, info = self.vec.step(self._np_action(action))
        # no sub-env ended this step: the vector env's info has no done codes at all
        code = torch.as_tensor(info.pop(_DONE_KEY, np.zeros(self.num_envs)), device=self.device)
        info.pop("_" + _DONE_KEY, None)
        terminated, truncated = code == 1, code == 2
        self._obs = self._obs_tensor(obs)
        rew = torch.tensor(reward, dtype=torch.float32, device=self.device)
        info = owned_info(info, self.num_envs, self.device)
        return self._obs.clone(), rew, terminated, truncated, info

    def render(self, env_idx: EnvIdx) -> torch.Tensor:
        if self.render_mode != "rgb_array":
            raise ConfigError(
                f"env.id={self.env_id!r} was built with render_mode={self.render_mode!r}: it "
                "cannot render frames (see rlrec.envs.gymnasium.check_renderable)"
            )
        idx = as_env_index(env_idx, self.num_envs, torch.device("cpu")).tolist()
        out = render_sub_envs(self.vec, idx)  # only the named sub-envs render
        if self._resize is not None and tuple(out.shape[1:3]) != tuple(self._resize):
            x = out.permute(0, 3, 1, 2).float()
            x = torch.nn.functional.interpolate(
                x, size=self._resize, mode="bilinear", antialias=True
            )
            out = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.vec.close()


def check_ready(env_cfg: GymnasiumEnvConfig, sim) -> None:
    """What the env's registry entry refuses, before any work: an ``env.id`` that is not
    registered, an ``env.kwargs`` key the env does not take (the entry point asks; make again)."""
    check_kwargs(env_cfg, resolve_spec(env_cfg))


def make(
    env_cfg: GymnasiumEnvConfig,
    sim,
    num_envs: int,
    device: torch.device,
    seed: Optional[int] = None,
) -> GymnasiumEnv:
    """Factory entry point for ``env=gymnasium``. Config errors are raised before any env is
    built."""
    _, modes = _render_modes(env_cfg)
    render = modes is None or "rgb_array" in modes
    resize = (env_cfg.render_height, env_cfg.render_width) if env_cfg.resize_frames else None
    return GymnasiumEnv(
        env_cfg.id,
        num_envs=num_envs,
        device=device,
        vectorization=env_cfg.vectorization,
        max_episode_steps=env_cfg.max_episode_steps,
        kwargs=dict(env_cfg.kwargs or {}),
        render=render,
        resize=resize,
        async_context=env_cfg.async_context,
        seed=seed,
    )
