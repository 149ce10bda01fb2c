"""ManiSkill3 backend (``env=maniskill``).

``sim=gpu``: one batched ManiSkill env on ``physx_cuda``; partial resets go through
``options={"env_idx": ...}``. ``sim=cpu``: ManiSkill's CPU sim holds one env per object, so N
single envs sit behind a gymnasium vector env (sync, or async with a ``spawn``/``forkserver``
start method: ``fork`` hangs in SAPIEN) whose autoreset is DISABLED; partial resets use its
``reset_mask``. Both give the same batched-torch :class:`EnvAdapter`.

What this module guarantees on top of ManiSkill:

- No autoreset and no ManiSkill ``TimeLimit``: the env class is built directly (not through
  ``gym.make``); the adapter reports ``truncated`` at ``max_episode_steps`` (never together with
  ``terminated``): the GPU adapter counts steps itself, each CPU sub-env's
  :class:`~rlrec.envs.base.HoldOnDone` counts its own (in the vector env of
  :class:`~rlrec.envs.base.VectorEnvAdapter`, as ``env=gymnasium``'s).
- ``render(env_idx)`` shows the current state as an owned copy: on GPU, pending GPU writes are
  finished (kinematics update + fetch) before rendering, and the selected rows of SAPIEN's
  persistent camera buffer are copied out before anything else can overwrite them.
- ``env.obs_mode=rgb|rgb_state``: the sensor cameras at ``env.obs_height x env.obs_width`` as
  rlrec's pixel dict (rlrec/obs.py), shaped by ManiSkill's own wrapper as ppo_rgb.py shapes it
  (:func:`observing`), batched on the sim's device.
- Nothing reads stdin: envs whose assets are not downloaded fail with a
  :class:`~rlrec.config.ConfigError` before anything is built, and ManiSkill's download prompt
  is replaced by an error while envs are constructed (robot assets are checked only there).
"""

from __future__ import annotations

import functools
import random
from typing import Any, Callable, Dict, List, Optional

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError, did_you_mean, one_of
from rlrec.envs.base import (
    EnvAdapter,
    EpisodeClock,
    HoldOnDone,
    VectorEnvAdapter,
    as_env_index,
    import_object,
    owned,
    owned_info,
)
from rlrec.envs.config import ManiSkillEnvConfig, ObsMode, SimConfig
from rlrec.envs.device import explicit
from rlrec.envs.physx import require_gpu_library
from rlrec.obs import map_obs

# --------------------------------------------------------------------------- checks before any work


def _spec(env_cfg):
    """The registry entry of ``env.id``, once mani_skill and the modules of ``env.imports`` (which
    register envs of their own) are imported."""
    env_id = env_cfg.id
    try:
        import mani_skill.envs  # noqa: F401  registers the built-in tasks
        from mani_skill.utils.registration import REGISTERED_ENVS as registry
    except ImportError as e:
        raise ConfigError(
            f"env=maniskill needs the maniskill extra, which is not installed ({e}): pip install "
            "-e .[maniskill] (or run bash scripts/setup_maniskill.sh, which also installs Vulkan)"
        ) from e
    for i, name in enumerate(env_cfg.imports or ()):
        import_object(name, f"env.imports[{i}]")
    if env_id not in registry:
        hint = did_you_mean(env_id, list(registry)) or "no close match"
        raise ConfigError(
            f"env.id={env_id!r} is not a registered ManiSkill env ({hint}). Envs of your own are "
            "found when their module is listed in env.imports."
        )
    return registry[env_id]


def missing_assets(spec) -> List[str]:
    """Data-source ids an env spec needs that are not downloaded (ManiSkill's own check, minus the
    prompt)."""
    from mani_skill.utils import assets

    ids = []
    for group in spec.asset_download_ids or []:
        expand = group in assets.DATA_GROUPS
        ids += (
            assets.expand_data_group_into_individual_data_source_ids(group) if expand else [group]
        )
    return [i for i in ids if not assets.is_data_source_downloaded(i)]


def _assets_error(env_id, what):
    """The env needs ManiSkill assets that are not on disk (rlrec never downloads them)."""
    return ConfigError(
        f"env.id={env_id!r} needs ManiSkill assets that are not downloaded ({what}). rlrec does "
        f"not download assets: run `python -m mani_skill.utils.download_asset {env_id}` once, or "
        "choose an env whose assets ship with mani_skill (e.g. PushCube-v1, PickCube-v1, "
        "StackCube-v1)."
    )


