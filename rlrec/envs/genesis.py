"""``env=genesis``: a batched Genesis scene behind rlrec's :class:`EnvAdapter` interface.

A Genesis env is a *task class* (``env._target_``, the protocol below); the
adapter builds it, seeds its resets, adds the time limit, turns its tensors into owned tensors on
rlrec's device and renders its camera (``env.camera_attr``) so that every frame shows the current
state. The adapter never resets on its own: rlrec's ``AutoReset`` does that above the recorder.

Genesis facts this module relies on (1.4.5, see docs/genesis.md):

- ``gs.init`` may run once per process (a second call raises), so :func:`init_genesis` calls it
  once and reuses it for every later scene (sequential sweeps in one process).
- The rasterizer draws from a cache that is refreshed only after ``scene.step``: after a reset or
  any pose write without a step, ``camera.render()`` returns the old image. The adapter therefore
  always renders with ``force_render=True``, once per state: the images of a render serve the
  observation and every ``render(env_idx)`` until the next step or reset.
- ``VisOptions(split_envs=True)`` makes a camera return one image per rendered env
  ``[len(rendered_envs_idx), H, W, 3]``; otherwise it returns one image of the env it is bound to.
- Headless OpenGL needs ``PYOPENGL_PLATFORM`` (``egl`` or ``osmesa``) set before genesis is
  imported.

A task class (the GenesisTask protocol, what ``env._target_`` must provide). Construction is
split in two so that configuration errors surface before Genesis compiles:

- ``__init__(num_envs, render_width, render_height, **env.kwargs)`` creates the ``gs.Scene``,
  its entities and the camera (cheap, nothing compiled yet);
- ``build()`` calls ``scene.build(n_envs=num_envs, ...)`` (compiles on first use).

Attributes: ``scene``; ``dt`` (seconds of simulated time per env step); the observation and
action sizes, either ``num_observations`` / ``num_actions`` (actions then live in [-1, 1]) or
single-env gymnasium spaces ``observation_space`` / ``action_space``; optionally
``max_episode_steps``; and a Genesis camera under the name given by ``env.camera_attr``
(default ``camera``). For one image per env, build the scene with
``VisOptions(split_envs=True)``.

Methods (tensors on Genesis's device, batched over all envs):

- ``reset_idx(env_idx, generator)``: reset the envs ``env_idx`` (long tensor), drawing every
  random number from ``generator`` (a ``torch.Generator``) so that seeded resets repeat.
- ``get_observations() -> obs[num_envs, num_observations]``
- ``step(actions) -> (obs, reward, terminated, info)``: apply actions, advance the scene,
  never reset. ``info`` holds tensors batched over envs, e.g. ``info["success"]`` (bool).
"""

from __future__ import annotations

import ctypes.util
import os
from typing import Dict, Optional

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.envs.base import (
    EnvAdapter,
    EpisodeClock,
    as_env_index,
    import_object,
    owned,
    pixel_space,
    resize_images,
)
from rlrec.envs.config import GenesisEnvConfig, ObsMode
from rlrec.envs.device import use_device
from rlrec.obs import RGB, STATE

PROTOCOL = ("build", "reset_idx", "get_observations", "step")  # a task's methods

# --------------------------------------------------------------------------- Genesis process state


def import_genesis():
    """``import genesis`` with headless GL set up, or a ConfigError saying how to install it."""
    # headless OpenGL for pyrender (egl, else osmesa), chosen before genesis imports it; a user's
    # setting wins (with neither library, Genesis's own default: rendering says what is missing)
    if "PYOPENGL_PLATFORM" not in os.environ:
        for lib in filter(ctypes.util.find_library, ("EGL", "OSMesa")):
            os.environ["PYOPENGL_PLATFORM"] = lib.lower()
            break
    try:
        import genesis as gs
    except ImportError as e:
        raise ConfigError(
            f"env=genesis needs the genesis extra (genesis-world), which cannot be imported ({e}): "
            "pip install -e '.[genesis]' (or bash scripts/setup_genesis.sh, which also installs "
            "EGL/OSMesa)"
        ) from e
    return gs


