"""One run at a time in a run dir (``rlrec/run/rundir.py``), and what a resuming run may remove
(``rlrec.run.preempt.remove_stale_temporaries``): never a live process's files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlrec.checks import ConfigError
from rlrec.run import rundir
from rlrec.run.rundir import remove_stale_temporaries
from tests.helpers import FAST, REPO, start_train, wait_for

DEAD = 2**22 + 12345  # above the default pid_max: no such process
BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps

# a process that takes the lock of argv[1] and waits to be killed
_HOLD = """
import sys, time
from rlrec.checks import ConfigError
from rlrec.run import rundir
rundir.claim(sys.argv[1], "hydra.run.dir")
print("locked", flush=True)
time.sleep(600)
"""


def _iterations(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"loss/policy"') if path.exists() else 0


def _state(root: Path):
    """Every path under root with, for files, size and mtime (an encoder's .part: existence)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        out[rel] = None if p.is_dir() or p.name.endswith(".part") else (st.st_size, st.st_mtime_ns)
    return out


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


# --------------------------------------------------------------------------- the lock itself


def test_the_lock_names_its_live_holder_and_is_taken_over_once_it_died(tmp_path):
    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(ConfigError) as err:
            rundir.claim(run_dir, "hydra.run.dir")
        msg = str(err.value)
        assert f"hydra.run.dir={run_dir}" in msg
        assert f"pid {holder.pid} on host {socket.gethostname()}, since 20" in msg
        assert sorted(p.name for p in run_dir.iterdir()) == [".rlrec.lock"]  # nothing added
    finally:
        holder.kill()
        holder.wait(timeout=10)
    claim = rundir.claim(run_dir, "hydra.run.dir")  # the kernel dropped the dead one's lock
    try:
        assert claim.previous is not None and claim.previous.pid == holder.pid
        mine = json.loads((run_dir / ".rlrec.lock").read_text())
        assert mine["pid"] == os.getpid() and mine["host"] == socket.gethostname()
    finally:
        claim.release()
    assert not (run_dir / ".rlrec.lock").exists()  # released: the file goes with the lock


def test_a_config_error_removes_only_what_the_run_created(tmp_path):
    """Claim.discard: Hydra's files and the dirs the claim made go; the user's files stay."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.log").write_text("mine")
    (mine / "data").mkdir()
    claim = rundir.claim(mine, "hydra.run.dir")
    (mine / ".hydra").mkdir()
    (mine / ".hydra" / "config.yaml").write_text("x")
    (mine / "train.log").write_text("x")
    claim.discard()
    assert sorted(p.name for p in mine.iterdir()) == ["data", "notes.log"]

    fresh = tmp_path / "a" / "b" / "run"
    claim = rundir.claim(fresh, "hydra.run.dir")
    (fresh / "train.log").write_text("x")
    claim.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # a/b/run made here: all gone

    kept = tmp_path / "kept"
    claim = rundir.claim(kept, "hydra.run.dir")
    (kept / "metrics.jsonl").write_text("{}")  # the run wrote output of its own: keep it all
    claim.discard()
    assert (kept / "metrics.jsonl").exists()


# --------------------------------------------------------------------------- stale temporaries


def test_resume_keeps_the_temporaries_of_live_processes(tmp_path):
    """A temporary whose pid is alive belongs to a running process: kept (the old check was
    only pid != os.getpid())."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        names = {
            f"checkpoints/.last.pt.{live.pid}-0.part": False,
            f"videos/train/.train-ep000001-step000000100.mp4.{live.pid}-0.part": False,
            f"checkpoints/.last.pt.{DEAD}-0.part": True,
            f"videos/eval/.eval-ep000000-step000000000.mp4.{DEAD}-3.part": True,
        }
        for name in names:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(b"x")
        removed = remove_stale_temporaries(tmp_path)
        assert sorted(str(p.relative_to(tmp_path)) for p in removed) == sorted(
            n for n, gone in names.items() if gone
        )
        for name, gone in names.items():
            assert (tmp_path / name).exists() != gone, name
    finally:
        live.kill()
        live.wait(timeout=10)


