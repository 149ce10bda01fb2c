"""One run at a time in a run dir (``rlrec/run/rundir.py``), and what a resuming run may remove
(``rlrec.run.rundir.remove_stale_temporaries``): never a live process's files."""

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
from tests.helpers import FAST, REPO, start_train, wait_for

DEAD = 2**22 + 12345  # above the default pid_max: no such process
BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps
HOST = socket.gethostname()


def _iterations(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"loss/policy"') if path.exists() else 0


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


# --------------------------------------------------------------------------- the lock itself


def test_the_lock_names_its_live_holder_and_is_taken_over_once_it_died(tmp_path):
    run_dir = tmp_path / "run"
    hold = f"from rlrec.run import rundir; rundir.claim({str(run_dir)!r}, 'k'); print('locked')"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"{hold}; import time; time.sleep(600)"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError) as err:
            rundir.claim(run_dir, "hydra.run.dir")
        assert f"hydra.run.dir={run_dir}" in str(err.value)
        assert f"pid {holder.pid} on host {HOST}, since 20" in str(err.value)
        assert sorted(p.name for p in run_dir.iterdir()) == [".rlrec.lock"]  # nothing added
    finally:
        holder.kill()
        holder.wait(timeout=10)
    claim = rundir.claim(run_dir, "hydra.run.dir")  # the kernel dropped the dead one's lock
    try:
        assert claim.previous is not None and claim.previous.pid == holder.pid
        mine = json.loads((run_dir / ".rlrec.lock").read_text())
        assert mine["pid"] == os.getpid() and mine["host"] == HOST
    finally:
        claim.release()
    assert not (run_dir / ".rlrec.lock").exists()  # released: the file goes with the lock


def test_a_config_error_removes_only_what_the_run_created(tmp_path):
    """Claim.discard: Hydra's files and the dirs the claim made go; the user's files stay, and
    everything stays where the run wrote output of its own (tests/test_cli.py: end to end)."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.log").write_text("mine")
    for name in ("mine", "a/b/run", "kept"):
        claim = rundir.claim(tmp_path / name, "hydra.run.dir")
        (tmp_path / name / ".hydra").mkdir()
        (tmp_path / name / "train.log").write_text("x")
        if name == "kept":
            (tmp_path / name / "metrics.jsonl").write_text("{}")
        claim.discard()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        *("kept", "kept/.hydra", "kept/metrics.jsonl", "kept/train.log"),
        *("mine", "mine/notes.log"),  # a/b/run: made by the claim, all gone
    ]


# --------------------------------------------------------------------------- stale temporaries


@pytest.mark.parametrize("shared", [False, True], ids=["run-dir", "recorder-dir"])
def test_resume_removes_only_the_temporaries_of_gone_processes(tmp_path, shared):
    """In the run dir: those of any process that is gone, never of a live one (the old check was
    only pid != os.getpid()). A recorder.dir outside the run dir may be shared with other runs:
    there only the clip temporaries of the process whose run-dir lock this run took over go."""
    live = _sleeper()
    run_dir, where = tmp_path / "run", tmp_path / ("shared" if shared else "run")
    part = ".train-ep000001-step000000100.mp4.{}-0.part"
    names = {
        f"{'' if shared else 'checkpoints/'}.last.pt.{live.pid}-0.part": False,  # a live one's
        f"{'' if shared else 'videos/eval/'}{part.format(DEAD)}": True,  # the dead holder's
        part.format(DEAD + 1): not shared,  # another run's, or a dead one's in the run dir
        part.format(os.getpid()): False,  # this process's
        f".last.pt.{DEAD}.tmp": False,  # not a temporary of rlrec.files
        part.format(DEAD)[1:]: False,  # not hidden
        "train-ep000001-step000000100.mp4": False,  # a finished clip
    }
    for name in names:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(b"x")
    run_dir.mkdir(exist_ok=True)
    (run_dir / ".rlrec.lock").write_text(json.dumps({"pid": DEAD, "host": HOST, "since": "x"}))
    claim = rundir.claim(run_dir, "hydra.run.dir")  # takes over the dead holder's lock
    try:
        dirs = [str(where)] * 2 if shared else []
        removed = rundir.remove_stale_temporaries(run_dir, dirs, claim.previous)
    finally:
        claim.release()
        live.kill()
        live.wait(timeout=10)
    assert sorted(str(p.relative_to(where)) for p in removed) == sorted(
        n for n, gone in names.items() if gone
    )
    assert all((where / name).exists() != gone for name, gone in names.items())


# --------------------------------------------------------------------------- real train.py runs


def _state(root: Path):
    """Every path under root with, for files, size and mtime (an encoder's .part: existence)."""
    return {
        str(p.relative_to(root)): None
        if p.is_dir() or p.name.endswith(".part")
        else (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.slow
def test_a_second_run_in_a_live_run_dir_is_refused_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    args = [*FAST, "torch_threads=1", f"total_steps={40 * BATCH}", f"hydra.run.dir={run_dir}"]
    first = start_train(args, tmp_path)
    try:
        wait_for(lambda: _iterations(run_dir) >= 2, first)
        os.kill(first.pid, signal.SIGSTOP)  # holds its lock, writes nothing while we look
        before = _state(tmp_path)
        second = start_train([*args, "resume=auto", "seed=5"], tmp_path)
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 2, out
        assert f"hydra.run.dir={run_dir} is in use by another rlrec run" in out, out
        assert f"pid {first.pid} on host {HOST}, since 20" in out, out
        # not a byte written, nothing deleted; the paused run's own ffmpeg (not paused: a
        # session of its own) may still open the clip it was handed, named with the run's pid
        after, ours = _state(tmp_path), f".{first.pid}-"
        assert {k: v for k, v in after.items() if ours not in k} == {
            k: v for k, v in before.items() if ours not in k
        }
        assert set(before) <= set(after)  # the live run's clips in progress are all still there
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0 and "rlrec: done" in out, out
    assert not (run_dir / ".rlrec.lock").exists()


@pytest.mark.slow
def test_a_killed_runs_lock_is_taken_over_and_its_clip_outside_the_run_dir_removed(tmp_path):
    """SIGKILL mid-clip with recorder.dir outside the run dir: the lock file stays with the dead
    pid; resume=auto takes the lock over and removes that pid's hidden .part from the recorder
    dir, and only that (another run's clip in progress in the shared dir stays)."""
    run_dir, shared = tmp_path / "run", tmp_path / "videos"
    args = [*FAST, "torch_threads=1", "recorder.trigger=always", f"recorder.dir={shared}"]
    args += ["eval_env.enabled=false", f"total_steps={20 * BATCH}", f"hydra.run.dir={run_dir}"]
    first = start_train(args, tmp_path)
    parts = lambda: list(shared.glob(f".*.{first.pid}-*.part"))  # noqa: E731
    wait_for(lambda: _iterations(run_dir) >= 2 and parts(), first)
    first.kill()
    first.wait(timeout=30)
    assert parts(), "the kill should have left a clip in progress"
    assert json.loads((run_dir / ".rlrec.lock").read_text())["pid"] == first.pid
    live = _sleeper()
    try:
        other = shared / f".train-ep000007-step000000700.mp4.{live.pid}-0.part"
        other.write_bytes(b"another run's clip in progress")
        second = start_train([*args, "resume=auto"], tmp_path)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 0, out
        assert f"took over the lock of {run_dir} from pid {first.pid}" in out, out
        assert parts() == [] and other.exists(), parts()
    finally:
        live.kill()
        live.wait(timeout=10)
    assert not (run_dir / ".rlrec.lock").exists()
    assert list(shared.glob("train-*.mp4"))
