"""The one place where a run is refused before work: :func:`refuse_before_work` (the config's keys
and values, the logger's extra, what several ranks refuse, the device, the env backend's readiness
and the memory budget), which the Hydra callback :class:`Preflight` runs before Hydra creates the
run dir (with the writable-dir checks of the run or sweep dir) and ``rlrec.run.cli`` runs for a
run no Preflight checked (a sweep's jobs); the entry point checks the launcher/sweeper extras
before Hydra composes anything.

Each failure prints ``rlrec: config error: ...`` naming the key and exits with status 2, like every
other config error, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, NoReturn, Optional, Tuple, Union

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.config import Config, to_dataclass
from rlrec.files import probe_dir
from rlrec.run import budget, rundir

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


def _installed(module: str) -> bool:
    with contextlib.suppress(ImportError):  # a parent package is missing or broken
        return importlib.util.find_spec(module) is not None
    return False


def check_plugin_extras(overrides: Iterable[str]) -> None:
    """ConfigError naming the override and the extra to install when a launcher/sweeper plugin
    chosen on the command line is not installed (Hydra alone would only say it is not found)."""
    for item in overrides:
        module, extra = PLUGINS.get(item.lstrip("+"), ("", ""))
        if module and not _installed(module):
            raise ConfigError(
                f"{item.lstrip('+')} needs the '{extra}' extra, which is not installed "
                f"({module} is missing): pip install 'rlrec[{extra}]' "
                f"(or pip install -e '.[{extra}]' in a checkout)"
            )


def check_logger_extra(config: DictConfig) -> None:
    """``logger=wandb`` without wandb: the logger would only find out after the run's first
    files."""
    if OmegaConf.select(config, "logger.name") == "wandb" and not _installed("wandb"):
        raise ConfigError(
            "logger=wandb needs the 'wandb' extra, which is not installed: "
            "pip install 'rlrec[wandb]' (or use logger=tensorboard)"
        )


@dataclass
class Checked:
    """A run's config that passed every check before work, and the device it was checked for."""

    config: Config
    device: Any  # torch.device (torch is imported only once a run is checked)


def refuse_before_work(cfg: DictConfig) -> Checked:
    """Every refusal before any work, once (ConfigError naming the key): the logger's extra, the
    config's keys and values (``rlrec.config.to_dataclass``, which probes the recorder dirs), what
    a run of several ranks refuses, the device, the env backend's ``check_ready`` and the memory
    budget. ``cfg``: the composed config without its ``hydra`` node. Called by :class:`Preflight`
    before the run dir exists and, where no Preflight checked the run (a sweep's jobs), by
    ``rlrec.run.cli``; :func:`checked_for` hands Preflight's result to the run."""
    check_logger_extra(cfg)
    # what it refuses is refused without importing torch, but for an env that cannot be built
    # (the backend's check names why)
    config = to_dataclass(cfg)
    from rlrec.envs.factory import check_ready, resolve_device
    from rlrec.train.checkpoint import check_exists

    if config.checkpoint is not None:
        check_exists(config.checkpoint)  # (a damaged file shows when the run reads it)
    distributed.check(config)
    # the rank's device, resolved once: the process group, the envs, the policy and the
    # normaliser all use it (cuda:<local rank> with several ranks, current for CUDA)
    device = resolve_device(config.sim)
    check_ready(config.env, config.sim)  # e.g. ManiSkill's GPU sim needs a library on disk
    budget.check(config, device)  # sizes that cannot fit are refused before anything is built
    return Checked(config, device)


# runs Preflight checked, by (run dir, config): the run started next in this process takes its own
# (None: Preflight could not check it, and the run checks it itself)
_CHECKED: Dict[Tuple[str, str], Optional[Checked]] = {}


def _checked_key(run_dir: Union[str, Path], cfg: DictConfig) -> Tuple[str, str]:
    return os.path.realpath(run_dir), OmegaConf.to_yaml(cfg)


def checked_for(run_dir: Union[str, Path], cfg: DictConfig) -> Optional[Checked]:
    """What :class:`Preflight` checked for the run of ``cfg`` in ``run_dir`` (once: it is taken),
    or None when it did not check it."""
    return _CHECKED.pop(_checked_key(run_dir, cfg), None)


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
        if distributed.env_rank() > 0:
            with refusing():
                checked = self._validate(task)
                run_dir = distributed.wait_for("run_dir", timeout)
            with read_write(config.hydra.run):
                config.hydra.run.dir = run_dir
            _CHECKED[_checked_key(run_dir, task)] = checked
            return
        run_dir = str(OmegaConf.select(config, "hydra.run.dir"))
        try:
            probe_dir(run_dir, "hydra.run.dir", use=OUTPUT_DIR)
            checked = self._validate(task)
            # last, once the checks passed: lock the run dir before Hydra writes into it, noting
            # what was there (a later config error removes only what this run created)
            claimed = rundir.claim(Path(run_dir), "hydra.run.dir")
        except ConfigError as err:
            if distributed.launched():
                distributed.publish("run_dir", str(err), timeout, error=True)
            refuse(err)
        if distributed.launched():
            distributed.publish("run_dir", str(claimed.run_dir), timeout)
        _CHECKED[_checked_key(claimed.run_dir, task)] = checked

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with refusing():  # values set for the whole sweep (each job checks its own)
            probe_dir(str(config.hydra.sweep.dir), "hydra.sweep.dir", use=OUTPUT_DIR)
            check_logger_extra(config)

    @staticmethod
    def _validate(task: DictConfig) -> Optional[Checked]:
        """:func:`refuse_before_work` (its ConfigError raised); None where it could not check."""
        try:
            return refuse_before_work(task)
        except ConfigError:
            raise
        except Exception:  # e.g. an interpolation only the job can resolve: the job checks again
            return None
