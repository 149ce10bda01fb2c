"""scripts/python.sh, the choice of the Python that the README's commands install into and run
with, from each starting point: an active venv, an installable default Python, Debian's own
externally managed python3 alone (PEP 668), and one without its venv module. Each case sources
the real script in a copy of scripts/ with only the PATH of that starting point."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3")


def _externally_managed(python: Path) -> bool:
    if not python.exists():
        return False
    code = "import os, sysconfig as s; print(s.get_path('stdlib') + '/EXTERNALLY-MANAGED')"
    marker = subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout
    return Path(marker.strip()).exists()


needs_debian_python = pytest.mark.skipif(
    not _externally_managed(SYSTEM_PYTHON),
    reason="needs an externally managed /usr/bin/python3 (Debian's or Ubuntu's own)",
)


def _pick(tmp_path: Path, path: str, **env) -> subprocess.CompletedProcess:
    """Sources a copy of scripts/python.sh in tmp_path/repo with a bare environment."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "scripts" / "python.sh", repo / "scripts" / "python.sh")
    cmd = ["/bin/bash", "-c", '. scripts/python.sh && echo "PY=$PY PYTHON=$PYTHON"']
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": path, "LANG": "C.UTF-8", **env}
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def test_an_active_venv_is_the_one(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    proc = _pick(tmp_path, "/usr/bin:/bin", VIRTUAL_ENV=str(venv))
    assert proc.returncode == 0, proc.stderr
    assert f"PY={venv}/bin/python PYTHON={venv}/bin/python" in proc.stdout
    assert not (tmp_path / "repo" / ".venv").exists()


def test_an_installable_default_python_is_the_one(tmp_path):
    """The `python` first on PATH (this test's own: a venv's, pyenv's) when pip may install
    into it, with no venv active."""
    if not os.access(sysconfig.get_path("purelib"), os.W_OK):
        pytest.skip("this Python's site-packages is not writable: it is not an installable one")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "python").exists():
        pytest.skip(f"no `python` beside {sys.executable}")
    proc = _pick(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stderr
    assert f"PY={bin_dir}/python " in proc.stdout
    assert not (tmp_path / "repo" / ".venv").exists()


@needs_debian_python
def test_debians_own_python_gets_a_venv_in_the_repo(tmp_path):
    """Debian's python3 alone (no `python`, pip refused by PEP 668): a .venv, said in one line;
    a second set-up takes the same .venv."""
    system_path = "/usr/local/bin:/usr/bin:/bin"
    proc = _pick(tmp_path, system_path)
    venv_python = tmp_path / "repo" / ".venv" / "bin" / "python"
    assert proc.returncode == 0, proc.stderr
    assert f"PY={venv_python} " in proc.stdout
    assert "externally managed" in proc.stdout and "source .venv/bin/activate" in proc.stdout
    assert subprocess.run([str(venv_python), "-m", "pip", "--version"]).returncode == 0
    again = _pick(tmp_path, system_path)
    assert f"PY={venv_python} " in again.stdout and "externally managed" not in again.stdout


@needs_debian_python
def test_a_python_without_venv_says_what_to_install_and_stops(tmp_path):
    """Debian's python3 without python3-venv (stood in for by a python3 whose `-m venv` fails
    as Debian's does then): one line naming the package, exit 1, nothing left behind."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then\n'
        "  echo 'The virtual environment was not created successfully because ensurepip is not"
        " available.' >&2; exit 1\n"
        "fi\n"
        f'exec {SYSTEM_PYTHON} "$@"\n'
    )
    fake.chmod(0o755)
    proc = _pick(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "apt-get install python3-venv" in lines[0], proc.stderr
    assert "PY=" not in proc.stdout
    assert not (tmp_path / "repo" / ".venv").exists()


@needs_debian_python
def test_a_foreign_dot_venv_is_never_touched(tmp_path):
    """A .venv in the repo that set-up did not make (no bin/python): refused in one line, left
    as it is."""
    foreign = tmp_path / "repo" / ".venv"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    proc = _pick(tmp_path, "/usr/local/bin:/usr/bin:/bin")
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and "holds no bin/python" in proc.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
