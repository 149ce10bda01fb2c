"""Encoder failures, close/final clips, file naming, and bad input."""

import os
import signal
import time

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs.autoreset import AutoReset
from rlrec.record import Recorder, RecorderError
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.testing import decode
from tests.record.recutil import (
    assert_frames,
    is_ffmpeg,
    listing,
    make_stack,
    point_reach,
    random_actions,
    run_steps,
    stopped,
)


def recorder_errors(caplog):
    records = [r for r in caplog.records if r.name == "rlrec.record.engine"]
    return [r.getMessage() for r in records if r.levelname == "ERROR"]


def test_unwritable_directory_training_goes_on_reported_once(tmp_path, caplog):
    video_dir = tmp_path / "videos"
    stack, rec, spy, clips = make_stack(video_dir, max_steps=4, trigger="always")
    stack.reset(seed=0)
    run_steps(stack, 4)  # episode 0: a good clip
    rec.flush()
    assert len(clips) == 1
    # the directory disappears under the run (a file now sits at its path)
    kept = tmp_path / "kept"
    os.rename(video_dir, kept)
    video_dir.write_text("not a directory")
    run_steps(stack, 12)  # three more episodes, all failing
    rec.flush()
    assert len(clips) == 1 and len(rec.errors) == 3
    (message,) = recorder_errors(caplog)  # reported once
    assert "encoding clip" in message and "on_error=raise" in message
    assert "Not a directory" in message
    assert_frames(kept / os.path.basename(clips[0].path), spy.episodes[0])  # the earlier clip
    stack.close()


def wait_for_ffmpeg(rec):
    for _ in range(200):
        rec.engine.encoder.flush()
        if rec.engine.encoder.current_pid is not None:
            return rec.engine.encoder.current_pid
        time.sleep(0.01)
    raise AssertionError("ffmpeg did not start")


def test_killed_ffmpeg_drops_that_clip_only(tmp_path, caplog):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=30, trigger="always")
    stack.reset(seed=0)
    run_steps(stack, 31)  # episode 1 is being recorded
    os.kill(wait_for_ffmpeg(rec), signal.SIGKILL)
    run_steps(stack, 29 + 30)  # the rest of episode 1, then episode 2
    rec.flush()
    assert len(recorder_errors(caplog)) == 1 and len(rec.errors) == 1
    assert "ffmpeg" in rec.errors[0]
    assert [c.episode for c in clips] == [0, 2]  # training went on, the next clip is whole
    # counted: the clip and every frame handed over for it (the reset's and 30 steps')
    assert rec.engine.losses() == {"clips_dropped": 1, "frames_dropped": 31, "encoder_stalls": 0}
    for clip in clips:
        assert_frames(clip.path, spy.episodes[clip.episode])
    stack.close()
    assert not [n for n in listing(tmp_path) if n.endswith(".part")]  # no temporary file left


def test_stopped_ffmpeg_does_not_stall_training(tmp_path, caplog):
    """ffmpeg stopped (SIGSTOP) mid-clip: training goes on at about full speed after at most
    recorder.stall_timeout_sec; that clip is dropped (ffmpeg killed, no file, no temporary) and
    reported once; the next clip is whole."""
    # 128x128 frames (48 KiB): ffmpeg's 1 MiB pipe and the 4 buffers fill in about 25 frames
    stack, rec, spy, clips = make_stack(
        tmp_path, size=128, max_steps=80, trigger="always", queue_size=4, stall_timeout_sec=0.3
    )
    stack.reset(seed=0)
    run_steps(stack, 5)
    t0 = time.perf_counter()
    run_steps(stack, 15)
    per_step = (time.perf_counter() - t0) / 15  # while recording, ffmpeg running
    pid = wait_for_ffmpeg(rec)
    with stopped(pid, resume_after=10.0):
        t0 = time.perf_counter()
        run_steps(stack, 60)  # the rest of episode 0 (2.8 MiB of frames) into the stopped ffmpeg
        stalled = time.perf_counter() - t0
        rec.flush()
    # one wait of about 0.3 s, else full speed (old code: stuck until the guard resumed ffmpeg)
    assert stalled < 60 * per_step * 2 + 0.3 * 2 + 1.0, (stalled, per_step)
    assert not is_ffmpeg(pid)  # killed
    assert len(rec.errors) == 1 and len(recorder_errors(caplog)) == 1
    assert "no progress for 0.3 s" in rec.errors[0] and "stall_timeout_sec" in rec.errors[0]
    # nothing of episode 0 under its final name, no temporary (episode 1's clip may have begun)
    assert clips == [] and [n for n in listing(tmp_path) if "-ep000000-" in n] == []
    # the reset's and 80 steps' frames: all of episode 0
    assert rec.engine.losses() == {"clips_dropped": 1, "frames_dropped": 81, "encoder_stalls": 1}
    run_steps(stack, 80)  # episode 1: recorded whole
    rec.flush()
    assert [c.episode for c in clips] == [1] and len(rec.errors) == 1
    assert_frames(clips[0].path, spy.episodes[1])
    stack.close()


