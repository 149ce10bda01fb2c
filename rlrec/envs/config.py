"""The env's and the sim's settings: the fields every backend understands (:class:`EnvConfig`),
each backend's schema, which extends it (:data:`BACKENDS`), the choices of the backends, and where
the simulator runs (the ``sim`` group). Plain Python: composing a config imports no backend, no
torch and no simulator (each backend's module, ``rlrec.envs.<name>``, builds its envs)."""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Type

from rlrec.checks import POSITIVE, Choice, ConfigError, check_choices, positive

# how an adapter runs CPU sub-envs: in this process, or one worker process each
Vectorization = Choice("Vectorization", "sync async", module=__name__)
# the multiprocessing start method of async vector envs
StartMethod = Choice("StartMethod", "fork spawn forkserver", module=__name__)
# the start methods of async CPU envs that SAPIEN survives (``fork`` hangs: its render device
# does not survive a fork)
SapienStartMethod = Choice("SapienStartMethod", "spawn forkserver", module=__name__)


# what an env observes (rlrec/obs.py): ``state`` one float vector; ``rgb`` its camera image
# (uint8, ``env.obs_height x env.obs_width``); ``rgb_state`` the image and the robot's own state
# (ppo_rgb.py's ``--include-state``)
ObsMode = Choice("ObsMode", "state rgb rgb_state", module=__name__)
SimName = Choice("SimName", "cpu gpu", module=__name__)  # where the simulator runs


@dataclass
class EnvConfig:
    """Fields every env backend understands. A backend's schema extends it; its ``name`` default
    is the backend's name (``env=<name>``, ``conf/env/<name>.yaml``)."""

    name: str = "???"  # OmegaConf's MISSING: each backend's schema gives its own
    # envs per stack (per rank on several ranks; the eval stack has its own: eval_env.num_envs)
    num_envs: int = 64
    max_episode_steps: Optional[int] = None  # None: the backend's own time limit
    render_width: int = 128
    render_height: int = 128
    # state (a flat float vector) | rgb (a camera image, uint8 at obs_height x obs_width) |
    # rgb_state (both): rlrec/obs.py; every backend observes each of them
    obs_mode: ObsMode = ObsMode.state
    obs_width: int = 64
    obs_height: int = 64

    def __post_init__(self) -> None:
        # a closed choice (an Enum field) is refused here when the schema is built in code, as
        # Hydra refuses it while composing: the backends never see a value outside it
        check_choices(self, "env.")

    def frame_size(self) -> Optional[Tuple[int, int]]:
        """``(height, width)`` of this env's frames, or None where the env chooses its own size
        (the memory estimate sizes the recorder's frame buffers with it)."""
        return (self.render_height, self.render_width)

    def obs_image(self) -> Optional[Tuple[int, int, int]]:
        """``(height, width, channels)`` of the image this env observes, or None (state only):
        the memory estimate and the encoder's checks read it before the env is built."""
        return None if self.obs_mode == ObsMode.state else (self.obs_height, self.obs_width, 3)


@dataclass
class SimConfig:
    """Where the simulator runs: ``cpu`` or ``gpu`` (CUDA)."""

    name: SimName = SimName.cpu
    device: str = "cpu"  # torch device of the env's tensors and of the policy


@dataclass
class BuiltinEnvConfig(EnvConfig):
    """rlrec's own point-mass reaching task (``rlrec.envs.builtin``)."""

    # the range of each float field, applied by rlrec.checks.check_fields (not a field)
    FLOAT_RANGES = {"goal_radius": POSITIVE, "dt": POSITIVE}

    name: str = "builtin"
    max_episode_steps: Optional[int] = 100
    goal_radius: float = 0.1
    dt: float = 0.05
    # state: position, velocity, goal minus position; rgb: the env's own image; rgb_state: the
    # image, and the agent's position and velocity (the goal is only in the image)


@dataclass
class GymnasiumEnvConfig(EnvConfig):
    """Any registered gymnasium id, vectorized with gymnasium's vector API."""

    name: str = "gymnasium"
    num_envs: int = 8
    id: str = "CartPole-v1"  # a registered id, or MODULE:ID to import the module that registers it
    # max_episode_steps None: the id's own TimeLimit (CartPole-v1: 500, Pendulum-v1: 200)
    vectorization: Vectorization = Vectorization.sync  # sync: one process | async: a worker per env
    async_context: Optional[StartMethod] = None  # async only: start method (None: the platform's)
    resize_frames: bool = False  # true: render_height x render_width frames (false: the env's size)
    kwargs: Any = field(default_factory=dict)  # passed to gymnasium.make (+env.kwargs.g=9.81)
    # the last N observed images, joined on the channel axis (an image env, or obs_mode rgb*)
    frame_stack: int = 1
    # state: the env's own observation (an image when its space is a Box of uint8 HxWxC); rgb:
    # its rendered frame; rgb_state: both (gymnasium's AddRenderObservation); docs/gymnasium.md

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self.frame_stack, "env.frame_stack")

    def frame_size(self) -> Optional[Tuple[int, int]]:
        return super().frame_size() if self.resize_frames else None

    def obs_image(self) -> Optional[Tuple[int, int, int]]:
        """A rendered frame has 3 channels; with ``obs_mode=state`` the env's own observation is
        an image or not (:func:`own_channels`)."""
        channels = 3 if self.obs_mode != ObsMode.state else own_channels(self.id, self.kwargs)
        if channels is None and self.frame_stack > 1:
            raise ConfigError(
                f"env.frame_stack={self.frame_stack} stacks images, but env.id={self.id!r} "
                "observes a flat state vector: set env.obs_mode=rgb or rgb_state, or "
                "env.frame_stack=1"
            )
        if channels is None:
            return None
        return (self.obs_height, self.obs_width, channels * self.frame_stack)


