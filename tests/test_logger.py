"""RunLogger: its TensorBoard clip previews, its status lines without a terminal, a lost clip's
line and the run's last console line."""

import io
import math
import os
import re
import threading
import time

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from rlrec.config import LoggerConfig, LoggerName
from rlrec.record import ClipInfo
from rlrec.report.progress import read_frames
from rlrec.train.logger import RunLogger, _Previews, _tb_add_clip, figure
from tests.helpers import FAST, read_metrics, run_train


class _Writer:
    """Captures what _tb_add_clip hands to TensorBoard's file writer."""

    def __init__(self):
        self.summaries = []

    def _get_file_writer(self):
        return self

    def add_summary(self, summary, step):
        self.summaries.append((summary, step))


def _clip(path, values, kind="train", size=16) -> ClipInfo:
    """A clip of one solid frame per value, at ``path``."""
    writer = imageio_ffmpeg.write_frames(str(path), (size, size), fps=30, macro_block_size=1)
    writer.send(None)
    for value in values:
        writer.send(np.full((size, size, 3), value, np.uint8))
    writer.close()
    return ClipInfo(str(path), kind, 0, 0, len(values), 30.0)


@pytest.mark.parametrize("frames, shown", [(400, 134), (20, 20)])
def test_a_preview_shows_the_clips_frames_at_most_150(tmp_path, frames, shown):
    """A long clip is subsampled (every 3rd of 400 frames: ceil(400 / 3)), a short one keeps
    every frame, each in its own colours (the clip's decoded frames, within a palette's
    rounding)."""
    clip, writer = _clip(tmp_path / "c.mp4", [(i * 12) % 256 for i in range(frames)]), _Writer()
    _tb_add_clip(writer, clip, 7, clip.path)
    ((summary, step),) = writer.summaries
    image = summary.value[0].image
    gif = Image.open(io.BytesIO(image.encoded_image_string))
    assert step == 7 and summary.value[0].tag == "video/train"
    assert (image.width, image.height) == (16, 16) and gif.n_frames == shown
    stride = math.ceil(frames / shown)
    for i, frame in enumerate(list(read_frames(tmp_path / "c.mp4"))[::stride]):
        gif.seek(i)
        assert np.abs(np.asarray(gif.convert("RGB"), dtype=np.int16) - frame).max() <= 8, i


def test_each_preview_shows_its_own_clip_under_a_fixed_name(tmp_path):
    """recorder.filename=latest.mp4: each clip replaces the file (atomically, as the encoder
    does) before the preview thread got to the previous one; every preview shows its own clip."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = RunLogger(LoggerConfig(name="tensorboard", progress=False), tmp_path, 10, {})
    videos = tmp_path / "videos"
    videos.mkdir()
    # a long one first keeps the preview thread busy while the others queue
    logger.log_clip(_clip(videos / "long.mp4", [0] * 400, "eval"), 0)
    latest = videos / "latest.mp4"
    for step, value in ((1, 40), (2, 200), (3, 120)):
        clip = _clip(tmp_path / "next.mp4", [value] * 3)
        os.replace(tmp_path / "next.mp4", latest)  # the next clip of that name
        logger.log_clip(ClipInfo(str(latest), "train", 0, 0, 3, 30.0), step)
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    shown = {}
    for event in acc.Images("video/train"):
        gif = Image.open(io.BytesIO(event.encoded_image_string))
        shown[event.step] = round(float(np.asarray(gif.convert("RGB")).mean()))
    assert shown.keys() == {1, 2, 3} and clip.num_frames == 3
    for step, value in ((1, 40), (2, 200), (3, 120)):
        assert abs(shown[step] - value) <= 3, shown
    assert sorted(os.listdir(videos)) == ["latest.mp4", "long.mp4"]  # no private link left


def test_closing_never_waits_unbounded_for_a_stuck_preview(capsys):
    """A TensorBoard preview stuck (a dead disk, say) holds close() up at most its timeout; the
    previews queued before it are made in order."""
    made, release = [], threading.Event()
    previews = _Previews()
    previews.submit(made.append, 1)
    previews.submit(lambda: release.wait(30))  # stuck
    previews.submit(made.append, 2)
    t0 = time.monotonic()
    previews.close(0.5)
    took = time.monotonic() - t0
    release.set()
    assert made == [1] and 0.4 < took < 5
    assert "did not finish within 0.5 s; 1 not made" in capsys.readouterr().err


_STATUS = re.compile(
    r"^rlrec: step ([\d,]+)/([\d,]+) \(\d+%\) \| (?:[\d,]+|-) SPS \|.* "
    r"\| elapsed (\d+):(\d\d):(\d\d) \| left (?:[\d:]+|-)$"
)


def _status_lines(stdout: str) -> list:
    """(step, elapsed seconds) of each status line of a run's output."""
    found = [m for m in map(_STATUS.match, stdout.splitlines()) if m]
    return [
        (int(m[1].replace(",", "")), int(m[3]) * 3600 + int(m[4]) * 60 + int(m[5])) for m in found
    ]


