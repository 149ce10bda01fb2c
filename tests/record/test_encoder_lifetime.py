"""No encoder left behind: a recorder that is never closed (an exception in the user's loop, then
garbage collection or the interpreter's exit) leaves no ffmpeg process, no encoder thread and no
temporary file, and no partial clip under a final name.

What such a recorder does (docs/recorder.md, "A recorder that is never closed"): the clip in
progress is dropped (its ffmpeg killed and reaped, its hidden ``.NAME.PID-N.part`` removed); the
clips that were already on disk stay, complete.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import psutil
import pytest

from rlrec.record import encoder as encoder_module
from rlrec.record.encoder import Encoder
from rlrec.record.sidecar import sha256_file
from rlrec.testing import decode
from tests.record.recutil import (
    assert_only_clips,
    frames,
    is_ffmpeg,
    make_stack,
    run_steps,
    sidecar,
    start_clip,
)

REPO = Path(__file__).resolve().parents[2]
LIMIT = 10  # episode length: episode 0's clip has LIMIT + 1 frames
BOUND = 10.0  # seconds: how long a dropped recorder may take to be gone


def ffmpegs_writing_into(directory) -> list:
    """Live (not zombie) processes whose command line names a file in ``directory``."""
    needle = os.path.abspath(str(directory))
    procs = psutil.process_iter(["cmdline", "status"])
    return [
        p
        for p in procs
        if needle in " ".join(p.info["cmdline"] or [])
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and p.pid != os.getpid()
    ]


def wait_until(predicate, timeout: float = BOUND) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def assert_finished_clip(path, count: int) -> None:
    """``path`` is a whole clip: decodable, ``count`` frames, with its sidecar naming that file."""
    assert len(decode(str(path))[0]) == count
    side = sidecar(path)
    assert side["sha256"] == sha256_file(str(path)) and side["frames"] == count


# --------------------------------------------------------------------------- interpreter exit

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from rlrec.record import RecorderConfig, Trigger
    from rlrec.envs.autoreset import AutoReset
    from rlrec.envs.builtin import PointReach
    from rlrec.record import Recorder

    video_dir, mode, filename = sys.argv[1], sys.argv[2], sys.argv[3] or None
    env = PointReach(2, max_episode_steps={limit}, render_width=32, render_height=32, seed=0)
    cfg = RecorderConfig(trigger=Trigger.always, lossless=True, filename=filename)
    recorder = Recorder(env, cfg, video_dir)
    stack = AutoReset(recorder)
    stack.reset(seed=0)
    for t in range({limit} + 6):  # episode 0 ends at step {limit}; episode 1's clip is open
        stack.step(torch.zeros(2, 2))
        if t == {limit} + 1:
            recorder.flush()  # episode 0's clip is on disk (and placed under a fixed name)
    if mode != "queued":  # "queued": frames wait in the queue, ffmpeg may not have started
        recorder.flush()  # episode 1's frames are in its ffmpeg, which runs
        pid = recorder.engine.encoder.current_pid
        assert pid is not None
        print("ffmpeg", pid, flush=True)
        if mode == "stopped":  # a hung ffmpeg: the exit must still be bounded
            os.kill(pid, signal.SIGSTOP)
    raise RuntimeError("the user's loop failed mid-clip")
    """
).format(limit=LIMIT)


@pytest.mark.parametrize(
    "mode, filename",
    [("running", ""), ("queued", ""), ("stopped", ""), ("running", "latest.mp4")],
)
def test_uncaught_exception_mid_clip_leaves_nothing_behind(tmp_path, mode, filename):
    script = tmp_path / "crash.py"
    script.write_text(SCRIPT)
    videos = tmp_path / "videos"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        start = time.monotonic()
        cmd = [sys.executable, str(script), str(videos), mode, filename]
        kw = dict(capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
        proc = subprocess.run(cmd, **kw)
        assert proc.returncode == 1, proc.stderr
        assert "the user's loop failed mid-clip" in proc.stderr
        # no ffmpeg survives its recorder's process (an orphan would go on writing its .part)
        assert wait_until(lambda: not ffmpegs_writing_into(videos), 3.0), [
            p.info for p in ffmpegs_writing_into(videos)
        ]
        elapsed = time.monotonic() - start
    finally:  # test hygiene: what a failing run left behind (an old encoder's orphaned ffmpeg)
        for survivor in ffmpegs_writing_into(videos):
            survivor.kill()
    if mode != "queued":
        pid = int(proc.stdout.split()[1])
        assert not is_ffmpeg(pid)
    assert elapsed < 60, elapsed  # a stopped ffmpeg did not hold the exit for long
    # episode 0's clip was finished before the exception: it is there, complete, with its
    # sidecar; episode 1's clip, in progress at the exception, is dropped: no file of it under any
    # name, no temporary file
    name = filename or "train-ep000000-step000000000.mp4"
    assert sorted(os.listdir(videos)) == [name[: -len(".mp4")] + ".json", name]
    assert_finished_clip(videos / name, LIMIT + 1)


# --------------------------------------------------------------------------- garbage collection


def test_an_encoder_dropped_mid_clip_is_collected_and_stops_its_thread_and_ffmpeg(tmp_path):
    enc = start_clip(Encoder(queue_size=4, name="lifetime-encoder"), tmp_path / "a.mp4", 5)
    pid, thread = enc.current_pid, enc.thread
    assert pid is not None and thread is not None and thread.is_alive()
    ref = weakref.ref(enc)
    gc.disable()  # reference counting alone must free it: no cycle through the thread's target
    try:
        del enc
        assert ref() is None, gc.get_referrers(ref())
    finally:
        gc.enable()
    thread.join(BOUND)
    assert not thread.is_alive()
    assert not is_ffmpeg(pid) and not psutil.pid_exists(pid)  # killed and reaped
    assert os.listdir(tmp_path) == []  # neither a.mp4 nor its temporary file


def test_a_recorder_dropped_mid_clip_leaves_no_thread_no_ffmpeg_no_temporary(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, num_envs=2, max_steps=LIMIT, trigger="always")
    stack.reset(seed=0)
    run_steps(stack, LIMIT + 4)
    rec.flush()
    pid, thread = rec.engine.encoder.current_pid, rec.engine.encoder.thread
    assert pid is not None and thread.is_alive() and rec.recording
    assert [c.num_frames for c in clips] == [LIMIT + 1]
    del stack, rec, spy
    gc.collect()
    thread.join(BOUND)
    assert not thread.is_alive(), "the encoder thread outlived its recorder"
    assert not any(t.name.startswith("rlrec-encoder") for t in threading.enumerate())
    assert not is_ffmpeg(pid)
    assert_only_clips(tmp_path, clips)  # the clip in progress was dropped, no temporary left
    assert_finished_clip(clips[0].path, LIMIT + 1)


def test_a_closed_recorder_is_collected_with_nothing_left(tmp_path):
    """The finalizer after a normal close: nothing to drop, the clip that close() saved stays."""
    stack, rec, spy, clips = make_stack(tmp_path, num_envs=1, max_steps=LIMIT, trigger="always")
    stack.reset(seed=0)
    run_steps(stack, 3)
    stack.close()  # record_final_episode: saves the clip in progress
    ref = weakref.ref(rec.engine.encoder)
    del stack, rec, spy
    gc.collect()
    assert ref() is None
    assert [c.num_frames for c in clips] == [4]
    assert_only_clips(tmp_path, clips)


def test_an_encoder_thread_stuck_outside_ffmpeg_is_cleaned_up_from_outside(tmp_path, monkeypatch):
    """The thread is stuck in user code (an overlay) when its encoder is dropped: the drop still
    returns within ABANDON_TIMEOUT_S, with ffmpeg killed and the temporary file removed; the
    thread ends once it is released."""
    monkeypatch.setattr(encoder_module, "ABANDON_TIMEOUT_S", 0.5)
    release, seen = threading.Event(), []

    def overlay(array, meta):
        seen.append(meta)
        if len(seen) > 2:  # ffmpeg started with the first frame; now stuck
            release.wait(BOUND)
        return array

    enc = Encoder(queue_size=4, stall_timeout=5.0)  # the thread is woken every 2 frames
    start_clip(enc, tmp_path / "a.mp4", 2, overlay=overlay)
    pid, thread = enc.current_pid, enc.thread
    assert pid is not None
    for f in frames(2, seed=1):  # one batch: its first frame reaches the stuck overlay
        enc.frame(f)
    assert wait_until(lambda: len(seen) > 2)
    start = time.monotonic()
    del enc
    gc.collect()
    took = time.monotonic() - start
    try:
        assert took < BOUND / 2, took  # ABANDON_TIMEOUT_S (0.5 s) and a loaded machine's slack
        assert not is_ffmpeg(pid)
        assert os.listdir(tmp_path) == []
    finally:
        release.set()
    thread.join(BOUND)
    assert not thread.is_alive()
    assert os.listdir(tmp_path) == []


def test_a_dropped_encoder_kills_and_reaps_its_stopped_ffmpeg(tmp_path):
    """A stopped ffmpeg (SIGSTOP) of a dropped encoder is killed and reaped within the bound."""
    enc = start_clip(Encoder(queue_size=4, stall_timeout=5.0), tmp_path / "a.mp4", 3)
    pid, thread = enc.current_pid, enc.thread
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        del enc
        took = time.monotonic() - start
        thread.join(BOUND)
        assert not thread.is_alive() and took < 3.0, took
        assert not psutil.pid_exists(pid)
        assert os.listdir(tmp_path) == []
    finally:
        if is_ffmpeg(pid):
            os.kill(pid, signal.SIGKILL)
