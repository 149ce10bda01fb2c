"""A sweep: each job's part in it (:func:`job`), the summary, and the sweep's stop.

:class:`SweepSummary` is a Hydra callback (wired in ``conf/config.yaml``). In multirun mode, each
job, when it ends, writes its own row file ``<sweep dir>/.rlrec_summary/<job num>.json`` (atomic
rename) and then rebuilds ``<sweep dir>/summary.csv`` from every row file under an exclusive file
lock, so parallel jobs (joblib, submitit, ray) never interleave writes and the CSV is complete as
of the last job that finished. The launching process prints the table once the sweep is over.

The figures come from the job's own ``metrics.jsonl`` (its last eval line), so a job that ran in
another process or on another node is summarised from what it left on disk.

A job's status is COMPLETED, FAILED (it raised, diverged, or its config was refused: the job
returns no result and the sweep goes on) or STOPPED (a signal stopped it after its checkpoint, or
it was not started because the sweep was stopping). The launching process's exit status says how
the sweep went (:func:`ending`: 1 when a job failed, 128 + the signal when it was stopped). A sweep
whose jobs were all refused before work ends as a refused run does: its refusals, exit 2, and
nothing left of it (what it created in the sweep dir is removed, and the sweep dir too when it
made it: :func:`rlrec.run.rundir.remove_created`).

Stopping a sweep (Ctrl-C: SIGINT to every process of the sweep; or SIGTERM): each process of the
sweep holds its one stop flag (a :class:`_Sweep`, which says what its signal handler does), which
its jobs' runs use too: each running job checkpoints and stops, no job starts after the signal,
and the launching process ends once the running jobs have written their rows (at most
:data:`GRACE_S` later; a second signal stops at once). With the basic launcher the jobs run in the
launching process, which ends after the stopped job's row (:class:`SweepStopped`); with joblib (or
another launcher of processes) it records the stop in ``<sweep dir>/.rlrec_summary/stop.json``
(jobs that start later do not run) and leaves the launcher once no job of
``.rlrec_summary/running/`` is alive. ``resume=auto`` with the same sweep dir then completes the
stopped and unstarted jobs.
"""

from __future__ import annotations

import _thread
import contextlib
import csv
import fcntl
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rlrec import distributed, report
from rlrec.checks import ConfigError
from rlrec.files import atomic_file, write_atomic
from rlrec.layout import RunDir, SweepDir
from rlrec.report.rundata import read_json, read_jsonl, read_overrides, read_rows
from rlrec.run import preempt, preflight, rundir
from rlrec.run.process import PROCESS

COMPLETED, FAILED, STOPPED = "COMPLETED", "FAILED", "STOPPED"
REFUSED = "refused"  # a FAILED row's mark: refused before work (not a column of summary.csv)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # stop the sweep (submitit's USR2 requeues a job)
GRACE_S = 60.0  # after a stop, how long the launching process waits for running jobs to stop
# figures of the last eval line copied into the summary, in this order
EVAL_KEYS = ("eval/return", "eval/success", "eval/length", "eval/episodes")
_FIRST = ("job", "status", "step", *EVAL_KEYS, "swept", "overrides")
_LAST = ("run_dir", "error")


# --------------------------------------------------------------------------- the summary


def final_figures(run_dir: Path) -> Dict[str, Any]:
    """``step`` (the last logged env step) and the last eval line's figures of a run dir."""
    lines = read_jsonl(RunDir(run_dir).metrics)  # a line cut by a kill is skipped
    evals = [rec for rec in lines if "eval/return" in rec]
    out = {k: evals[-1][k] for k in EVAL_KEYS if evals and k in evals[-1]}
    if lines:
        out["step"] = max(int(rec.get("step", 0)) for rec in lines)
    return out


def job_row(config: DictConfig, job_return: Any, outcome: Optional[dict] = None) -> Dict[str, Any]:
    """The summary row of one finished job (``outcome``: its status and error where the job said
    them, :func:`set_outcome`)."""
    hydra = config.hydra
    overrides: List[str] = list(OmegaConf.to_container(hydra.overrides.task))  # type: ignore[arg-type]
    # the keys the command line fixed for the whole sweep (not written yet: every override counts)
    fixed = (read_json(SweepDir(str(hydra.sweep.dir)).attempt) or {}).get("fixed", [])
    row: Dict[str, Any] = {
        "job": int(hydra.job.num),
        "status": job_return.status.name,
        # the overrides that tell this job apart (seed=2 of seed=1,2, an Optuna trial's draw)
        "swept": " ".join(o for o in overrides if o.partition("=")[0] not in fixed),
        "overrides": " ".join(overrides),
    }
    # one column per override key, so the CSV sorts and plots directly
    pairs = (item.partition("=") for item in overrides)
    row.update((key.lstrip("+~"), value) for key, sep, value in pairs if sep)
    row.update(final_figures(hydra.runtime.output_dir))
    if outcome:
        row.update(outcome)
    elif row["status"] == FAILED:
        # JobReturn.return_value re-raises a failed job's exception: read the stored one
        err = job_return._return_value
        row["error"] = f"{type(err).__name__}: {err}"
    row["run_dir"] = str(hydra.runtime.output_dir)
    return row


