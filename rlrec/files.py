"""Files rlrec writes: one temporary-name scheme, atomic writes, and one directory probe.

Every file written under a final name (a checkpoint, a clip, a sidecar, a sweep's row, a logger's
private link) is first written to a hidden temporary beside it,

    ``.<name>.<pid>-<n>.part``   (``<pid>``: the writing process, ``<n>``: a per-process counter)

and then renamed into place (``os.replace``, atomic on POSIX): a reader sees the old file or the
complete new one, never half of it. A write that fails (a full disk, an exception) removes its
temporary; a kill leaves at most the temporary, whose name says which process wrote it, so a
resuming run removes those of processes that are gone (:func:`temporary_owner`, read by
``rlrec.run.preempt.remove_stale_temporaries``) and never one of a live process.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Iterator, Optional, Union

from rlrec.checks import ConfigError

PathLike = Union[str, "os.PathLike[str]"]

_COUNTER = itertools.count()
_TEMPORARY = re.compile(r"^\..+\.(\d+)-\d+\.part$")  # .<name>.<pid>-<n>.part


def temporary_name(final: PathLike, tag: str = "") -> str:
    """A fresh hidden temporary beside ``final``: ``.<name>[.<tag>].<pid>-<n>.part``. ``tag``
    tells apart temporaries of one final name that serve another purpose (a preview link)."""
    head, tail = os.path.split(os.fspath(final))
    return os.path.join(head, f".{tail}{tag and '.' + tag}.{os.getpid()}-{next(_COUNTER)}.part")


def temporary_owner(name: str) -> Optional[int]:
    """The pid that wrote the temporary named ``name`` (a base name), or None when ``name`` is
    not a temporary of this scheme."""
    m = _TEMPORARY.match(name)
    return int(m[1]) if m else None


def remove_quietly(path: Optional[PathLike]) -> None:
    """Removes ``path`` if it can (a temporary this process wrote): already gone, or its
    directory is (or is no directory any more), is no error here."""
    with contextlib.suppress(OSError, TypeError):  # (None: nothing to remove)
        os.remove(path)


@contextlib.contextmanager
def atomic_file(path: PathLike, mode: str = "wb", *, durable: bool = False) -> Iterator[IO]:
    """``with atomic_file(path) as f: ...`` writes ``f`` to a temporary beside ``path`` and moves
    it into place when the block ends; on any exception the temporary is removed and ``path`` is
    untouched. ``durable``: the data and the rename are fsynced (a checkpoint)."""
    tmp = temporary_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        # durable: the rename too survives a power cut (a platform without directory handles, or
        # a filesystem that cannot sync a directory: the rename is still atomic)
        if durable:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_atomic(path: PathLike, data: Union[str, bytes], *, durable: bool = False) -> None:
    """Replaces ``path`` with ``data`` in one atomic rename (see :func:`atomic_file`)."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", durable=durable) as f:
        f.write(data)


def inside(path: PathLike, root: PathLike) -> bool:
    """Whether ``path`` is ``root`` or lies below it (symbolic links resolved)."""
    path, root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return path == root or root in path.parents


def probe_dir(path: PathLike, key: str, *, use: str = "a directory", create: bool = False) -> str:
    """ConfigError naming ``key`` unless files can be created in ``path``. ``create=False`` looks
    before any work: ``path`` is, or can be created as, a directory, probed with a temporary file
    in its nearest existing ancestor (removed at once: nothing is left behind). ``create=True``
    creates ``path`` and probes it. Returns ``path``."""
    shown = os.fspath(path)
    target = Path(shown).absolute()
    refused = f"{key}={shown!r} cannot be used as {use}"
    try:
        if create:
            os.makedirs(target, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{refused}: {err}") from err
    base = next(p for p in [target, *target.parents] if p.exists())  # the nearest that exists
    if not base.is_dir():
        raise ConfigError(f"{refused}: {base} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=base, prefix=".rlrec-probe-"):
            pass
    except OSError as err:
        raise ConfigError(f"{refused}: {base} is not writable ({err})") from err
    return shown
