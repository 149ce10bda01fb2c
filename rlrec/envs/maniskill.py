"""ManiSkill3 backend (``env=maniskill``).

``sim=gpu``: one batched ManiSkill env on ``physx_cuda``; partial resets go through
``options={"env_idx": ...}``. ``sim=cpu``: ManiSkill's CPU sim holds one env per object, so N
single envs sit behind a gymnasium vector env (sync, or async with a ``spawn``/``forkserver``
start method: ``fork`` hangs in SAPIEN) whose autoreset is DISABLED; partial resets use its
``reset_mask``. Both give the same batched-torch :class:`EnvAdapter`.

What this module guarantees on top of ManiSkill:

- No autoreset and no ManiSkill ``TimeLimit``: the env class is built directly (not through
  ``gym.make``), the adapter counts steps itself and reports ``truncated`` at
  ``max_episode_steps`` (never together with ``terminated``).
- ``render(env_idx)`` shows the current state as an owned copy: on GPU, pending GPU writes are
  finished (kinematics update + fetch) before rendering, and the selected rows of SAPIEN's
  persistent camera buffer are copied out before anything else can overwrite them.
- Nothing reads stdin: envs whose assets are not downloaded fail with a
  :class:`~rlrec.config.ConfigError` before anything is built, and ManiSkill's download prompt
  is replaced by an error while envs are constructed (robot assets are checked only there).
"""

from __future__ import annotations

import contextlib
import functools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from rlrec.checks import Choice, ConfigError
from rlrec.envs.base import (
    EnvAdapter,
    EnvIdx,
    EpisodeClock,
    Info,
    SubEnv,
    as_env_index,
    import_object,
    owned_info,
    render_sub_envs,
    reset_options,
    vector_env,
)
from rlrec.envs.config import EnvConfig, SimConfig, StartMethod, Vectorization
from rlrec.envs.device import explicit
from rlrec.envs.physx import require_gpu_library


class ObsMode(Choice):
    """ManiSkill observation modes rlrec supports (a flat state vector; visual obs modes are not
    wired to the policy)."""

    state = "state"


@dataclass
class ManiSkillEnvConfig(EnvConfig):
    """A ManiSkill3 task; ``sim=gpu`` runs one batched physx_cuda env."""

    name: str = "maniskill"
    num_envs: int = 8  # sim=gpu: raise it (env.num_envs=512)
    id: str = "PushCube-v1"  # any registered ManiSkill id whose assets are on disk
    obs_mode: ObsMode = ObsMode.state  # a flat state vector
    control_mode: str = "pd_joint_delta_pos"
    reward_mode: str = "normalized_dense"
    max_episode_steps: Optional[int] = 50  # None: the env's registered limit
    imports: List[str] = field(default_factory=list)  # modules that register envs, imported first
    cpu_vectorization: Vectorization = Vectorization.sync  # sim=cpu: sync | async
    async_context: StartMethod = (
        StartMethod.spawn
    )  # async start method: spawn | forkserver (fork hangs)
    kwargs: Any = field(default_factory=dict)  # extra keyword arguments of the ManiSkill env class


ASYNC_CONTEXTS = ["spawn", "forkserver"]  # "fork" deadlocks SAPIEN's renderer in the child
INSTALL_HINT = (
    "pip install -e .[maniskill] (or run bash scripts/setup_maniskill.sh, which also installs "
    "Vulkan)"
)


class AssetsMissing(ConfigError):
    """The env needs ManiSkill assets that are not on disk (and rlrec never downloads silently)."""


# --------------------------------------------------------------------------- checks before any work


def _import_maniskill():
    try:
        import mani_skill.envs  # noqa: F401  registers the built-in tasks
        from mani_skill.utils.registration import REGISTERED_ENVS
    except ImportError as e:
        raise ConfigError(
            f"env=maniskill needs the maniskill extra, which is not installed ({e}): {INSTALL_HINT}"
        ) from e
    return REGISTERED_ENVS


def _spec(env_id: str, imports: Sequence[str] = ()):
    """The registry entry of ``env_id``, once mani_skill and the modules of ``env.imports`` (which
    register envs of their own) are imported."""
    registry = _import_maniskill()
    for i, name in enumerate(imports):
        import_object(name, f"env.imports[{i}]")
    if env_id not in registry:
        near = sorted(
            k
            for k in registry
            if k.split("-")[0].lower() in env_id.lower() or env_id.lower() in k.lower()
        )
        hint = f" Did you mean: {', '.join(near[:5])}?" if near else ""
        raise ConfigError(
            f"env.id={env_id!r} is not a registered ManiSkill env.{hint} Envs of your own are "
            "found when their module is listed in env.imports."
        )
    return registry[env_id]


