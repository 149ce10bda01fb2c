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
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Dict, Optional, Sequence

from rlrec import distributed


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
    does not replace it, so the run is still requeued. A sweep's flag (``rlrec.run.sweep``, a
    subclass that overrides :meth:`ignoring`, :meth:`first` and :meth:`stop_now`, called from the
    handler: keep them short) catches the stop signals between its jobs too (:meth:`catch`), and
    its jobs' runs use it, so a signal between jobs and one during a job are one stop."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._sigints = 0
        self._running = False  # a run is in progress (install .. uninstall)
        self._previous: Dict[int, Any] = {}  # the handlers this flag replaced, until release()
        self._held = False  # catch() hooked signals for the time between runs too
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
        self.signum = self.signum or signum
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
        self._sigints += signum == signal.SIGINT
        if self.signum is None:
            self.signum = signum
            self.first(signum)
        elif not self._running:
            raise self.stop_now(self.signum)
        # a run writes its checkpoint: only a second Ctrl-C cuts it short
        elif signum == signal.SIGINT and self._sigints > 1:
            raise KeyboardInterrupt

    def _hook(self, signals: Sequence[int]) -> None:
        for sig in signals:
            if sig not in self._previous:
                # not the main thread (some launchers): the default handlers stay
                with contextlib.suppress(ValueError):
                    self._previous[sig] = signal.signal(sig, self._handle)

    def catch(self, signals: Sequence[int]) -> None:
        """``signals`` set this flag between runs too, until :meth:`release`."""
        self._held = True
        self._hook(signals)

    def install(self) -> None:
        """A run starts: the stop signals set this flag until :meth:`uninstall`."""
        self._running = True
        usr = requeue_signal()
        self._hook([signal.SIGTERM, signal.SIGINT, *([usr] if usr else [])])

    def uninstall(self) -> None:
        self._running = False
        if not self._held:
            self.release()

    def release(self) -> None:
        """Restores the handlers this flag replaced."""
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, handler)
        self._previous.clear()


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
