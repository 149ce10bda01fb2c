"""Preemption and requeue: what a run does when a scheduler stops it, and how it comes back.

- SIGTERM / SIGINT (SLURM preemption, Ctrl-C): :class:`StopRequested`, the flag the runner checks
  at every env step, makes the run drop the unfinished rollout (or evaluation), close the
  recorders (the clip in progress is saved), write the checkpoint of the state as of that
  rollout's (evaluation's) start, and exit; ``resume=auto`` then continues bit-exactly.
- Under submitit (``hydra/launcher=submitit_slurm`` / ``submitit_local``) its preemption signal
  (USR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise, sent ``signal_delay_s`` before the time
  limit) does the same, and then hands over to submitit's own handler, which requeues the job with
  the same overrides (the Hydra submitit launcher's ``checkpoint``) and exits.
- A job started by submitit resumes by itself: ``resume`` defaults to ``auto`` there, and the
  requeued job has the same run dir (Hydra copies the resolved sweep dir into every job), so it
  continues from the newest checkpoint. Elsewhere pass ``resume=auto`` with the run dir of the run
  to continue.
- A job run by a worker process of a joblib sweep's launcher watches that launcher
  (:meth:`StopRequested.watch_parent`, set up by ``rlrec.run.sweep``): a launcher killed with
  SIGKILL sends nothing, so once per iteration the job checks that its parent is still the
  launcher, and stops as on a SIGHUP (checkpoint, exit) when it is not.
- A kill at a bad moment (SIGKILL, node failure) can leave temporary files of the dead process
  (``checkpoints/.last.pt.<pid>-<n>.part``, ``videos/*/.<clip>.<pid>-<n>.part``: the one scheme of
  ``rlrec.files``); a resuming run removes them before it starts, so the run dir holds only
  complete files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rlrec import distributed
from rlrec.files import inside, temporary_owner
from rlrec.layout import CHECKPOINTS, SUPERSEDED, TENSORBOARD, VIDEOS
from rlrec.run import rundir


def under_submitit() -> bool:
    """True inside a job started by submitit (local or SLURM)."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def requeue_signal() -> Optional[int]:
    """submitit's preemption/timeout signal in a submitit job, else None."""
    if not under_submitit():
        return None
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}", signal.SIGUSR2))


