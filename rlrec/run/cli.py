"""The ``train.py`` / ``rlrec-train`` entry point: the Hydra task function, the only module that
touches Hydra's runtime. Hydra composes the config; this module resolves it into dataclasses once
(``rlrec.run.preflight.refuse_before_work``) and hands it to :class:`rlrec.train.runner.Runner`."""

from __future__ import annotations

import atexit
import gc
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Dict, Optional

import hydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlrec import distributed, report
from rlrec.checks import ConfigError
from rlrec.config import register_configs
from rlrec.run import preempt, preflight, rundir, sweep
from rlrec.run.preflight import checked_for, refuse, refuse_before_work

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")

# A per-process id for run dir names: two runs started in the same second never share a dir.
_UID = f"{os.getpid()}{secrets.token_hex(2)}"
if not OmegaConf.has_resolver("rlrec_uid"):
    OmegaConf.register_new_resolver("rlrec_uid", lambda: _UID, use_cache=True)
register_configs()


def _config_groups() -> str:
    """``--help``'s list of config groups (conf/config.yaml's ``hydra.help.template``): Hydra's
    own listing, less Hydra's groups and the ``schema/`` groups that only type the others."""
    from hydra.core.global_hydra import GlobalHydra

    app = GlobalHydra.instance().hydra
    if app is None:
        return ""
    internal = ("hydra", "schema")  # schema/: rlrec.config.register_configs
    return app.format_config_groups(lambda group: group.split("/")[0] not in internal).rstrip()


if not OmegaConf.has_resolver("rlrec_config_groups"):
    OmegaConf.register_new_resolver("rlrec_config_groups", _config_groups)


def _build(cfg: DictConfig, run_dir: Path):
    """Builds the runner of a config that passed :func:`rlrec.run.preflight.refuse_before_work`
    (in Preflight, or here: ConfigError before any work). Several ranks: joins the process group
    first (docs/distributed.md)."""
    from rlrec.envs.device import use_device
    from rlrec.train.runner import Runner  # imported here: --help and config errors stay fast

    checked = checked_for(run_dir, cfg) or refuse_before_work(cfg)
    config, device = checked.config, checked.device
    # a (requeued) submitit job that asked for nothing else continues its checkpoint
    if preempt.under_submitit() and not (config.resume or config.checkpoint or config.eval_only):
        config.resume = "auto"
    if config.resume == "auto" and distributed.env_rank() == 0:
        # what a killed run left half-written, here and in recorder dirs outside the run dir
        recorder_dirs = [r.dir for r in (config.recorder, config.eval_env.recorder) if r.dir]
        preempt.remove_stale_temporaries(run_dir, recorder_dirs)
    use_device(device)
    distributed.init(config.distributed, device)  # several ranks: the process group
    try:  # the stop flag: a sweep's, when this process runs its jobs
        return Runner(config, run_dir, device, stop=preempt.run_flag())
    except ConfigError as exc:  # what only reading the checkpoint or building the envs shows
        exc.args = (
            f"{exc} (found after the run dir was claimed: when the run read its "
            "checkpoint or built its envs)",
        )
        raise


def _lost_rank(exc: BaseException) -> None:
    """A collective failed (another rank died, or did not answer within the timeout): the runner
    has closed its recorders, envs and logger and released the run dir. The process ends here,
    without leaving the process group: that would wait for the rank that is gone."""
    import logging

    text = " ".join(str(exc).split())[:400]
    print(
        f"rlrec[rank {distributed.rank()}]: stopped: another rank of this run failed or did not "
        f"answer within distributed.timeout_sec ({type(exc).__name__}: {text}); resume=auto with "
        "the same run dir continues from the newest checkpoint",
        file=sys.stderr,
        flush=True,
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _refuse_torchrun_sweep() -> None:
    if distributed.launched() and not preempt.under_submitit():
        refuse(
            ConfigError(
                "-m (a sweep) under torchrun is refused: torchrun starts ranks of ONE run; sweep "
                "with python train.py -m and hydra/launcher=slurm (tasks_per_node, nodes) for "
                "jobs of several ranks, or run torchrun once per setting"
            )
        )


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run(cfg: DictConfig) -> Optional[float]:
    """The Hydra task function: validates, builds, trains (or evaluates) and returns the final
    eval return, for sweepers such as Optuna."""
    from hydra.core.hydra_config import HydraConfig

    preflight.composed()  # Hydra reports what the run raises as it does without rlrec
    hydra_cfg = HydraConfig.get()
    run_dir, multirun = Path(hydra_cfg.runtime.output_dir), hydra_cfg.mode == RunMode.MULTIRUN
    try:
        if multirun:
            _refuse_torchrun_sweep()
            return _task(cfg, run_dir, Path(str(hydra_cfg.sweep.dir)), int(hydra_cfg.job.num))
        return _task(cfg, run_dir)
    except BaseException as exc:
        if distributed.lost_peer(exc):
            _lost_rank(exc)
        raise
    finally:
        distributed.shutdown()


def _task(
    cfg: DictConfig, run_dir: Path, sweep_dir: Optional[Path] = None, job: int = 0
) -> Optional[float]:
    """A single run, or (``sweep_dir``) job ``job`` of a sweep. A refused config ends a single run
    (exit 2) and fails a sweep's job alone (a FAILED row with the error; the other jobs run); a
    diverged run ends with its one line (exit 3; a FAILED row). A stop signal stops a single run
    after its checkpoint (exit 128 + the signal) and a job with a STOPPED row: a job that returns
    no result says so in the launching process's exit status (rlrec.run.sweep)."""
    import torch

    main = distributed.env_rank() == 0  # a submitit job of several tasks: rank 0 keeps the books
    if sweep_dir is not None:
        if main:
            sweep.begin_job(sweep_dir)
        signum = sweep.stop_signal(sweep_dir)
        if signum is not None:  # the sweep is stopping: start nothing
            return _not_started(signum)
    threads = torch.get_num_threads()  # jobs of a basic-launcher sweep share this process
    # Preflight claimed (locked) a single run's dir before Hydra created it, noting what was there
    claim = rundir.claim_of(run_dir) if sweep_dir is None else None
    try:
        try:
            if claim is None and main:  # a sweep's job, or run() called without Preflight
                key = "hydra.run.dir" if sweep_dir is None else "hydra.sweep.dir"
                claim = rundir.claim(run_dir, key, record=False)
            runner = _build(cfg, run_dir)
        except ConfigError as exc:
            if sweep_dir is None:
                if claim is not None:
                    claim.discard()  # removes only what this run created
                refuse(exc)
            print(f"rlrec: config error: {exc}", file=sys.stderr)
            sweep.set_outcome(sweep.FAILED, f"ConfigError: {exc}", refused=True)
            return None
        if sweep_dir is not None:
            signum = distributed.broadcast(sweep.stop_signal(sweep_dir))  # rank 0's decision
            if signum is not None:  # the stop came while the job was being built
                runner.close()
                return _not_started(signum)
            if main:
                sweep.job_running(sweep_dir, job)
        result = _run(runner, run_dir, sweep_dir, main)
        if result is None:  # a sweep's job that diverged
            return None
    finally:
        torch.set_num_threads(threads)  # the next job starts with the process's default again
        if claim is not None:
            claim.release()
    return None if _stopped(runner, sweep_dir) else result.get("eval/return")


def _run(
    runner, run_dir: Path, sweep_dir: Optional[Path], main: bool
) -> Optional[Dict[str, float]]:
    """The run's result, then its report.html. A full disk ends a single run with how to resume
    (exit 1); a diverged run ends with its one line (exit 3; a sweep's job: a FAILED row, None)."""
    from rlrec.train.checkpoint import STORAGE_ERRNOS, CheckpointWriteError, storage_failure
    from rlrec.train.divergence import EXIT_STATUS, Diverged

    try:
        result = runner.run()
        if main:  # report.html of the run (rlrec.report; of a sweep: python -m rlrec.report)
            report.write_at_end(run_dir, runner.cfg.report)
        return result
    except (CheckpointWriteError, OSError) as exc:  # e.g. a full disk: says how to resume
        written = isinstance(exc, CheckpointWriteError)  # its message says it
        if sweep_dir is not None or not (written or exc.errno in STORAGE_ERRNOS):
            raise
        print(f"rlrec: {exc if written else storage_failure(exc, run_dir)}", file=sys.stderr)
        raise SystemExit(1) from None
    except Diverged as exc:  # one line (every rank stops at the same iteration)
        if main:
            print(exc, file=sys.stderr, flush=True)
        if sweep_dir is None:
            raise SystemExit(EXIT_STATUS) from None
        sweep.set_outcome(sweep.FAILED, str(exc))  # this job alone fails
        return None


def _stopped(runner, sweep_dir: Optional[Path]) -> bool:
    """Whether a stop ended a sweep's job (its STOPPED row written). A stopped single run exits
    with 128 + the signal; submitit's own signal requeues the job (and exits)."""
    stopped = runner.stop.signum
    # a stop of the sweep (the sweep's stop flag too: no later job starts here), or of this job
    # whose launching process is gone (SIGHUP); submitit's own signal requeues the job instead
    if sweep_dir is not None and stopped is not None and stopped != preempt.requeue_signal():
        sweep.set_outcome(
            sweep.STOPPED,
            f"stopped by {signal.Signals(stopped).name} at step {runner.global_step} (checkpoint "
            "saved): resume=auto continues it",
        )
        return True
    preempt.requeue_if_preempted(stopped)  # submitit requeues the job and exits
    if runner.stop and sweep_dir is None:  # stopped, checkpoint written: 128 + the signal
        raise SystemExit(runner.stop.exit_status)
    return False


def _not_started(signum: int) -> None:
    name = signal.Signals(signum).name
    sweep.set_outcome(sweep.STOPPED, f"not started: the sweep was stopped by {name}")


def main() -> None:
    """Checks the command line for launcher/sweeper plugins that are not installed (naming the
    extra), then hands over to Hydra; an override Hydra cannot apply ends as every config error
    does (``rlrec: config error: ...``, exit 2). A sweep exits with 1 when a job failed and with
    128 + the signal when it was stopped (rlrec.run.sweep.exit_status)."""
    # The interpreter's collections at exit walk every object torch made (0.7-1 s of a short run
    # on a 2-core CPU): frozen by the first exit handler to run, those objects are freed by
    # reference counting alone. What holds a file or a process is closed before (Runner.close).
    atexit.unregister(gc.freeze)  # registered once however often main() runs in a process
    atexit.register(gc.freeze)
    with preflight.refusing():  # before Hydra composes anything
        preflight.check_plugin_extras(sys.argv[1:])
    if distributed.launched():
        if any(a in ("-m", "--multirun") or a.startswith("hydra.mode=") for a in sys.argv[1:]):
            _refuse_torchrun_sweep()
        if distributed.env_rank() > 0:
            # rank 0 alone writes Hydra's files (.hydra/, the job log) into the shared run dir
            sys.argv += ["hydra.output_subdir=null"]
            if not any(a.startswith(("hydra/job_logging", "+hydra/job_logging")) for a in sys.argv):
                sys.argv += ["hydra/job_logging=stdout"]
    try:
        try:
            with preflight.overrides_refused():  # Hydra's errors on an override, in rlrec's words
                run()
        except sweep.SweepStopped:
            sweep.report_stopped()
        status = sweep.exit_status()
    finally:
        sweep.finish()
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
