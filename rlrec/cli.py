"""The ``train.py`` / ``rlrec-train`` entry point: the Hydra task function, the only module that
touches Hydra's runtime. Hydra composes the config; this module resolves it into dataclasses once
(``rlrec.config.to_dataclass``) and hands it to :class:`rlrec.runner.Runner`."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from rlrec import preempt
from rlrec.config import ConfigError, register_configs, to_dataclass
from rlrec.preflight import check_argv

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")

# A per-process id for run dir names: two runs started in the same second never share a dir.
_UID = f"{os.getpid()}{secrets.token_hex(2)}"
if not OmegaConf.has_resolver("rlrec_uid"):
    OmegaConf.register_new_resolver("rlrec_uid", lambda: _UID, use_cache=True)
register_configs()


def _remove_if_empty(run_dir: Path) -> None:
    """After a config error: drop the run dir Hydra made if it holds nothing but its own files
    (and empty dirs), then its parents left empty (outputs/DATE)."""
    if not run_dir.is_dir():
        return
    leftovers = [
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and p.relative_to(run_dir).parts[0] != ".hydra"
        and not p.name.endswith(".log")
    ]
    if not leftovers:
        shutil.rmtree(run_dir, ignore_errors=True)
        parent = run_dir.absolute().parent
        for _ in range(2):  # outputs/DATE/TIME_UID: DATE and outputs; never above the cwd
            if parent == Path.cwd() or Path.cwd() not in parent.parents:
                break
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
            parent = parent.parent


def run(cfg: DictConfig) -> Optional[float]:
    """The task body: validate, build, run; returns the final eval return (for sweepers)."""
    import torch
    from hydra.core.hydra_config import HydraConfig

    from rlrec.runner import Runner  # imported here: --help and config errors stay fast

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    threads = torch.get_num_threads()  # jobs of a basic-launcher sweep share this process
    try:
        config = to_dataclass(cfg)
        preempt.default_resume(config)  # a requeued submitit job continues its checkpoint
        runner = Runner(config, run_dir)
    except ConfigError as exc:
        _remove_if_empty(run_dir)
        print(f"rlrec: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        result = runner.run()
    finally:
        torch.set_num_threads(threads)  # the next job starts with the process's default again
    preempt.requeue_if_preempted(runner.stop.signum)  # submitit requeues the job and exits
    return result.get("eval/return")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> Optional[float]:
    """Trains (or evaluates) and returns the final eval return, for sweepers such as Optuna."""
    return run(cfg)


def main() -> None:
    """Checks the command line for launcher/sweeper plugins that are not installed (naming the
    extra), then hands over to Hydra."""
    check_argv()
    _hydra_main()


if __name__ == "__main__":
    main()