def refuse_device(sim, device: torch.device) -> None:
    """Refuses Genesis's GPU sim on a CUDA device other than the first one visible. Quadrants,
    Genesis's kernel backend, creates its CUDA context on device 0 whatever torch's current device
    is (its ``rhi/cuda/cuda_context.cpp``; quadrants 1.3.3's binary logs "Using CUDA device
    [id=0]"), so with ``sim=gpu`` on ``cuda:N`` (rank N >= 1 on a shared node,
    ``sim.device=cuda:N``) Genesis's zero-copy state tensors would live on device 0 while rlrec's
    adapter, policy and buffers are on device N. ``sim=cpu`` with the policy on ``cuda:N`` is not
    refused: Genesis's CPU backend makes no CUDA context (its torch device is the CPU,
    Genesis's ``get_device``; Quadrants starts with ``arch=cpu``, which
    makes a ``CpuDevice`` and no ``CUDAContext``: docs/distributed.md, "Each rank's device")."""
    device = torch.device(device)
    if sim.name == "gpu" and device.type == "cuda" and (device.index or 0) != 0:
        raise ConfigError(
            f"env=genesis sim=gpu runs on the first visible GPU only (Genesis's CUDA context "
            f"takes device 0), but this process's device is {device}: give each process its own "
            "GPU as cuda:0 with CUDA_VISIBLE_DEVICES (SLURM: --gpus-per-task=1; torchrun: each "
            "rank with CUDA_VISIBLE_DEVICES=$LOCAL_RANK; docs/distributed.md), use "
            "sim.device=cuda:0, or sim=cpu (Genesis on the CPU, the policy on any GPU)"
        )


def check_ready(env_cfg: GenesisEnvConfig, sim) -> None:
    """What the entry point refuses before anything is built: the GPU sim on a CUDA device that
    is not the first visible one (:func:`refuse_device`). Imports no Genesis."""
    from rlrec.envs.factory import resolve_device

    refuse_device(sim, resolve_device(sim))


def init_genesis(sim_name: str):
    """Initialises Genesis once per process for ``sim=cpu`` (gs.cpu) or ``sim=gpu`` (gs.gpu).

    Later calls reuse the first initialisation; asking for the other backend in the same process
    is an error, because Genesis cannot be initialised twice. ``sim=gpu`` is refused with a
    ConfigError, before any scene is built, when Genesis does not run on CUDA (it would fall back
    to the CPU with only a warning); without CUDA at all, ``resolve_device`` refused it before.
    """
    gs = import_genesis()
    want_cpu = sim_name != "gpu"
    if gs._initialized:  # by an earlier adapter, or by the user's own code
        if (gs.backend == gs.cpu) != want_cpu:
            raise ConfigError(
                f"sim={sim_name} asks for Genesis backend {'cpu' if want_cpu else 'gpu'}, but "
                f"Genesis is already initialised with backend {gs.backend} in this process and "
                "gs.init may run only once: run this config in a new process"
            )
    else:
        gs.init(backend=gs.cpu if want_cpu else gs.gpu, logging_level="warning")
    # gs.init(backend=gs.gpu) tries cuda, amdgpu, metal and then cpu, and takes the CPU with only a
    # warning ("Backend gpu not available on this machine. Falling back to CPU.", gs.init in
    # genesis-world 1.4.5; its get_device raises for CUDA when torch has no CUDA build or no
    # device). With GS_TORCH_FORCE_CPU_DEVICE=1 its tensors go to the CPU even on a GPU backend.
    # Either way the run would train on the CPU while the config says sim=gpu.
    device = torch.device(gs.device)
    if not want_cpu and (gs.backend == gs.cpu or device.type != "cuda"):
        raise ConfigError(
            f"sim=gpu: Genesis runs on backend {gs.backend} with its tensors on {device}, not "
            "on CUDA (gs.init falls back to the CPU with only a warning when no CUDA backend "
            "works, and GS_TORCH_FORCE_CPU_DEVICE=1 keeps its tensors on the CPU). Training "
            "would run on the CPU: make CUDA usable (a CUDA build of torch, a visible GPU, "
            "GS_TORCH_FORCE_CPU_DEVICE unset), or use sim=cpu"
        )
    return gs