def missing_assets(spec) -> List[str]:
    """Data-source ids an env spec needs that are not downloaded (ManiSkill's own check, minus the
    prompt)."""
    from mani_skill.utils import assets

    missing: List[str] = []
    for asset_id in spec.asset_download_ids or []:
        if asset_id in assets.DATA_GROUPS:
            ids = assets.expand_data_group_into_individual_data_source_ids(asset_id)
        else:
            ids = [asset_id]
        missing += [i for i in ids if not assets.is_data_source_downloaded(i)]
    return missing


def _require_assets(env_id: str, spec) -> None:
    missing = missing_assets(spec)
    if missing:
        raise _assets_error(env_id, ", ".join(missing))


def _assets_error(env_id: str, what: str) -> AssetsMissing:
    return AssetsMissing(
        f"env.id={env_id!r} needs ManiSkill assets that are not downloaded ({what}). rlrec does "
        f"not download assets: run `python -m mani_skill.utils.download_asset {env_id}` once, or "
        "choose an env whose assets ship with mani_skill (e.g. PushCube-v1, PickCube-v1, "
        "StackCube-v1)."
    )


@contextlib.contextmanager
def _no_download_prompt(env_id: str):
    """While ManiSkill builds an env, its yes/no download prompt raises instead of reading stdin."""
    from mani_skill.utils import download_asset

    def refuse(message: str) -> bool:
        raise _assets_error(env_id, message.strip())

    saved = download_asset.prompt_yes_no
    download_asset.prompt_yes_no = refuse
    try:
        yield
    finally:
        download_asset.prompt_yes_no = saved


def _vulkan_hint(e: BaseException) -> Optional[str]:
    text = str(e).lower()
    if any(
        w in text
        for w in ("vulkan", "vk::", "render device", "physical device", "descriptorbinding")
    ):
        return (
            f"SAPIEN could not create a Vulkan render device ({e}). ManiSkill needs Vulkan even "
            "for state observations: on Debian without a GPU run bash scripts/setup_maniskill.sh "
            "(Mesa >= 23 lavapipe)."
        )
    return None


def build_maniskill_env(env_id: str, kwargs: Dict[str, Any], imports: Sequence[str] = ()):
    """The bare ManiSkill ``BaseEnv`` (no gym.make wrappers: no TimeLimit, no order enforcing)."""
    spec = _spec(env_id, imports)
    _require_assets(env_id, spec)
    try:
        with _no_download_prompt(env_id):
            return spec.cls(**{**spec.default_kwargs, **kwargs})
    except AssertionError as e:  # ManiSkill asserts on bad control modes with the allowed list
        if "control" in str(e).lower() or "supported modes" in str(e).lower():
            raise ConfigError(
                f"env.control_mode={kwargs.get('control_mode')!r} is invalid for {env_id}: {e}"
            ) from e
        raise
    except RuntimeError as e:
        hint = _vulkan_hint(e)
        if hint:
            raise RuntimeError(hint) from e
        raise


def _check_config(cfg: ManiSkillEnvConfig, spec) -> None:
    """What only ManiSkill knows: the task's reward modes, and the start methods SAPIEN survives
    (the schema's choices are refused by the schema)."""
    rewards = list(getattr(spec.cls, "SUPPORTED_REWARD_MODES", []))
    if rewards and cfg.reward_mode not in rewards:
        raise ConfigError(
            f"env.reward_mode={cfg.reward_mode!r} is invalid: allowed values are "
            f"{', '.join(rewards)}"
        )
    if cfg.async_context not in ASYNC_CONTEXTS:
        raise ConfigError(
            f"env.async_context={cfg.async_context!r} is invalid: allowed values are "
            f"{', '.join(ASYNC_CONTEXTS)} "
            "(fork hangs: SAPIEN's render device does not survive a fork)"
        )


# --------------------------------------------------------------------------- rendering


def sync_gpu_state(base_env) -> None:
    """Finish pending GPU writes of a ManiSkill ``BaseEnv`` so a render shows the state it holds.

    ManiSkill ends reset with apply -> kinematics update -> fetch and step with a fetch. If
    something wrote to the GPU buffers since (apply without fetch), finish that sequence so the
    render reads the state the sim now holds, not the last fetched one. Nothing is re-applied.
    A no-op on the CPU sim.
    """
    if not getattr(base_env, "gpu_sim_enabled", False):
        return
    scene = base_env.scene
    if getattr(scene, "_needs_fetch", False):
        scene.px.gpu_update_articulation_kinematics()
        scene._gpu_fetch_all()