def write_summary(sweep_dir: Path, row: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Adds ``row`` (if given) and rebuilds ``summary.csv``, holding the sweep's lock."""
    paths = SweepDir(sweep_dir)
    paths.rows.mkdir(parents=True, exist_ok=True)
    with open(paths.rows_lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if row is not None:
            write_atomic(paths.row(row["job"]), json.dumps(row))
        rows = read_rows(sweep_dir)
        keys = {k for r in rows for k in r} - {REFUSED}
        first, last = [k for k in _FIRST if k in keys], [k for k in _LAST if k in keys]
        with atomic_file(paths.summary, "w") as f:  # (POSIX: the CSV's \r\n as written)
            columns = first + sorted(keys - set(first) - set(last)) + last
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    return rows


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "" if value is None else str(value)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A plain-text table (job, status, step, eval figures, swept overrides) for the console."""
    cols = [c for c in _FIRST if c != "overrides" and any(c in r for r in rows)]
    cells = [
        [c.replace("eval/", "") for c in cols],
        *([_fmt(r.get(c)) for c in cols] for r in rows),
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the sweep's stop


class SweepStopped(BaseException):
    """Raised in the launching process to end a stopped sweep: a BaseException, so that Hydra's
    ``run_job`` and callback runner (which catch Exception) let it through to :func:`ending`.
    Its argument: the signal that stopped the sweep."""


def _say(text: str) -> None:
    # os.write: a signal handler may run while the main thread is inside print()
    os.write(2, (text + "\n").encode())


class _Sweep(preempt.StopRequested):
    """This process's stop flag while it takes part in a sweep (``PROCESS.sweep``): what a stop
    signal does here, and what the task function tells the callbacks."""

    def __init__(self) -> None:
        super().__init__()
        # set in the process that launches the sweep: its pid, the sweep dir, this attempt's id
        self.launcher_pid = self.sweep_dir = self.attempt = None
        self.watch = False  # jobs run in other processes: leave the launcher once none runs
        self.done = threading.Event()  # the sweep ended: the watcher interrupts nothing
        self.watcher = None  # the thread of _watch
        self.outcome = {}  # set_outcome's, for on_job_end
        self.status = 0  # the exit status of the sweep this process launched (ending)
        self.running = None  # this process's entry in running/ while its job runs
        # in the launching process: the sweep dir's entries before the sweep, the dirs it made
        self.before, self.made = frozenset(), []

    @property
    def launcher(self) -> bool:
        return self.launcher_pid == os.getpid()

    def ignoring(self) -> bool:
        return self.done.is_set()

    def stop_now(self, signum: int) -> BaseException:
        # a second signal, or the watcher
        return SweepStopped(signum) if self.launcher else KeyboardInterrupt()

    def first(self, signum: int) -> None:
        if not self.launcher:
            return
        _say(
            f"rlrec sweep: {signal.Signals(signum).name}: stopping the sweep; running jobs "
            "checkpoint and stop, no new job starts (a second Ctrl-C stops at once)"
        )
        with contextlib.suppress(OSError):
            stop = {"attempt": self.attempt, "signal": signum}
            write_atomic(SweepDir(self.sweep_dir).stop, json.dumps(stop))
        if self.watch and self.watcher is None:
            self.watcher = threading.Thread(target=self._watch, name="rlrec-sweep", daemon=True)
            self.watcher.start()

    def _watch(self) -> None:
        """In the launching process of process-per-job launchers: once no job runs any more (each
        wrote its row), or after GRACE_S, interrupt the main thread, which raises SweepStopped."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if self.done.wait(0.1):
                return
            # the jobs of this attempt still run by their process (those of dead ones are ignored)
            entries = SweepDir(self.sweep_dir).running.glob("*.json")
            if not any(
                e.get("attempt") == self.attempt and rundir.alive(e) for e in map(_json, entries)
            ):
                break
        else:
            _say(f"rlrec sweep: jobs still running {GRACE_S:.0f} s after the stop: ending them")
        if not self.done.is_set():
            _thread.interrupt_main(signal.SIGINT)


def _json(path: Path) -> Dict[str, Any]:
    return read_json(path) or {}


def _state() -> _Sweep:
    """This process's :class:`_Sweep`, its stop flag from the first call until :func:`ending`."""
    if PROCESS.sweep is None:
        PROCESS.sweep = _Sweep()
    return PROCESS.sweep


def _stop_signal(sweep_dir: Path) -> Optional[int]:
    """The signal that stopped the sweep (this process got it, or the launching process recorded
    it for this attempt), else None: a job that has not started training yet must not start."""
    attempt, stop = _json(SweepDir(sweep_dir).attempt).get("id"), _json(SweepDir(sweep_dir).stop)
    recorded = int(stop["signal"]) if attempt and stop.get("attempt") == attempt else None
    return _state().signum or recorded


def set_outcome(status: str, error: str, refused: bool = False) -> None:
    """What the job tells the callbacks when it returns without a result: FAILED (``refused``:
    its config was refused before work) or STOPPED (by a signal, or not started);
    :meth:`SweepSummary.on_job_end`, which Hydra calls next in the same process, puts it into the
    job's row."""
    _state().outcome = {"status": status, "error": error, REFUSED: refused}


def _not_started(signum: int) -> str:
    return f"not started: the sweep was stopped by {signal.Signals(signum).name}"


def _watch_launcher(st: _Sweep, attempt: Dict[str, Any]) -> None:
    """A stop signal between this process's jobs sets its flag; a worker process of the
    launching process (joblib's) watches it: a launcher killed with SIGKILL sends no signal, so
    the job stops with a checkpoint once it is gone."""
    st.catch(STOP_SIGNALS)
    launcher = attempt.get("pid") if attempt.get("host") == rundir.this_host() else None
    if launcher == os.getppid() and launcher != os.getpid():
        st.watch_parent(launcher)


def job(cfg: DictConfig, run_dir: Path, sweep_dir: Path, num: int) -> Optional[float]:
    """Job ``num`` of the sweep in ``sweep_dir``, as the task function runs it: a refused config
    or a diverged run fails this job alone (a FAILED row with the error; the other jobs run); a
    stop signal stops it after its checkpoint (a STOPPED row), or before it trains ("not
    started"); submitit's own signal requeues it. A stop signal that reaches this process between
    jobs or while the job is built is recorded, not fatal (a joblib worker that died of it would
    take the other workers with it); submitit handles the signals of its own jobs."""
    import torch

    from rlrec.train.divergence import Diverged

    st, main = _state(), distributed.env_rank() == 0  # several tasks: rank 0 keeps the books
    attempt = _json(SweepDir(sweep_dir).attempt)  # who launched the sweep, from where
    if main and not preempt.under_submitit():
        _watch_launcher(st, attempt)
    if (signum := _stop_signal(sweep_dir)) is not None:  # the sweep is stopping: start nothing
        return set_outcome(STOPPED, _not_started(signum))
    threads, claim = torch.get_num_threads(), None  # jobs of a basic launcher share this process
    try:
        try:
            if main:
                claim = rundir.claim(run_dir, "hydra.sweep.dir", record=False)
            runner = preflight.start(cfg, run_dir, st, holder=claim and claim.previous)
        except ConfigError as exc:
            print(f"rlrec: config error: {exc}", file=sys.stderr)
            return set_outcome(FAILED, f"ConfigError: {exc}", refused=True)
        signum = distributed.broadcast(_stop_signal(sweep_dir))  # rank 0's decision
        if signum is not None:  # the stop came while the job was being built
            runner.close()
            return set_outcome(STOPPED, _not_started(signum))
        if main:  # running (for the launcher's watcher) until its row is written
            st.running = SweepDir(sweep_dir).running_entry(num)
            st.running.parent.mkdir(parents=True, exist_ok=True)
            record = {"job": num, **rundir.me(), "attempt": attempt.get("id")}
            write_atomic(st.running, json.dumps(record))
        try:
            result = runner.run()
            if main:  # report.html of the run (of the sweep: python -m rlrec.report)
                report.write_at_end(run_dir, runner.cfg.report)
        except Diverged as exc:  # one line (every rank stops at the same iteration)
            if main:
                print(exc, file=sys.stderr, flush=True)
            return set_outcome(FAILED, str(exc))
    finally:
        torch.set_num_threads(threads)  # the next job starts with the process's default again
        if claim is not None:
            claim.release()
    stopped = runner.stop.signum
    # a stop of the sweep, or of this job whose launching process is gone (SIGHUP); submitit's
    # own signal requeues the job (and exits)
    if stopped is not None and stopped != preempt.requeue_signal():
        name = signal.Signals(stopped).name
        at = f"at step {runner.global_step} (checkpoint saved): resume=auto continues it"
        return set_outcome(STOPPED, f"stopped by {name} {at}")
    preempt.requeue_if_preempted(stopped)
    return result.get("eval/return")


# --------------------------------------------------------------------------- the end of a sweep


def _refused(sweep_dir: Path, rows: List[Dict[str, Any]]) -> None:
    """Every job was refused before work: removes what the sweep created (its rows, summary.csv,
    Hydra's files and job dirs; the sweep dir and its parents when it made them, once empty) and
    ends with the refusals, as a refused run does (exit 2)."""
    st = _state()
    ours = frozenset(p.name for p in (SweepDir(sweep_dir).rows, SweepDir(sweep_dir).summary))
    rundir.remove_created(sweep_dir, st.before, st.made, ours=ours)
    jobs: Dict[str, List[str]] = {}
    for r in rows:  # one line for each refusal, naming its jobs
        jobs.setdefault(r["error"].removeprefix("ConfigError: "), []).append(str(r["job"]))
    for error, nums in jobs.items():
        print(f"rlrec: config error: {error} (job {', '.join(nums)})", file=sys.stderr, flush=True)
    st.status = 2


def _end(sweep_dir: Optional[Path], stopped: bool = False) -> None:
    """The end of a sweep this process launched (``stopped``: by :class:`SweepStopped`): the
    rows of the jobs the stop left unstarted, the summary table, what failed or was stopped, and
    the exit status it makes; a sweep whose jobs were all refused ends as a refused run does."""
    st = _state()
    st.done.set()
    signum, failed = st.signum or (signal.SIGINT if stopped else None), []
    if sweep_dir is not None and SweepDir(sweep_dir).rows.is_dir():
        rows = read_rows(sweep_dir)
        if rows and all(r.get(REFUSED) for r in rows) and signum is None:
            return _refused(sweep_dir, rows)
        have = {int(r.get("job", -1)) for r in rows}
        for job_dir in sorted(Path(sweep_dir).iterdir()) if stopped else ():
            # a job handed to a worker as the sweep stopped, whose worker ended (with the
            # launching process) after Hydra made the job's dir and before the job wrote its own
            # "not started" row (no job trains without a row of its own: one still building
            # checks the stop before it trains)
            if job_dir.is_dir() and job_dir.name.isdigit() and int(job_dir.name) not in have:
                row = {"job": int(job_dir.name), "status": STOPPED, "error": _not_started(signum)}
                # its overrides (none where Hydra had not written them yet)
                row.update(overrides=" ".join(read_overrides(job_dir)), run_dir=str(job_dir))
                write_summary(sweep_dir, row)
        rows = write_summary(sweep_dir)
        if rows:
            summary = f"rlrec sweep summary ({SweepDir(sweep_dir).summary}):\n{format_table(rows)}"
            print(summary, flush=True)
        failed = [str(r.get("job")) for r in rows if r.get("status") == FAILED]
        if failed:
            _say(
                f"rlrec sweep: {len(failed)} of {len(rows)} jobs failed (job {', '.join(failed)}):"
                f" see the error column of {SweepDir(sweep_dir).summary}"
            )
        if signum is not None or any(r.get("status") == STOPPED for r in rows):
            _say(
                f"rlrec sweep: stopped by {signal.Signals(signum or signal.SIGINT).name}; run "
                f"the same command with resume=auto hydra.sweep.dir={sweep_dir} to complete the "
                "stopped and unstarted jobs"
            )
    st.status = 128 + signum if signum is not None else int(bool(failed))


@contextlib.contextmanager
def ending() -> Iterator[None]:
    """Around Hydra in the entry point: a sweep this process launched ends with its exit status
    (SystemExit: 128 + the signal that stopped it, 1 when a job failed, 2 when every job was
    refused), also when it was stopped (:class:`SweepStopped`: its summary as it stands); then
    the process forgets it and the signal handlers it hooked (``main`` may run again in the same
    process, as the tests do)."""
    status = 0
    try:
        try:
            yield
        except SweepStopped:
            _end(_state().sweep_dir, stopped=True)
        status = PROCESS.sweep.status if PROCESS.sweep is not None else 0
    finally:
        st, PROCESS.sweep = PROCESS.sweep, None
        if st is not None:
            st.done.set()
            if st.watcher is not None:
                st.watcher.join(timeout=1.0)
            if st.running is not None:
                st.running.unlink(missing_ok=True)
            st.release()
    if status:
        raise SystemExit(status)


class SweepSummary(Callback):
    """Hydra callback: ``<sweep dir>/summary.csv`` as jobs finish, a table at the end of the
    sweep; in the launching process, the stop signals (see the module doc)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        sweep_dir = Path(str(config.hydra.sweep.dir))
        st = _state()  # what was there before: a sweep whose jobs are all refused removes the rest
        st.before = frozenset(os.listdir(sweep_dir)) if sweep_dir.is_dir() else frozenset()
        st.made = rundir.missing_dirs(sweep_dir.absolute())
        SweepDir(sweep_dir).rows.mkdir(parents=True, exist_ok=True)
        task = list(OmegaConf.to_container(config.hydra.overrides.task))  # type: ignore[arg-type]
        parsed = OverridesParser.create().parse_overrides(task)  # keys set for every job
        fixed = sorted(o.get_key_element() for o in parsed if not o.is_sweep_override())
        # this attempt of the sweep (a stop recorded by an earlier one, then resumed, is not
        # ours) and the keys it fixed, which the jobs (maybe elsewhere) read back
        st.launcher_pid, st.sweep_dir, st.attempt = os.getpid(), sweep_dir, uuid.uuid4().hex
        me = {"id": st.attempt, **rundir.me(), "fixed": fixed}
        write_atomic(SweepDir(sweep_dir).attempt, json.dumps(me))
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        st.watch = not launcher.endswith(".BasicLauncher")  # jobs run in other processes
        st.catch(STOP_SIGNALS)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if str(OmegaConf.select(config, "hydra.mode")) != "RunMode.MULTIRUN":
            return
        st = _state()
        outcome, st.outcome = st.outcome, {}
        if distributed.env_rank() != 0:  # a job of several tasks: rank 0 writes its row
            return
        row = job_row(config, job_return, outcome)
        try:
            write_summary(Path(str(config.hydra.sweep.dir)), row)
        finally:
            if st.running is not None:
                st.running.unlink(missing_ok=True)
                st.running = None
        figures = ", ".join(f"{k.split('/')[1]} {_fmt(row[k])}" for k in EVAL_KEYS[:3] if k in row)
        swept = f" ({row['swept']})" if row["swept"] else ""
        print(
            f"rlrec sweep: job {row['job']} {row['status'].lower()}{swept}"
            f"{': ' + figures if figures else ''} -> {SweepDir(config.hydra.sweep.dir).summary}",
            flush=True,
        )
        if st.orphaned:
            # a worker of a launching process that is gone: no one will hand it another job or
            # take its result (loky's worker would wait for one), so it ends here
            _say(f"rlrec sweep: job {row['job']}: the launching process is gone; this worker exits")
            sys.stdout.flush()
            os._exit(128 + signal.SIGHUP)
        if st.signum is not None and st.launcher:
            # the jobs run in this process (basic launcher): end the sweep here, start no more
            raise SweepStopped(st.signum)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _end(Path(str(config.hydra.sweep.dir)))