def build_maniskill_env(env_cfg: ManiSkillEnvConfig, kwargs: Dict[str, Any]):
    """The bare ManiSkill ``BaseEnv`` of ``env.id`` built with ``kwargs`` (no gym.make wrappers: no
    TimeLimit, no order enforcing), observing ``env.obs_mode`` (:func:`observing`); its assets
    were checked by :func:`check_ready`. While it is built, ManiSkill's yes/no download prompt
    raises instead of reading stdin."""
    spec, env_id = _spec(env_cfg), env_cfg.id
    from mani_skill.utils import download_asset

    def refuse(message):
        raise _assets_error(env_id, message.strip())

    saved = download_asset.prompt_yes_no
    download_asset.prompt_yes_no = refuse
    try:
        return observing(spec.cls(**{**spec.default_kwargs, **kwargs}), env_cfg)
    except AssertionError as e:  # ManiSkill asserts on bad control modes with the allowed list
        if "control" in str(e).lower() or "supported modes" in str(e).lower():
            raise ConfigError(
                f"env.control_mode={kwargs.get('control_mode')!r} is invalid for {env_id}: {e}"
            ) from e
        raise
    except RuntimeError as e:
        vulkan = ("vulkan", "vk::", "render device", "physical device", "descriptorbinding")
        if any(w in str(e).lower() for w in vulkan):
            raise RuntimeError(
                f"SAPIEN could not create a Vulkan render device ({e}). ManiSkill needs Vulkan "
                "even for state observations: on Debian without a GPU run bash "
                "scripts/setup_maniskill.sh (Mesa >= 23 lavapipe)."
            ) from e
        raise
    finally:
        download_asset.prompt_yes_no = saved


def observing(env, env_cfg: ManiSkillEnvConfig):
    """``env`` observing ``obs_mode``: as built for ``state``; for ``rgb`` and ``rgb_state`` (built
    with ManiSkill's ``obs_mode="rgb"`` by :func:`make`) in ManiSkill's
    ``FlattenRGBDObservationWrapper`` as ManiSkill's ppo_rgb.py applies it (``obs_mode="rgb"``;
    the wrapper with ``rgb=True, depth=False, state=args.include_state``): the sensor cameras'
    uint8 images joined on the channel axis under "rgb", the robot's state (``agent`` and
    ``extra`` flattened) under "state" for ``rgb_state``, batched tensors on the sim's device; its
    constructor makes the env's observation space that Dict (``update_obs_space``).
    ``env.unwrapped`` is the ``BaseEnv``. A task without a sensor
    camera is refused (and closed) here: its cameras are known once it is built."""
    obs_mode = env_cfg.obs_mode
    if obs_mode == ObsMode.state:
        return env
    if not env.unwrapped.scene.sensors:  # the wrapper reads the first camera's image
        env.close()
        raise ConfigError(
            f"env.obs_mode={obs_mode.value} observes the task's sensor cameras, but "
            f"env.id={env_cfg.id!r} has none (found once the env was built): set "
            "env.obs_mode=state, or pick a task with a sensor camera (PushCube-v1: base_camera)"
        )
    from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

    return FlattenRGBDObservationWrapper(env, depth=False, state=obs_mode == ObsMode.rgb_state)


# --------------------------------------------------------------------------- rendering


def render_rows(
    base_env, idx: List[int], render: Optional[Callable[[], Any]] = None
) -> torch.Tensor:
    """Envs ``idx`` of a ManiSkill ``BaseEnv`` (CPU or GPU sim) as ``uint8 [k, H, W, 3]``, an owned
    CPU copy of the current state. ``render`` gives the batched image (default: the human render
    camera, ``render_rgb_array``). ManiSkill renders every sub-scene at once; only the rows asked
    for are copied.

    On the GPU sim, pending GPU writes are finished first: ManiSkill ends reset with apply ->
    kinematics update -> fetch and step with a fetch. If something wrote to the GPU buffers since
    (apply without fetch), that sequence is finished so the render reads the state the sim now
    holds, not the last fetched one. Nothing is re-applied. The rows are copied into storage of
    their own (``index_select`` allocates and ``.to("cpu")`` copies again), so the result never
    aliases the camera buffer that the next render overwrites.
    """
    scene = base_env.scene if getattr(base_env, "gpu_sim_enabled", False) else None
    if getattr(scene, "_needs_fetch", False):
        scene.px.gpu_update_articulation_kinematics()
        scene._gpu_fetch_all()
    frames = torch.as_tensor((render or base_env.render_rgb_array)())
    if frames.ndim == 3:  # one env, unbatched
        frames = frames.unsqueeze(0)
    rows = torch.as_tensor(idx, dtype=torch.long, device=frames.device)
    return frames.index_select(0, rows)[..., :3].to("cpu", torch.uint8).contiguous()


# --------------------------------------------------------------------------- the adapter