# --------------------------------------------------------------------------- cameras


def camera_rows(scene, camera, num_envs: int) -> Dict[int, int]:
    """env index -> row of :func:`render_camera`'s images for the envs the camera draws (one row
    when it returns a single image, of the env it is bound to)."""
    vis = scene.options.vis
    if vis.split_envs:
        rendered = range(num_envs) if vis.rendered_envs_idx is None else vis.rendered_envs_idx
        return {int(e): row for row, e in enumerate(rendered)}
    return {int(camera.env_idx or 0): 0}


def render_camera(camera, pin: bool = False) -> torch.Tensor:
    """The camera's images of the current state, an owned ``uint8 [rows, H, W, 3]`` tensor on
    the CPU (rows: see :func:`camera_rows`), in pinned memory where ``pin`` (the observation's
    copy to a GPU then runs without waiting for the GPU).

    On the CPU whatever the sim's device: the rasterizer draws with OpenGL and hands back numpy
    arrays, which the recorder's encoder reads on the CPU, so moving them to a GPU would only add
    a copy there and one back. A renderer that answers with a CUDA tensor costs the one copy to
    the CPU that its encoding needs anyway."""
    # force_render: after a reset or pose write without a step, Genesis would return its old
    # image
    rgb = camera.render(rgb=True, force_render=True)[0]
    rgb = rgb if isinstance(rgb, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rgb))
    rgb = rgb.as_subclass(torch.Tensor)[..., :3]
    rgb = rgb[None] if rgb.ndim == 3 else rgb  # a single image of the camera's env
    # a copy of its own: the batch renderer hands out the tensors it caches for later renders
    # (Genesis's BatchRenderer); the rasterizer's numpy images are new at each render
    # (pyrender's read_color_buf)
    return torch.empty(rgb.shape, dtype=torch.uint8, pin_memory=pin).copy_(rgb)


# --------------------------------------------------------------------------- building the task


def _spaces(task, target):
    spaces = getattr(task, "observation_space", None), getattr(task, "action_space", None)
    if all(isinstance(space, gym.Space) for space in spaces):
        return spaces
    n_obs, n_act = getattr(task, "num_observations", None), getattr(task, "num_actions", None)
    if not (isinstance(n_obs, int) and isinstance(n_act, int)):
        raise ConfigError(
            f"env._target_={target!r} must define num_observations and num_actions (ints) or "
            "observation_space and action_space (gymnasium spaces)"
        )
    box = gym.spaces.Box
    return box(-np.inf, np.inf, (n_obs,), np.float32), box(-1.0, 1.0, (n_act,), np.float32)


def _camera(task, camera_attr, target):
    """The task's camera named by ``env.camera_attr`` (None: rendering disabled)."""
    if camera_attr is None:
        return None
    from genesis.vis.camera import Camera

    cam = getattr(task, camera_attr, None)
    if isinstance(cam, Camera):
        return cam
    names = sorted(n for n in vars(task) if not n.startswith("_"))
    cams = [n for n in names if isinstance(getattr(task, n, None), Camera)]
    what = f"has {camera_attr!r} = {type(cam).__name__}, not a Genesis camera (scene.add_camera)"
    if cam is None:
        what = f"has no attribute {camera_attr!r}"
    found = f"its cameras: {', '.join(cams)}"
    if not cams:
        found = f"it has no camera; attributes: {', '.join(names)}"
    raise ConfigError(
        f"env.camera_attr={camera_attr!r} is invalid: {target} {what} ({found}). "
        "Set env.camera_attr to the attribute holding the camera, or env.camera_attr=null to run "
        "without rendering"
    )


