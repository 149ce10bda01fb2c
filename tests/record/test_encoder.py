"""The Encoder on its own, no env: clips in, files (or error messages) out."""

import numpy as np
import pytest
import torch

from rlrec.record.encoder import ClipInfo, ClipJob, Encoder
from rlrec.testing import decode
from tests.record.recutil import listing


def job(path, **kw) -> ClipJob:
    kw = {"fixed_name": False, "kind": "train", "episode": 3, "step": 42, "fps": 10.0, "quality": 7,
          "lossless": True, "preset": "ultrafast", **kw}  # fmt: skip
    return ClipJob(path=str(path), **kw)


def frames(n, k=1, size=16, seed=0) -> torch.Tensor:
    """``n`` distinct random frames of ``k`` tiles, uint8 ``[n, k, size, size, 3]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, k, size, size, 3), generator=gen, dtype=torch.uint8)


def encode(enc, clip_job, clip_frames, keep=True):
    enc.open(clip_job)
    for f in clip_frames:
        enc.frame(f)
    enc.end(keep)
    enc.flush()
    return enc.results()


@pytest.fixture
def enc():
    encoder = Encoder(queue_size=8, name="test-encoder")
    yield encoder
    encoder.close()


def test_kept_clip_holds_exactly_the_frames_sent(tmp_path, enc):
    sent = frames(5)
    (info,) = encode(enc, job(tmp_path / "a.mp4", tag={"eval": 7}), sent)
    assert info == ClipInfo(str(tmp_path / "a.mp4"), "train", 3, 42, 5, 10.0, tag={"eval": 7})
    decoded, fps = decode(info.path)
    assert fps == 10.0
    assert np.array_equal(decoded, sent[:, 0].numpy())  # lossless: equal, frame for frame
    assert listing(tmp_path) == ["a.mp4"]  # no temporary file left


def test_several_tiles_are_tiled_and_odd_sizes_padded(tmp_path, enc):
    sent = frames(2, k=3, size=15)
    (info,) = encode(enc, job(tmp_path / "grid.mp4"), sent)
    decoded, _ = decode(info.path)
    assert decoded.shape == (2, 30, 30, 3)  # a 2x2 grid of 15x15 tiles: 30x30, already even
    assert np.array_equal(decoded[:, :15, 15:], sent[:, 1].numpy())
    assert (decoded[:, 15:, 15:] == 0).all()  # the unused tile


def test_dropped_clip_leaves_no_file(tmp_path, enc):
    assert encode(enc, job(tmp_path / "a.mp4"), frames(4), keep=False) == []
    assert listing(tmp_path) == []


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
    assert isinstance(error, str)
    assert error.startswith(f"encoding clip {str(bad)!r} failed:") and "ffmpeg" in error
    sent = frames(3, seed=4)
    (info,) = encode(enc, job(tmp_path / "b.mp4"), sent)
    assert isinstance(info, ClipInfo) and np.array_equal(decode(info.path)[0], sent[:, 0].numpy())
    assert listing(tmp_path) == ["b.mp4"]


@pytest.mark.parametrize("queue_size", [1, 2])
def test_back_pressure_never_drops_a_frame(tmp_path, queue_size):
    enc = Encoder(queue_size=queue_size)
    sent = frames(30, size=8)
    enc.open(job(tmp_path / "a.mp4"))
    for f in sent:
        enc.frame(f)
        assert enc._buffers <= queue_size  # never more buffers than the queue holds
    enc.end(True)
    enc.close()
    (info,) = enc.results()
    assert info.num_frames == 30
    assert np.array_equal(decode(info.path)[0], sent[:, 0].numpy())


def test_frames_are_copied_when_queued(tmp_path, enc):
    buffer = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    enc.open(job(tmp_path / "a.mp4"))
    for value in (10, 20, 30):
        enc.frame(buffer.fill_(value))  # the caller reuses its buffer at once
    enc.end(True)
    enc.flush()
    (info,) = enc.results()
    assert [int(f.mean()) for f in decode(info.path)[0]] == [10, 20, 30]


def test_flush_and_close_are_idempotent(tmp_path):
    enc = Encoder(queue_size=4)
    enc.flush()  # nothing yet, not even a thread
    enc.close()
    enc.close()
    enc = Encoder(queue_size=4)
    enc.open(job(tmp_path / "a.mp4"))
    enc.frame(frames(1)[0])
    enc.end(True)
    enc.flush()
    enc.flush()
    enc.close()
    enc.close()
    enc.flush()
    assert [r.num_frames for r in enc.results()] == [1] and not enc.pending
    assert listing(tmp_path) == ["a.mp4"]


def test_close_with_a_clip_open_discards_it(tmp_path):
    enc = Encoder(queue_size=4)
    enc.open(job(tmp_path / "a.mp4"))
    for f in frames(3):
        enc.frame(f)
    enc.close()  # never ended: dropped with its temporary file
    assert enc.results() == [] and listing(tmp_path) == []