def is_image(space) -> bool:
    """Whether an observation space is an image: a Box of uint8, HxWxC (rlrec/obs.py)."""
    import gymnasium as gym

    return isinstance(space, gym.spaces.Box) and space.dtype == "uint8" and len(space.shape) == 3


_OWN_CHANNELS: Dict[str, Optional[int]] = {}  # own_channels' answers, by id and kwargs


class EnvNotBuilt(ConfigError):
    """An env built to read its space before work could not be built (the backend's own check
    before work names why: ``rlrec.config.validate`` asks it first)."""


def own_channels(env_id: str, kwargs: Any) -> Optional[int]:
    """The channels of gymnasium env ``env_id``'s own observation where it is an image, else
    None: read from one env built without rendering (gymnasium sets an env's space when it builds
    it), once per id and kwargs in a process, before any work; :class:`EnvNotBuilt` when it
    cannot be built."""
    key = repr((env_id, dict(kwargs or {})))
    if key not in _OWN_CHANNELS:
        try:  # gymnasium's own MODULE:ID imports MODULE
            probe = gym_make(env_id, disable_env_checker=True, **dict(kwargs or {}))
        except Exception as err:  # noqa: BLE001 (named in the refusal)
            raise EnvNotBuilt(f"env.id={env_id!r} cannot be built: {err}") from err
        space = probe.observation_space
        probe.close()
        _OWN_CHANNELS[key] = int(space.shape[-1]) if is_image(space) else None
    return _OWN_CHANNELS[key]


def gym_make(env_id: str, **kwargs: Any):
    """``gymnasium.make(env_id, **kwargs)``, with MuJoCo's warnings (e.g. a deprecated attribute
    of the model) in rlrec's log: MuJoCo writes them to ``MUJOCO_LOG.TXT`` in the working directory
    unless the program installs its own handler, so once the env's module has imported mujoco (a
    MuJoCo env), rlrec installs one where none is. Another env never imports mujoco."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if module:  # MODULE:ID: importing MODULE registers ID
        importlib.import_module(module)
    spec = gym.registry.get(name)  # (gym.make says what is wrong with an id that is not there)
    if spec is not None and isinstance(spec.entry_point, str):  # the env's module, imported first
        gym.envs.registration.load_env_creator(spec.entry_point)
    mujoco = sys.modules.get("mujoco")
    if mujoco is not None and mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)
    return gym.make(env_id, **kwargs)


def _mujoco_warning(text: str) -> None:
    logging.getLogger(__name__).warning("MuJoCo: %s", text.strip())


@dataclass
class ManiSkillEnvConfig(EnvConfig):
    """A ManiSkill3 task; ``sim=gpu`` runs one batched physx_cuda env."""

    name: str = "maniskill"
    num_envs: int = 8  # sim=gpu: raise it (env.num_envs=512)
    id: str = "PushCube-v1"  # any registered ManiSkill id whose assets are on disk
    control_mode: str = "pd_joint_delta_pos"
    reward_mode: str = "normalized_dense"
    max_episode_steps: Optional[int] = 50  # None: the env's registered limit
    imports: List[str] = field(default_factory=list)  # modules that register envs, imported first
    cpu_vectorization: Vectorization = Vectorization.sync  # sim=cpu: sync | async
    async_context: SapienStartMethod = SapienStartMethod.spawn  # async only
    kwargs: Any = field(default_factory=dict)  # extra keyword arguments of the ManiSkill env class
    # rgb: the sensor cameras' images at obs_height x obs_width, joined on the channel axis
    # (PushCube-v1: one camera); rgb_state: and the robot's state (ppo_rgb.py's --include-state)


@dataclass
class GenesisEnvConfig(EnvConfig):
    """A batched Genesis scene, built from ``_target_``."""

    name: str = "genesis"
    num_envs: int = 16
    _target_: str = "rlrec.envs.genesis_tasks.FrankaReach"  # the env class (docs/genesis.md)
    camera_attr: Optional[str] = (
        "camera"  # the env's attribute holding its camera (None: no camera)
    )
    # max_episode_steps None: the env's own (FrankaReach: 100 steps = 2 s)
    kwargs: Any = field(default_factory=dict)  # keyword arguments of the env class
    # rgb: every env's camera image (resized), rgb_state: and the env's observation (genesis.py)

    def __post_init__(self) -> None:
        super().__post_init__()
        drawn = (self.kwargs or {}).get("rendered_envs_idx")  # rlrec's own tasks' key
        if self.obs_mode != ObsMode.state and (self.camera_attr is None or drawn is not None):
            why = f"env.kwargs.rendered_envs_idx={drawn} draws only those envs"
            if self.camera_attr is None:
                why = "env.camera_attr=null: no camera"
            raise ConfigError(
                f"env.obs_mode={self.obs_mode.value} observes every env's camera image, but {why}: "
                "set env.camera_attr to the env's camera and env.kwargs.rendered_envs_idx=null "
                "(every env drawn), or env.obs_mode=state"
            )


# env group option -> its schema (Hydra's schema/env/<name>); the backend is the module
# rlrec.envs.<name> (rlrec.envs.factory.backend_module)
BACKENDS: Dict[str, Type[EnvConfig]] = {
    "builtin": BuiltinEnvConfig,
    "gymnasium": GymnasiumEnvConfig,
    "maniskill": ManiSkillEnvConfig,
    "genesis": GenesisEnvConfig,
}