class ManiSkillGPUEnv(EnvAdapter):
    """One batched ``physx_cuda`` ManiSkill env, with the time limit counted here.

    Nothing is reset here: ManiSkill's env resets itself once while it is built (with its own
    seeds), and the adapter's first reset is the caller's. ``seed`` (:func:`make` draws a random
    one for None) is given to the first reset that gets no seed of its own.

    Seeds (``seed_per_env = False``): ``reset(seed=s)`` gives ManiSkill the seeds ``s + i``, so
    sub-scene ``i``'s episode seed is ``s + i`` (``_batched_episode_rng``, which tasks use for
    per-scene choices such as the assets a scene loads). But ManiSkill's tasks draw their initial
    poses with ``torch.rand`` for all reset sub-scenes at once, under ``torch.manual_seed`` of the
    first seed, ``s`` (mani_skill 3.0.1 ``mani_skill/envs/sapien_env.py`` ``BaseEnv.reset``): a
    full reset with seed ``s`` repeats exactly for the same ``num_envs`` and device, but sub-env
    ``i`` does not start as sub-env 0 of seed ``s + i``, and a partial reset with seed ``s``
    draws its envs' starts from the head of that one stream. Unseeded resets draw from torch's
    global generator of the sim's device.
    """

    seed_per_env = False

    def __init__(self, env_cfg, kwargs, num_envs: int, device, max_episode_steps, seed=None):
        self.num_envs, self.device, self.max_episode_steps = (
            num_envs,
            torch.device(device),
            max_episode_steps,
        )
        self.clock = EpisodeClock(num_envs, self.device)
        self._seed = seed
        self.env = build_maniskill_env(env_cfg, gpu_env_kwargs(kwargs, num_envs, device))
        self.base = self.env.unwrapped  # the BaseEnv below the camera modes' wrapper
        self.dt = float(self.base.control_timestep)
        self.single_observation_space = self.base.single_observation_space
        self.single_action_space = self.base.single_action_space
        # the observation of ManiSkill's own reset while it was built (as the wrapper shapes it)
        self._own(self.base._init_raw_obs)

    def _own(self, obs):
        """``obs`` (a tensor, or the camera modes' dict of them, on the sim's device) kept as owned
        tensors on the adapter's device; a copy of them for the caller."""
        self._obs = map_obs(lambda v: owned(v, self.device), obs)
        return map_obs(torch.clone, self._obs)

    def reset(self, seed=None, env_idx=None):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        if idx.numel() == 0:
            return map_obs(torch.clone, self._obs), {}
        seeds = self._seeds(seed)  # env i is seeded seed + i, as gymnasium's vector envs do
        # idx.numel() is metadata: unique() (a sort, a device sync) only when idx may cover all envs
        full = env_idx is None or (
            idx.numel() >= self.num_envs and idx.unique().numel() == self.num_envs
        )
        obs, info = self.env.reset(
            seed=seeds, options={} if full else {"env_idx": idx.to(self.base.device)}
        )
        self.clock.reset(idx)
        return self._own(obs), owned_info(info, self.num_envs, self.device)

    def step(self, action):
        obs, reward, terminated, _, info = self.env.step(action.to(self.base.device))
        return self.clock.finish(self, self._own(obs), reward, terminated, info)

    def render(self, env_idx):
        return render_rows(self.base, as_env_index(env_idx, self.num_envs, "cpu").tolist())

    def _release(self):
        self.env.close()


