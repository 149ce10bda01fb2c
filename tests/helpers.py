"""Shared helpers: compose rlrec configs with Hydra's compose API, run train.py as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from hydra import compose, initialize_config_dir

import rlrec.run.cli  # registers schemas and resolvers
from rlrec.config import Config, to_dataclass

REPO = Path(__file__).resolve().parent.parent

# small, fast settings for end-to-end runs of the built-in env
FAST = [
    "env.num_envs=8",
    "env.render_width=32",
    "env.render_height=32",
    "eval_env.num_envs=2",
    "eval_env.every=2",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "logger.progress=false",
    "logger=none",
    "report.enabled=false",  # the report's own tests turn it on (tests/report/)
]


def compose_cfg(overrides: List[str] = ()):
    with initialize_config_dir(version_base="1.3", config_dir=rlrec.run.cli.CONFIG_DIR):
        return compose("config", overrides=list(overrides))


def make_config(overrides: List[str] = ()) -> Config:
    return to_dataclass(compose_cfg(overrides))


def _train(args: List[str]) -> dict:
    """``python train.py ARGS``'s command line and environment, its output unbuffered."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return dict(args=[sys.executable, str(REPO / "train.py"), *args], env=env, text=True)


def run_train(
    args: List[str], cwd: Path, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    proc = subprocess.run(**_train(args), cwd=cwd, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_metrics(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def start_train(args: List[str], cwd: Path, new_session: bool = False) -> subprocess.Popen:
    """``train.py`` in a subprocess, stdout and stderr together, text; ``new_session``: in a
    process group of its own (so a test can signal the whole group, as Ctrl-C does)."""
    out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return subprocess.Popen(**_train(args), cwd=cwd, start_new_session=new_session, **out)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Polls ``predicate`` while ``proc`` runs; fails (killing it) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"train.py ended early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.05)