def test_recorder_dirs_outside_the_run_dir_lose_only_the_dead_holders_clips(tmp_path):
    """recorder.dir outside the run dir may be shared with other runs: only the clip temporaries
    of the process whose run-dir lock this run took over are removed there."""
    run_dir, shared = tmp_path / "run", tmp_path / "shared"
    run_dir.mkdir()
    shared.mkdir()
    other_dead = DEAD + 1
    (run_dir / ".rlrec.lock").write_text(
        json.dumps({"pid": DEAD, "host": socket.gethostname(), "since": "2026-01-01 00:00:00"})
    )
    names = {
        f".train-ep000003-step000000300.mp4.{DEAD}-2.part": True,  # the dead holder's
        f".eval-ep000000-step000000000.mp4.{other_dead}-0.part": False,  # another run's
        f".train-ep000004-step000000400.mp4.{os.getpid()}-0.part": False,  # a live process's
        f".last.pt.{DEAD}.tmp": False,  # not a clip temporary
        f"train-ep000001-step000000100.mp4.{DEAD}-1.part": False,  # not hidden
        "train-ep000001-step000000100.mp4": False,  # a finished clip
    }
    for name in names:
        (shared / name).write_bytes(b"x")
    claim = rundir.claim(run_dir, "hydra.run.dir")  # takes over the dead holder's lock
    try:
        removed = remove_stale_temporaries(run_dir, [str(shared), str(shared)], claim.previous)
    finally:
        claim.release()
    assert [p.name for p in removed] == [n for n, gone in names.items() if gone]
    for name, gone in names.items():
        assert (shared / name).exists() != gone, name


# --------------------------------------------------------------------------- real train.py runs


@pytest.mark.slow
def test_a_second_run_in_a_live_run_dir_is_refused_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    total = 40 * BATCH
    args = [*FAST, "torch_threads=1", f"total_steps={total}", f"hydra.run.dir={run_dir}"]
    first = start_train(args, tmp_path)
    try:
        wait_for(lambda: _iterations(run_dir) >= 2, first)
        os.kill(first.pid, signal.SIGSTOP)  # holds its lock, writes nothing while we look
        before = _state(tmp_path)
        second = start_train([*args, "resume=auto", "seed=5"], tmp_path)
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 2, out
        assert f"hydra.run.dir={run_dir} is in use by another rlrec run" in out, out
        assert f"pid {first.pid} on host {socket.gethostname()}, since 20" in out, out
        after = _state(tmp_path)
        # not a byte written, nothing deleted; the paused run's own ffmpeg (not paused: a
        # session of its own) may still open the clip it was handed, named with the run's pid
        ours = f".{first.pid}-"
        assert {k: v for k, v in after.items() if ours not in k} == {
            k: v for k, v in before.items() if ours not in k
        }
        assert set(before) <= set(after)  # the live run's clips in progress are all still there
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    assert "rlrec: done" in out
    assert not (run_dir / ".rlrec.lock").exists()


@pytest.mark.slow
def test_a_killed_runs_lock_is_taken_over_and_its_clip_outside_the_run_dir_removed(tmp_path):
    """SIGKILL mid-clip with recorder.dir outside the run dir: the lock file stays with the dead
    pid; resume=auto takes the lock over and removes that pid's hidden .part from the recorder
    dir, and only that (another run's clip in progress in the shared dir stays)."""
    run_dir, shared = tmp_path / "run", tmp_path / "videos"
    args = [
        *FAST,
        "torch_threads=1",
        "recorder.trigger=always",
        f"recorder.dir={shared}",
        "eval_env.enabled=false",
        f"total_steps={20 * BATCH}",
        f"hydra.run.dir={run_dir}",
    ]
    first = start_train(args, tmp_path)
    parts = lambda: list(shared.glob(f".*.{first.pid}-*.part"))  # noqa: E731
    wait_for(lambda: _iterations(run_dir) >= 2 and parts(), first)
    first.kill()
    first.wait(timeout=30)
    assert parts(), "the kill should have left a clip in progress"
    assert json.loads((run_dir / ".rlrec.lock").read_text())["pid"] == first.pid
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        other = shared / f".train-ep000007-step000000700.mp4.{live.pid}-0.part"
        other.write_bytes(b"another run's clip in progress")
        second = start_train([*args, "resume=auto"], tmp_path)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 0, out
        assert f"took over the lock of {run_dir} from pid {first.pid}" in out, out
        assert parts() == [], parts()
        assert other.exists()
    finally:
        live.kill()
        live.wait(timeout=10)
    assert not (run_dir / ".rlrec.lock").exists()
    assert list(shared.glob("train-*.mp4"))
