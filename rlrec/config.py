"""Typed schemas for every config group, registered in Hydra's ConfigStore.

The dataclasses below hold every default value, once. The YAML files under ``conf/`` each start
from one of these schemas (``defaults: [/schema/<group>/<name>@_here_]``) and set only what their
option changes (``sim/gpu.yaml``: ``device: cuda``), so unknown keys, wrong types and values outside
a closed choice (each an :class:`enum.Enum`) are rejected by OmegaConf while composing. Value checks
that a type cannot express (positive counts, env_idx in range, ...) live in :func:`validate`, which
runs once, before any env is built, and creates nothing. The runner only ever sees the dataclasses
returned by :func:`to_dataclass`.
"""

from __future__ import annotations

import enum
import math
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value is invalid. The message names the key and what is allowed."""


class Choice(str, enum.Enum):
    """A closed choice: compares equal to, and prints as, its string value (like 3.11's StrEnum)."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> List[str]:
        return [m.value for m in cls]


Vectorization = Choice("Vectorization", {"sync": "sync", "async": "async"}, module=__name__)
Vectorization.__doc__ = (
    "How an adapter runs CPU sub-envs: in this process, or one worker process each."
)

StartMethod = Choice(
    "StartMethod", {"fork": "fork", "spawn": "spawn", "forkserver": "forkserver"}, module=__name__
)
StartMethod.__doc__ = "multiprocessing start method of async vector envs."


class SimName(Choice):
    """Where the simulator runs."""

    cpu = "cpu"
    gpu = "gpu"


class Activation(Choice):
    """Hidden-layer activation of the policy and value MLPs."""

    tanh = "tanh"
    relu = "relu"
    elu = "elu"


class BootstrapAt(Choice):
    """Which episode ends PPO bootstraps from ``V(final_obs)`` (every other end adds nothing).
    ``truncated``: time-outs only; a termination is a true end (a fall, a crash) worth no future.
    ``done``: every end, termination included, as ManiSkill's PPO baselines do (their tasks
    terminate on success, and a success is then worth its reward plus the value of the state it
    reached, not less than lingering beside the goal). docs/maniskill.md says when to use which."""

    truncated = "truncated"
    done = "done"


class KLCheck(Choice):
    """When ``algo.target_kl`` is checked. ``epoch``: after each epoch, on its last minibatch's KL
    (CleanRL; one device sync per epoch). ``minibatch``: before each minibatch's optimizer step,
    which that minibatch then skips (ManiSkill's ppo.py; one device sync per minibatch)."""

    epoch = "epoch"
    minibatch = "minibatch"


class LoggerName(Choice):
    """Where metrics go besides metrics.jsonl and the console."""

    tensorboard = "tensorboard"
    wandb = "wandb"
    none = "none"


class WandbMode(Choice):
    offline = "offline"
    online = "online"
    disabled = "disabled"


OnError = Choice("OnError", {"warn": "warn", "raise": "raise"}, module=__name__)
OnError.__doc__ = (
    "What an encoder failure does: log once and train on (warn), or stop the run (raise)."
)


class X264Preset(Choice):
    """x264's speed/size trade-off: slower presets make smaller files for more encoder CPU."""

    ultrafast = "ultrafast"
    superfast = "superfast"
    veryfast = "veryfast"
    faster = "faster"
    fast = "fast"
    medium = "medium"
    slow = "slow"
    slower = "slower"
    veryslow = "veryslow"


class Backend(Choice):
    """torch.distributed backend: ``auto`` is NCCL when the policy is on CUDA, else gloo."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class ObsMode(Choice):
    """ManiSkill observation modes rlrec supports (a flat state vector)."""

    state = "state"


# --------------------------------------------------------------------------- env


@dataclass
class EnvConfig:
    """Fields every env backend understands."""

    name: str = MISSING
    # envs per stack (per rank on several ranks; the eval stack has its own: eval_env.num_envs)
    num_envs: int = 64
    max_episode_steps: Optional[int] = None  # None: the backend's own time limit
    render_width: int = 128
    render_height: int = 128


@dataclass
class BuiltinEnvConfig(EnvConfig):
    """rlrec's own point-mass reaching task (``rlrec.envs.builtin``)."""

    name: str = "builtin"
    max_episode_steps: Optional[int] = 100
    goal_radius: float = 0.1
    dt: float = 0.05


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


# --------------------------------------------------------------------------- sim


@dataclass
class SimConfig:
    """Where the simulator runs: ``cpu`` or ``gpu`` (CUDA)."""

    name: SimName = SimName.cpu
    device: str = "cpu"  # torch device of the env's tensors and of the policy


# --------------------------------------------------------------------------- recorder


class Trigger(Choice):
    """When a clip starts. ``eval``: the first episode after each full reset."""

    cubic = "cubic"
    episode = "episode"
    step = "step"
    always = "always"
    eval = "eval"
    none = "none"


@dataclass
class RecorderConfig:
    """One recorder: which env, when, how long, how encoded."""

    enabled: bool = True
    trigger: Trigger = Trigger.cubic  # exactly one trigger
    every: Optional[int] = None  # N for trigger=episode (episodes) or trigger=step (env steps)
    length_frames: Optional[int] = None  # clip length in frames, or
    length_sec: Optional[float] = None  # in seconds of sim time; both None: the whole episode
    # None: 1 / env dt; a frame every max(1, round(1 / (fps * dt))) steps
    fps: Optional[float] = None
    env_idx: List[int] = field(default_factory=lambda: [0])  # several: tiled into a grid
    overlay: bool = False  # episode, step, reward, success drawn on the frames
    # a fixed name replaced atomically by each clip; None: one file per clip
    filename: Optional[str] = None
    dir: Optional[str] = None  # None: the run's video dir (<run dir>/videos/train or /eval)
    record_final_episode: bool = (
        True  # close() (exit, exception, Ctrl-C, SIGTERM) saves the clip in progress
    )
    queue_size: int = 64  # frame buffers in flight between the training thread and the encoder
    # seconds a hung ffmpeg may stall training: then its clip is dropped and training goes on
    stall_timeout_sec: float = 10.0
    quality: int = 7  # 1..10 (imageio's scale; 7 = x264 crf 15)
    preset: X264Preset = X264Preset.ultrafast  # the encoder's CPU time against the file's size
    lossless: bool = False  # exact RGB (libx264rgb, qp 0): pixel-exact, fewer players
    on_error: OnError = OnError.warn  # warn: log once, training goes on | raise: fatal


# --------------------------------------------------------------------------- eval env


@dataclass
class EvalEnvConfig:
    """How the evaluation stack differs from the collection stack."""

    enabled: bool = True
    num_envs: int = 16
    seed: int = 1_000_000
    every: int = 10  # PPO iterations between evaluations (and always at the end)
    episodes: Optional[int] = None  # None: one episode per eval env
    deterministic: bool = True
    recorder: RecorderConfig = field(
        default_factory=lambda: RecorderConfig(trigger=Trigger.eval, record_final_episode=False)
    )


# --------------------------------------------------------------------------- algo


@dataclass
class PPOConfig:
    """PPO hyper-parameters (CleanRL names)."""

    name: str = "ppo"
    num_steps: int = 32  # rollout length per env
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    anneal_clip: bool = False  # clip range annealed with the learning rate (SB3's lin_0.2)
    clip_vloss: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: Optional[float] = 0.1
    kl_check: KLCheck = KLCheck.epoch  # epoch | minibatch (ManiSkill's: before each step)
    # which episode ends add gamma * V(final_obs): truncated (time-outs) | done (every end)
    bootstrap_at: BootstrapAt = BootstrapAt.truncated
    norm_obs: bool = True
    reward_scale: float = 1.0
    hidden_sizes: List[int] = field(default_factory=lambda: [64, 64])
    init_log_std: float = 0.0
    activation: Activation = Activation.tanh
    # torch.compile of the policy step and of the update step (CUDA graphs on CUDA); docs/gpu.md
    compile: bool = False


# --------------------------------------------------------------------------- logger


@dataclass
class LoggerConfig:
    """Console, metrics file, TensorBoard, optional W&B."""

    name: LoggerName = LoggerName.tensorboard  # metrics.jsonl and the console are always written
    progress: bool = True
    log_every: int = 1  # iterations between train log lines
    wandb_project: str = "rlrec"
    wandb_entity: Optional[str] = None
    wandb_mode: WandbMode = WandbMode.offline  # offline works without a network


# --------------------------------------------------------------------------- distributed


@dataclass
class DistributedConfig:
    """Data-parallel training on several processes (``torchrun``, or SLURM through submitit;
    docs/distributed.md). With one process these keys change nothing."""

    backend: Backend = Backend.auto  # auto: nccl on CUDA, gloo on CPU
    # seconds a collective (or the start-up rendezvous) waits for the other ranks before the run
    # fails: longer than the slowest evaluation + checkpoint, which only rank 0 runs
    timeout_sec: float = 600.0
    share_gpus: bool = False  # sim=gpu: let several local ranks share a GPU (else refused)


# --------------------------------------------------------------------------- top level


@dataclass
class Config:
    """The whole run. ``checkpoint=PATH`` resumes, ``eval_only=true`` evaluates it."""

    env: Any = MISSING
    sim: SimConfig = MISSING
    eval_env: EvalEnvConfig = MISSING
    recorder: RecorderConfig = MISSING
    algo: PPOConfig = MISSING
    logger: LoggerConfig = MISSING
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 1
    total_steps: int = 200_000
    checkpoint: Optional[str] = None
    resume: Optional[str] = None  # "auto": newest checkpoint of this run dir
    eval_only: bool = False
    checkpoint_every: int = 20  # iterations between periodic checkpoints
    torch_threads: Optional[int] = (
        1  # None: torch's default (all cores); docs/architecture.md says why 1
    )


ENV_SCHEMAS = {
    "builtin": BuiltinEnvConfig,
    "gymnasium": GymnasiumEnvConfig,
    "maniskill": ManiSkillEnvConfig,
    "genesis": GenesisEnvConfig,
}


def register_configs() -> None:
    """Register every schema under ``schema/`` so ``conf/**.yaml`` can extend them
    (``defaults: [/schema/<group>/<name>@_here_]``) without listing them as group options."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="config", node=Config)
    for name, schema in ENV_SCHEMAS.items():
        cs.store(group="schema/env", name=name, node=schema)
    cs.store(group="schema/sim", name="sim", node=SimConfig)
    cs.store(group="schema/eval_env", name="eval_env", node=EvalEnvConfig)
    cs.store(group="schema/recorder", name="recorder", node=RecorderConfig)
    cs.store(group="schema/algo", name="ppo", node=PPOConfig)
    cs.store(group="schema/logger", name="logger", node=LoggerConfig)
    cs.store(group="schema/distributed", name="distributed", node=DistributedConfig)


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Range:
    """The values a float field allows: always a finite number, within ``low``/``high`` where
    given (``*_open``: the bound itself excluded). NaN and infinity mean nothing in any field."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"a finite number in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"a finite number {'<' if self.high_open else '<='} {self.high:g}"
        return "a finite number"


POSITIVE = Range(low=0.0, low_open=True)
NON_NEGATIVE = Range(low=0.0)
UNIT = Range(low=0.0, high=1.0)
# seconds, bounded where they become a clip length, a timeout or a timedelta: a day is far beyond
# any use, and 1e308 would overflow those (int(inf), threading's and timedelta's limits)
SECONDS = Range(low=0.0, low_open=True, high=86_400.0)

# The range of every float field of every schema (tests/test_config.py fails on a float field
# missing here). One generic check (check_floats) applies them, with one message format.
FLOAT_RANGES: Dict[type, Dict[str, Range]] = {
    BuiltinEnvConfig: {"goal_radius": POSITIVE, "dt": POSITIVE},
    RecorderConfig: {"length_sec": SECONDS, "fps": POSITIVE, "stall_timeout_sec": SECONDS},
    PPOConfig: {
        "learning_rate": POSITIVE,
        "gamma": UNIT,
        "gae_lambda": UNIT,
        "clip_coef": POSITIVE,
        "ent_coef": NON_NEGATIVE,
        "vf_coef": NON_NEGATIVE,
        "max_grad_norm": POSITIVE,
        "target_kl": POSITIVE,
        "reward_scale": POSITIVE,
        # the initial std is exp(init_log_std): beyond +-20 it is 0 or overflows in float32 math
        "init_log_std": Range(low=-20.0, high=20.0),
    },
    DistributedConfig: {"timeout_sec": SECONDS},
}


def float_fields(cls: type) -> Iterator[Tuple[str, bool]]:
    """``(name, nullable)`` of each field of dataclass ``cls`` typed ``float`` or
    ``Optional[float]``."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        hint, nullable = hints[f.name], False
        if typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            nullable = len(args) < len(typing.get_args(hint))
            hint = args[0] if len(args) == 1 else None
        if hint is float:
            yield f.name, nullable


def float_range(cls: type, name: str) -> Range:
    """The range of float field ``name`` of ``cls`` (a subclass inherits its bases' ranges)."""
    for klass in cls.__mro__:
        if name in FLOAT_RANGES.get(klass, {}):
            return FLOAT_RANGES[klass][name]
    return Range()


def check_floats(obj: Any, prefix: str = "") -> None:
    """Every float field of dataclass ``obj`` and of the dataclasses it holds is a finite number
    in its range (``FLOAT_RANGES``); ConfigError naming the key and the range otherwise."""
    if not is_dataclass(obj):
        return
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            check_floats(value, f"{prefix}{f.name}.")
    for name, nullable in float_fields(type(obj)):
        value = getattr(obj, name)
        if value is None and nullable:
            continue
        allowed = float_range(type(obj), name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or value not in allowed:
            rule = f"{allowed} or null" if nullable else str(allowed)
            raise ConfigError(f"{prefix}{name}={value!r} is invalid: must be {rule}")


SEED_MAX = 2**32 - 1  # NumPy's seeds are 32-bit


def check_seed(value: Any, key: str, num_envs: int, count_key: str) -> None:
    """Env i of a stack is seeded ``seed + i``: every one of them must be a seed NumPy takes."""
    high = SEED_MAX - (num_envs - 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ConfigError(
            f"{key}={value!r} is invalid: must be an integer in [0, {high}] (env i is seeded "
            f"{key} + i for each of the {count_key}={num_envs} envs, and seeds are 32-bit)"
        )


DEVICE_TYPES = ("cpu", "cuda")


def check_device(value: Any, key: str = "sim.device") -> None:
    """``cpu``, ``cuda`` or ``cuda:N``, parsed by ``torch.device`` (torch is imported here only:
    the checks above it stay fast)."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if (
        device is None
        or device.type not in DEVICE_TYPES
        or (device.type == "cpu" and device.index is not None)
    ):
        raise ConfigError(
            f"{key}={value!r} is invalid: allowed values are cpu, cuda, cuda:N (N: a GPU index)"
        )


def check_keys(cfg: DictConfig) -> None:
    """Every key of a composed config is declared by its schema. Hydra's ``+key=value`` adds a
    key even to a struct config (it merges with ``force_add``), and ``OmegaConf.to_object`` keeps
    such a key as a stray attribute, so a mistyped ``+evn=gymnasium`` would be ignored. Free-form
    fields (``env.kwargs``) are not schemas and take any key."""

    def walk(node: DictConfig, prefix: str) -> None:
        schema = OmegaConf.get_type(node)
        if not is_dataclass(schema):
            return
        allowed = [f.name for f in fields(schema)]
        for key in node.keys():
            if key in allowed or (not prefix and key == "hydra"):
                continue
            where = f"{prefix.rstrip('.')} ({schema.__name__})" if prefix else "the top level"
            extra = " (+experiment=NAME adds a preset)" if not prefix else ""
            raise ConfigError(
                f"{prefix}{key} is not a config key: allowed keys at {where} are "
                f"{', '.join(allowed)}{extra}"
            )
        for key in allowed:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                walk(child, f"{prefix}{key}.")

    walk(cfg, "")


def _positive(value: Any, key: str, *, allow_none: bool = False, strict: bool = True) -> None:
    if value is None and allow_none:
        return
    bad = value is None or (value <= 0 if strict else value < 0)
    if bad:
        rule = "a positive number" if strict else "a number >= 0"
        if allow_none:
            rule += " or null"
        raise ConfigError(f"{key}={value!r} is invalid: must be {rule}")


def _choice(value: Any, key: str, allowed: List[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(allowed)}")


def choice(obj: Any, attr: str, kind: type, key: str, allow_none: bool = False) -> None:
    """Turns ``obj.attr`` into its :class:`Choice` member; ConfigError listing the allowed values.
    (Hydra already refuses bad values while composing; this covers dataclasses built in code.)"""
    value = getattr(obj, attr)
    if value is None and allow_none:
        return
    try:
        setattr(obj, attr, kind(value))
    except ValueError:
        allowed = kind.values() + (["null"] if allow_none else [])
        _choice(value, key, allowed)


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_dir(path: str, key: str) -> None:
    """ConfigError naming ``key`` unless ``path`` is, or can be created as, a writable directory.
    Looks only (permissions of the nearest existing ancestor): creates nothing."""
    target = Path(path).absolute()
    base = nearest_existing(target)
    if not base.is_dir():
        raise ConfigError(
            f"{key}={path!r} cannot be used as a directory: {base} is not a directory"
        )
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={path!r} cannot be used as a directory: {base} is not writable")


def validate_recorder(rec: RecorderConfig, key: str, num_envs: int) -> None:
    """Checks one recorder's settings against the env it will wrap."""
    _positive(rec.every, f"{key}.every", allow_none=True)
    _positive(rec.length_frames, f"{key}.length_frames", allow_none=True)
    check_floats(rec, f"{key}.")  # length_sec, fps
    _positive(rec.queue_size, f"{key}.queue_size")
    if not 1 <= rec.quality <= 10:
        raise ConfigError(f"{key}.quality={rec.quality!r} is invalid: must be in 1..10")
    choice(rec, "preset", X264Preset, f"{key}.preset")
    choice(rec, "on_error", OnError, f"{key}.on_error")
    if rec.length_frames is not None and rec.length_sec is not None:
        raise ConfigError(
            f"{key}.length_frames and {key}.length_sec are both set: give at most one clip length"
        )
    choice(rec, "trigger", Trigger, f"{key}.trigger")
    trigger = rec.trigger
    if trigger in (Trigger.episode, Trigger.step) and rec.every is None:
        raise ConfigError(f"{key}.trigger={trigger.value} needs {key}.every (a positive count)")
    if trigger not in (Trigger.episode, Trigger.step) and rec.every is not None:
        raise ConfigError(
            f"{key}.every={rec.every} is set but {key}.trigger={trigger.value}: a recorder has "
            f"exactly one trigger; use {key}.trigger=episode or {key}.trigger=step with every"
        )
    if not rec.env_idx:
        raise ConfigError(f"{key}.env_idx is empty: give at least one env index")
    for i in rec.env_idx:
        if not 0 <= i < num_envs:
            raise ConfigError(
                f"{key}.env_idx={list(rec.env_idx)} is invalid: each index must be in "
                f"[0, {num_envs - 1}] (num_envs={num_envs})"
            )
    if len(set(rec.env_idx)) != len(rec.env_idx):
        raise ConfigError(f"{key}.env_idx={list(rec.env_idx)} repeats an index")
    name = rec.filename
    if name is not None:
        # ffmpeg is handed file: and an absolute path, so this is about what the name means: one
        # visible file in the video dir (".mp4" is appended when missing), with room for the
        # temporary name beside it (.NAME.PID-N.part) under the 255-byte limit
        rule = (
            "must be a plain file name (no '/', not starting with '.', '-' or a space, at most "
            "200 bytes), e.g. latest.mp4; .mp4 is appended when missing"
        )
        bad = not isinstance(name, str) or not name.strip() or name != name.strip()
        bad = bad or "/" in name or "\0" in name or name.startswith((".", "-"))
        if bad or len(name.encode()) + (0 if name.lower().endswith(".mp4") else 4) > 200:
            raise ConfigError(f"{key}.filename={name!r} is invalid: {rule}")
    if rec.dir:
        # a URL-like prefix (pipe:, file:, s3://...) is refused rather than taken as a directory
        # of that name: ffmpeg would read it as a protocol, and a user probably meant one
        import re

        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", rec.dir)  # ffmpeg's idea of a protocol
        if scheme:
            raise ConfigError(
                f"{key}.dir={rec.dir!r} is invalid: {scheme.group()} reads as a protocol (URL), "
                f"and the recorder writes local files only; give a directory path "
                f"(./{rec.dir} for a directory of that name)"
            )
    if rec.enabled and trigger is not Trigger.none and rec.dir:
        check_dir(rec.dir, f"{key}.dir")


def validate(cfg: Config) -> None:
    """Value checks that types cannot express. Raises :class:`ConfigError` naming the key."""
    env = cfg.env
    _choice(env.name, "env.name", list(ENV_SCHEMAS))
    check_floats(cfg)  # every float of every schema: finite and in its range
    _positive(env.num_envs, "env.num_envs")
    _positive(env.max_episode_steps, "env.max_episode_steps", allow_none=True)
    _positive(env.render_width, "env.render_width")
    _positive(env.render_height, "env.render_height")
    choice(cfg.sim, "name", SimName, "sim.name")
    _positive(cfg.total_steps, "total_steps")
    _positive(cfg.checkpoint_every, "checkpoint_every")
    _positive(cfg.torch_threads, "torch_threads", allow_none=True)
    if cfg.resume not in (None, "auto"):
        raise ConfigError(f"resume={cfg.resume!r} is invalid: allowed values are auto, null")
    if cfg.checkpoint is not None and cfg.resume is not None:
        raise ConfigError("checkpoint and resume are both set: give one of them")
    check_seed(cfg.seed, "seed", env.num_envs, "env.num_envs")
    ev = cfg.eval_env
    _positive(ev.num_envs, "eval_env.num_envs")
    check_seed(ev.seed, "eval_env.seed", ev.num_envs, "eval_env.num_envs")
    _positive(ev.every, "eval_env.every")
    _positive(ev.episodes, "eval_env.episodes", allow_none=True)
    a = cfg.algo
    for k in ("num_steps", "num_minibatches", "update_epochs"):
        _positive(getattr(a, k), f"algo.{k}")
    if (env.num_envs * a.num_steps) % a.num_minibatches:
        raise ConfigError(
            f"algo.num_minibatches={a.num_minibatches} must divide env.num_envs * algo.num_steps "
            f"= {env.num_envs * a.num_steps}"
        )
    choice(a, "activation", Activation, "algo.activation")
    choice(a, "kl_check", KLCheck, "algo.kl_check")
    choice(a, "bootstrap_at", BootstrapAt, "algo.bootstrap_at")
    if not a.hidden_sizes or any(h <= 0 for h in a.hidden_sizes):
        raise ConfigError(f"algo.hidden_sizes={list(a.hidden_sizes)} must be positive sizes")
    choice(cfg.logger, "name", LoggerName, "logger.name")
    choice(cfg.logger, "wandb_mode", WandbMode, "logger.wandb_mode")
    _positive(cfg.logger.log_every, "logger.log_every")
    choice(cfg.distributed, "backend", Backend, "distributed.backend")
    validate_recorder(cfg.recorder, "recorder", env.num_envs)
    validate_recorder(ev.recorder, "eval_env.recorder", ev.num_envs)
    check_device(cfg.sim.device)  # last: it imports torch
    if cfg.sim.name == SimName.gpu and str(cfg.sim.device).strip().startswith("cpu"):
        raise ConfigError(
            f"sim.name=gpu with sim.device={cfg.sim.device}: a GPU simulator keeps its tensors on "
            "CUDA; use sim=gpu (sim.device=cuda or cuda:N), or sim=cpu"
        )


def to_dataclass(cfg: DictConfig) -> Config:
    """Resolves a composed Hydra config into :class:`Config` (once, before the loop) and validates
    it."""
    check_keys(cfg)  # before to_object, which would keep a stray key as an attribute
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, dict):  # composed without the top-level schema (e.g. a bare compose())
        obj = Config(**{k: v for k, v in obj.items() if k != "hydra"})
    assert is_dataclass(obj)
    validate(obj)
    return obj


def to_container(obj: Any) -> Any:
    """Plain dict/list view of a config dataclass (for checkpoints and logs)."""
    if is_dataclass(obj):
        return {f.name: to_container(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_container(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_container(v) for k, v in obj.items()}
    return obj
