"""Preemption and requeue: what a run does when a scheduler stops it, and how it comes back.

- SIGTERM / SIGINT (SLURM preemption, Ctrl-C): :class:`StopRequested`, the flag the runner checks
  at every env step, makes the run drop the unfinished rollout, closes the recorders (the clip
  in progress is saved), writes a checkpoint and exits.
- Under submitit (``hydra/launcher=submitit_slurm`` / ``submitit_local``) its preemption signal
  (USR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise, sent ``signal_delay_s`` before the time
  limit) does the same, and then hands over to submitit's own handler, which requeues the job with
  the same overrides (the Hydra submitit launcher's ``checkpoint``) and exits.
- A job started by submitit resumes by itself: ``resume`` defaults to ``auto`` there, and the
  requeued job has the same run dir (Hydra copies the resolved sweep dir into every job), so it
  continues from the newest checkpoint. Elsewhere pass ``resume=auto`` with the run dir of the run
  to continue.
- A kill at a bad moment (SIGKILL, node failure) can leave temporary files of the dead process
  (``checkpoints/.last.pt.<pid>.tmp``, ``videos/*/.<clip>.<pid>-<n>.part``); a resuming run
  removes them before it starts, so the run dir holds only complete files.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Dict, List, Optional

# temporaries of rlrec.checkpoint.save and of the recorder's encoder: the pid is in the name
_TEMPORARY = re.compile(r"^\..+\.(\d+)(-\d+\.part|\.tmp)$")


def under_submitit() -> bool:
    """True inside a job started by submitit (local or SLURM)."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def requeue_signal() -> Optional[int]:
    """submitit's preemption/timeout signal in a submitit job, else None."""
    if not under_submitit():
        return None
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}", signal.SIGUSR2))


def stop_signals() -> List[int]:
    """The signals that make a run checkpoint and stop."""
    sigs = [signal.SIGTERM, signal.SIGINT]
    usr = requeue_signal()
    if usr is not None and usr not in sigs:
        sigs.append(usr)
    return sigs


class StopRequested:
    """The stop flag: installed for the run's life, the :func:`stop_signals` set it and the loop
    checks it every env step; a second SIGINT interrupts at once (KeyboardInterrupt)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: Dict[int, object] = {}

    def __bool__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def install(self) -> None:
        for sig in stop_signals():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (some launchers): the default handlers stay
                pass

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def default_resume(cfg) -> None:
    """``resume=auto`` for submitit jobs that did not ask for anything else (see module doc)."""
    if under_submitit() and cfg.resume is None and cfg.checkpoint is None and not cfg.eval_only:
        cfg.resume = "auto"


def requeue_if_preempted(signum: Optional[int]) -> None:
    """After the run stopped on submitit's signal and saved its checkpoint: let submitit requeue
    the job (its handler exits the process)."""
    if signum is None or signum != requeue_signal():
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)


def remove_stale_temporaries(run_dir: Path) -> List[Path]:
    """Deletes temporary checkpoint/clip files that other processes left in ``run_dir``'s
    ``checkpoints/`` and ``videos/`` (never this process's own): a resuming run owns the dir."""
    removed = []
    run_dir = Path(run_dir)
    for sub in ("checkpoints", "videos"):
        base = run_dir / sub
        if not base.is_dir():
            continue
        for p in base.rglob(".*"):
            m = _TEMPORARY.match(p.name)
            if not m or not p.is_file():
                continue
            pid = int(m.group(1))
            if pid == os.getpid():
                continue
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
    return removed
