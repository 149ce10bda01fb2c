"""Shared helpers of the tests of rlrec/train/: runs of the built-in env in this process or as
``train.py`` driven by a script, and what they leave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rlrec.train.runner import Runner
from tests.helpers import FAST, REPO, make_config, read_metrics

QUIET = [*FAST, "recorder=none", "eval_env.recorder.enabled=false"]  # FAST without clips
BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps


def runner(run_dir: Path, overrides: Sequence[str] = (), base: Sequence[str] = QUIET) -> Runner:
    """A Runner of ``base`` + ``overrides`` in ``run_dir`` (made if need be)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return Runner(make_config([*base, *overrides]), run_dir)


def steps(run_dir: Path, key: str = "eval/return") -> list:
    """The steps of the metrics.jsonl lines that hold ``key``."""
    return [m["step"] for m in read_metrics(run_dir) if key in m]


def snapshot(run_dir: Path) -> dict:
    """Every file of ``run_dir`` but the logs and Hydra's, with its bytes."""
    files = (p for p in Path(run_dir).rglob("*") if p.is_file() and ".hydra" not in p.parts)
    return {p: p.read_bytes() for p in files if p.suffix != ".log"}


def drive(tmp_path: Path, code: str, args: Sequence[str], env=None) -> subprocess.CompletedProcess:
    """``code`` (a script that ends by running ``rlrec.run.cli.main``) with ``args``, from
    ``tmp_path``, rlrec importable, ``env`` added to the environment."""
    driver = tmp_path / "driver.py"
    driver.write_text(code)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(driver), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def differences(a, b, where: str = "") -> list:
    """Where two checkpoint entries differ (tensors bit for bit)."""
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        same = type(a) is type(b) and getattr(a, "dtype", None) == getattr(b, "dtype", None)
        equal = torch.equal if isinstance(a, torch.Tensor) else np.array_equal
        return [] if same and equal(a, b) else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where} keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} != {b!r}"]


def same_state(ref: dict, ours: dict, keys: Sequence[str], roles=("adapter", "autoreset")) -> list:
    """Where two checkpoints differ in ``keys`` and in the ``roles`` of both env stacks (the
    recorder's ``clips_saved`` aside: a clip cut by a stop is not saved)."""
    diffs = [d for k in keys for d in differences(ref[k], ours[k], k)]
    for stack in ("train_env", "eval_env"):
        for role in roles:
            a, b = (
                {k: v for k, v in (s[stack][role] or {}).items() if k != "clips_saved"}
                for s in (ref, ours)
            )
            diffs += differences(a, b, f"{stack}.{role}")
    return diffs


def temporaries(run_dir: Path) -> list:
    """The temporary files left in ``run_dir``."""
    found = (p for p in Path(run_dir).rglob(".*") if p.is_file())
    return sorted(str(p.relative_to(run_dir)) for p in found if p.suffix in (".part", ".tmp"))
