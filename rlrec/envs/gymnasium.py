"""``env=gymnasium``: any registered gymnasium id behind rlrec's batched torch interface.

The sub-envs run in a gymnasium vector env (``SyncVectorEnv`` or ``AsyncVectorEnv``, chosen by
``env.vectorization``) whose autoreset is disabled (:class:`rlrec.envs.base.VectorEnvAdapter`):
rlrec's ``AutoReset`` resets finished envs by ``reset(env_idx=...)`` (a ``reset_mask`` reset of
the vector env), so the recorder below it sees the terminal frame of every episode and the first
frame of the next.

Each sub-env is ``gym.make(env.id, render_mode="rgb_array", **env.kwargs)`` (with gymnasium's own
``TimeLimit``; ``env.max_episode_steps`` replaces its limit; a MuJoCo env's warnings go to rlrec's
log: :func:`rlrec.envs.config.gym_make`), wrapped in
:class:`~rlrec.envs.base.HoldOnDone`, which keeps a finished sub-env frozen on its terminal state
until it is reset. That is the adapter contract ("step never resets; a finished env stays in its
terminal state") and it never asks the vector env to step a finished env, which gymnasium's
disabled-autoreset mode forbids. It also knows its index, so ``render(env_idx)`` renders the named
sub-envs only (:func:`rlrec.envs.base.render_sub_envs`, through the public ``VectorEnv.call`` when
async).

``dt`` (seconds per env step, used for video fps): ``env.unwrapped.dt`` if the env has it
(Pendulum: 0.05, MuJoCo: timestep * frame_skip), else ``env.unwrapped.tau`` (CartPole: 0.02),
else ``1 / metadata["render_fps"]``, else 1/30.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError, did_you_mean
from rlrec.envs.base import HoldOnDone, VectorEnvAdapter, import_object, resize_images
from rlrec.envs.config import GymnasiumEnvConfig, ObsMode, gym_make
from rlrec.obs import RGB, STATE

MAKE_KWARGS = ("max_episode_steps", "disable_env_checker")  # gym.make's own keyword arguments

# --------------------------------------------------------------------------- config checks


def resolve_spec(env_cfg) -> gym.envs.registration.EnvSpec:
    """The registry entry of ``env.id``; a ConfigError with close matches when it does not exist.
    ``MODULE:ID`` imports ``MODULE`` (which registers ``ID``) first."""
    module, _, env_id = str(env_cfg.id).rpartition(":")
    if module:
        import_object(module, "env.id", env_cfg.id)
    if env_id in gym.registry:
        return gym.registry[env_id]
    hint = did_you_mean(env_id, list(gym.registry))
    raise ConfigError(
        f"env.id={env_cfg.id!r} is not a registered gymnasium id{': ' + hint if hint else ''}. "
        "(Ids from other packages need their module imported first: write env.id=MODULE:ID.)"
    )


@contextlib.contextmanager
def construction_errors(env_id: Any):
    """Turns the env's own "a dependency is missing" error (gymnasium's DependencyNotInstalled,
    an ImportError of its entry point) into one ConfigError line naming ``env.id`` and, in
    gymnasium's words, what to install."""
    try:
        yield
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        text = "a dependency of the env is missing: " + " ".join(str(err).split())
        if isinstance(err, ImportError):
            hint = f" (install the package that provides {err.name})" if err.name else ""
            text = f"importing the env failed: {' '.join(str(err).split())}{hint}"
        raise ConfigError(f"env.id={env_id!r} cannot be built, {text}") from None


def _check_kwargs(env_cfg, creator):
    """ConfigError naming the key and the env's keyword arguments when ``env.kwargs`` has a key
    the env's class (or function) ``creator`` does not take; nothing is built. An env that takes
    ``**kwargs`` accepts any key."""
    try:
        params = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the env itself will say
        return
    own = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in env_cfg.kwargs or {} if k not in (*own, *MAKE_KWARGS)]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ConfigError(
            f"env.kwargs.{unknown[0]} is not a keyword argument of env.id={env_cfg.id!r} "
            f"({getattr(creator, '__qualname__', creator)}): its keyword arguments are "
            f"{', '.join(own) or 'none'} (and gym.make's {', '.join(MAKE_KWARGS)})"
        )


def check_ready(env_cfg, sim=None) -> Tuple[gym.envs.registration.EnvSpec, Optional[List[str]]]:
    """What the env's registry entry refuses, before any work and without building an env: an
    ``env.id`` that is not registered, an ``env.kwargs`` key the env does not take (the entry point
    asks; make again), and with ``env.obs_mode=rgb|rgb_state`` an env that renders no frames.
    Returns the entry and the render modes its class declares (None: not declared)."""
    spec = resolve_spec(env_cfg)
    creator = spec.entry_point  # the class or function that builds the env
    if isinstance(creator, str):
        with construction_errors(env_cfg.id):  # importing its module
            creator = gym.envs.registration.load_env_creator(creator)
    _check_kwargs(env_cfg, creator)
    meta = getattr(creator, "metadata", None)
    modes = list(meta.get("render_modes") or []) if isinstance(meta, dict) else None
    if env_cfg.obs_mode != ObsMode.state:
        mode = f"observe env.obs_mode={env_cfg.obs_mode}"
        _refuse_unrenderable(env_cfg, spec, modes, mode, "observe with env.obs_mode=state")
    return spec, modes


def check_renderable(env_cfg) -> None:
    """Raises ConfigError unless ``env.id`` renders ``rgb_array`` frames (call when recording)."""
    off = "turn recording off with recorder=none and eval_env.recorder.enabled=false"
    _refuse_unrenderable(env_cfg, *check_ready(env_cfg), "be recorded", off)


def _refuse_unrenderable(env_cfg, spec, modes, what, fix):
    if modes is None:  # metadata only on instances: build one and ask it
        kwargs = dict(env_cfg.kwargs or {})
        with construction_errors(env_cfg.id):
            probe = gym_make(spec.id, render_mode="rgb_array", disable_env_checker=True, **kwargs)
        modes = [probe.render_mode] if probe.render_mode else []
        probe.close()
    if "rgb_array" not in modes:
        raise ConfigError(
            f"env.id={env_cfg.id!r} cannot {what}: it has no render_mode='rgb_array' (its render "
            f"modes: {modes or 'none'}). {fix.capitalize()}, or pick an env that renders "
            "rgb_array frames."
        )


# --------------------------------------------------------------------------- adapter


def _dt_of(env):
    base = env.unwrapped
    fps = (base.metadata or {}).get("render_fps")
    for value in (getattr(base, "dt", None), getattr(base, "tau", None), fps and 1.0 / fps):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 1.0 / 30.0