def test_on_error_raise_is_fatal(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=30, trigger="always", on_error="raise")
    stack.reset(seed=0)
    run_steps(stack, 1)
    os.kill(wait_for_ffmpeg(rec), signal.SIGKILL)
    with pytest.raises(RecorderError, match="on_error=raise"):
        run_steps(stack, 60)
        rec.flush()
    stack.close()


@pytest.mark.parametrize("final", [True, False])
def test_close_saves_or_drops_the_episode_in_progress_and_is_idempotent(tmp_path, final):
    stack, rec, spy, clips = make_stack(
        tmp_path, max_steps=50, trigger="always", record_final_episode=final
    )
    stack.reset(seed=0)
    run_steps(stack, 7)
    names_while_recording = [n for n in listing(tmp_path) if not n.startswith(".")]
    stack.close()
    stack.close()
    rec.close()
    assert names_while_recording == []  # the clip in progress is only a hidden temporary file
    if final:  # 8 frames: all there were, and the clip's sidecar, nothing else
        (clip,) = clips
        assert_frames(clip.path, spy.episodes[0])
        assert len(listing(tmp_path)) == 2
    else:
        assert clips == [] and listing(tmp_path) == []


def test_record_next_episode_and_end_clip(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=5, trigger="cubic")
    stack.reset(seed=0)
    run_steps(stack, 5 * 4)  # episodes 0..3 (clips of 0 and 1); episode 4 has just begun
    rec.record_next_episode()  # episode 5, although not on the schedule
    run_steps(stack, 5 + 2)
    assert rec.recording
    rec.end_clip()  # e.g. an evaluation stopped early: the clip is saved now, not at the next reset
    rec.flush()
    assert [(c.episode, c.num_frames) for c in clips] == [(0, 6), (1, 6), (5, 3)]
    assert_frames(clips[-1].path, spy.episodes[5])
    stack.close()


def test_fixed_filename_holds_each_clip_while_it_is_reported(tmp_path):
    """Each clip replaces the fixed name atomically, and on_clip finds its own clip there, though
    later clips are encoded meanwhile (what the TensorBoard preview relies on: it links the file
    while on_clip runs)."""
    stack, rec, spy, clips = make_stack(
        tmp_path, max_steps=2, trigger="always", filename="latest.mp4"
    )
    seen = []
    rec.engine.on_clip = lambda clip: seen.append((clip, decode(clip.path)[0]))  # slow: 50 ms
    stack.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    run_steps(stack, 2 * 12, lambda env: random_actions(env, gen))
    stack.close()
    assert [clip.episode for clip, _ in seen] == list(range(13))
    assert {clip.path for clip, _ in seen} == {str(tmp_path / "latest.mp4")}
    for clip, frames in seen:
        assert np.array_equal(frames, np.stack(spy.episodes[clip.episode])), clip.episode
    assert listing(tmp_path) == ["latest.json", "latest.mp4"]
    assert_frames(tmp_path / "latest.mp4", spy.episodes[-1])  # the last clip


def make_rec(tmp_path, num_envs=4, **kw):
    return Recorder(point_reach(num_envs), RecorderConfig(**kw), str(tmp_path))


