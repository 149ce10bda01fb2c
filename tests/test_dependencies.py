"""rlrec's declared dependencies are what it imports.

- deptry (the ``dev`` extra; configured in pyproject.toml's ``[tool.deptry]``) finds every
  third-party module that ``rlrec/`` imports and checks that a base dependency, or the extra of
  the path that imports it, declares it.
- The main job's code path (train, evaluate, record, the report) runs in a venv that holds only
  rlrec's declared base dependencies (tests/base_venv.py), and each optional path refuses there
  in one line that names its extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import base_venv
from tests.helpers import REPO


def test_deptry_finds_every_import_declared():
    proc = subprocess.run(
        [sys.executable, "-m", "deptry", "rlrec"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No dependency issues found" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def base_python() -> Path:
    return base_venv.base_python()


def _run(python: Path, args, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), str(REPO / "train.py"), *args],
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_main_job_runs_on_the_base_dependencies(base_python, tmp_path):
    """The default run's whole path (train, evaluate, record, checkpoint, the report and its
    progress video) with only the base dependencies (no extra's package, nor matplotlib's source
    of old: the dev extra, in the venv): exit 0, no traceback, the report written."""
    probe = "import importlib.util as u; print([m for m in %r if u.find_spec(m)])"
    extras = ["mani_skill", "genesis", "wandb", "selenium", "pytest", "hydra_plugins", "mujoco"]
    found = subprocess.run([str(base_python), "-c", probe % extras], capture_output=True, text=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
    run_dir = tmp_path / "run"
    args = ["+experiment=smoke", "total_steps=4096", "logger.progress=false"]
    proc = _run(base_python, [*args, f"hydra.run.dir={run_dir}"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "report failed" not in out, out
    assert (run_dir / "report.html").stat().st_size > 0
    assert (run_dir / "videos" / "progress.mp4").stat().st_size > 0
    assert (run_dir / "tensorboard").is_dir()
    assert f"rlrec: report {(run_dir / 'report.html').resolve()}" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, extra",
    [
        ("env=maniskill", "maniskill"),
        ("env=genesis", "genesis"),
        ("logger=wandb", "wandb"),
        ("hydra/launcher=joblib", "launchers"),
    ],
)
def test_optional_paths_name_their_extra(base_python, tmp_path, override, extra):
    """An optional path on the base install: refused before work (exit 2), one line that names
    the extra, no traceback, nothing written."""
    args = [override, f"hydra.run.dir={tmp_path / 'run'}"]
    if override.startswith("hydra/launcher"):
        args = ["-m", override, "seed=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = _run(base_python, args, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and f"[{extra}]" in lines[0], out
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, extra",
    [("rlrec.testing", "testing"), ("rlrec.record.wrappers.genesis_forge", "genesis-forge")],
)
def test_optional_modules_name_their_extra(base_python, module, extra):
    """A module of an optional path, imported on the base install: an ImportError whose one
    line names the extra to install."""
    proc = subprocess.run(
        [str(base_python), "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("ImportError: ")
    assert f"pip install 'rlrec[{extra}]'" in proc.stderr.splitlines()[-1], proc.stderr
