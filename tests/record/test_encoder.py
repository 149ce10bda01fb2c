"""The Encoder on its own, no env: clips in, files (or error messages) out."""

import os
import threading
import time

import pytest
import torch

from rlrec.record.encoder import ClipInfo, Encoder
from rlrec.testing import decode
from tests.record.recutil import (
    assert_frames,
    frames,
    is_ffmpeg,
    job,
    listing,
    start_clip,
    stopped,
)


def send(enc, clip_job, clip_frames, keep=True):
    enc.open(clip_job)
    for f in clip_frames:
        enc.frame(f)
    enc.end(keep)


def encode(enc, clip_job, clip_frames, keep=True):
    send(enc, clip_job, clip_frames, keep)
    enc.flush()
    return list(enc.results())


@pytest.fixture
def enc():
    encoder = Encoder(queue_size=8, name="test-encoder")
    yield encoder
    encoder.close()


def test_kept_clip_holds_exactly_the_frames_sent(tmp_path, enc):
    sent = frames(5)
    (info,) = encode(enc, job(tmp_path / "a.mp4", tag={"eval": 7}), sent)
    assert info == ClipInfo(str(tmp_path / "a.mp4"), "train", 3, 42, 5, 10.0, tag={"eval": 7})
    assert decode(info.path)[1] == 10.0
    assert_frames(info.path, sent[:, 0])  # lossless: equal, frame for frame
    assert listing(tmp_path) == ["a.mp4"]  # no temporary file left
    # several tiles are tiled, an odd size padded
    sent = frames(2, k=3, size=15)
    (info,) = encode(enc, job(tmp_path / "grid.mp4"), sent)
    decoded, _ = decode(info.path)
    assert decoded.shape == (2, 30, 30, 3)  # a 2x2 grid of 15x15 tiles: 30x30, already even
    assert (decoded[:, :15, 15:] == sent[:, 1].numpy()).all()
    assert (decoded[:, 15:, 15:] == 0).all()  # the unused tile
    # a dropped clip leaves no file
    assert encode(enc, job(tmp_path / "b.mp4"), frames(4), keep=False) == []
    assert listing(tmp_path) == ["a.mp4", "grid.mp4"]


def test_a_taken_name_is_never_overwritten_unless_fixed(tmp_path, enc):
    (first,) = encode(enc, job(tmp_path / "a.mp4"), frames(2, seed=1))
    (second,) = encode(enc, job(tmp_path / "a.mp4"), frames(3, seed=2))
    assert second.path == str(tmp_path / "a-1.mp4")
    (third,) = encode(enc, job(tmp_path / "a.mp4", fixed_name=True), frames(4, seed=3))
    assert third.path == first.path and len(decode(third.path)[0]) == 4
    assert listing(tmp_path) == ["a-1.mp4", "a.mp4"]


def test_failing_clip_reports_an_error_and_the_next_clip_works(tmp_path, enc):
    bad = tmp_path / "missing" / "a.mp4"  # its directory does not exist
    (error,) = encode(enc, job(bad), frames(3))
    assert error.startswith(f"encoding clip {str(bad)!r} failed:") and "ffmpeg" in error
    sent = frames(3, seed=4)
    (info,) = encode(enc, job(tmp_path / "b.mp4"), sent)
    assert_frames(info.path, sent[:, 0])
    assert listing(tmp_path) == ["b.mp4"]


@pytest.mark.parametrize("queue_size", [1, 2])
def test_back_pressure_never_drops_a_frame(tmp_path, queue_size):
    enc = Encoder(queue_size=queue_size)
    sent = frames(30, size=8)
    enc.open(job(tmp_path / "a.mp4"))
    for f in sent:
        enc.frame(f)
        assert enc.buffers <= queue_size  # never more buffers than the queue holds
    enc.end(True)
    enc.close()
    (info,) = enc.results()
    assert info.num_frames == 30
    assert_frames(info.path, sent[:, 0])


def test_frames_are_copied_when_queued(tmp_path, enc):
    buffer = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    # the caller reuses its buffer at once
    (info,) = encode(enc, job(tmp_path / "a.mp4"), (buffer.fill_(v) for v in (10, 20, 30)))
    assert [int(f.mean()) for f in decode(info.path)[0]] == [10, 20, 30]


def test_flush_and_close_are_idempotent_and_close_drops_a_clip_never_ended(tmp_path):
    enc = Encoder(queue_size=4)
    enc.flush()  # nothing yet, not even a thread
    enc.close()
    enc.close()
    enc = Encoder(queue_size=4)
    send(enc, job(tmp_path / "a.mp4"), frames(1))
    for call in (enc.flush, enc.flush, enc.close, enc.close, enc.flush):
        call()
    assert [r.num_frames for r in enc.results()] == [1] and not enc.waiting
    enc = Encoder(queue_size=4)
    enc.open(job(tmp_path / "b.mp4"))
    for f in frames(3):
        enc.frame(f)
    enc.close()  # never ended: dropped with its temporary file
    assert list(enc.results()) == [] and listing(tmp_path) == ["a.mp4"]


