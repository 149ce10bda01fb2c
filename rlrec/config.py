"""The run's config: the root schema assembled from the components' own schemas, registered in
Hydra's ConfigStore, resolved into dataclasses once and checked across components.

Each component owns its schema and its defaults (``rlrec.record.settings.RecorderConfig``,
``rlrec.ppo.config.PPOConfig``, ``rlrec.envs.config`` (the env and sim schemas, each backend's
in ``BACKENDS``), ``rlrec.distributed.DistributedConfig``, ``rlrec.report.config.ReportConfig``);
the run's own groups (eval env, logger) and the top level live here. The dataclasses hold every
default value, once. The YAML files under ``conf/`` each start
from one of these schemas (``defaults: [/schema/<group>/<name>@_here_]``) and set only what their
option changes (``sim/gpu.yaml``: ``device: cuda``), so unknown keys, wrong types and values outside
a closed choice (each an :class:`enum.Enum`) are rejected by OmegaConf while composing. Value checks
that a type cannot express (positive counts, env_idx in range, ...) live in :func:`validate`, which
runs once, before any env is built, and creates nothing. The runner only ever sees the dataclasses
returned by :func:`to_dataclass`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, is_dataclass
from operator import attrgetter
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from rlrec.checks import (
    SECONDS,
    Choice,
    ConfigError,
    check_device,
    check_fields,
    check_seed,
    did_you_mean,
    one_of,
    positive,
)
from rlrec.distributed import DistributedConfig
from rlrec.envs.config import BACKENDS, EnvNotBuilt, SimConfig
from rlrec.ppo.config import PPOConfig, check_encoder
from rlrec.record.settings import RecorderConfig, Trigger, check_view
from rlrec.report.config import ReportConfig

# where metrics go besides metrics.jsonl and the console
LoggerName = Choice("LoggerName", "tensorboard wandb none", module=__name__)
WandbMode = Choice("WandbMode", "offline online disabled", module=__name__)


# --------------------------------------------------------------------------- eval env


class KeptClips(Choice):
    """Which eval episodes get a clip of their own (``eval-stepSTEP-envENV.mp4``): every eval
    env's first episode of an evaluation is recorded, and these are kept."""

    none = "none"  # no per-episode clips (the evaluation's one clip of eval_env.recorder stays)
    all = "all"
    failed = "failed"  # the episodes that did not succeed (every episode, where no success)
    worst = "worst"  # the eval_env.clips_k lowest returns
    best = "best"  # the eval_env.clips_k highest returns


@dataclass
class EvalEnvConfig:
    """How the evaluation stack differs from the collection stack."""

    enabled: bool = True
    num_envs: int = 16
    seed: int = 1_000_000
    every: int = 10  # PPO iterations between evaluations (and always at the end)
    episodes: Optional[int] = None  # None: one episode per eval env
    deterministic: bool = True
    at_start: bool = True  # one evaluation before training (step 0): the untrained policy
    # per-episode clips, kept as chosen (eval_env.recorder's settings, one clip per eval env)
    clips: KeptClips = KeptClips.none
    clips_k: int = 3  # clips=worst / best: how many
    recorder: RecorderConfig = field(
        default_factory=lambda: RecorderConfig(trigger=Trigger.eval, record_final_episode=False)
    )


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
    # without a terminal (a job's log, nohup, CI), progress=true prints a status line instead of
    # the bar: at most this often, and after each evaluation
    status_every_sec: float = 30.0

    FLOAT_RANGES = {"status_every_sec": SECONDS}


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
    report: ReportConfig = field(default_factory=ReportConfig)  # report.html at the end
    seed: int = 1
    total_steps: int = 200_000
    checkpoint: Optional[str] = None
    resume: Optional[str] = None  # "auto": newest checkpoint of this run dir
    eval_only: bool = False
    checkpoint_every: int = 20  # iterations between periodic checkpoints
    # periodic checkpoints kept, the newest (the older ones of this run are removed once a new one
    # is on disk); 0 keeps all. 1 is refused: resume=auto could fall back to none
    checkpoint_keep: int = 0
    # None: torch's default (all cores); docs/architecture.md says why 1
    torch_threads: Optional[int] = 1


