"""The run dir: one run at a time in it, and what a run created there.

- **The lock.** A run holds an exclusive ``fcntl.flock`` on ``<run dir>/.rlrec.lock`` for its
  whole life; the file names the holder (pid, host, since when). A second run in the same dir fails
  before any work with a message that names the holder. The kernel drops a flock when its holder
  dies, so the lock a killed run left is taken over by the next run, which remembers whom it took
  it from (:attr:`Claim.previous`): ``rlrec.run.preempt.remove_stale_temporaries`` removes that
  process's temporaries and no live process's.
- **What a run created.** For a single run, :class:`rlrec.run.preflight.Preflight` claims the run
  dir (:func:`claim`) before Hydra creates it: the claim records which of its ancestors and entries
  existed, creates the dir and takes the lock before Hydra writes ``.hydra/`` or its log. A run
  that then fails on its config (:meth:`Claim.discard`) removes only what it created: Hydra's own
  files, empty dirs, the run dir and its parents if it made them; never a file that was there
  before (``hydra.run.dir=.`` or a dir holding the user's own ``notes.log`` stays as it was). A
  sweep job claims its dir when it starts (Hydra has created it by then): it holds the lock but
  removes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

from rlrec.checks import ConfigError
from rlrec.layout import HYDRA, HYDRA_SWEEP, RunDir


class RunDirBusy(ConfigError):
    """Another live run holds the run dir's lock."""


this_host = socket.gethostname  # the host a lock file and a sweep's records name


def pid_alive(pid: int) -> bool:
    """True if a process ``pid`` exists on this host (a zombie counts as alive)."""
    if pid <= 0:
        return False
    try:
        with contextlib.suppress(PermissionError):  # someone else's process: it exists
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run dir's lock."""

    pid: int
    host: str
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.since}"

    @classmethod
    def parse(cls, text: str) -> Optional["Holder"]:
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["host"]), str(data["since"]))
        except (ValueError, KeyError, TypeError):
            return None


def _busy(path: Path, run_dir: Path, key: str) -> RunDirBusy:
    """The refusal naming the holder of the lock file ``path`` (read again briefly: the holder may
    be writing it)."""
    for _ in range(10):  # bounded: at most ~0.2 s
        try:
            holder = Holder.parse(path.read_text())
        except OSError:
            holder = None
        if holder is not None:
            break
        time.sleep(0.02)
    who = holder.describe() if holder is not None else "a process that did not say who it is"
    msg = (
        f"{key}={run_dir} is in use by another rlrec run ({who}; lock file {path}): wait for it "
        f"to end, or choose another {key}"
    )
    if holder is not None and holder.host == this_host() and not pid_alive(holder.pid):
        msg += (
            f" (pid {holder.pid} has exited, but a process it started, such as a simulator "
            "worker, still holds the lock: end it first)"
        )
    return RunDirBusy(msg)


