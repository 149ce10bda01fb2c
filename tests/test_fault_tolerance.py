"""Fault tolerance of a real ``python train.py`` process: SIGKILL then ``resume=auto``, and
SIGTERM/SIGINT (preemption, Ctrl-C) answered with a checkpoint and the final clip within 10 s."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio_ffmpeg
import pytest
import torch

from rlrec import checkpoint as ckpt
from tests.helpers import FAST, REPO, read_metrics, run_train

BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps
# every episode of env 0 is recorded, so a clip is being written at any moment
RECORD_ALL = ["recorder.trigger=always", "torch_threads=1"]
_CLIP = re.compile(r"^(train|eval)-ep(\d+)-step(\d+)(-\d+)?\.mp4$")


def _start(args, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"train.py ended early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.05)


def _train_steps(run_dir: Path):
    if not (run_dir / "metrics.jsonl").exists():
        return []
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if '"loss/policy"' in line and line.endswith("}"):
            out.append(int(re.search(r'"step": (\d+)', line).group(1)))
    return out


def _temporaries(run_dir: Path):
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob(".*")
        if p.is_file() and (p.name.endswith(".part") or p.name.endswith(".tmp"))
    )


def _clips(run_dir: Path, kind: str):
    return sorted((run_dir / "videos" / kind).glob("*.mp4"))


def _assert_videos_decode(run_dir: Path) -> None:
    for path in run_dir.rglob("*.mp4"):
        frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))  # decodes the whole file
        assert frames >= 1, path


def _assert_checkpoints_load(run_dir: Path) -> None:
    for path in (run_dir / "checkpoints").glob("*.pt"):
        ckpt.load(path)


@pytest.mark.slow
def test_sigkill_then_resume_continues_to_the_total(tmp_path):
    total = 24 * BATCH
    common = [
        *FAST,
        *RECORD_ALL,
        f"total_steps={total}",
        "checkpoint_every=4",
        "algo.anneal_lr=true",
    ]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    # the uninterrupted reference runs alongside the run that gets killed
    reference = _start([*common, f"hydra.run.dir={ref_dir}"], tmp_path)
    victim = _start([*common, f"hydra.run.dir={run_dir}"], tmp_path)
    # kill once two periodic checkpoints exist and the run is part-way into the next iterations
    _wait_for(
        lambda: (
            (run_dir / "checkpoints" / "iter_000008.pt").exists()
            and len(_train_steps(run_dir)) >= 10
        ),
        victim,
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL

    killed_at = max(_train_steps(run_dir))
    assert killed_at < total, "the kill came after the end: nothing to resume"
    newest = ckpt.newest(run_dir / "checkpoints")
    saved = ckpt.load(newest)
    resumed_from = saved["global_step"]
    assert 8 * BATCH <= resumed_from <= killed_at
    saved_rec = saved["train_env"]["recorder"]
    clips_before = {p.name for p in _clips(run_dir, "train")}
    stale = _temporaries(run_dir)  # usually the clip being encoded when the kill came

    proc = run_train([*common, "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert reference.wait(timeout=300) == 0, reference.stdout.read()
    assert "done" in proc.stdout

    # the step count continues from the checkpoint, and the run ends at the total asked for
    lines = read_metrics(run_dir)
    steps = [m["step"] for m in lines if "loss/policy" in m]
    restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert steps[restart] == resumed_from + BATCH
    assert steps[restart:] == list(range(resumed_from + BATCH, total + 1, BATCH))
    final = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert final["global_step"] == total

    # ...and so does the recorder schedule: the resumed run's next clip is the next episode
    new_clips = [p.name for p in _clips(run_dir, "train") if p.name not in clips_before]
    eps = sorted(int(_CLIP.match(n).group(2)) for n in new_clips)
    assert eps and eps[0] == saved_rec["episode"] + 1, (saved_rec, new_clips)
    # the resumed run is the uninterrupted run: same parameters, recorder counters, clip names
    ref = ckpt.load(ref_dir / "checkpoints" / "last.pt")
    for k, v in ref["ppo"]["agent"].items():
        assert torch.equal(v, final["ppo"]["agent"][k]), k
    for k in ("episode", "steps"):  # clips_saved differs by the clip that was cut (below)
        assert ref["train_env"]["recorder"][k] == final["train_env"]["recorder"][k], k
    ref_names = {p.name for p in _clips(ref_dir, "train")}
    ours = {re.sub(r"-\d+\.mp4$", ".mp4", p.name) for p in _clips(run_dir, "train")}
    # the one clip that may be missing: the episode that was being recorded at the checkpoint
    # (a clip is never continued across processes); its half-written file was removed
    assert ours <= ref_names
    assert all(int(_CLIP.match(n).group(2)) == saved_rec["episode"] for n in ref_names - ours)

    # no corrupt or half-written file is left: every checkpoint loads, every clip decodes
    assert _temporaries(run_dir) == [], f"left over (killed run's were {stale})"
    _assert_checkpoints_load(run_dir)
    _assert_videos_decode(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_stop_signal_checkpoints_and_saves_the_final_clip_within_10s(tmp_path, signame):
    run_dir = tmp_path / "run"
    # a run far too long to end by itself; no periodic checkpoints, so last.pt is the signal's
    args = [
        *FAST,
        *RECORD_ALL,
        "total_steps=100000000",
        "checkpoint_every=100000",
        f"hydra.run.dir={run_dir}",
    ]
    proc = _start(args, tmp_path)
    _wait_for(lambda: len(_train_steps(run_dir)) >= 4 and _clips(run_dir, "train"), proc)
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, _ = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 10.0, f"took {elapsed:.1f}s to stop"
    assert proc.returncode == 0, out
    assert "stopped by signal" in out

    # a checkpoint of that moment: the last completed update (the unfinished rollout is dropped)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.pt"]
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert data["global_step"] == max(_train_steps(run_dir)) == data["iteration"] * BATCH
    # the final clip: the episode in progress when the signal came is on disk, complete
    episode = data["train_env"]["recorder"]["episode"]
    last = [p for p in _clips(run_dir, "train") if int(_CLIP.match(p.name).group(2)) == episode]
    assert len(last) == 1, [p.name for p in _clips(run_dir, "train")]
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(last[0]))
    assert 1 <= frames <= 101
    assert _temporaries(run_dir) == []
    _assert_videos_decode(run_dir)


def test_resume_removes_only_other_processes_temporaries(tmp_path):
    from rlrec.preempt import remove_stale_temporaries

    dead = 2**22 + 12345  # above the default pid_max: no such process
    names = {
        f"checkpoints/.last.pt.{dead}.tmp": True,
        f"videos/train/.train-ep000003-step000000300.mp4.{dead}-2.part": True,
        f"videos/eval/.eval-ep000000-step000000000.mp4.{os.getpid()}-0.part": False,  # ours
        "videos/train/train-ep000001-step000000100.mp4": False,  # a finished clip
        "checkpoints/last.pt": False,
        f"elsewhere/.x.{dead}.tmp": False,  # outside checkpoints/ and videos/
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
