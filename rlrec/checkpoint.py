"""Checkpoint files: written atomically, recognised by a format tag, checked against the env."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from rlrec.config import ConfigError

FORMAT = "rlrec-checkpoint"
VERSION = 2  # 2: env stack state keyed by role (rlrec.stack)


def rng_state() -> Dict[str, Any]:
    """Every global RNG stream a run draws from."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Writes to ``.<name>.<pid>.tmp`` beside ``path`` and renames it into place, so a kill at
    any moment leaves the previous file at ``path`` valid."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save({"format": FORMAT, "version": VERSION, **payload}, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # the rename itself survives a power cut, not only the data
    except BaseException:  # e.g. a full disk: do not leave the half-written temporary behind
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory handles: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path: str | Path, key: str = "checkpoint") -> Dict[str, Any]:
    """Loads an rlrec checkpoint; a clear :class:`ConfigError` naming ``key`` otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"{key}={path} does not exist (expected an rlrec checkpoint file such as "
            "<run dir>/checkpoints/last.pt)"
        )
    try:
        data = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ConfigError(
            f"{key}={path} is not an rlrec checkpoint (could not be read: {exc})"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{key}={path} is not an rlrec checkpoint (no '{FORMAT}' tag)")
    if data.get("version") != VERSION:
        raise ConfigError(
            f"{key}={path} has checkpoint version {data.get('version')}, "
            f"this rlrec reads version {VERSION}"
        )
    return data


def check_compatible(
    data: Dict[str, Any], obs_shape, action_desc: str, key: str = "checkpoint"
) -> None:
    """Fails when the checkpoint was trained on an env with other observation/action spaces."""
    saved_obs, saved_act = tuple(data["obs_shape"]), data["action_space"]
    if saved_obs != tuple(obs_shape) or saved_act != action_desc:
        raise ConfigError(
            f"{key} was trained on env {data.get('env_name')!r} with observations {saved_obs} "
            f"and actions {saved_act}; this env has observations {tuple(obs_shape)} "
            f"and actions {action_desc}"
        )


_PERIODIC = re.compile(r"^iter_(\d+)\.pt$")


def _global_step(path: Path) -> Optional[int]:
    """The env steps a checkpoint holds, None if it cannot be read. Memory-mapped: only the
    records that are touched are read, not the whole file."""
    try:
        return int(
            torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"]
        )
    except Exception:
        return None


def newest(checkpoint_dir: Path) -> Optional[Path]:
    """The checkpoint of ``checkpoint_dir`` with the most env steps (``last.pt`` wins ties).

    Reads ``last.pt`` and the periodic checkpoints from the highest iteration down to the first
    readable one (iterations only grow within a run), so a run with many periodic checkpoints
    opens two files, not all of them. Unreadable files (a kill mid-write) are skipped."""
    directory = Path(checkpoint_dir)
    periodic = sorted(
        (int(m.group(1)), p) for p in directory.glob("iter_*.pt") if (m := _PERIODIC.match(p.name))
    )
    best: Optional[Path] = None
    best_step = -1
    for _, p in reversed(periodic):
        step = _global_step(p)
        if step is not None:
            best, best_step = p, step
            break
    last = directory / "last.pt"
    if last.is_file():
        step = _global_step(last)
        if step is not None and step >= best_step:
            best = last
    return best
