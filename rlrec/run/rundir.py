"""The run dir: one run at a time in it, what a run created there, and what a resuming run may
remove.

- **The lock.** A run holds an exclusive ``fcntl.flock`` on ``<run dir>/.rlrec.lock`` for its
  whole life; the file names the holder (pid, host, since when). A second run in the same dir fails
  before any work with a message that names the holder. The kernel drops a flock when its holder
  dies, so the lock a killed run left is taken over by the next run, which remembers whom it took
  it from (:attr:`Claim.previous`): :func:`remove_stale_temporaries` removes that process's
  temporaries and no live process's.
- **What a run created.** For a single run, :class:`rlrec.run.preflight.Preflight` claims the run
  dir (:func:`claim`) before Hydra creates it: the claim records which of its ancestors and entries
  existed, creates the dir and takes the lock before Hydra writes ``.hydra/`` or its log. A run
  that then fails on its config (:meth:`Claim.discard`) removes only what it created: Hydra's own
  files, empty dirs, the run dir and its parents if it made them; never a file that was there
  before (``hydra.run.dir=.`` or a dir holding the user's own ``notes.log`` stays as it was). A
  sweep job claims its dir when it starts (Hydra has created it by then): it holds the lock but
  removes nothing.
- **Stale temporaries.** A kill at a bad moment (SIGKILL, node failure) can leave temporary files
  of the dead process (``checkpoints/.last.pt.<pid>-<n>.part``, ``videos/*/.<clip>.<pid>-<n>.part``:
  the one scheme of ``rlrec.files``); a resuming run removes them before it starts, so the run dir
  holds only complete files.
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
from typing import Dict, FrozenSet, List, Optional, Sequence

from rlrec.checks import ConfigError
from rlrec.files import inside, temporary_owner
from rlrec.layout import CHECKPOINTS, HYDRA, HYDRA_SWEEP, SUPERSEDED, TENSORBOARD, VIDEOS, RunDir

this_host = socket.gethostname  # the host a lock file and a sweep's records name


def me() -> Dict[str, object]:
    """This process, as a lock file and a sweep's records name it."""
    return {"pid": os.getpid(), "host": this_host()}


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


def alive(record: dict) -> bool:
    """Whether the process a record of :func:`me` names may still run: one of another host may."""
    return record.get("host") != this_host() or pid_alive(int(record.get("pid", 0)))


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run dir's lock."""

    pid: int
    host: str
    since: str

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.since}"


def _holder(text: str) -> Optional[Holder]:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        data = json.loads(text)
        return Holder(int(data["pid"]), str(data["host"]), str(data["since"]))
    return None


def _busy(path: Path, run_dir: Path, key: str) -> ConfigError:
    """The refusal naming the holder of the lock file ``path`` (read again briefly: the holder may
    be writing it)."""
    holder = None
    for _ in range(10):  # bounded: at most ~0.2 s
        with contextlib.suppress(OSError):
            holder = _holder(path.read_text())
        if holder is not None:
            break
        time.sleep(0.02)
    msg = (
        f"{key}={run_dir} is in use by another rlrec run "
        f"({holder or 'a process that did not say who it is'}; lock file {path}): wait for it "
        f"to end, or choose another {key}"
    )
    if holder is not None and not alive(vars(holder)):
        msg += (
            f" (pid {holder.pid} has exited, but a process it started, such as a simulator "
            "worker, still holds the lock: end it first)"
        )
    return ConfigError(msg)