def _lock(run_dir: Path, key: str) -> Tuple[Optional[int], Optional[Holder]]:
    """An exclusive flock on ``<run dir>/.rlrec.lock``, written with its holder: the open file
    (None where the file system cannot lock) and the dead holder it was taken over from (the
    kernel released a dead holder's lock), or raises :class:`RunDirBusy` naming the holder."""
    path = RunDir(run_dir).lock
    for _ in range(20):  # another run may unlink the file between our open and our flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(path, run_dir, key) from None
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                print(
                    f"rlrec: warning: cannot lock {path} ({err}): a second run in {run_dir} "
                    "would not be detected",
                    file=sys.stderr,
                )
                return None, None
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # locked a file its holder unlinked on release: try the new one
    else:
        raise RunDirBusy(f"{key}={run_dir}: cannot take the lock {path}")
    me = {"pid": os.getpid(), "host": this_host(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    with os.fdopen(os.dup(fd), "r+") as f:
        previous = Holder.parse(f.read())
        f.seek(0)
        f.truncate()
        f.write(json.dumps(me) + "\n")
    if previous is None or previous.pid == os.getpid():
        return fd, None
    print(
        f"rlrec: took over the lock of {run_dir} from {previous.describe()}, which is no longer "
        "running",
        file=sys.stderr,
        flush=True,
    )
    return fd, previous


@dataclass
class Claim:
    """A run's hold on its run dir: the lock, what existed there before the run, and the dead
    holder whose lock it took over."""

    run_dir: Path
    fd: Optional[int]  # the locked lock file (None: the file system cannot lock)
    previous: Optional[Holder]
    # what the run may remove again on a config error; None: not known (a sweep job)
    created_dirs: List[Path] = field(default_factory=list)  # the run dir and ancestors it made
    before: Optional[FrozenSet[str]] = None  # names in the run dir before the run

    def release(self) -> None:
        """Removes the lock file and drops the lock (unlinked first, so a run waiting on this
        file notices and locks a new one). Idempotent."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                RunDir(self.run_dir).lock.unlink()
            os.close(self.fd)
            self.fd = None
        if claim_of(self.run_dir) is self:
            del _CLAIMS[os.path.realpath(self.run_dir)]

    def discard(self) -> List[Path]:
        """After a config error: releases the claim and removes what this run created (nothing
        that existed before the claim); returns the removed paths."""
        self.release()
        if self.before is None:
            return []
        return remove_created(self.run_dir, self.before, self.created_dirs)


_CLAIMS: Dict[str, Claim] = {}  # this process's claims, by run dir (its real path)


def missing_dirs(path: Path) -> List[Path]:
    """``path`` and those of its ancestors that do not exist, top-most first."""
    return [p for p in reversed([path, *path.parents]) if not p.exists()]


def claim(run_dir: Path, key: str, record: bool = True) -> Claim:
    """Takes ``run_dir`` for this run: creates it (noting what it creates and, with ``record``,
    which entries were there before) and takes its lock; :class:`RunDirBusy` (a ConfigError naming
    ``key`` and the holder) while another run holds it, having created nothing."""
    run_dir = Path(os.path.abspath(run_dir))
    old = claim_of(run_dir)
    if old is not None:  # an earlier job of this process that ended without releasing
        old.release()
    created: List[Path] = []
    before = frozenset(os.listdir(run_dir)) if run_dir.is_dir() else frozenset()
    for d in missing_dirs(run_dir):
        with contextlib.suppress(FileExistsError):  # made meanwhile by someone else: not ours
            d.mkdir()
            created.append(d)
    try:
        fd, previous = _lock(run_dir, key)
    except BaseException:
        _remove_empty(created)
        raise
    result = Claim(run_dir, fd, previous, created, before if record else None)
    _CLAIMS[os.path.realpath(run_dir)] = result
    return result


def claim_of(run_dir: Path) -> Optional[Claim]:
    """This process's claim on ``run_dir`` (made by Preflight for a single run), if any."""
    return _CLAIMS.get(os.path.realpath(run_dir))


def _only_hydra_files(path: Path) -> bool:
    """A created entry the run may remove: Hydra's output subdir, its ``*.log``, its sweep file,
    or dirs that hold only these (a refused sweep job's dir)."""
    if path.is_symlink():
        return False
    if path.is_dir():
        return path.name == HYDRA or all(_only_hydra_files(p) for p in path.iterdir())
    return path.is_file() and (path.name.endswith(".log") or path.name == HYDRA_SWEEP)


def remove_created(
    run_dir: Path,
    before: FrozenSet[str],
    created_dirs: List[Path],
    ours: FrozenSet[str] = frozenset(),
) -> List[Path]:
    """Removes the entries of ``run_dir`` that are not in ``before``, when each is Hydra's or
    named in ``ours`` (the caller's own), then the dirs of ``created_dirs`` that are empty, last
    first; nothing when the run wrote anything else. Returns the removed paths."""
    if not run_dir.is_dir():
        return []
    new = [run_dir / name for name in sorted(set(os.listdir(run_dir)) - before)]
    if not all(p.name in ours or _only_hydra_files(p) for p in new):
        return []  # the run wrote something of its own: keep everything
    for p in new:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return new + _remove_empty(created_dirs)


def _remove_empty(dirs: List[Path]) -> List[Path]:
    """Removes ``dirs`` (the run dir and the parents a claim made), last first, while each is
    empty; returns the removed ones."""
    removed = []
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            break
        removed.append(d)
    return removed
