"""Checks that run before Hydra does any work: launcher/sweeper/logger extras, a writable output
dir and (for a single run) the config values.

Each failure prints ``rlrec: config error: ...`` naming the key and exits with status 2, like every
other config error, and leaves nothing behind.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlrec import distributed
from rlrec.checks import ConfigError, nearest_existing
from rlrec.run import rundir

# Hydra plugin options -> (module that provides them, the rlrec extra that installs it).
# conf/hydra/launcher/slurm.yaml builds on submitit_slurm, so it needs the same extra.
PLUGINS: Dict[str, Dict[str, Tuple[str, str]]] = {
    "hydra/launcher": {
        "joblib": ("hydra_plugins.hydra_joblib_launcher", "launchers"),
        "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
        "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
        "slurm": ("hydra_plugins.hydra_submitit_launcher", "launchers"),
        "ray": ("hydra_plugins.hydra_ray_launcher", "ray"),
    },
    "hydra/sweeper": {
        "optuna": ("hydra_plugins.hydra_optuna_sweeper", "launchers"),
        "lr_search": ("hydra_plugins.hydra_optuna_sweeper", "launchers"),
    },
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing or broken
        return False


def check_plugin_extras(overrides: Iterable[str]) -> None:
    """ConfigError naming the override and the extra to install when a launcher/sweeper plugin
    chosen on the command line is not installed (Hydra alone would only say it is not found)."""
    for item in overrides:
        key, sep, value = item.lstrip("+").partition("=")
        if not sep or key not in PLUGINS or value not in PLUGINS[key]:
            continue
        module, extra = PLUGINS[key][value]
        if not _installed(module):
            raise ConfigError(
                f"{key}={value} needs the '{extra}' extra, which is not installed "
                f"({module} is missing): pip install 'rlrec[{extra}]' "
                f"(or pip install -e '.[{extra}]' in a checkout)"
            )


def check_logger_extra(config: DictConfig) -> None:
    """``logger=wandb`` without wandb: the logger would only find out after the run's first
    files."""
    if OmegaConf.select(config, "logger.name") == "wandb" and not _installed("wandb"):
        from rlrec.config import WANDB_MISSING

        raise ConfigError(WANDB_MISSING)


def check_writable(path: str, key: str) -> None:
    """ConfigError naming ``key`` unless ``path`` is (or can be created as) a writable directory.
    Probes with a temporary file in the nearest existing ancestor, so nothing is left behind."""
    base = nearest_existing(Path(path).absolute())
    if not base.is_dir():
        raise ConfigError(
            f"{key}={path} cannot be used as the output dir: {base} is not a directory"
        )
    try:
        with tempfile.NamedTemporaryFile(dir=base, prefix=".rlrec-probe-"):
            pass
    except OSError as err:
        raise ConfigError(
            f"{key}={path} cannot be used as the output dir: {base} is not writable ({err})"
        ) from err


def _fail(err: ConfigError) -> None:
    print(f"rlrec: config error: {err}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def check_argv(argv: Optional[Iterable[str]] = None) -> None:
    """Entry-point check of the command line (before Hydra composes anything)."""
    try:
        check_plugin_extras(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        _fail(err)


class Preflight(Callback):
    """Hydra callback: before Hydra creates the run (or sweep) dir, fails on a dir that cannot be
    written and, for a single run, on config values rlrec.config.validate rejects, so that such
    errors leave nothing behind; then claims (locks) the run dir. (Errors only the runner can see,
    such as a checkpoint that does not fit the env, come later; the run then removes what it
    created, and only that: rlrec/run/rundir.py.)"""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if distributed.launched():
            return self._on_rank_start(config)
        self._check_dir(config, "hydra.run.dir")
        self._validate(config)
        # last, once the checks passed: lock the run dir before Hydra writes into it, noting what
        # was there (a later config error removes only what this run created: rlrec/run/rundir.py)
        try:
            rundir.claim(Path(str(OmegaConf.select(config, "hydra.run.dir"))), "hydra.run.dir")
        except ConfigError as err:
            _fail(err)

    def _on_rank_start(self, config: DictConfig) -> None:
        """One rank of several (torchrun): rank 0 checks, claims the run dir and publishes it;
        every other rank validates (writing nothing) and takes rank 0's run dir as its own, so
        that ``${now:...}`` in hydra.run.dir names one dir for the run. A refusal on rank 0 is
        every rank's."""
        timeout = OmegaConf.select(config, "distributed.timeout_sec", default=None)
        timeout = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else 600.0
        if distributed.env_rank() > 0:
            self._validate(config)
            try:
                run_dir = distributed.wait_for("run_dir", timeout)
            except ConfigError as err:
                _fail(err)
            with read_write(config.hydra.run):
                config.hydra.run.dir = run_dir
            return
        run_dir = str(OmegaConf.select(config, "hydra.run.dir"))
        try:
            check_writable(run_dir, "hydra.run.dir")
            self._validate(config, fail=False)
            claimed = rundir.claim(Path(run_dir), "hydra.run.dir")
        except ConfigError as err:
            distributed.publish_error("run_dir", str(err), timeout)
            _fail(err)
        distributed.publish("run_dir", str(claimed.run_dir), timeout)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check_dir(config, "hydra.sweep.dir")
        try:
            check_logger_extra(
                config
            )  # values set for the whole sweep (swept ones: each job checks)
        except ConfigError as err:
            _fail(err)

    @staticmethod
    def _check_dir(config: DictConfig, key: str) -> None:
        try:
            check_writable(str(OmegaConf.select(config, key)), key)
        except ConfigError as err:
            _fail(err)

    @staticmethod
    def _validate(config: DictConfig, fail: bool = True) -> None:
        """``fail=False``: the ConfigError is raised, not reported."""
        from rlrec.config import to_dataclass

        task = copy.deepcopy(config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        try:
            check_logger_extra(task)
            distributed.check(to_dataclass(task))
        except ConfigError as err:
            if not fail:
                raise
            _fail(err)
        except Exception:  # e.g. an interpolation only the job can resolve: the job checks again
            pass