class StopRequested:
    """The stop flag and the process's one signal handler: installed for a run's life, the stop
    signals (SIGTERM, SIGINT, submitit's :func:`requeue_signal`) set it and the loop checks it
    every env step; a second SIGINT interrupts at once (KeyboardInterrupt). Otherwise the handler
    only sets the flag (and calls :meth:`first`: a sweep's launcher writes its stop file there):
    no checkpoint and no state of the run is touched from it (a handler runs between any two
    bytecodes, e.g. inside ``loss.backward()`` or a checkpoint write), so the work it lands in
    finishes and the run stops at the next boundary.

    ``signum`` is the first stop signal: a later one (SLURM's SIGTERM after submitit's USR2, say)
    does not replace it, so the run is still requeued. A sweep holds the process's flag for its
    life (:func:`hold`, a subclass that overrides :meth:`ignoring`, :meth:`first` and
    :meth:`stop_now`, called from the handler: keep them short): its runs then use that flag
    (:func:`run_flag`), so a signal between jobs and one during a job are one stop."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._sigints = 0
        self._runs = 0  # runs in progress (install .. uninstall)
        self._previous: Dict[int, Any] = {}  # handlers catch() replaced, until release()
        self._run_previous: Dict[int, Any] = {}  # handlers install() replaced besides
        self._parent: Optional[int] = None  # watch_parent's: the launching process
        self._agreed = False  # whether agreed() said to stop

    def __bool__(self) -> bool:
        return self.signum is not None

    @property
    def exit_status(self) -> int:
        """0 without a stop signal, else 128 + its number (SIGTERM 143, SIGINT 130): what a shell
        reports for a process that the signal ended, and what PyTorch Lightning exits with."""
        return 0 if self.signum is None else 128 + int(self.signum)

    def watch_parent(self, pid: int) -> None:
        """This process runs a job for its parent ``pid`` (a joblib sweep's launching process):
        once that parent is gone (the process was handed to another parent), :meth:`agreed`
        stops the run as a SIGHUP would, at the end of its iteration, with its checkpoint."""
        self._parent = int(pid)

    @property
    def orphaned(self) -> bool:
        """Whether the parent that :meth:`watch_parent` named is gone."""
        return self._parent is not None and os.getppid() != self._parent

    def agreed(self) -> bool:
        """Whether to stop, agreed by every rank: with several ranks one all-reduce of the flag, so
        that a signal to any rank stops every rank at the same iteration (each then exits with
        that signal); with one process the flag itself. Checked once per iteration, which is
        also when a watched parent (:meth:`watch_parent`) is looked at: one ``getppid``."""
        if self.signum is None and self.orphaned:
            self.signum = signal.SIGHUP
            os.write(
                2,
                f"rlrec: the launching process (pid {self._parent}) is gone: this job stops "
                "with a checkpoint (SIGHUP); resume=auto continues it\n".encode(),
            )
        signum = distributed.agree_signal(self.signum)
        if signum is not None and self.signum is None:
            self.signum = signum
        self._agreed = signum is not None
        return self._agreed

    def now(self) -> bool:
        """Whether a stop cuts the work in progress short now, without asking the other ranks:
        with one process once a stop signal came; with several once :meth:`agreed` said so (an
        evaluation, rank 0's alone, runs to its end before that)."""
        return self.signum is not None and (self._agreed or distributed.world_size() == 1)

    def ignoring(self) -> bool:
        """True once signals mean nothing any more (a sweep that has ended)."""
        return False

    def first(self, signum: int) -> None:
        """After the flag took its first stop signal."""

    def stop_now(self, signum: int) -> BaseException:
        """What a later signal raises while no run is in progress (``signum``: the first)."""
        return KeyboardInterrupt()

    def _handle(self, signum, frame):
        if self.ignoring():
            return
        if signum == signal.SIGINT:
            self._sigints += 1
        if self.signum is None:
            self.signum = signum
            self.first(signum)
        elif not self._runs:
            raise self.stop_now(self.signum)
        # a run writes its checkpoint: only a second Ctrl-C cuts it short
        elif signum == signal.SIGINT and self._sigints > 1:
            raise KeyboardInterrupt

    def _hook(self, sigs: Sequence[int], into: Dict[int, Any]) -> None:
        for sig in sigs:
            if sig in self._previous or sig in self._run_previous:
                continue
            # not the main thread (some launchers): the default handlers stay
            with contextlib.suppress(ValueError):
                into[sig] = signal.signal(sig, self._handle)

    @staticmethod
    def _restore(previous: Dict[int, Any]) -> None:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, handler)
        previous.clear()

    def install(self) -> None:
        """A run starts: the stop signals set this flag until :meth:`uninstall`."""
        self._runs += 1
        if self._runs == 1:  # (a signal hooked already is skipped)
            usr = requeue_signal()
            self._hook([signal.SIGTERM, signal.SIGINT, *([usr] if usr else [])], self._run_previous)

    def uninstall(self) -> None:
        self._runs = max(0, self._runs - 1)
        if self._runs == 0:
            self._restore(self._run_previous)

    def catch(self, signals: Sequence[int]) -> None:
        """``signals`` set this flag between runs too, until :func:`release`."""
        self._hook(signals, self._previous)


_HELD: Optional[StopRequested] = None  # this process's flag while a sweep holds it


def hold(flag: StopRequested) -> None:
    """Makes ``flag`` this process's stop flag until :func:`release`."""
    global _HELD
    _HELD = flag


def release() -> None:
    """Forgets the held flag and restores the handlers it replaced."""
    global _HELD
    flag, _HELD = _HELD, None
    if flag is not None:
        flag._restore(flag._run_previous)
        flag._restore(flag._previous)


def run_flag() -> StopRequested:
    """The stop flag a run installs: the one held in this process (a sweep's), else a new one."""
    return _HELD if _HELD is not None else StopRequested()


def requeue_if_preempted(signum: Optional[int]) -> None:
    """After the run stopped on submitit's signal and saved its checkpoint: let submitit requeue
    the job (its handler exits the process)."""
    if signum is None or signum != requeue_signal():
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        try:
            handler(signum, None)
        except Exception as exc:  # submitit's UncompletedJobError: timed out too many times
            print(
                f"rlrec: the job is not requeued ({exc}); its checkpoint is written: the same "
                "command with resume=auto and the same run dir (sweep dir) continues it",
                file=sys.stderr,
                flush=True,
            )
            raise


def _stale(pid: int, in_run_dir: bool, holder: Optional[rundir.Holder]) -> bool:
    """Whether a temporary named with ``pid`` was left by a process that is gone.

    - ``holder``, the process whose run-dir lock this run took over, is gone whatever host it ran
      on (the kernel released its lock); its files go everywhere, recorder dirs included;
    - other pids are checked only in the run dir (the lock says only its run writes there) and only
      where they mean something, on the host of the run dir's last holder: no such process here;
    - in a recorder dir outside the run dir, which other runs (of other hosts, maybe) may share,
      only the holder's files go.
    """
    if pid == os.getpid():
        return False
    here = rundir.this_host()
    if holder is not None and pid == holder.pid:
        return holder.host != here or not rundir.pid_alive(pid)
    return in_run_dir and (holder is None or holder.host == here) and not rundir.pid_alive(pid)


def remove_stale_temporaries(run_dir: Path, recorder_dirs: Sequence[str] = ()) -> List[Path]:
    """Deletes the temporary files that processes now gone left in ``run_dir`` (itself, and its
    ``checkpoints/``, ``videos/``, ``superseded/`` and ``tensorboard/``), and the clip
    temporaries (``.<clip>.<pid>-<n>.part``) they left in ``recorder_dirs`` (``recorder.dir``
    outside the run dir): never a file of this process or of a live one (see :func:`_stale`)."""
    removed = []
    run_dir = Path(run_dir)
    holder = getattr(rundir.claim_of(run_dir), "previous", None)  # the dead one it took over
    # (a glob of a dir that is not there finds nothing)
    subs = (CHECKPOINTS, VIDEOS, SUPERSEDED, TENSORBOARD)
    candidates = [(p, True) for sub in subs for p in (run_dir / sub).rglob(".*")]
    # metrics.jsonl rewritten by a resume (rlrec.train.timeline)
    candidates += [(p, True) for p in run_dir.glob(".*.part")]
    for d in dict.fromkeys(recorder_dirs):  # the recorder writes its clips into the dir itself
        candidates += [(p, inside(Path(d), run_dir)) for p in Path(d).glob(".*.part")]
    for p, in_run_dir in dict.fromkeys(candidates):
        pid = temporary_owner(p.name)
        if pid is None or not p.is_file() or not _stale(pid, in_run_dir, holder):
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed
