"""Checkpoint files: written atomically, recognised by a format tag, sealed by a digest, loaded
without running code, checked against the env.

- **No code runs on load.** Every load is ``torch.load(..., weights_only=True)``: a checkpoint
  holds tensors, dicts, lists, tuples, str, int, float, bool and None only (the RNG states as
  tensors, the config as plain data), and :func:`save` refuses anything else before it
  writes. A file that would need the full unpickler (a pickle whose globals run code, such as a
  ``__reduce__`` payload) is refused with a :class:`ConfigError` that says so; it is never
  unpickled by anything but the weights-only unpickler, and a file that is not a torch zip archive
  is not unpickled at all (its opcodes are only scanned, which runs nothing).
- **Damage is detected.** Each file carries the sha256 :func:`digest` of its contents (every
  tensor's dtype, shape and bytes, and every other value), verified on every load.
  ``resume=auto`` (:func:`find_resume`) falls back from a damaged or unreadable file to the newest
  good one, with a warning naming the bad file, and stops with a :class:`ConfigError` naming every
  file when none can be used (a restart at step 0 would append duplicate steps to metrics.jsonl).
  Every lookup of a run's checkpoints (``resume=auto``, the export, the replay) reads them through
  :func:`scan`, newest first.
- **A failed write loses nothing.** :func:`save` writes a temporary beside the target and renames
  it into place (``rlrec.files.atomic_file``); on a full disk (any ``OSError``) the temporary is
  removed, the files written before are untouched, and :class:`CheckpointWriteError` says which
  file could not be written and how to resume.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import pickletools
import random
import shlex
import struct
import sys
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.files import atomic_file
from rlrec.layout import CHECKPOINT_FILES, LAST_CHECKPOINT, RunDir, periodic_iteration

FORMAT = "rlrec-checkpoint"
# 3: loads with weights_only=True (the numpy/Python RNG states as tensors), sha256 digest
# 2: env stack state keyed by role (rlrec.train.stack)
VERSION = 3

PLAIN_TYPES = "tensors, dicts, lists, tuples, str, int, float, bool and None"


class UnsafeCheckpoint(ConfigError):
    """A file that would run code if it were unpickled: refused, never retried elsewhere."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (e.g. a full disk); the message says which file, that
    the checkpoints written before are intact, and how to resume; its ``__cause__``: the
    ``OSError``."""


# ---------------------------------------------------------------------- RNG streams
def seed_rng(seed: int) -> None:
    """Seeds every global RNG stream a run draws from (Python's, numpy's and torch's)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> Dict[str, Any]:
    """Every global RNG stream a run draws from, as tensors and plain data (loads with
    ``weights_only=True``)."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    numpy = {"bit_generator": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64))}
    numpy.update(pos=int(pos), has_gauss=int(has_gauss), cached_gaussian=float(gauss))
    internal = torch.tensor(internal, dtype=torch.int64)  # 625 ints below 2**32
    python = {"version": int(version), "state": internal, "gauss_next": gauss_next}
    state = {"torch": torch.get_rng_state(), "numpy": numpy, "python": python}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # this process's own device only, the current one (rlrec.envs.device.use_device made it
        # so), so that the checkpoint resumes on a machine with any number of visible GPUs
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npy, py, cuda = state["numpy"], state["python"], state.get("cuda")
    rest = int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])
    np.random.set_state((npy["bit_generator"], npy["key"].numpy().astype(np.uint32), *rest))
    random.setstate((int(py["version"]), tuple(py["state"].tolist()), py["gauss_next"]))
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, (list, tuple)):  # an older checkpoint: every visible device's state
        index = torch.cuda.current_device()
        cuda = cuda[index] if index < len(cuda) else None
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)  # the current device's


# ---------------------------------------------------------------------- digest
def digest(data: Mapping) -> str:
    """sha256 of everything in ``data`` but its ``digest`` entry: each tensor's dtype, shape and
    bytes, each other value with its type, in order. Raises :class:`TypeError` naming the entry
    for a value that ``torch.load(weights_only=True)`` could not load back as plain data."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in data.items() if k != "digest"}, "")
    return h.hexdigest()


_TAGS = ((b"I", int), (b"S", str), (b"Y", bytes), (b"X", (torch.dtype, torch.device)))


def _feed(h, obj, where):
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"B1" if obj else b"B0")
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, (int, str, bytes, torch.dtype, torch.device)):  # tag, length, bytes
        tag = next(tag for tag, kinds in _TAGS if isinstance(obj, kinds))
        text = obj if isinstance(obj, (str, bytes)) else str(obj)  # a str Enum: its value
        text = text if isinstance(text, bytes) else str.encode(text, "utf-8", "surrogatepass")
        h.update(tag + b"%d:" % len(text) + text)
    elif isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise _refused(where, "a non-strided tensor")
        t = obj.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}:".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        h.update(b"D%d:" % len(obj))
        for k, v in obj.items():
            _feed(h, k, f"{where}[key]")
            _feed(h, v, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, (list, tuple)):  # torch.Size is a tuple
        h.update(b"L%d:" % len(obj))
        for i, v in enumerate(obj):
            _feed(h, v, f"{where}[{i}]")
    else:
        raise _refused(where, f"a {type(obj).__module__}.{type(obj).__qualname__}")


def _refused(where, kind):
    return TypeError(
        f"checkpoint entry {where or '<top level>'} is {kind}: a checkpoint holds {PLAIN_TYPES} "
        "only, so that it loads with torch.load(weights_only=True) without running code"
    )


# ---------------------------------------------------------------------- writing
def save(path: Path, payload: Dict[str, Any], run_dir: Optional[Path] = None) -> None:
    """Writes ``payload`` (plus the format tag, version and digest) through a temporary beside
    ``path`` (``rlrec.files``: ``.<name>.<pid>-<n>.part``, fsynced, renamed into place, the
    rename fsynced), so a kill at any moment leaves the previous file at ``path`` valid. A value
    that would not load as plain data is refused before anything is written. An ``OSError`` (a
    full disk) removes the temporary and raises :class:`CheckpointWriteError`; ``run_dir`` goes
    into its resume command."""
    path = Path(path)
    data = {"format": FORMAT, "version": VERSION, **payload}
    data["digest"] = digest(data)
    buf = io.BytesIO()  # serialised in memory: the file is written by plain os-level writes
    torch.save(data, buf)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, durable=True) as f:
            f.write(buf.getbuffer())
    except OSError as exc:  # e.g. a full disk: atomic_file removed the half-written temporary
        raise CheckpointWriteError(storage_failure(exc, run_dir, path)) from exc


# what a full or read-only output file system raises, wherever the run writes
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
}


def storage_failure(
    exc: OSError, run_dir: Optional[Path], checkpoint: Optional[Path] = None
) -> str:
    """One line for a run that could not write a file of its output (``exc.errno`` in
    :data:`STORAGE_ERRNOS`), the ``checkpoint`` or another: which file and why, that what was
    written before it is on disk, and how to continue (from which checkpoint)."""
    cause = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in STORAGE_ERRNOS:
        cause += f" ({STORAGE_ERRNOS[exc.errno]})"
    target = shlex.quote(f"hydra.run.dir={run_dir}") if run_dir else "hydra.run.dir=<run dir>"
    then = "no checkpoint was written before it, so the run starts again (what it wrote is moved"
    then += " aside)"
    with contextlib.suppress(Exception):  # (quietly: what resume=auto skips, it says then)
        path, data = find_resume(
            checkpoint.parent if checkpoint else RunDir(run_dir).checkpoints, True
        )
        then = f"the checkpoints before are intact ({path.name} the newest): it continues from "
        then += f"that one (step {int(data['global_step']):,})"
    what = f"checkpoint {checkpoint}" if checkpoint else exc.filename or "the run output"
    return (
        f"could not write {what}: {cause}. What the run wrote before it is on disk, nothing was "
        f"replaced. Once the run dir can be written again (free some space), python train.py "
        f"resume=auto {target} (with the run's other overrides): {then}"
    )


# ---------------------------------------------------------------------- reading
def load(path: str | Path, key: str = "checkpoint") -> Dict[str, Any]:
    """Loads and verifies an rlrec checkpoint; a clear :class:`ConfigError` naming
    ``key=path`` otherwise (missing, not an rlrec checkpoint, needs code to load, other
    version, damaged)."""
    check_exists(path, key)
    return _read(Path(path), f"{key}={path}")


def check_exists(path: str | Path, key: str = "checkpoint") -> None:
    """A :class:`ConfigError` naming ``key=path`` when no file is there (asked before any work by
    ``rlrec.run.preflight.refuse_before_work``; what the file holds shows once it is read)."""
    if not Path(path).is_file():
        raise ConfigError(
            f"{key}={path} does not exist (expected an rlrec checkpoint file such as "
            "<run dir>/checkpoints/last.pt)"
        )


def _read(p, label):
    """The verified contents of ``p``; :class:`UnsafeCheckpoint` for a file that would run code,
    :class:`ConfigError` for any other reason it cannot be used."""
    other = lambda v: f"{label} has checkpoint version {v}, this rlrec reads version {VERSION}"  # noqa: E731
    why = "not a zip archive written by torch.save: empty, truncated or another file"
    try:
        if zipfile.is_zipfile(p):  # torch.save writes them: anything else is never unpickled
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. torch's note on the pickle protocol
                data, why = torch.load(p, map_location="cpu", weights_only=True), None
    except OSError as exc:
        raise ConfigError(f"{label} could not be read: {exc}") from None
    except Exception as exc:
        failure = " ".join(str(exc).split()) or type(exc).__name__
        why = f"could not be read: {failure.split('. ')[0][:300]}"
    if why is not None:  # what its pickle holds, scanned (not run): the globals it would import
        code, found = _scan(p)
        if found.get("format") == FORMAT and found.get("version") != VERSION:
            raise ConfigError(other(found.get("version")))
        if code:
            raise UnsafeCheckpoint(
                f"{label} is refused: loading it would run code ({', '.join(code[:3])}), and "
                f"rlrec loads checkpoints with torch.load(weights_only=True), as {PLAIN_TYPES} "
                "only; it was not loaded"
            )
        raise ConfigError(f"{label} is not an rlrec checkpoint, or is damaged ({why})")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{label} is not an rlrec checkpoint (no '{FORMAT}' tag)")
    if data.get("version") != VERSION:
        raise ConfigError(other(data.get("version")))
    try:
        actual = digest(data)
    except TypeError as exc:
        actual = f"<none: {exc}>"
    if data.get("digest") != actual:
        raise ConfigError(
            f"{label} is damaged: its contents do not match the sha256 digest saved with it "
            f"(saved {str(data.get('digest'))[:16]}, now {actual[:16]}); it was not used"
        )
    return data


_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING"}
_INTS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG"}


def _scan(p, limit=1 << 16):
    """What the pickle of ``p`` (a torch zip archive's ``data.pkl``, else the file's head) holds
    in its first ``limit`` opcodes, parsed only (nothing is executed): the globals it would
    import (but those of torch's own legacy format, not code of the file's choosing), and its
    format and version (``save`` puts them first: its first strings and ints)."""
    names, strings, values = [], [], []
    # unreadable, truncated or not a pickle: what was parsed so far
    with contextlib.suppress(Exception):
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as z:
                raw = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        else:
            with open(p, "rb") as f:
                raw = f.read(1 << 22)
        for op, arg, _ in itertools.islice(pickletools.genops(raw), limit):
            if op.name in ("GLOBAL", "INST"):
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                names.append(".".join(strings[-2:]) if len(strings) >= 2 else "a global")
            strings += [str(arg)] if op.name in _STRINGS else []
            values += [arg] if op.name in _STRINGS or op.name in _INTS else []
    legacy = ("torch.", "collections.OrderedDict", "_codecs.encode")
    return [n for n in names if not n.startswith(legacy)], dict(zip(values[:4:2], values[1:4:2]))


