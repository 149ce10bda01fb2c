"""The ``train.py`` / ``rlrec-train`` entry point: the Hydra task function runs a single run
(:func:`_single`: its claim of the run dir, exit status, stop and report) or a sweep's job
(``rlrec.run.sweep.job``), of the config ``rlrec.run.preflight`` checked once."""

from __future__ import annotations

import atexit
import gc
import os
import secrets
import sys
from pathlib import Path
from typing import Optional

import hydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlrec import distributed, report
from rlrec.checks import ConfigError
from rlrec.config import register_configs
from rlrec.run import preempt, preflight, rundir, sweep

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")

# A per-process id for run dir names: two runs started in the same second never share a dir.
_UID = f"{os.getpid()}{secrets.token_hex(2)}"


def _config_groups() -> str:
    """``--help``'s list of config groups (conf/config.yaml's ``hydra.help.template``): Hydra's
    own listing, less Hydra's groups and the ``schema/`` groups that only type the others."""
    from hydra.core.global_hydra import GlobalHydra

    app = GlobalHydra.instance().hydra
    if app is None:
        return ""
    internal = ("hydra", "schema")  # schema/: rlrec.config.register_configs
    return app.format_config_groups(lambda group: group.split("/")[0] not in internal).rstrip()


if not OmegaConf.has_resolver("rlrec_uid"):
    OmegaConf.register_new_resolver("rlrec_uid", lambda: _UID, use_cache=True)
    OmegaConf.register_new_resolver("rlrec_config_groups", _config_groups)
register_configs()


def _lost_rank(exc: BaseException) -> None:
    """A collective failed (another rank died, or did not answer within the timeout): the runner
    has closed its recorders, envs and logger and released the run dir. The process ends here,
    not leaving the process group (that would wait for the rank that is gone)."""
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
    os._exit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run(cfg: DictConfig) -> Optional[float]:
    """The Hydra task function: the final eval return, for sweepers such as Optuna."""
    from hydra.core.hydra_config import HydraConfig

    preflight.composed()  # Hydra reports what the run raises as it does without rlrec
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return sweep.job(cfg, run_dir, Path(str(hydra_cfg.sweep.dir)), int(hydra_cfg.job.num))
        return _single(cfg, run_dir)
    except BaseException as exc:
        if distributed.lost_peer(exc):
            _lost_rank(exc)
        raise
    finally:
        distributed.shutdown()


def _single(cfg: DictConfig, run_dir: Path) -> Optional[float]:
    """A single run. Exit 2: refused (what it created removed); 1: a full disk (how to resume); 3:
    diverged (one line); 128 + the signal: stopped after its checkpoint (submitit's: requeued)."""
    from rlrec.train.checkpoint import STORAGE_ERRNOS, CheckpointWriteError, storage_failure
    from rlrec.train.divergence import EXIT_STATUS, Diverged

    main = distributed.env_rank() == 0
    # Preflight claimed (locked) the run dir before Hydra created it, noting what was there
    checked, claim = preflight.take(run_dir, cfg)
    stop = preempt.StopRequested()
    try:
        try:
            if claim is None and main:  # run() called without Preflight
                claim = rundir.claim(run_dir, "hydra.run.dir", record=False)
            runner = preflight.start(cfg, run_dir, stop, checked, claim and claim.previous)
        except ConfigError as exc:
            if claim is not None:
                claim.discard()  # removes only what this run created
            preflight.refuse(exc)
        try:
            result = runner.run()
            if main:  # report.html of the run (rlrec.report)
                report.write_at_end(run_dir, runner.cfg.report)
        except (CheckpointWriteError, OSError) as exc:  # e.g. a full disk: says how to resume
            written = isinstance(exc, CheckpointWriteError)  # its message says it
            if not (written or exc.errno in STORAGE_ERRNOS):
                raise
            print(f"rlrec: {exc if written else storage_failure(exc, run_dir)}", file=sys.stderr)
            raise SystemExit(1) from None
        except Diverged as exc:  # one line (every rank stops at the same iteration)
            if main:
                print(exc, file=sys.stderr, flush=True)
            raise SystemExit(EXIT_STATUS) from None
    finally:
        if claim is not None:
            claim.release()
    preempt.requeue_if_preempted(stop.signum)  # submitit requeues the job and exits
    if stop:  # stopped, checkpoint written: 128 + the signal
        raise SystemExit(stop.exit_status)
    return result.get("eval/return")


def main() -> None:
    """The launcher/sweeper plugins of the command line checked (naming a missing extra), then
    Hydra; an override it cannot apply ends as every config error does (``rlrec: config error:
    ...``, exit 2), a sweep with its exit status (rlrec.run.sweep.ending)."""
    # The interpreter's collections at exit walk every object torch made: frozen by the first
    # exit handler to run, those objects are freed by reference counting alone. What holds a file
    # or a process is closed before (Runner.close).
    atexit.unregister(gc.freeze)  # registered once however often main() runs in a process
    atexit.register(gc.freeze)
    with preflight.refusing():  # before Hydra composes anything
        preflight.check_plugin_extras(sys.argv[1:])
    if distributed.env_rank() > 0:
        # rank 0 alone writes Hydra's files (.hydra/, the job log) into the shared run dir
        sys.argv += ["hydra.output_subdir=null"]
        if not any(a.startswith(("hydra/job_logging", "+hydra/job_logging")) for a in sys.argv):
            sys.argv += ["hydra/job_logging=stdout"]
    with sweep.ending(), preflight.overrides_refused():
        run()


if __name__ == "__main__":
    main()