def register_configs() -> None:
    """Register every schema under ``schema/`` so ``conf/**.yaml`` can extend them
    (``defaults: [/schema/<group>/<name>@_here_]``) without listing them as group options."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="config", node=Config)
    cs.store(group="schema/algo", name="ppo", node=PPOConfig)
    for name, node in BACKENDS.items():  # the env backends' schemas
        cs.store(group="schema/env", name=name, node=node)
    groups = {"sim": SimConfig, "eval_env": EvalEnvConfig, "recorder": RecorderConfig}
    groups.update(logger=LoggerConfig, distributed=DistributedConfig, report=ReportConfig)
    for name, node in groups.items():
        cs.store(group=f"schema/{name}", name=name, node=node)


# --------------------------------------------------------------------------- validation


def check_keys(node: DictConfig, prefix: str = "") -> None:
    """Every key of a composed config is declared by its schema. Hydra's ``+key=value`` adds a
    key even to a struct config (it merges with ``force_add``), and ``OmegaConf.to_object`` keeps
    such a key as a stray attribute, so a mistyped ``+evn=gymnasium`` would be ignored. Free-form
    fields (``env.kwargs``) are not schemas and take any key."""
    schema = OmegaConf.get_type(node)
    if not is_dataclass(schema):
        return
    allowed = [f.name for f in fields(schema)]
    for key in node.keys():
        if key not in allowed and (prefix or key != "hydra"):
            raise unknown_key(prefix, key, schema)
    for key in allowed:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            check_keys(child, f"{prefix}{key}.")


def unknown_key(prefix: str, key: str, schema: type, rest: str = "") -> ConfigError:
    """The refusal of ``prefix + key``, a key dataclass ``schema`` does not declare: the closest
    declared keys (each written as ``prefix + name + rest``: ``rest`` completes what the user
    wrote, ``.trigger=cubic`` of ``recoder.trigger=cubic``), then every declared key."""
    allowed = [f.name for f in fields(schema)]
    where = f"{prefix.rstrip('.')} ({schema.__name__})" if prefix else "the top level"
    extra = " (+experiment=NAME adds a preset)" if not prefix else ""
    hint = did_you_mean(key, allowed, prefix, rest)
    return ConfigError(
        f"{prefix}{key} is not a config key: {hint + ' ' if hint else ''}allowed keys at {where} "
        f"are {', '.join(allowed)}{extra}"
    )


# the counts that must be positive, and those that may also be null
POSITIVE_KEYS = (
    "env.num_envs env.render_width env.render_height total_steps checkpoint_every "
    "eval_env.num_envs eval_env.every eval_env.clips_k algo.num_steps algo.num_minibatches "
    "algo.update_epochs logger.log_every"
).split()
POSITIVE_OR_NULL_KEYS = ("env.max_episode_steps", "torch_threads", "eval_env.episodes")


def validate(cfg: Config) -> None:
    """Value checks that types cannot express. Raises :class:`ConfigError` naming the key."""
    env = cfg.env
    one_of(env.name, "env.name", list(BACKENDS))
    check_fields(cfg)  # every closed choice, every float of every schema: finite, in its range
    for key in (*POSITIVE_KEYS, *POSITIVE_OR_NULL_KEYS):
        positive(attrgetter(key)(cfg), key, allow_none=key in POSITIVE_OR_NULL_KEYS)
    if cfg.checkpoint_keep < 0 or cfg.checkpoint_keep == 1:
        raise ConfigError(
            f"checkpoint_keep={cfg.checkpoint_keep} is invalid: allowed values are 0 (keep every "
            "periodic checkpoint) or 2 and more (the newest N); a single one is refused: it leaves "
            "resume=auto nothing to fall back to when the newest is damaged"
        )
    if cfg.resume not in (None, "auto"):
        raise ConfigError(f"resume={cfg.resume!r} is invalid: allowed values are auto, null")
    if cfg.checkpoint is not None and cfg.resume is not None:
        raise ConfigError("checkpoint and resume are both set: give one of them")
    if cfg.eval_only and cfg.checkpoint is None and cfg.resume is None:
        raise ConfigError("eval_only=true needs checkpoint=PATH (the checkpoint to evaluate)")
    check_seed(cfg.seed, "seed", env.num_envs, "env.num_envs")
    ev, a = cfg.eval_env, cfg.algo
    check_seed(ev.seed, "eval_env.seed", ev.num_envs, "eval_env.num_envs")
    if (env.num_envs * a.num_steps) % a.num_minibatches:
        raise ConfigError(
            f"algo.num_minibatches={a.num_minibatches} must divide env.num_envs * algo.num_steps "
            f"= {env.num_envs * a.num_steps}"
        )
    if not a.hidden_sizes or any(h <= 0 for h in a.hidden_sizes):
        raise ConfigError(f"algo.hidden_sizes={list(a.hidden_sizes)} must be positive sizes")
    cfg.report.check("report")
    cfg.recorder.check(env.num_envs, "recorder")
    ev.recorder.check(ev.num_envs, "eval_env.recorder")
    try:  # both read the env's observation: a Gymnasium env is built to read its space
        check_encoder(a.encoder, env, "algo.encoder")
        for key, rec in (("recorder", cfg.recorder), ("eval_env.recorder", ev.recorder)):
            check_view(rec, env.obs_image() is not None, key)
    except EnvNotBuilt:  # the backend's own check names why (the registry's close matches)
        from rlrec.envs.factory import check_ready

        check_ready(env, cfg.sim)
        raise
    check_device(cfg.sim.device)  # last: it imports torch (sim=gpu on the CPU: resolve_device)


def to_dataclass(cfg: DictConfig) -> Config:
    """Resolves a composed Hydra config into :class:`Config` (once, before the loop) and validates
    it."""
    check_keys(cfg)  # before to_object, which would keep a stray key as an attribute
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, dict):  # composed without the top-level schema (e.g. a masked copy)
        obj = Config(**{k: v for k, v in obj.items() if k != "hydra"})
    validate(obj)
    return obj


def to_container(obj: Any) -> Any:
    """Plain dict/list view of a config dataclass, closed choices as their values (for checkpoints
    and logs)."""
    if is_dataclass(obj):  # by hand: OmegaConf.structured costs ~40 ms, and a run's state
        # (a snapshot every iteration) holds its config
        return {f.name: to_container(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_container(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_container(v) for k, v in obj.items()}
    return obj
