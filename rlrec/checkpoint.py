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
VERSION = 1


def rng_state() -> Dict[str, Any]:
    """Every global RNG stream a run draws from."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
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
    except BaseException:  # e.g. a full disk: do not leave the half-written temporary behind
        tmp.unlink(missing_ok=True)
        raise


def load(path: str | Path, key: str = "checkpoint") -> Dict[str, Any]:
    """Loads an rlrec checkpoint; a clear :class:`ConfigError` naming ``key`` otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{key}={path} does not exist (expected an rlrec checkpoint file such as "
                          "<run dir>/checkpoints/last.pt)")
    try:
        data = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ConfigError(f"{key}={path} is not an rlrec checkpoint (could not be read: {exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{key}={path} is not an rlrec checkpoint (no '{FORMAT}' tag)")
    if data.get("version") != VERSION:
        raise ConfigError(f"{key}={path} has checkpoint version {data.get('version')}, "
                          f"this rlrec reads version {VERSION}")
    return data


def check_compatible(data: Dict[str, Any], obs_shape, action_desc: str, key: str = "checkpoint") -> None:
    """Fails when the checkpoint was trained on an env with other observation/action spaces."""
    saved_obs, saved_act = tuple(data["obs_shape"]), data["action_space"]
    if saved_obs != tuple(obs_shape) or saved_act != action_desc:
        raise ConfigError(
            f"{key} was trained on env {data.get('env_name')!r} with observations {saved_obs} and actions "
            f"{saved_act}; this env has observations {tuple(obs_shape)} and actions {action_desc}"
        )


_PERIODIC = re.compile(r"^iter_(\d+)\.pt$")


def newest(checkpoint_dir: Path) -> Optional[Path]:
    """The checkpoint of ``checkpoint_dir`` with the most env steps (``last.pt`` wins ties)."""
    best: Optional[Path] = None
    best_step = -1
    for p in sorted(Path(checkpoint_dir).glob("*.pt")):
        if not (p.name == "last.pt" or _PERIODIC.match(p.name)):
            continue
        try:
            step = int(torch.load(p, map_location="cpu", weights_only=False)["global_step"])
        except Exception:
            continue  # unreadable: ignore, an older valid one is used instead
        if step > best_step or (step == best_step and p.name == "last.pt"):
            best, best_step = p, step
    return best