# ---------------------------------------------------------------------- lookup
def scan(directory: Path) -> Iterator[Tuple[Path, Union[Dict[str, Any], ConfigError]]]:
    """The checkpoints of ``directory``, newest first (``last.pt``, then the periodic ones from
    the highest iteration down), each read as it is asked for: its verified contents, or the
    :class:`ConfigError` saying why it cannot be used (one without an env step count too; an
    :class:`UnsafeCheckpoint` for a file that would run code)."""
    directory = Path(directory)
    found = ((periodic_iteration(p.name), p) for p in directory.glob(CHECKPOINT_FILES))
    periodic = [p for i, p in sorted((i, p) for i, p in found if i is not None)]
    for p in filter(Path.is_file, [directory / LAST_CHECKPOINT, *reversed(periodic)]):
        try:
            data = _read(p, str(p))
            step = data.get("global_step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ConfigError(f"{p} holds no env step count (global_step={step!r})")
        except ConfigError as exc:
            data = exc
        yield p, data


def blowup(data: Mapping) -> Optional[str]:
    """The blow-up under way when the checkpoint ``data`` was written ("iteration I (step S)
    with WHAT", ``rlrec.train.divergence``), or None: its values are finite but ruined, and
    training from it diverges again, so ``resume=auto`` passes over it and ``checkpoint=`` of it
    trains nothing."""
    return str(data["blowup"]) if data.get("blowup") else None


def find_resume(directory: Path, quiet: bool = False) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """``resume=auto``: the newest good checkpoint of ``directory`` (the one with the most env
    steps, ``last.pt`` winning ties) and its contents, or None when it holds no checkpoint at all
    (a new run). It reads ``last.pt`` and the periodic ones down to the first good one (iterations
    only grow within a run), not all of them.

    A damaged or unreadable file is skipped with a warning that names it, and so is one written
    during a blow-up (:func:`blowup`; none when ``quiet``); when every checkpoint there is
    unusable a :class:`ConfigError` names them all (a restart at step 0 would append duplicate
    steps to the run's metrics.jsonl), or, when they were written during a blow-up, says so and
    how to start again. A file that would run code stops the run with
    :class:`UnsafeCheckpoint`: nothing in that run dir is trusted by guesswork."""
    best, bad, ruined = None, [], []
    for p, got in scan(directory):
        if isinstance(got, UnsafeCheckpoint):
            raise UnsafeCheckpoint(f"resume=auto: {got}")
        if isinstance(got, ConfigError):
            bad.append(str(got))
        elif blowup(got):
            ruined.append((p, blowup(got)))
        else:
            if best is None or got["global_step"] > best[1]["global_step"]:
                best = p, got
            if p.name != LAST_CHECKPOINT:
                break
    said = []
    if ruined:
        names = ", ".join(p.name for p, _ in ruined)
        why = f"written after the blow-up that began at {ruined[0][1]}: finite but ruined values"
        if best is None:
            raise ConfigError(
                f"resume=auto: every checkpoint in {directory} that can be read ({names}) was "
                f"{why}, from which training diverges again. To start again with other settings "
                "(a lower algo.learning_rate, say): the same command in a new run dir "
                f"(hydra.run.dir=...), or move them out of {directory} (resume=auto then starts "
                "this run dir again from step 0)"
            )
        step = best[1]["global_step"]
        said.append(
            f"{names} {why}; skipped, resuming from {best[0]} (step {step}), the newest "
            "from before it"
        )
    if best is None and bad:
        listing = "\n".join(f"  {reason}" for reason in bad)
        raise ConfigError(
            f"resume=auto: no checkpoint in {directory} can be used, so the run does not start "
            f"over at step 0 (which would append duplicate steps to metrics.jsonl):\n{listing}\n"
            f"Move them out of {directory} to start this run dir afresh, or give checkpoint=PATH"
        )
    said += [f"{reason}; skipped it, resuming from {best[0]}" for reason in bad]
    for text in [] if quiet else said:
        print(f"rlrec: warning: resume=auto: {text}", file=sys.stderr, flush=True)
    return best


def of_step(directory: Path, step: Optional[int], key: str) -> Tuple[Path, Dict[str, Any]]:
    """The checkpoint of env step ``step`` in ``directory`` and its contents (``step`` None: the
    newest, which a damaged ``last.pt`` does not pass over unasked); a :class:`ConfigError`
    naming ``key`` and the steps there otherwise."""
    steps, unusable = [], []
    for p, got in scan(directory):
        if isinstance(got, ConfigError):
            if step is None:
                raise ConfigError(f"{got}: ask for another step ({key}=S)") from None
            unusable.append(f"{p.name} (unusable)")
        elif step is None or got["global_step"] == step:
            return p, got
        else:
            steps.append(got["global_step"])
    if not steps and not unusable:
        raise ConfigError(f"{directory} holds no checkpoint (no *.pt there)")
    raise ConfigError(
        f"{directory} holds no checkpoint of step {step}: {key}= one of "
        f"{', '.join([*map(str, sorted(set(steps))), *unusable])}"
    )