class GymnasiumEnv(VectorEnvAdapter):
    """A gymnasium vector env of ``num_envs`` copies of ``env.id`` (``env_cfg``, the schema of
    ``env=gymnasium``), batched as torch tensors; ``render``: built with render_mode="rgb_array".

    Actions: ``long [N]`` for Discrete, ``float [N, *shape]`` for Box (clipped to the bounds).
    Observations: ``float32 [N, *shape]`` on ``device`` (non-Box observation spaces are
    flattened with gymnasium's ``FlattenObservation``; Discrete becomes one-hot); an image
    (``obs_mode`` state: the env's own, when its space is a Box of uint8 HxWxC; ``rgb``: its
    rendered frame, ``rgb_state``: the frame and its observation as "state", through gymnasium's
    ``AddRenderObservation``) as ``{"rgb": uint8 [N, H, W, C * frame_stack]}`` (rlrec/obs.py), at
    ``env.obs_height x env.obs_width``, the last ``env.frame_stack`` images on the channel axis,
    oldest first: a reset fills its envs' stack with the reset image. Frames: of
    ``env.render_height x env.render_width`` with ``env.resize_frames``, else the env's own size.
    """

    def __init__(
        self,
        env_cfg: GymnasiumEnvConfig,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: Optional[int] = None,
        render: bool = True,
    ):
        self.env_id, self.frame_stack = env_cfg.id, env_cfg.frame_stack
        self.obs_size = (env_cfg.obs_height, env_cfg.obs_width)
        self._resize = env_cfg.frame_size()  # None: the env's own frame size
        make_kwargs: Dict[str, Any] = dict(env_cfg.kwargs or {}, disable_env_checker=True)
        if env_cfg.max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = env_cfg.max_episode_steps
        if render:
            make_kwargs["render_mode"] = "rgb_array"
            if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
                # headless: pygame-drawn envs (classic control, Box2D) need no display for
                # rgb_array, MuJoCo's render through EGL (its default, GLFW, needs one)
                os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
                os.environ.setdefault("MUJOCO_GL", "egl")

        def make_one(index):
            env = gym_make(env_cfg.id, **make_kwargs)  # MuJoCo's warnings: rlrec's log
            if not isinstance(env.observation_space, gym.spaces.Box):
                env = gym.wrappers.FlattenObservation(env)
            if env_cfg.obs_mode != ObsMode.state:  # the frame as the observation, or beside it
                rgb_only = env_cfg.obs_mode == ObsMode.rgb
                env = gym.wrappers.AddRenderObservation(env, rgb_only, RGB, STATE)
            if not isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box)):
                raise ConfigError(
                    f"env.id={env_cfg.id!r} has action space {env.action_space}: rlrec's "
                    "gymnasium adapter supports Box and Discrete action spaces"
                )
            env = HoldOnDone(env, index)
            env.dt = _dt_of(env)  # the adapter's dt, read through the vector env
            return env

        # the first sub-env is built in this process (by an async vector env too, before any
        # worker starts): the env's own errors come from here
        fns = [functools.partial(make_one, i) for i in range(num_envs)]
        with construction_errors(self.env_id):
            vec = env_cfg.vectorization, env_cfg.async_context
            super().__init__(fns, device, *vec, seed, copy=False)
        self.render_mode = self.vec.render_mode
        spec = self.vec.get_attr("spec")[0]
        self.max_episode_steps = spec.max_episode_steps if spec else env_cfg.max_episode_steps
        space = self.single_observation_space
        if isinstance(space, gym.spaces.Dict):  # an image (rlrec/obs.py), at obs_size, stacked
            image = (*self.obs_size, space[RGB].shape[2] * self.frame_stack)
            rgb = gym.spaces.Box(0, 255, image, np.uint8)
            self.single_observation_space = gym.spaces.Dict({**space.spaces, RGB: rgb})
            self._stack = torch.zeros(self.num_envs, *image, dtype=torch.uint8, device=self.device)

    def _tensors(self, obs, reset):
        obs = super()._tensors(obs, reset)
        if not isinstance(obs, dict):
            return obs
        rgb = resize_images(obs[RGB], self.obs_size)  # all envs at once, on the device
        if reset is None:  # a step: the oldest image out, the new one in
            self._stack = torch.cat([self._stack[..., rgb.shape[-1] :], rgb], dim=-1)
        else:  # never a previous episode's images in a stack
            self._stack[reset] = rgb[reset].repeat(1, 1, 1, self.frame_stack)
        return {**obs, RGB: self._stack}

    def render(self, env_idx) -> torch.Tensor:
        if self.render_mode != "rgb_array":
            raise ConfigError(
                f"env.id={self.env_id!r} was built with render_mode={self.render_mode!r}: it "
                "cannot render frames (see rlrec.envs.gymnasium.check_renderable)"
            )
        return resize_images(super().render(env_idx), self._resize)  # the named sub-envs only


def make(env_cfg: GymnasiumEnvConfig, sim, num_envs: int, device: torch.device, seed=None):
    """Factory entry point for ``env=gymnasium``. Config errors are raised before any env is
    built."""
    _, modes = check_ready(env_cfg, sim)
    return GymnasiumEnv(env_cfg, num_envs, device, seed, modes is None or "rgb_array" in modes)