@pytest.mark.slow
def test_without_a_terminal_a_status_line_follows_each_evaluation(tmp_path):
    """Output captured (no terminal): a status line after each evaluation, with its figures;
    no other while logger.status_every_sec has not passed."""
    run_dir = tmp_path / "run"
    args = [*FAST, "logger.progress=true", "logger.status_every_sec=86400", "total_steps=1024"]
    proc = run_train([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    evals = [m for m in read_metrics(run_dir) if "eval/return" in m]
    assert [step for step, _ in _status_lines(proc.stdout)] == [m["step"] for m in evals]
    last = [line for line in proc.stdout.splitlines() if _STATUS.match(line)][-1]
    assert last.startswith("rlrec: step 1,024/1,024 (100%) | ")
    assert f"eval return {figure(evals[-1]['eval/return'])} success " in last
    assert "train return " in last


@pytest.mark.slow
def test_without_a_terminal_status_lines_come_at_a_bounded_rate(tmp_path):
    """Without evaluations, a status line at most every logger.status_every_sec: far fewer than
    the iterations."""
    run_dir = tmp_path / "run"
    args = [*FAST, "logger.progress=true", "logger.status_every_sec=0.5"]
    args += ["eval_env.enabled=false", "recorder=none", "total_steps=16384"]  # 128 iterations
    proc = run_train([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    lines = _status_lines(proc.stdout)
    iterations = [m for m in read_metrics(run_dir) if "train/lr" in m]
    elapsed = lines[-1][1] + 1  # whole seconds shown: less than one more
    assert 1 <= len(lines) <= elapsed / 0.5 + 1 and len(lines) < len(iterations) / 4, proc.stdout
    assert [s for s, _ in lines] == sorted(s for s, _ in lines)


def test_a_status_line_says_steps_speed_figures_and_time_left(tmp_path, capsys):
    """Off a terminal (pytest captures the output), logger.progress=true: no bar, a status line
    after an evaluation; logger.progress=false: none."""
    for progress in (True, False):
        cfg = LoggerConfig(name=LoggerName.none, progress=progress)
        logger = RunLogger(cfg, tmp_path, total_steps=100, config_dict={})
        logger.progress(50, sps=10.0)  # logger.status_every_sec has not passed: no line
        logger.log(50, {"eval/return": 1.5, "eval/success": 1.0})  # an evaluation: a line
        logger.close()
        assert logger._progress is None
        out = capsys.readouterr().out
        line = "rlrec: step 50/100 (50%) | 10 SPS | eval return 1.5 success 1 | elapsed 0:00:00"
        assert out == (f"{line} | left 0:00:05\n" if progress else ""), out


def test_a_lost_eval_clip_is_said_on_its_line_and_in_the_last_console_line(tmp_path, capsys):
    logger = RunLogger(LoggerConfig(name="none", progress=False), tmp_path, 100, {})
    logger.log(256, {"eval/return": 1.0}, clip=True)  # its clip never comes
    losses = {"record/clips_dropped": 2, "record/frames_dropped": 40, "record/encoder_stalls": 0}
    logger.close(256, losses)
    line, last = read_metrics(tmp_path)
    assert line["eval/clip"] is None and line["eval/clip_lost"] is True
    assert last == {"step": 256, **losses}  # as the run closes: the losses changed
    logger.summary(1.0, {}, None, True)
    out = capsys.readouterr().out
    assert "recording lost clips_dropped 2, frames_dropped 40" in out
    assert "encoder_stalls" not in out  # named when nonzero