@dataclass
class Claim:
    """A run's hold on its run dir: the lock, what existed there before the run, and the dead
    holder whose lock it took over."""

    run_dir: Path
    fd: Optional[int] = None  # the locked lock file (None: the file system cannot lock)
    previous: Optional[Holder] = None
    # what the run may remove again on a config error; None: not known (a sweep job)
    created_dirs: List[Path] = field(default_factory=list)  # the run dir and ancestors it made
    before: Optional[FrozenSet[str]] = None  # names in the run dir before the run

    def _lock(self, key: str) -> None:
        """An exclusive flock on ``<run dir>/.rlrec.lock``, written with its holder, noting the
        dead holder it was taken over from (the kernel released a dead holder's lock)."""
        path = RunDir(self.run_dir).lock
        for _ in range(20):  # another run may unlink the file between our open and our flock
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _busy(path, self.run_dir, key) from None
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                print(
                    f"rlrec: warning: cannot lock {path} ({err}): a second run in {self.run_dir} "
                    "would not be detected",
                    file=sys.stderr,
                )
                return
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)  # locked a file its holder unlinked on release: try the new one
        else:
            raise ConfigError(f"{key}={self.run_dir}: cannot take the lock {path}")
        self.fd = fd
        with os.fdopen(os.dup(fd), "r+") as f:
            previous = _holder(f.read())
            f.seek(0)
            f.truncate()
            f.write(json.dumps({**me(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}) + "\n")
        if previous is not None and previous.pid != os.getpid():
            self.previous = previous
            print(
                f"rlrec: took over the lock of {self.run_dir} from {previous}, which is no longer "
                "running",
                file=sys.stderr,
                flush=True,
            )

    def release(self) -> None:
        """Removes the lock file and drops the lock (unlinked first, so a run waiting on this
        file notices and locks a new one). Idempotent."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                RunDir(self.run_dir).lock.unlink()
            os.close(self.fd)
            self.fd = None

    def discard(self) -> None:
        """After a config error: releases the claim and removes what this run created (nothing
        that existed before the claim)."""
        self.release()
        if self.before is not None:
            remove_created(self.run_dir, self.before, self.created_dirs)


def missing_dirs(path: Path) -> List[Path]:
    """``path`` and those of its ancestors that do not exist, top-most first."""
    return [p for p in reversed([path, *path.parents]) if not p.exists()]


def claim(run_dir: Path, key: str, record: bool = True) -> Claim:
    """Takes ``run_dir`` for this run: creates it (noting what it creates and, with ``record``,
    which entries were there before) and takes its lock; a ConfigError naming ``key`` and the
    holder while another run holds it, having created nothing."""
    run_dir = Path(os.path.abspath(run_dir))
    before = frozenset(os.listdir(run_dir)) if run_dir.is_dir() else frozenset()
    result = Claim(run_dir, before=before if record else None)
    for d in missing_dirs(run_dir):
        with contextlib.suppress(FileExistsError):  # made meanwhile by someone else: not ours
            d.mkdir()
            result.created_dirs.append(d)
    try:
        result._lock(key)
    except BaseException:
        _remove_empty(result.created_dirs)
        raise
    return result


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
) -> None:
    """Removes the entries of ``run_dir`` that are not in ``before``, when each is Hydra's or
    named in ``ours`` (the caller's own), then the dirs of ``created_dirs`` that are empty, last
    first; nothing when the run wrote anything else."""
    new = [run_dir / name for name in set(os.listdir(run_dir)) - before] if run_dir.is_dir() else []
    if all(p.name in ours or _only_hydra_files(p) for p in new):  # else: the run wrote its own
        for p in new:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        _remove_empty(created_dirs)


def _remove_empty(dirs: List[Path]) -> None:
    """Removes ``dirs`` (the run dir and the parents a claim made), last first, while each is
    empty."""
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            return


def _stale(pid: int, in_run_dir: bool, holder: Optional[Holder]) -> bool:
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
    if holder is not None and pid == holder.pid:
        return holder.host != this_host() or not pid_alive(pid)
    return in_run_dir and (holder is None or holder.host == this_host()) and not pid_alive(pid)


def remove_stale_temporaries(
    run_dir: Path, recorder_dirs: Sequence[str] = (), holder: Optional[Holder] = None
) -> List[Path]:
    """Deletes the temporary files that processes now gone left in ``run_dir`` (itself, and its
    ``checkpoints/``, ``videos/``, ``superseded/`` and ``tensorboard/``), and the clip
    temporaries (``.<clip>.<pid>-<n>.part``) they left in ``recorder_dirs`` (``recorder.dir``
    outside the run dir): never a file of this process or of a live one (see :func:`_stale`).
    ``holder``: the dead process whose lock this run took over (:attr:`Claim.previous`)."""
    run_dir = Path(run_dir)
    subs = (CHECKPOINTS, VIDEOS, SUPERSEDED, TENSORBOARD)
    candidates = [(p, True) for sub in subs for p in (run_dir / sub).rglob(".*")]
    # metrics.jsonl rewritten by a resume (rlrec.train.timeline)
    candidates += [(p, True) for p in run_dir.glob(".*.part")]
    for d in dict.fromkeys(recorder_dirs):  # the recorder writes its clips into the dir itself
        candidates += [(p, inside(Path(d), run_dir)) for p in Path(d).glob(".*.part")]
    removed = []
    for p, in_run_dir in dict.fromkeys(candidates):
        pid = temporary_owner(p.name)
        if pid is not None and p.is_file() and _stale(pid, in_run_dir, holder):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed
