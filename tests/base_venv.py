"""A venv with only rlrec's declared base dependencies (``[project] dependencies``), for
tests/test_dependencies.py, and one with only onnxruntime and numpy (:func:`onnx_python`, for
tests/test_onnx_policy.py): not rlrec itself (the tests run the checkout's files, which import
rlrec from beside it). Made once and cached under ``~/.cache/rlrec/test-venvs/`` by the digest of
the dependency list, the constraints and the Python; torch comes from ``scripts/constraints.txt``
as in the set-up scripts. scripts/test.sh makes it during set-up (``python -m tests.base_venv``),
beside other work; a test that finds it missing makes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = ".rlrec-test-venv"  # written first into a venv made here: only those are ever removed

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib


def base_dependencies() -> list:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def base_python() -> Path:
    """The base venv's python, made first where it is missing."""
    return venv_python("base", base_dependencies())


def onnx_python() -> Path:
    """The python of a venv of onnxruntime and numpy alone (no torch), made first where missing."""
    return venv_python("onnx", ["onnxruntime", "numpy"])


def lerobot_python() -> Path:
    """The python of a venv of LeRobot (tests/dataset: it pins a torch of its own)."""
    return venv_python("lerobot", ["lerobot==0.4.4"], constrained=False)  # the newest here


def venv_python(name: str, deps: list, constrained: bool = True) -> Path:
    """The python of the venv ``name`` of ``deps``, made first where it is missing;
    ``constrained=False``: without rlrec's torch pin (a package that pins its own torch)."""
    constraints = REPO / "scripts" / "constraints.txt"
    pin = ["-c", str(constraints)] if constrained else []
    key = json.dumps([sys.version, deps, constraints.read_text() if constrained else ""]).encode()
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlrec" / "test-venvs"
    )
    venv = cache / f"{name}-{hashlib.sha256(key).hexdigest()[:16]}"
    python = venv / "bin" / "python"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:  # one builder at a time (xdist workers, checkouts)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return python
        if venv.exists():
            if not (venv / MARKER).exists():
                raise RuntimeError(f"{venv} exists and was not made by {__name__}: remove it")
            shutil.rmtree(venv)  # an unfinished build of this module's own (its marker says so)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        (venv / MARKER).write_text(f"made by {__name__}\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pin, *deps],
            check=True,
            timeout=1800,
        )
        (venv / ".complete").write_text("")
    return python


if __name__ == "__main__":
    print(f"tests/base_venv.py: {base_python()} {onnx_python()} {lerobot_python()}")