def test_threads_go_to_the_clips_ffmpeg_and_the_clip_is_exact(tmp_path):
    """``Encoder(threads=...)`` (per-episode clips: one x264 thread per clip) reaches the ffmpeg
    of each clip, and changes nothing of what the clip holds."""
    enc = start_clip(Encoder(queue_size=8, threads=1), tmp_path / "a.mp4", 4)  # ffmpeg runs
    args, deadline = [], time.monotonic() + 10.0
    while b"-threads" not in args and time.monotonic() < deadline:  # read empty now and then
        with open(f"/proc/{enc.current_pid}/cmdline", "rb") as f:  # on a loaded machine
            args = f.read().split(b"\0")
    assert args[args.index(b"-threads") + 1] == b"1"
    enc.end(True)
    enc.close()
    (info,) = enc.results()
    assert_frames(info.path, frames(4)[:, 0])


# --------------------------------------------------------------------------- a hung ffmpeg


def test_ffmpeg_stopped_while_finishing_bounds_flush(tmp_path):
    enc = start_clip(Encoder(queue_size=4, stall_timeout=0.3), tmp_path / "a.mp4", 3)
    pid = enc.current_pid
    with stopped(pid):
        t0 = time.perf_counter()
        enc.end(True)
        enc.flush()  # ffmpeg never finishes: given up on after 0.3 s without progress
        waited = time.perf_counter() - t0
        (error,) = enc.results()
    assert waited < 2.0, waited
    assert "no progress for 0.3 s" in error and "killed" in error
    assert not is_ffmpeg(pid)  # killed (and reaped)
    assert listing(tmp_path) == []  # no clip under its name, no temporary file
    sent = frames(2, seed=5)
    (info,) = encode(enc, job(tmp_path / "b.mp4"), sent)  # the next clip works
    assert_frames(info.path, sent[:, 0])
    enc.close()


def test_encoder_stuck_elsewhere_the_training_thread_gives_up_once(tmp_path):
    """The encoder thread stuck outside ffmpeg (here: in the overlay): frame(), flush() and
    close() still return after 2 * stall_timeout without progress; one failure is reported."""
    release = threading.Event()

    def stuck_overlay(array, meta):
        release.wait(8.0)  # bounded: old code that waits for good then ends the test late
        return array

    enc = Encoder(queue_size=2, stall_timeout=0.2)
    t0 = time.perf_counter()
    send(enc, job(tmp_path / "a.mp4", overlay=stuck_overlay), frames(20, size=8))
    enc.flush()
    waited = time.perf_counter() - t0
    assert waited < 2.5, waited  # one give-up (0.4 s) for the frames, one for flush
    release.set()
    sent = frames(3, seed=6)
    send(enc, job(tmp_path / "b.mp4"), sent)
    enc.close()
    error, info = enc.results()
    assert "a.mp4" in error and "without progress" in error
    assert_frames(info.path, sent[:, 0])
    assert listing(tmp_path) == ["b.mp4"]


# --------------------------------------------------------------------------- paths and names


@pytest.mark.parametrize("directory", ["-vids", "pipe:1", "file:x"])
def test_ffmpeg_reads_the_clip_path_as_a_file(tmp_path, monkeypatch, enc, directory):
    """A relative directory that looks like an ffmpeg option or protocol is still a directory."""
    monkeypatch.chdir(tmp_path)
    os.makedirs(directory)
    sent = frames(2, seed=7)
    (info,) = encode(enc, job(os.path.join(directory, "a.mp4")), sent)
    assert listing(tmp_path / directory) == ["a.mp4"]
    assert_frames(tmp_path / directory / "a.mp4", sent[:, 0])


def test_two_encoders_racing_for_the_same_names_lose_no_clip(tmp_path, monkeypatch):
    """Two encoders (as two runs sharing a video dir) end clips of the same names at the same
    moment. The check for a free name is made to coincide in both (a barrier), which is when
    check-then-rename gives both the same name; claiming names atomically loses nothing."""
    barrier = threading.Barrier(2, timeout=2.0)
    exists = os.path.exists

    def coinciding_exists(path):
        if str(path).startswith(str(tmp_path)) and str(path).endswith(".mp4"):
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                barrier.reset()
        return exists(path)

    monkeypatch.setattr(os.path, "exists", coinciding_exists)
    encoders = [Encoder(queue_size=4, name=f"race-{i}") for i in range(2)]
    sent = {}
    for n in range(4):  # four rounds: both encoders end a clip named a.mp4 in each
        for i, e in enumerate(encoders):
            sent[(i, n)] = frames(1 + n + 4 * i, size=8, seed=10 * n + i)
            send(e, job(tmp_path / "a.mp4", episode=n, step=i), sent[(i, n)])
        for e in encoders:
            e.flush()
    for e in encoders:
        e.close()
    infos = [r for e in encoders for r in e.results()]
    assert len({r.path for r in infos}) == 8, infos
    assert listing(tmp_path) == sorted(["a.mp4"] + [f"a-{k}.mp4" for k in range(1, 8)])
    for r in infos:  # each file holds the clip it was reported for
        assert_frames(r.path, sent[(r.step, r.episode)][:, 0])


def test_clips_of_changing_frame_sizes_back_to_back_lose_no_buffer(tmp_path):
    """A batch of the encoder thread can hold buffers of the old frame size and of the new one;
    the new ones must come back (else the training thread runs out of buffers)."""
    enc = Encoder(queue_size=2, stall_timeout=0.5)
    sent = [frames(3, size=8 if n % 2 else 16, seed=n) for n in range(8)]
    for n, clip in enumerate(sent):
        send(enc, job(tmp_path / f"c{n}.mp4"), clip)
    enc.close()
    infos = list(enc.results())
    assert [type(r) for r in infos] == [ClipInfo] * 8, infos
    for info, clip in zip(infos, sent):
        assert_frames(info.path, clip[:, 0])