def owned_rows(frames, idx: List[int]) -> torch.Tensor:
    """Rows ``idx`` of a batched ``[N, H, W, C]`` frame tensor as uint8 RGB on the CPU, in storage
    of their own: ``index_select`` allocates and ``.to("cpu")`` copies again, so the result never
    aliases the camera buffer that the next render overwrites."""
    frames = torch.as_tensor(frames)
    if frames.ndim == 3:  # one env, unbatched
        frames = frames.unsqueeze(0)
    rows = torch.as_tensor(idx, dtype=torch.long, device=frames.device)
    return frames.index_select(0, rows)[..., :3].to("cpu", torch.uint8).contiguous()


def render_rows(
    base_env, idx: List[int], render: Optional[Callable[[], Any]] = None
) -> torch.Tensor:
    """Envs ``idx`` of a ManiSkill ``BaseEnv`` (CPU or GPU sim) as ``uint8 [k, H, W, 3]``, an owned
    CPU copy of the current state (pending GPU writes finished first). ``render`` gives the batched
    image (default: the human render camera, ``render_rgb_array``). ManiSkill renders every
    sub-scene at once; only the rows asked for are copied."""
    sync_gpu_state(base_env)
    return owned_rows((render or base_env.render_rgb_array)(), idx)


# --------------------------------------------------------------------------- the adapter


class ManiSkillEnv(EnvAdapter):
    """Common part of both sims: time limit, seeding, info conventions. Subclasses drive the sim.

    Nothing is reset here: ManiSkill's env resets itself once while it is built (with its own
    seeds), and the adapter's first reset is the caller's. ``seed`` (None: a random one) is given
    to the first reset that gets no seed of its own."""

    def __init__(
        self,
        num_envs: int,
        device: torch.device,
        max_episode_steps: Optional[int],
        seed: Optional[int],
    ):
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.clock = EpisodeClock(num_envs, self.device)
        self._seed: Optional[int] = random.randrange(2**31) if seed is None else seed
        self._last_obs: Optional[torch.Tensor] = None  # None: no reset or step yet
        self._closed = False

    # subclasses: _reset_sim(seeds, idx) -> (obs, info), seeds: None or one per env;
    # _step_sim(action) -> (obs, reward, term, info);
    # _render_sim(idx list) -> uint8 [k, H, W, 3] on CPU, owned

    def reset(
        self, seed: Optional[int] = None, env_idx: EnvIdx = None
    ) -> Tuple[torch.Tensor, Info]:
        idx = as_env_index(env_idx, self.num_envs, self.device)
        n = self.num_envs
        full = env_idx is None or (idx.numel() == n and idx.unique().numel() == n)
        if not full and idx.numel() == 0:
            if self._last_obs is None:  # nothing reset or stepped yet
                shape = (self.num_envs, *self.single_observation_space.shape)
                self._last_obs = torch.zeros(shape, device=self.device)
            return self._last_obs.clone(), {}
        seed, self._seed = (self._seed if seed is None else seed), None
        # env i is seeded seed + i, as gymnasium's vector envs do for an int seed
        seeds = None if seed is None else [int(seed) + i for i in range(self.num_envs)]
        obs, info = self._reset_sim(seeds, None if full else idx)
        self.clock.reset(idx)
        self._last_obs = obs
        return obs.clone(), info

    def step(self, action: torch.Tensor):
        obs, reward, terminated, info = self._step_sim(action)
        truncated = self.clock.step(terminated, self.max_episode_steps)
        self._last_obs = obs
        return obs.clone(), reward, terminated, truncated, info

    def render(self, env_idx: EnvIdx) -> torch.Tensor:
        idx = as_env_index(env_idx, self.num_envs, torch.device("cpu")).tolist()
        return self._render_sim(idx)


