"""What ``python train.py`` imports and composes before it knows it has work to do: ``--help``,
``--cfg job`` and a refused config import no torch (and no simulator); ``hydra.mode`` on the command
line works as Hydra documents it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FAST, REPO

HEAVY = re.compile(r"\|\s+(torch|gymnasium|mani_skill|genesis|sapien)(\.\S+)?$", re.MULTILINE)


def _importtime(args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, refused",
    [
        (["--help"], False),
        (["--cfg", "job"], False),
        (["--cfg", "job", "+experiment=cartpole"], False),
        (["recorder.trigger=bogus"], True),  # OmegaConf refuses it while composing
        (["algo.num_minibatches=7"], True),  # refuse_before_work (rlrec.config.validate)
    ],
)
def test_help_cfg_and_a_refused_config_import_no_torch(tmp_path, args, refused):
    proc = _importtime([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert (proc.returncode != 0) == refused, proc.stderr[-2000:]
    if refused:
        assert "recorder.trigger" in proc.stderr or "algo.num_minibatches" in proc.stderr
    assert not HEAVY.findall(proc.stderr), sorted({m[0] for m in HEAVY.findall(proc.stderr)})
    assert not (tmp_path / "run").exists()


def test_the_run_mode_of_the_command_line(tmp_path):
    """``hydra.mode=MULTIRUN`` without ``-m`` sweeps (here one job), as with Hydra's own mode
    check; a bad value is refused naming the key and the allowed values."""
    sweep, run = tmp_path / "sweep", tmp_path / "run"
    proc = _importtime(
        [
            *FAST,
            "total_steps=128",
            "eval_env.enabled=false",
            "hydra.mode=MULTIRUN",
            f"hydra.sweep.dir={sweep}",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (sweep / "0" / "metrics.jsonl").is_file() and not run.exists()
    proc = _importtime(["hydra.mode=BOGUS", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode != 0 and "hydra.mode" in proc.stderr and "MULTIRUN" in proc.stderr
    assert not run.exists()


def test_exit_freezes_the_objects_left_once_however_often_main_runs(tmp_path):
    """``main`` registers ``gc.freeze`` as an exit handler once, however often it runs in a
    process: at exit the interpreter's collections then skip every object left (torch's)."""
    run_dir = tmp_path / "run"
    code = f"""
import atexit, gc, sys
import rlrec.run.cli as cli
calls, freeze = [], gc.freeze
gc.freeze = lambda: calls.append(1) or freeze()  # what main() registers, counted
# registered first, so run last: after the handlers main() registered
atexit.register(lambda: print("at exit:", len(calls), "freezes,", gc.get_freeze_count() > 0))
for _ in range(2):
    sys.argv = ["train.py", "--cfg", "job", "hydra.run.dir={run_dir}"]
    cli.main()
print("before exit:", len(calls), "freezes,", gc.get_freeze_count() > 0)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "before exit: 0 freezes, False" in proc.stdout, proc.stdout
    assert "at exit: 1 freezes, True" in proc.stdout, proc.stdout