@pytest.mark.parametrize(
    "kw, key",
    [
        (dict(trigger="sometimes"), "recorder.trigger"),
        (dict(trigger=Trigger.cubic, every=5), "recorder.every"),  # two triggers
        (dict(trigger=Trigger.always, every=5), "recorder.every"),
        (dict(trigger=Trigger.episode), "recorder.every"),
        (dict(trigger=Trigger.step, every=0), "recorder.every"),
        (dict(length_frames=0), "recorder.length_frames"),
        (dict(length_sec=-1.0), "recorder.length_sec"),
        (dict(length_sec=1.0, length_frames=3), "recorder.length_frames"),
        (dict(fps=0), "recorder.fps"),
        (dict(env_idx=[4]), "recorder.env_idx"),
        (dict(env_idx=[]), "recorder.env_idx"),
        (dict(env_idx=[1, 1]), "recorder.env_idx"),
        (dict(queue_size=0), "recorder.queue_size"),
        (dict(quality=11), "recorder.quality"),
        (dict(preset="warp"), "recorder.preset"),
        (dict(on_error="ignore"), "recorder.on_error"),
        (dict(filename="a/b.mp4"), "recorder.filename"),
        # names that are not one plain file, or that ffmpeg would read as an option
        (dict(filename=".."), "recorder.filename"),
        (dict(filename="."), "recorder.filename"),
        (dict(filename=".hidden.mp4"), "recorder.filename"),
        (dict(filename="-y.mp4"), "recorder.filename"),
        (dict(filename=" latest.mp4"), "recorder.filename"),
        (dict(filename="x" * 200), "recorder.filename"),  # no room for its temporary name
        # a protocol prefix: refused, not made a directory of that name
        (dict(dir="pipe:1"), "recorder.dir"),
        (dict(dir="file:videos"), "recorder.dir"),
        (dict(dir="s3://bucket/videos"), "recorder.dir"),
        (dict(stall_timeout_sec=0.0), "recorder.stall_timeout_sec"),
        (dict(stall_timeout_sec=float("nan")), "recorder.stall_timeout_sec"),
    ],
)
def test_bad_input_names_the_key_before_any_work(tmp_path, kw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_rec(tmp_path / "videos", **kw)
    assert not (tmp_path / "videos").exists()  # nothing was created


def test_bad_input_messages_list_allowed_values(tmp_path):
    with pytest.raises(ConfigError, match="cubic, episode, step, always, eval, none"):
        RecorderConfig(trigger="sometimes").check(8, "eval_env.recorder")
    with pytest.raises(ConfigError, match=r"eval_env\.recorder\.env_idx=\[8\].*\[0, 7\]"):
        RecorderConfig(env_idx=[8]).check(8, "eval_env.recorder")


def test_odd_but_plain_dir_and_a_name_without_mp4(tmp_path, monkeypatch):
    """``-vids`` is a directory (relative to the working directory at start-up), not an ffmpeg
    option; a filename without ``.mp4`` gets it."""
    monkeypatch.chdir(tmp_path)
    clips = []
    cfg = RecorderConfig(
        trigger=Trigger.always, dir="-vids", filename="latest", record_final_episode=False
    )
    stack = AutoReset(Recorder(point_reach(max_steps=3), cfg, None, on_clip=clips.append))
    monkeypatch.chdir(tmp_path / "-vids")  # a later change of directory changes nothing
    stack.reset(seed=0)
    run_steps(stack, 3)
    stack.close()
    assert [c.path for c in clips] == [str(tmp_path / "-vids" / "latest.mp4")]
    assert listing(tmp_path / "-vids") == ["latest.json", "latest.mp4"]
    assert len(decode(clips[0].path)[0]) == 4


def test_video_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"recorder\.dir='.*file/videos'"):
        make_rec(tmp_path, dir=str(blocker / "videos"))
    with pytest.raises(ConfigError, match=r"recorder\.dir='.*file/videos'"):
        RecorderConfig(dir=str(blocker / "videos")).check(4, "recorder")
    env = point_reach(2)
    with pytest.raises(ConfigError, match=r"eval_env\.recorder\.dir"):
        Recorder(env, RecorderConfig(), str(blocker / "videos"), kind="eval")
    with pytest.raises(ConfigError, match="needs a directory"):
        Recorder(env, RecorderConfig(), None)