class GenesisAdapter(EnvAdapter):
    """A Genesis task (the protocol of the module's docstring) as an :class:`EnvAdapter` (no
    autoreset, time limit here), built (compiled) here once its camera (``env.camera_attr``) and
    spaces are checked; the time limit is ``env.max_episode_steps``, else the task's own.

    Seeds (``seed_per_env = False``): the task draws the starts of the envs it resets from one
    ``torch.Generator`` on Genesis's device (``reset_idx(env_idx, generator)``), seeded with the
    adapter's ``seed`` and reseeded by ``reset(seed=s)``. A full reset with seed ``s`` therefore
    repeats exactly for the same ``num_envs`` and device (in any scene), but sub-env ``i`` does
    not start as sub-env 0 of seed ``s + i``: its start is the ``i``-th of the batch's draws, and
    a partial reset with seed ``s`` draws its envs' starts from the head of that stream. Resets
    without a seed continue the one stream.

    ``env.obs_mode=rgb|rgb_state``: every env's camera image (the step's one render of the camera
    for all envs, which :meth:`render` serves too), resized on rlrec's device to
    ``env.obs_height x env.obs_width``, as ``{"rgb"}`` (rlrec/obs.py), with the task's
    observation as "state" for ``rgb_state``. Genesis draws one image per env on the CPU too: its
    rasterizer renders a camera of a ``split_envs`` scene env by env (its ``render_camera``; the
    camera's ``build`` batches over ``rendered_envs_idx``); its BatchRenderer, which renders every
    env in one pass, requires the CUDA backend and is not needed here.
    """

    seed_per_env = False

    def __init__(self, task, env_cfg: GenesisEnvConfig, num_envs: int, device, seed: Optional[int]):
        import genesis as gs

        target = env_cfg._target_
        # the camera and the spaces are checked before the scene compiles (task.build())
        self.camera = _camera(task, env_cfg.camera_attr, target)
        state_space, self.single_action_space = _spaces(task, target)
        self.obs_mode, self.obs_size = env_cfg.obs_mode, (env_cfg.obs_height, env_cfg.obs_width)
        self.single_observation_space = pixel_space(self.obs_mode, self.obs_size, state_space)
        task.build()
        self.task, self.num_envs, self.device, self.dt = (
            task,
            num_envs,
            torch.device(device),
            float(task.dt),
        )
        self.max_episode_steps = env_cfg.max_episode_steps or getattr(
            task, "max_episode_steps", None
        )
        self._camera_name = f"{env_cfg.camera_attr!r} of {target}"  # its name in messages
        self._sim_device = torch.device(gs.device)
        self._gen = torch.Generator(self._sim_device).manual_seed(seed or 0)
        self.clock = EpisodeClock(num_envs, self.device)
        self._bounds = None  # a Box action space's, on Genesis's device
        if isinstance(self.single_action_space, gym.spaces.Box):
            space = self.single_action_space
            self._bounds = [
                torch.as_tensor(b, dtype=torch.float32, device=self._sim_device)
                for b in (space.low, space.high)
            ]
        self._rows = {} if self.camera is None else camera_rows(task.scene, self.camera, num_envs)
        # the camera's images of the current state (render_camera), dropped by every step and reset
        self._frames: Optional[torch.Tensor] = None
        if self.obs_mode != ObsMode.state:  # each env's row of the images, where they are observed
            if len(self._rows) < num_envs:  # known once it is built
                self._release()
                raise ConfigError(
                    f"env.obs_mode={self.obs_mode.value} observes every env's camera image, but "
                    f"camera {self._camera_name} draws envs {sorted(self._rows)} only (found once "
                    "the scene was built): build it with gs.options.VisOptions(split_envs=True) "
                    "drawing every env (rendered_envs_idx=None), or set env.obs_mode=state"
                )
            self._obs_rows = torch.tensor(
                [self._rows[e] for e in range(num_envs)], device=self.device
            )

    # ------------------------------------------------------------------ episodes
    def reset(self, seed=None, env_idx=None):
        if seed is not None:
            self._gen.manual_seed(int(seed))
        idx = as_env_index(env_idx, self.num_envs, self._sim_device)
        if idx.numel():
            self._frames = None
            self.task.reset_idx(idx, self._gen)
            self.clock.reset(idx)
        return self._observe(self.task.get_observations()), {}

    def _observe(self, state):
        state = owned(state, self.device, torch.float32)
        if self.obs_mode == ObsMode.state:
            return state
        # the uint8 images go to the device (from pinned memory, without waiting for it) and are
        # resized there
        rgb = self._drawn().to(self.device, non_blocking=True)[self._obs_rows]
        obs = {RGB: resize_images(rgb, self.obs_size)}
        return {**obs, STATE: state} if self.obs_mode == ObsMode.rgb_state else obs

    def step(self, action):
        self._frames = None
        action = torch.as_tensor(action).to(self._sim_device)
        if self._bounds is not None:
            action = torch.clamp(action.float(), *self._bounds)
        obs, reward, terminated, info = self.task.step(action)
        return self.clock.finish(self, self._observe(obs), reward, terminated, info)

    # ------------------------------------------------------------------ frames
    def render(self, env_idx):
        if self.camera is None:
            raise ConfigError(
                "env.camera_attr=null: this Genesis env has no camera to render; set "
                "env.camera_attr, or turn recording off (recorder.enabled=false, "
                "eval_env.recorder.enabled=false)"
            )
        envs = as_env_index(env_idx, self.num_envs, "cpu").tolist()
        missing = [e for e in envs if e not in self._rows]
        if missing:
            raise ConfigError(
                f"env {missing} cannot be rendered: camera {self._camera_name} draws envs "
                f"{sorted(self._rows)} only. Build the scene with "
                "gs.options.VisOptions(split_envs=True) and rendered_envs_idx covering the "
                "recorded envs (recorder.env_idx, eval_env.recorder.env_idx); for rlrec's own "
                "tasks set env.kwargs.rendered_envs_idx (null: every env)"
            )
        return self._drawn()[[self._rows[e] for e in envs]]  # indexing copies: owned

    def _drawn(self):
        """The camera's images of the current state: one render per step or reset at most, shared
        by the observation and every :meth:`render` until the next step or reset."""
        if self._frames is None:
            self._frames = render_camera(self.camera, pin=self.device.type == "cuda")
        return self._frames

    def _release(self):
        self.task.scene.destroy()
        self.task = self.camera = None


def make(env_cfg: GenesisEnvConfig, sim, num_envs: int, device: torch.device, seed=None):
    """Factory entry point for ``env=genesis``: checks the config, builds the task, wraps it."""
    refuse_device(sim, device)  # for callers that did not ask check_ready (the entry point does)
    target = env_cfg._target_
    import_genesis()
    if "." not in target:
        raise ConfigError(
            f"env._target_={target!r} is invalid: give a dotted path such as my_module.MyEnv"
        )
    cls = import_object(target, "env._target_")
    use_device(device)  # gs.init takes torch's current CUDA device (Genesis's get_device)
    init_genesis(sim.name)
    size = dict(render_width=env_cfg.render_width, render_height=env_cfg.render_height)
    task = cls(num_envs=num_envs, **size, **dict(env_cfg.kwargs or {}))
    missing = [m for m in PROTOCOL if not callable(getattr(task, m, None))]
    missing += [a for a in ("scene", "dt") if getattr(task, a, None) is None]
    if missing:
        raise ConfigError(
            f"env._target_={target!r} does not follow the GenesisTask protocol "
            f"(rlrec.envs.genesis): missing {', '.join(missing)}"
        )
    return GenesisAdapter(task, env_cfg, num_envs, device, seed)