class _CPUSubEnv(gym.Wrapper):
    """A CPU ManiSkill env (one env per object) as a plain gymnasium env: numpy, unbatched."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = env.unwrapped.single_observation_space  # a Dict for cameras
        self.action_space = env.unwrapped.single_action_space
        self.dt = float(env.unwrapped.control_timestep)

    @staticmethod
    def _info(info):
        # python scalars, so the vector env stacks them into typed arrays (np.bool_ would give
        # object arrays)
        return {
            k: v.item() for k, v in info.items() if isinstance(v, torch.Tensor) and v.numel() == 1
        }

    def reset(self, *, seed=None, options=None):
        options = {k: v for k, v in (options or {}).items() if k != "reset_mask"}
        obs, info = self.env.reset(seed=seed, options=options)
        return map_obs(lambda v: v[0].numpy(), obs), self._info(info)

    def step(self, action):
        obs, reward, terminated, _, info = self.env.step(np.asarray(action))
        obs = map_obs(lambda v: v[0].numpy(), obs)
        return obs, float(reward[0]), bool(terminated[0]), False, self._info(info)

    def render(self) -> np.ndarray:
        return render_rows(self.unwrapped, [0])[0].numpy()


def _make_cpu_sub_env(index, env_cfg, kwargs, limit):
    # module-level (picklable) so spawn/forkserver workers can build their env
    cpu = {**kwargs, "num_envs": 1, "sim_backend": "physx_cpu", "render_backend": "cpu"}
    return HoldOnDone(_CPUSubEnv(build_maniskill_env(env_cfg, cpu)), index, limit)


# --------------------------------------------------------------------------- factory entry point


def gpu_env_kwargs(kwargs: Dict[str, Any], num_envs: int, device: torch.device) -> Dict[str, Any]:
    """The keyword arguments of the batched GPU env on the CUDA device ``device``: the sim backend
    and num_envs are rlrec's; ``render_backend`` defaults to the same GPU (``env.kwargs`` may set
    another).

    Both backends carry the device's index (``physx_cuda:1``, ``sapien_cuda:1``). ManiSkill 3.0.1
    takes ``<backend>:<index>`` for both (its ``parse_sim_and_render_backend`` splits it off and
    builds ``torch.device``/``sapien.Device("cuda:<index>")`` for the sim and the render device).
    A bare ``physx_cuda``/``sapien_cuda`` would be
    ``sapien.Device("cuda")``, which SAPIEN resolves to the first CUDA device it enumerated
    (SAPIEN ``src/device.cpp`` ``findDevice``), not to torch's current device: rank k's sim would
    sit on another GPU than its policy."""
    index = explicit(device).index
    return {
        "render_backend": f"sapien_cuda:{index}",
        **kwargs,
        "num_envs": num_envs,
        "sim_backend": f"physx_cuda:{index}",
    }


def check_ready(env_cfg: ManiSkillEnvConfig, sim: SimConfig):
    """The registry entry of ``env.id``, once what ManiSkill refuses before any work is refused
    (``sim=gpu`` without CUDA: ``rlrec.envs.factory.resolve_device``, asked first by the entry point
    and by ``make_adapter``): ``sim=gpu`` without SAPIEN's PhysX GPU library on disk (building a
    ``physx_cuda`` env would download it with no timeout: rlrec/envs/physx.py; checked before
    mani_skill is imported), ``sim=cpu`` on a CUDA device, then the extra, ``env.imports``, an
    ``env.id`` that is not registered, a reward mode the task does not take, and missing assets
    (importing mani_skill: seconds, once)."""
    if sim.name == "gpu":
        require_gpu_library()
    elif torch.device(sim.device).type != "cpu":
        raise ConfigError(
            f"sim=cpu with sim.device={sim.device}: the ManiSkill CPU sim hands out CPU tensors; "
            "use sim.device=cpu"
        )
    spec = _spec(env_cfg)
    rewards = list(getattr(spec.cls, "SUPPORTED_REWARD_MODES", []))
    if rewards:
        one_of(env_cfg.reward_mode, "env.reward_mode", rewards)
    if missing := missing_assets(spec):
        raise _assets_error(env_cfg.id, ", ".join(missing))
    return spec


def make(env_cfg: ManiSkillEnvConfig, sim: SimConfig, num_envs: int, device, seed=None):
    """The adapter for ``env=maniskill``: batched GPU env for ``sim=gpu``, vectorized CPU envs
    otherwise. ``env.kwargs`` wins over rlrec's keyword arguments of the env class (the sim
    backend and num_envs are added per sim)."""
    spec = check_ready(env_cfg, sim)  # for callers that did not ask (the entry point does)
    limit = env_cfg.max_episode_steps or spec.max_episode_steps
    kw = {
        # ppo_rgb.py's obs_mode="rgb" for both camera modes (observing shapes it)
        "obs_mode": "state" if env_cfg.obs_mode == ObsMode.state else "rgb",
        "control_mode": env_cfg.control_mode,
        "reward_mode": env_cfg.reward_mode,
        "render_mode": "rgb_array",
        "human_render_camera_configs": dict(
            width=env_cfg.render_width, height=env_cfg.render_height
        ),
        # every sensor camera's size (ManiSkill's camera configs: a key that names no camera is
        # set on all of them)
        "sensor_configs": dict(width=env_cfg.obs_width, height=env_cfg.obs_height),
        **(env_cfg.kwargs or {}),
    }
    seed = random.randrange(2**31) if seed is None else seed  # a random one, for either sim
    if sim.name == "gpu":
        return ManiSkillGPUEnv(env_cfg, kw, num_envs, device, limit, seed)
    # N single CPU envs, each held on its end with the time limit; seeds as ManiSkillGPUEnv's
    fns = [functools.partial(_make_cpu_sub_env, i, env_cfg, kw, limit) for i in range(num_envs)]
    vec = fns, "cpu", env_cfg.cpu_vectorization, env_cfg.async_context, seed
    try:  # as on the GPU sim: ManiSkill's controllers get the actions as given
        env = VectorEnvAdapter(*vec, clip_actions=False, info_masks=False)
    except (EOFError, ConnectionError) as e:  # an async worker died building its env
        raise RuntimeError(
            "a ManiSkill worker process failed while building its env (its traceback is "
            "printed above); env.cpu_vectorization=sync raises the same error in this process"
        ) from e
    env.max_episode_steps = limit
    return env