class ManiSkillGPUEnv(ManiSkillEnv):
    """One batched ``physx_cuda`` ManiSkill env.

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

    def __init__(
        self,
        env_id: str,
        kwargs: Dict[str, Any],
        num_envs: int,
        device: torch.device,
        max_episode_steps: Optional[int],
        imports: Sequence[str] = (),
        seed: Optional[int] = None,
    ):
        super().__init__(num_envs, device, max_episode_steps, seed)
        self.env = build_maniskill_env(env_id, gpu_env_kwargs(kwargs, num_envs, device), imports)
        self.dt = float(self.env.control_timestep)
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space

    def _reset_sim(self, seeds, idx):
        options = {} if idx is None else {"env_idx": idx.to(self.env.device)}
        obs, info = self.env.reset(seed=seeds, options=options)
        return obs.to(self.device).clone(), owned_info(info, self.num_envs, self.device)

    def _step_sim(self, action):
        obs, reward, terminated, _, info = self.env.step(action.to(self.env.device))
        return (
            obs.to(self.device).clone(),
            reward.to(self.device, torch.float32).clone(),
            terminated.to(self.device, torch.bool).clone(),
            owned_info(info, self.num_envs, self.device),
        )

    def _render_sim(self, idx: List[int]) -> torch.Tensor:
        return render_rows(self.env, idx)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.close()


class _CPUSubEnv(SubEnv):
    """CPU ManiSkill env ``index`` as a plain gymnasium env (numpy, unbatched), for a vector env."""

    def __init__(self, env, index: int):
        super().__init__(env, index)
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self.dt = float(env.control_timestep)

    @staticmethod
    def _info(info: Dict[str, Any]) -> Dict[str, Any]:
        # python scalars, so the vector env stacks them into typed arrays (np.bool_ would give
        # object arrays)
        return {
            k: v.item() for k, v in info.items() if isinstance(v, torch.Tensor) and v.numel() == 1
        }

    def reset(self, *, seed=None, options=None):
        options = {k: v for k, v in (options or {}).items() if k != "reset_mask"}
        obs, info = self.env.reset(seed=seed, options=options)
        return obs[0].numpy(), self._info(info)

    def step(self, action):
        obs, reward, terminated, _, info = self.env.step(np.asarray(action))
        return obs[0].numpy(), float(reward[0]), bool(terminated[0]), False, self._info(info)

    def frame(self) -> np.ndarray:
        return np.array(
            self.env.render_rgb_array()[0, ..., :3].cpu().numpy(), dtype=np.uint8, copy=True
        )


def _make_cpu_sub_env(
    index: int, env_id: str, kwargs: Dict[str, Any], imports: Tuple[str, ...]
) -> _CPUSubEnv:
    # module-level (picklable) so spawn/forkserver workers can build their env
    env = build_maniskill_env(
        env_id,
        {**kwargs, "num_envs": 1, "sim_backend": "physx_cpu", "render_backend": "cpu"},
        imports,
    )
    return _CPUSubEnv(env, index)


class ManiSkillCPUEnv(ManiSkillEnv):
    """N single CPU ManiSkill envs in a gymnasium vector env with autoreset disabled."""

    def __init__(
        self,
        env_id: str,
        kwargs: Dict[str, Any],
        num_envs: int,
        max_episode_steps: Optional[int],
        imports: Sequence[str] = (),
        seed: Optional[int] = None,
        vectorization: str = "sync",
        context: str = "spawn",
    ):
        super().__init__(num_envs, torch.device("cpu"), max_episode_steps, seed)
        fns = [
            functools.partial(_make_cpu_sub_env, i, env_id, dict(kwargs), tuple(imports))
            for i in range(num_envs)
        ]
        try:
            self.vec = vector_env(fns, vectorization, context)
        except (EOFError, ConnectionError) as e:  # an async worker died building its env
            raise RuntimeError(
                "a ManiSkill worker process failed while building its env (its traceback is "
                "printed above); env.cpu_vectorization=sync raises the same error in this "
                "process"
            ) from e
        self.dt = float(self.vec.get_attr("dt")[0])
        self.single_observation_space = self.vec.single_observation_space
        self.single_action_space = self.vec.single_action_space

    def _reset_sim(self, seeds, idx):
        options = None if idx is None else reset_options(idx, self.num_envs)
        obs, info = self.vec.reset(seed=seeds, options=options)
        obs = torch.as_tensor(obs, dtype=torch.float32).clone()
        return obs, owned_info(info, self.num_envs, self.device, masks=False)

    def _step_sim(self, action):
        act = action.detach().cpu().numpy().astype(self.single_action_space.dtype, copy=False)
        obs, reward, terminated, _, info = self.vec.step(act)
        return (
            torch.as_tensor(obs, dtype=torch.float32).clone(),
            torch.as_tensor(reward, dtype=torch.float32),
            torch.as_tensor(terminated, dtype=torch.bool).clone(),
            owned_info(info, self.num_envs, self.device, masks=False),
        )

    def _render_sim(self, idx: List[int]) -> torch.Tensor:
        return render_sub_envs(self.vec, idx)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.vec.close()


# --------------------------------------------------------------------------- factory entry point


def env_kwargs(cfg: ManiSkillEnvConfig) -> Dict[str, Any]:
    """Keyword arguments for the ManiSkill env class (sim backend and num_envs are added per
    sim)."""
    kw = dict(
        obs_mode=cfg.obs_mode,
        control_mode=cfg.control_mode,
        reward_mode=cfg.reward_mode,
        render_mode="rgb_array",
        human_render_camera_configs=dict(width=cfg.render_width, height=cfg.render_height),
    )
    kw.update(dict(cfg.kwargs or {}))
    return kw


def gpu_backends(device: torch.device) -> Dict[str, str]:
    """ManiSkill's sim and render backends on the CUDA device ``device``, with its index
    (``physx_cuda:1``, ``sapien_cuda:1``). ManiSkill 3.0.1 takes ``<backend>:<index>`` for both
    (``mani_skill/envs/utils/system/backend.py`` lines 46-49 split it off, lines 61-64 build
    ``torch.device``/``sapien.Device("cuda:<index>")`` for the sim, lines 79-81 the render device).
    A bare ``physx_cuda``/``sapien_cuda`` would be ``sapien.Device("cuda")``, which SAPIEN resolves
    to the first CUDA device it enumerated (SAPIEN ``src/device.cpp`` ``findDevice``), not to
    torch's current device: rank k's sim would sit on another GPU than its policy."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ConfigError(
            f"sim=gpu env=maniskill runs ManiSkill's GPU sim on a CUDA device, not {device}: "
            "use sim.device=cuda"
        )
    index = explicit(device).index
    return {"sim_backend": f"physx_cuda:{index}", "render_backend": f"sapien_cuda:{index}"}


