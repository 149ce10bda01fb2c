"""The one place where a run is refused: before work, :func:`refuse_before_work` (the config's
keys and values, the logger's extra, the device, what several ranks refuse, the env backend's
readiness and the memory budget), which the Hydra callback :class:`Preflight` runs before Hydra
creates the run dir (with the writable-dir checks of the run or sweep dir, and a sweep under
torchrun) and :func:`start` for a run no Preflight checked (a sweep's jobs); the entry point
checks the launcher/sweeper extras before Hydra composes anything, and an override Hydra cannot
apply is refused in rlrec's words (:func:`overrides_refused`). What only reading the checkpoint or
building the envs shows is refused by :func:`start`, once the run dir is claimed.

Each failure prints ``rlrec: config error: ...`` naming the key and exits with status 2, like every
other config error, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import importlib.util
import json
import os
import re
import sys
import typing
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, NoReturn, Optional, Tuple, Union

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from rlrec import distributed
from rlrec.checks import ConfigError, field_types, one_of
from rlrec.config import Config, to_dataclass, unknown_key
from rlrec.files import probe_dir
from rlrec.run import budget, preempt, rundir
from rlrec.run.process import PROCESS

OUTPUT_DIR = "the output dir"  # probe_dir's wording for hydra.run.dir and hydra.sweep.dir

# Hydra plugin options -> (module that provides them, the rlrec extra that installs it).
# conf/hydra/launcher/slurm.yaml builds on submitit_slurm, so it needs the same extra.
PLUGINS: Dict[str, Tuple[str, str]] = {
    "hydra/launcher=joblib": ("hydra_plugins.hydra_joblib_launcher", "launchers"),
    "hydra/launcher=submitit_local": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
    "hydra/launcher=submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
    "hydra/launcher=slurm": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
    "hydra/launcher=ray": ("hydra_plugins.hydra_ray_launcher", "ray"),
    "hydra/sweeper=optuna": ("hydra_plugins.hydra_optuna_sweeper", "launchers"),
    "hydra/sweeper=lr_search": ("hydra_plugins.hydra_optuna_sweeper", "launchers"),
}


def _need(what: str, module: str, extra: str) -> None:
    """ConfigError naming ``what`` and the extra to install unless ``module`` is installed."""
    with contextlib.suppress(ImportError):  # a parent package is missing or broken
        if importlib.util.find_spec(module) is not None:
            return
    raise ConfigError(
        f"{what} needs the '{extra}' extra, which is not installed ({module} is missing): "
        f"pip install 'rlrec[{extra}]' (or pip install -e '.[{extra}]' in a checkout)"
    )


def check_plugin_extras(overrides: Iterable[str]) -> None:
    """The launcher/sweeper plugins chosen on the command line are installed (Hydra alone would
    only say one is not found)."""
    for item in overrides:
        if item.lstrip("+") in PLUGINS:
            _need(item.lstrip("+"), *PLUGINS[item.lstrip("+")])


def check_logger_extra(config: DictConfig) -> None:
    """``logger=wandb`` without wandb: the logger would only find out after the run's first
    files."""
    if OmegaConf.select(config, "logger.name") == "wandb":
        _need("logger=wandb", "wandb", "wandb")


@dataclass
class Checked:
    """A run's config that passed every check before work, and the device it was checked for."""

    config: Config
    device: Any  # torch.device (torch is imported only once a run is checked)


def refuse_before_work(cfg: DictConfig) -> Checked:
    """Every refusal before any work, once (ConfigError naming the key): the logger's extra, the
    config's keys and values (``rlrec.config.to_dataclass``, which probes the recorder dirs), the
    device, what a run of several ranks refuses, the env backend's ``check_ready`` and the memory
    budget. ``cfg``: the composed config without its ``hydra`` node. Called by :class:`Preflight`
    before the run dir exists and, where no Preflight checked the run (a sweep's jobs), by
    :func:`start`."""
    check_logger_extra(cfg)
    # what it refuses is refused without importing torch, but for an env that cannot be built
    # (the backend's check names why)
    config = to_dataclass(cfg)
    from rlrec.envs.factory import check_ready, resolve_device
    from rlrec.train.checkpoint import check_exists

    if config.checkpoint is not None:
        check_exists(config.checkpoint)  # (a damaged file shows when the run reads it)
    # the rank's device, resolved once: the process group, the envs, the policy and the
    # normaliser all use it (cuda:<local rank> with several ranks, current for CUDA)
    device = resolve_device(config.sim)
    distributed.check(config, device)
    check_ready(config.env, config.sim)  # e.g. ManiSkill's GPU sim needs a library on disk
    budget.check(config, device)  # sizes that cannot fit are refused before anything is built
    return Checked(config, device)


def _key(run_dir: Union[str, Path], cfg: DictConfig) -> Tuple[str, str]:
    return os.path.realpath(run_dir), OmegaConf.to_yaml(cfg)


