"""The ``train.py`` / ``rlrec-train`` entry point: the Hydra task function, the only module that
touches Hydra's runtime. Hydra composes the config; this module resolves it into dataclasses once
(``rlrec.config.to_dataclass``) and hands it to :class:`rlrec.runner.Runner`."""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from rlrec import preempt, rundir, sweep
from rlrec.config import ConfigError, register_configs, to_dataclass
from rlrec.preflight import check_argv

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")

# A per-process id for run dir names: two runs started in the same second never share a dir.
_UID = f"{os.getpid()}{secrets.token_hex(2)}"
if not OmegaConf.has_resolver("rlrec_uid"):
    OmegaConf.register_new_resolver("rlrec_uid", lambda: _UID, use_cache=True)
register_configs()


def _build(cfg: DictConfig, run_dir: Path):
    """Validates the config and builds the runner (ConfigError before any work)."""
    from rlrec.runner import Runner  # imported here: --help and config errors stay fast

    config = to_dataclass(cfg)
    preempt.default_resume(config)  # a requeued submitit job continues its checkpoint
    return Runner(config, run_dir)


def run(cfg: DictConfig) -> Optional[float]:
    """The task body: validate, build, run; returns the final eval return (for sweepers)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return _sweep_job(cfg, run_dir, Path(str(hydra_cfg.sweep.dir)), int(hydra_cfg.job.num))
    import torch

    from rlrec.checkpoint import CheckpointWriteError

    threads = torch.get_num_threads()
    # Preflight claimed (locked) the run dir before Hydra created it, noting what was there
    claim = rundir.claim_of(run_dir)
    try:
        try:
            if claim is None:  # run() called without Preflight: lock, knowing nothing more
                claim = rundir.claim(run_dir, "hydra.run.dir", record=False)
            runner = _build(cfg, run_dir)
        except ConfigError as exc:
            if claim is not None:
                claim.discard()  # removes only what this run created
            print(f"rlrec: config error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        try:
            result = runner.run()
        except CheckpointWriteError as exc:  # e.g. a full disk: the message says how to resume
            print(f"rlrec: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
    finally:
        torch.set_num_threads(threads)
        if claim is not None:
            claim.release()
    preempt.requeue_if_preempted(runner.stop.signum)  # submitit requeues the job and exits
    if runner.stop:  # stopped by a signal, checkpoint written: 128 + the signal (143 on SIGTERM)
        raise SystemExit(runner.stop.exit_status)
    return result.get("eval/return")


def _not_started(signum: int) -> None:
    name = signal.Signals(signum).name
    sweep.set_outcome(sweep.STOPPED, f"not started: the sweep was stopped by {name}")


def _sweep_job(cfg: DictConfig, run_dir: Path, sweep_dir: Path, job: int) -> Optional[float]:
    """One job of a sweep. A refused config fails this job alone (a FAILED row with the error;
    the other jobs run), a stop signal stops it after its checkpoint (a STOPPED row): either way it
    returns no result, and the launching process's exit status says so (rlrec.sweep)."""
    import torch

    sweep.begin_job(sweep_dir)
    signum = sweep.stop_signal(sweep_dir)
    if signum is not None:  # the sweep is stopping: start nothing
        return _not_started(signum)
    threads = torch.get_num_threads()  # jobs of a basic-launcher sweep share this process
    claim = None
    try:
        try:
            claim = rundir.claim(run_dir, "hydra.sweep.dir", record=False)
            runner = _build(cfg, run_dir)
        except ConfigError as exc:
            print(f"rlrec: config error: {exc}", file=sys.stderr)
            sweep.set_outcome(sweep.FAILED, f"ConfigError: {exc}")
            return None
        signum = sweep.stop_signal(sweep_dir)
        if signum is not None:  # the stop came while the job was being built
            runner.close()
            return _not_started(signum)
        sweep.job_running(sweep_dir, job)
        result = runner.run()
    finally:
        torch.set_num_threads(threads)  # the next job starts with the process's default again
        if claim is not None:
            claim.release()
    stopped = runner.stop.signum
    if stopped in sweep.STOP_SIGNALS:
        sweep.note_stopped(stopped)
        sweep.set_outcome(
            sweep.STOPPED,
            f"stopped by {signal.Signals(stopped).name} at step {runner.global_step} (checkpoint "
            "saved): resume=auto continues it",
        )
        return None
    preempt.requeue_if_preempted(stopped)  # submitit requeues the job and exits
    return result.get("eval/return")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> Optional[float]:
    """Trains (or evaluates) and returns the final eval return, for sweepers such as Optuna."""
    return run(cfg)


def main() -> None:
    """Checks the command line for launcher/sweeper plugins that are not installed (naming the
    extra), then hands over to Hydra. A sweep exits with 1 when a job failed and with 128 + the
    signal when it was stopped (rlrec.sweep.exit_status)."""
    check_argv()
    try:
        try:
            _hydra_main()
        except sweep.SweepStopped:
            sweep.report_stopped()
        status = sweep.exit_status()
    finally:
        sweep.finish()
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