def gpu_env_kwargs(kwargs: Dict[str, Any], num_envs: int, device: torch.device) -> Dict[str, Any]:
    """The keyword arguments of the batched GPU env on ``device``: the sim backend and num_envs
    are rlrec's; ``render_backend`` defaults to the same GPU (``env.kwargs`` may set another)."""
    backends = gpu_backends(device)
    return {
        "render_backend": backends["render_backend"],
        **kwargs,
        "num_envs": num_envs,
        "sim_backend": backends["sim_backend"],
    }


def check_ready(env_cfg: ManiSkillEnvConfig, sim: SimConfig) -> None:
    """What ManiSkill refuses, before any work: ``sim=gpu`` without CUDA or without SAPIEN's PhysX
    GPU library on disk (building a ``physx_cuda`` env would download it with no timeout:
    rlrec/envs/physx.py; checked before mani_skill is imported), ``sim=cpu`` on a CUDA device,
    then the extra, ``env.imports``, an ``env.id`` that is not registered, a reward mode or start
    method the task does not take, and missing assets (importing mani_skill: seconds, once)."""
    if sim.name == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError(
                "sim=gpu needs CUDA, but torch.cuda.is_available() is False: use sim=cpu"
            )
        require_gpu_library()
    elif torch.device(sim.device).type != "cpu":
        raise ConfigError(
            f"sim=cpu with sim.device={sim.device}: the ManiSkill CPU sim hands out CPU tensors; "
            "use sim.device=cpu"
        )
    spec = _spec(env_cfg.id, list(env_cfg.imports or []))
    _check_config(env_cfg, spec)
    _require_assets(env_cfg.id, spec)


def make(
    env_cfg: ManiSkillEnvConfig,
    sim: SimConfig,
    num_envs: int,
    device: torch.device,
    seed: Optional[int] = None,
) -> ManiSkillEnv:
    """The adapter for ``env=maniskill``: batched GPU env for ``sim=gpu``, vectorized CPU envs
    otherwise."""
    check_ready(env_cfg, sim)  # for callers that did not ask (the entry point does)
    imports, spec = list(env_cfg.imports or []), _spec(env_cfg.id)
    limit = (
        env_cfg.max_episode_steps
        if env_cfg.max_episode_steps is not None
        else spec.max_episode_steps
    )
    kw = env_kwargs(env_cfg)
    if sim.name == "gpu":
        return ManiSkillGPUEnv(env_cfg.id, kw, num_envs, device, limit, imports, seed)
    return ManiSkillCPUEnv(
        env_cfg.id,
        kw,
        num_envs,
        limit,
        imports,
        seed,
        vectorization=env_cfg.cpu_vectorization,
        context=env_cfg.async_context,
    )