def take(run_dir: Path, cfg: DictConfig) -> Tuple[Optional[Checked], Optional[rundir.Claim]]:
    """What :class:`Preflight` checked (None: it could not) and claimed for the run of ``cfg`` in
    ``run_dir``, once: it is taken."""
    return PROCESS.checked.pop(_key(run_dir, cfg), (None, None))


def start(cfg: DictConfig, run_dir: Path, stop, checked=None, holder=None):
    """The runner of the run of ``cfg`` in its claimed ``run_dir`` with the stop flag ``stop``,
    of ``checked`` (Preflight's checks), else of :func:`refuse_before_work`'s. What only reading
    the checkpoint or building the envs shows is refused now, saying so. A (requeued) submitit job
    that asked for nothing else continues its checkpoint; ``resume=auto`` first removes what a
    killed run left half-written (``holder``: the dead process whose lock the claim took over).
    Several ranks: joins the process group first (docs/distributed.md)."""
    from rlrec.train.runner import Runner  # imported here: --help and config errors stay fast

    checked = checked or refuse_before_work(cfg)
    config = checked.config
    if preempt.under_submitit() and not (config.resume or config.checkpoint or config.eval_only):
        config.resume = "auto"
    if config.resume == "auto" and distributed.env_rank() == 0:
        # here and in recorder dirs outside the run dir
        dirs = [r.dir for r in (config.recorder, config.eval_env.recorder) if r.dir]
        rundir.remove_stale_temporaries(run_dir, dirs, holder)
    distributed.init(config.distributed, checked.device)  # several ranks: the process group
    try:
        return Runner(config, run_dir, checked.device, stop)
    except ConfigError as exc:
        exc.args = (
            f"{exc} (found after the run dir was claimed: when the run read its checkpoint or "
            "built its envs)",
        )
        raise


def refuse(err: ConfigError) -> NoReturn:
    """The one way a config error ends the process: ``rlrec: config error: ...``, exit 2."""
    print(f"rlrec: config error: {err}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@contextlib.contextmanager
def refusing() -> Iterator[None]:
    """A :class:`ConfigError` raised inside ends the process as :func:`refuse` does."""
    try:
        yield
    except ConfigError as err:
        refuse(err)


# Hydra prints its own error and exits 1 unless this is "1": then it raises the error
FULL_ERROR = "HYDRA_FULL_ERROR"


@contextlib.contextmanager
def overrides_refused() -> Iterator[None]:
    """Hydra run inside: an override it cannot apply ends the process as :func:`refuse` does, in
    rlrec's words (:func:`override_error`). Until the task function starts (:func:`composed`),
    HYDRA_FULL_ERROR=1 makes Hydra raise such an error to here; where the user set it, Hydra's
    own error is raised as it is."""
    users = os.environ.get(FULL_ERROR)
    PROCESS.full_error.append(users)
    os.environ[FULL_ERROR] = "1"
    try:
        yield
    except (ConfigCompositionException, OverrideParseException) as exc:
        if users == "1":
            raise
        refuse(override_error(exc))
    finally:
        composed()


def composed() -> None:
    """Hydra composed the run's config (its task function starts): HYDRA_FULL_ERROR as the user
    set it, so that Hydra reports the run's own errors as it does without rlrec."""
    while PROCESS.full_error:
        users = PROCESS.full_error.pop()
        if users is None:
            os.environ.pop(FULL_ERROR, None)
        else:
            os.environ[FULL_ERROR] = users


_MERGING = "Error merging override "  # Hydra's words for a value of the wrong type


def override_error(exc: Exception) -> ConfigError:
    """rlrec's one line for Hydra's error on an override: an unknown key with the closest declared
    keys ("did you mean env=gymnasium?"), an unknown option of a config group with its options, a
    value of the wrong type with the key's type and an example; any other error in Hydra's words,
    on one line."""
    text, cause = str(exc), exc.__cause__
    try:
        if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
            group, _, name = exc.missing_cfg_file.rpartition("/")  # env/gymasium
            one_of(name, group, list(exc.options))
        unknown = isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key
        if unknown and is_dataclass(cause.object_type) and "use +" in text:
            written = text.rpartition("use +")[2]  # Hydra: "To append to your config use +K=V"
            prefix, _, key = cause.full_key.rpartition(".")
            rest = written[len(cause.full_key) :]  # what follows the unknown key: .trigger=cubic
            raise unknown_key(prefix and prefix + ".", key, cause.object_type, rest)
        if isinstance(cause, ValidationError) and cause.full_key and text.startswith(_MERGING):
            written = text[len(_MERGING) :]
            check_type(written, cause)
            text = f"{written} is invalid: {str(cause.msg).splitlines()[0]}"  # OmegaConf's words
    except ConfigError as err:
        return err
    return ConfigError(" ".join(text.split()))


# the types a key may declare: what a value is, what a list of them holds, an example
_KINDS = {
    bool: ("true or false", "true/false values", "true"),
    int: ("an integer", "integers", "8"),
    float: ("a number", "numbers", "0.5"),
    str: ("a string", "strings", "text"),
}


def check_type(written: str, err: ValidationError) -> None:
    """ConfigError for override ``written`` (``KEY=VALUE``) whose value Hydra could not merge
    into the key's type (``err``): the key, its type and an example (the key's value before, where
    it is one), or a closed choice's allowed values. Returns where the key's type is not one of
    these."""
    key = re.sub(r"\[\d+\]$", "", str(err.full_key))  # an element's error: its list's key
    name = key.rpartition(".")[2]
    node = err.parent_node
    if node is not None and not isinstance(node, DictConfig):
        node = node._get_parent()  # an element's list: the dict that holds it
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    declared = {n: (h, null) for n, h, null in field_types(schema)} if is_dataclass(schema) else {}
    hint, nullable = declared.get(name, (None, False))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):  # OmegaConf takes their names
        one_of(err.value, key, [m.name for m in hint] + (["null"] if nullable else []))
    many = typing.get_origin(hint) is list
    base = typing.get_args(hint)[0] if many else hint
    if base not in _KINDS:
        return
    one, several, example = _KINDS[base]
    before = OmegaConf.select(node, name, throw_on_resolution_failure=False)  # its value so far
    values = list(before or []) if many else [before]
    if values and all(type(v) is base for v in values):  # as an override writes it
        example = json.dumps(values if many else before, separators=(",", ":")).strip('"')
    elif many:
        example = f"[{example},{example}]"
    note = ""
    if base is int and not many and isinstance(err.value, float) and err.value.is_integer():
        count = int(err.value)  # 1e5: a float
        example = str(count)
        note = f" ({written.partition('=')[2]} is a float: write a count as {count} or {count:_})"
    kind = f"a list of {several}" if many else one
    raise ConfigError(
        f"{written} is invalid: must be {kind}{' or null' if nullable else ''}, e.g. "
        f"{key}={example}{note}"
    )


class Preflight(Callback):
    """Hydra callback: before Hydra creates the run (or sweep) dir, fails on a dir that cannot be
    written and, for a single run, on what :func:`refuse_before_work` refuses, so that such
    errors leave nothing behind; then claims (locks) the run dir. (Errors only the runner can see,
    such as a checkpoint that does not fit the env, come later; the run then removes what it
    created, and only that: rlrec/run/rundir.py.)"""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run, or one rank of several (torchrun): rank 0 checks, claims the run dir and
        (several ranks) publishes it; every other rank validates (writing nothing) and takes rank
        0's run dir as its own, so that ``${now:...}`` in hydra.run.dir names one dir for the run.
        A refusal on rank 0 is every rank's."""
        timeout = OmegaConf.select(config, "distributed.timeout_sec", default=None)
        timeout = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else 600.0
        task = copy.deepcopy(config)  # the config the task function gets: without ``hydra``
        with read_write(task), open_dict(task):
            del task["hydra"]
        claimed = None
        try:
            # validated first on every rank: with the policy on CUDA the ranks meet in it
            # (distributed.shared_gpus), and a refusal must come after that to reach them
            checked = _validate(task)
            if distributed.env_rank() > 0:
                run_dir = distributed.wait_for("run_dir", timeout)
                with read_write(config.hydra.run):
                    config.hydra.run.dir = run_dir
            else:
                run_dir = probe_dir(config.hydra.run.dir, "hydra.run.dir", use=OUTPUT_DIR)
                # last, once the checks passed: lock the run dir before Hydra writes into it,
                # noting what was there (a later config error removes only what this run created)
                claimed = rundir.claim(Path(run_dir), "hydra.run.dir")
                if distributed.launched():
                    distributed.publish("run_dir", str(claimed.run_dir), timeout)
        except ConfigError as err:
            if distributed.launched() and distributed.env_rank() == 0:
                distributed.publish("run_dir", str(err), timeout, error=True)
            refuse(err)
        PROCESS.checked[_key(run_dir, task)] = (checked, claimed)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with refusing():  # values set for the whole sweep (each job checks its own)
            if distributed.launched():
                raise ConfigError(
                    "-m (a sweep) under torchrun is refused: torchrun starts ranks of ONE run; "
                    "sweep with python train.py -m and hydra/launcher=slurm (tasks_per_node, "
                    "nodes) for jobs of several ranks, or run torchrun once per setting"
                )
            probe_dir(str(config.hydra.sweep.dir), "hydra.sweep.dir", use=OUTPUT_DIR)
            check_logger_extra(config)


def _validate(task: DictConfig) -> Optional[Checked]:
    """:func:`refuse_before_work` (its ConfigError raised); None where it could not check."""
    try:
        return refuse_before_work(task)
    except ConfigError:
        raise
    except Exception:  # e.g. an interpolation only the job can resolve: the job checks again
        return None
