"""The run report (rlrec.report): the progress video's tiles are the eval clips' frames, the page
holds what a run dir tells, for a run dir of any age, a sweep dir, and the command line."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlrec.layout import PROGRESS_VIDEO, RunDir
from rlrec.report.config import ReportConfig
from rlrec.report.curves import tick_labels
from rlrec.report.html import write_run_report
from rlrec.report.progress import BAND, even_subset, write_progress
from rlrec.report.rundata import read_jsonl, read_rows, read_run, wilson
from rlrec.testing import decode
from tests.helpers import FAST, REPO, read_metrics, run_train, start_train, wait_for


def _decode(path: Path) -> np.ndarray:
    return decode(str(path))[0]


def _report(*args: str) -> subprocess.CompletedProcess:
    """``python -m rlrec.report ARGS``."""
    cmd = [sys.executable, "-m", "rlrec.report", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    return out


# --------------------------------------------------------------------------- progress video


def test_even_subset_keeps_first_and_last():
    many = even_subset(list(range(200)), 16)
    assert (many[0], many[-1], len(many), len(set(many))) == (0, 199, 16, 16)
    assert even_subset(list(range(5)), 16) == [0, 1, 2, 3, 4]
    assert even_subset(list(range(9)), 3) == [0, 4, 8] and even_subset(list(range(9)), 1) == [8]


def test_progress_tiles_equal_the_eval_clips(lossless_run):
    """Lossless clips: each tile of every frame equals its clip's frame (its last one once the
    clip ended), pixel for pixel; only the label bands differ from the clips."""
    side = json.loads((lossless_run / "videos" / "progress.json").read_text())
    assert side["encoder"]["lossless"] is True
    video = _decode(lossless_run / PROGRESS_VIDEO)
    clips = [_decode(lossless_run / t["clip"]) for t in side["tiles"]]
    assert len(clips) == 5  # one tile per evaluation
    assert len({c.shape[0] for c in clips}) > 1  # clips of several lengths: tiles hold
    assert video.shape[0] == side["frames"] == max(c.shape[0] for c in clips)
    steps = [t["step"] for t in side["tiles"]]
    assert steps == sorted(steps) and len(set(steps)) == 5 and steps[0] == 0
    for tile, clip in zip(side["tiles"], clips):
        y, x, h, w = tile["y"], tile["x"], tile["h"], tile["w"]
        assert clip.shape[1:3] == (h, w)
        for t in range(video.shape[0]):
            expected = clip[min(t, clip.shape[0] - 1)]
            assert np.array_equal(video[t, y : y + h, x : x + w], expected), (tile, t)
        # the label band above the tile is not the clip's
        assert video[0, y - BAND : y, x : x + w].any()
    first = read_run(lossless_run).evaluations[0]  # its label: the step, return and success
    envs = first.sidecar["envs"]
    verdict = "ok" if envs[0]["success"] else "fail"
    assert first.tile_label() == [f"step {first.step}", f"R {envs[0]['return']:.2f} {verdict}"]


def test_max_tiles_takes_an_even_subset_and_no_clip_no_video(lossless_run, tmp_path):
    run_dir = _copy(lossless_run, tmp_path)
    run = read_run(run_dir)
    tiles = json.loads(write_progress(run, max_tiles=2).with_suffix(".json").read_text())["tiles"]
    assert [t["step"] for t in tiles] == [run.evaluations[0].step, run.evaluations[-1].step]
    # a grid of the two tiles: one row, side by side
    assert [(t["y"], t["x"]) for t in tiles] == [(BAND, 0), (BAND, tiles[0]["w"])]
    shutil.rmtree(run_dir / "videos")
    assert write_progress(read_run(run_dir)) is None
    page = write_run_report(run_dir).read_text()
    assert "No progress video" in page
    assert page.count("clip missing") == 5  # each eval line names a clip that is gone


# --------------------------------------------------------------------------- the page


def test_run_writes_its_report(lossless_run):
    page = RunDir(lossless_run).report.read_text()
    run = read_run(lossless_run)
    # the progress video and every eval clip are played inline, by relative path, then again
    # the clip of each failed episode that has one (the recorded env's), in the failures table
    sources = re.findall(r'<video [^>]*src="([^"]+)"', page)
    assert sources[0] == PROGRESS_VIDEO
    failed = [ep["clip"] for ep in run.episodes if ep.get("success") is False and ep.get("clip")]
    assert sources[1:] == [ev.clip for ev in run.evaluations] + failed
    assert all(not s.startswith(("/", "http", "file:")) for s in sources)
    assert page.count("<svg") == 1 and "eval/return" in page  # the curves, inline
    assert 'http-equiv="Content-Security-Policy"' in page and "<script" not in page
    # the user's overrides come before the whole config
    assert page.index("eval_env.recorder.lossless=true") < page.index("The whole config")
    assert '<span class="ok" data-health="clips_dropped">0<' in page


def test_an_older_or_damaged_run_dir_still_gets_its_page(lossless_run, tmp_path):
    """No eval_episodes.jsonl (an older run), a clip ffmpeg cannot read (its sidecar still there):
    the page says both, its curves drawn."""
    run_dir = _copy(lossless_run, tmp_path)
    (run_dir / "eval_episodes.jsonl").unlink()
    (run_dir / read_run(run_dir).evaluations[0].clip).write_bytes(b"not an mp4")
    page = write_run_report(run_dir).read_text()
    assert "wrote no per-episode eval records" in page and page.count("<svg") == 1
    assert "The progress video could not be written" in page


def test_failed_episodes_with_seed_clip_and_replay_command(lossless_run, tmp_path):
    run_dir = _copy(lossless_run, tmp_path)
    run = read_run(run_dir)
    ev = run.evaluations[1]
    lines = [
        {"step": ev.step, "iteration": 2, "env": 0, "episode": 2, "seed": 1000000,
         "return": 1.5, "length": 100, "success": False, "ended": "truncated",
         "clip": ev.clip, "frames": [0, 99]},
        {"step": ev.step, "iteration": 2, "env": 1, "episode": 2, "seed": 1000001,
         "return": 9.0, "length": 30, "success": True, "ended": "terminated",
         "clip": None, "frames": None},
        {"step": 99999, "iteration": 77, "env": 1, "episode": 9, "seed": 1000001,
         "return": 0.5, "length": 100, "success": False, "ended": "truncated",
         "clip": None, "frames": None},
    ]  # fmt: skip
    (run_dir / "eval_episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = write_run_report(run_dir).read_text()
    failures = page[page.index('id="failures"') : page.index('id="config"')]
    assert "2 of 3 eval episodes failed" in failures
    assert "1000000" in failures and "1000001" in failures
    assert f'src="{ev.clip}"' in failures and "frames 0&ndash;99" in failures
    assert (run_dir / "checkpoints" / "iter_000002.pt").is_file()
    # run in the run dir, so that the page's commands hold wherever the dir is moved
    replay = f"python -m rlrec.run.replay . replay.step={ev.step} replay.env=0"
    assert replay in failures and "replay (in the run dir)" in failures
    assert str(run_dir.resolve()) not in failures
    assert "no checkpoint of its step kept" in failures  # iteration 77 has none
    assert failures.count("<tr>") == 3  # the header and the two failed episodes


def test_health_counts_drops_stops_and_resumes(lossless_run, tmp_path):
    """Each process counts its recording losses from 0: the row adds each process's part (its
    lines up to a resume, with what that resume moved to superseded/), and counts the eval clips
    named but missing and those lost before they were written, which read as lost."""
    run_dir = _copy(lossless_run, tmp_path)
    moved = run_dir / "superseded" / "1-step000000256"
    moved.mkdir(parents=True)
    (moved / "metrics.jsonl").write_text(
        json.dumps({"step": 384, "record/clips_dropped": 4, "record/frames_dropped": 9}) + "\n"
    )  # the first process, after its checkpoint: it dropped 4 clips in all
    extra = [
        {"step": 256, "record/clips_dropped": 1, "record/frames_dropped": 7},
        {"step": 256, "event": "stop", "signal": "SIGTERM"},
        {"step": 256, "event": "resume", "from": "checkpoints/last.pt",
         "moved": "superseded/1-step000000256"},
        {"step": 512, "record/clips_dropped": 2, "record/encoder_stalls": 1},
        {"step": 512, "eval/return": 1.0, "eval/length": 10, "eval/clip": None,
         "eval/clip_lost": True},
    ]  # fmt: skip
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in extra))
    page = write_run_report(run_dir).read_text()
    health = page[page.index('id="health"') : page.index('id="progress"')]

    def count(key: str) -> str:
        return re.search(rf'data-health="{key}">(\d+)<', health)[1]

    assert count("clips_dropped") == "6"  # the first process's 4, the resumed one's 2
    assert count("frames_dropped") == "9"
    assert count("encoder_stalls") == "1"
    assert count("stops") == "1"
    assert count("resumes") == "1"
    assert count("clips_missing") == "1"  # the lost one
    assert "SIGTERM" in health
    evaluations = page[page.index('id="evaluations"') : page.index('id="failures"')]
    assert evaluations.count("clip lost") == 1 and "clip_lost" not in evaluations


# --------------------------------------------------------------------------- curves, figures


def test_tick_labels_and_the_wilson_interval():
    """Each label is its tick's value (as many decimals as the step), on the ranges of the issue;
    the Wilson interval's known values."""
    for ticks, labels in (
        ([2.82, 2.825, 2.83, 2.835, 2.84], "2.820 2.825 2.830 2.835 2.840"),
        ([2.8395 + 0.0005 * k for k in range(6)], "2.8395 2.8400 2.8405 2.8410 2.8415 2.8420"),
        ([0, 2.5e5, 5e5, 7.5e5], "0 250,000 500,000 750,000"),
        ([-0.2, 0.0, 0.2], "-0.2 0.0 0.2"),
    ):
        assert " ".join(tick_labels(ticks)) == labels
    known = [(9, 10, 0.5958, 0.9821), (0, 10, 0.0, 0.2775), (900, 1000, 0.8798, 0.9171)]
    for k, n, lo, hi in [*known, (10, 10, 0.7225, 1.0)]:
        assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-4)


def _panels(svg: str) -> list:
    """Each panel of a curves SVG: its frame (x0, y0, x1, y1), its axes' (position, label)s, its
    curves' points and its legend box (x, y, w, h) or None."""
    out = []
    for part in svg.split('font-size="13">')[1:]:
        frame = [
            float(v) for v in re.search(r'd="M([\d.]+) ([\d.]+)H([\d.]+)V([\d.]+)', part).groups()
        ]
        xs = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle">([^<]+)<', part)
        ys = re.findall(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="end">([^<]+)<', part)
        points = re.findall(r'cx="([\d.]+)" cy="([\d.]+)"', part)
        for line in re.findall(
            r'<path d="M([^"]+)" fill="none" stroke="#\w+" stroke-width="1.6"', part
        ):
            points += [p.split() for p in line.split("L")]
        box = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', part)
        points = [(float(x), float(y)) for x, y in points]
        out.append((frame, xs, ys, points, box and [float(v) for v in box.groups()]))
    return out


def test_short_run_axes_legends_and_success_interval(short_run):
    """Through train.py, a run of one training point: every axis's labels are distinct and true
    (their values in proportion to their positions); each legend lies below its plot area and
    covers no point; the page and the console's last line give the eval success with its Wilson
    interval and episode count."""
    run_dir, stdout = short_run
    page = RunDir(run_dir).report.read_text()
    panels = _panels(re.search(r"<svg.*?</svg>", page, re.S)[0])
    assert len(panels) >= 6 and sum(box is not None for *_, box in panels) >= 4
    for frame, xs, ys, points, box in panels:
        for axis in (xs, ys):
            values = [float(label.replace(",", "")) for _, label in axis]
            assert len(set(values)) == len(values) >= 2, axis
            pos = [float(p) for p, _ in axis]
            per_px = (values[-1] - values[0]) / (pos[-1] - pos[0])
            for p, v in zip(pos, values):  # a label off by half a step fails
                assert v == pytest.approx(values[0] + (p - pos[0]) * per_px, abs=abs(per_px))
        if box is not None:
            x, y, w, h = box
            assert y > frame[3]  # below the plot area
            assert not any(x <= px <= x + w and y <= py <= y + h for px, py in points)
    last = [r for r in read_metrics(run_dir) if "eval/success" in r][-1]
    n, rate = last["eval/episodes"], last["eval/success"]
    lo, hi = wilson(round(rate * n), n)
    figure = f"success {rate:.3f} [{lo:.3f}, {hi:.3f}] of {n} episodes"
    done = [line for line in stdout.splitlines() if line.startswith("rlrec: done in")]
    assert figure in done[0] and figure in page


def test_a_moved_run_dir_names_no_old_path(short_run, tmp_path):
    """The page a run wrote, opened where the run dir was moved to, and the page the command
    writes there, name no absolute path: the summary links to its own folder."""
    run_dir, _ = short_run
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)  # (the run's dir stays: the session's other tests read it)
    for page in (RunDir(moved).report.read_text(), _command_report(moved)):
        assert str(run_dir.resolve()) not in page and str(moved.resolve()) not in page
        assert re.search(r"<p>128 env steps .*<a href=\"./\">the run dir</a></p>", page)


def _command_report(run_dir: Path) -> str:
    proc = _report(run_dir)
    assert proc.returncode == 0, proc.stderr
    return (run_dir / "report.html").read_text()


def test_sweep_report_rows_clips_and_the_jobs_that_differ_only_by_seed(tmp_path):
    """Through train.py -m seed=1,2 and the command: a row, a report and the last eval clip of
    each job beside its return curves (that panel alone); the two jobs make one group, with the
    mean and range of their last eval returns, the success of all their episodes with its
    interval, and their eval return curves on one panel, one curve a seed."""
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=1,2", *FAST, "total_steps=256", "recorder=none", f"hydra.sweep.dir={sweep}"]
    run_train(args, cwd=tmp_path)
    page = _command_report(sweep)
    rows = read_rows(sweep)
    for job in ("0", "1"):
        last = read_run(sweep / job).evaluations[-1].clip
        assert f'src="{job}/{last}"' in page and f'href="{job}/report.html"' in page
        assert RunDir(sweep / job).report.is_file() and f"seed={int(job) + 1}" in page
    clips = page[page.index('id="clips"') :]
    assert clips.count("<svg") == 2 and clips.count(">return</text>") == 2
    assert "steps per second" not in page
    group = page[page.index('id="seeds"') : page.index('id="clips"')]
    returns = [r["eval/return"] for r in rows]
    assert len(rows) == 2 and group.count("<tr>") == 2  # its header and the one group
    mean = f"{sum(returns) / 2:.4g} [{min(returns):.4g}, {max(returns):.4g}]"
    assert f"<td>1 2</td><td>{mean}</td>" in group
    n = sum(r["eval/episodes"] for r in rows)
    k = sum(round(r["eval/success"] * r["eval/episodes"]) for r in rows)
    lo, hi = wilson(k, n)
    assert f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] of {n} episodes" in group
    ((frame, _, _, points, box),) = _panels(group)
    assert ">seed=1<" in group and ">seed=2<" in group and box is not None
    evals = sum(len([x for x in read_metrics(r["run_dir"]) if "eval/return" in x]) for r in rows)
    assert group.count("<circle") == evals  # each seed's every evaluation


# --------------------------------------------------------------------------- entry points


def test_command_writes_with_the_runs_own_settings_and_overrides(lossless_run, tmp_path):
    """``python -m rlrec.report RUN`` prints the page's path and writes with the run's own
    report.* (its .hydra/config.yaml) under report.KEY=VALUE overrides; a bad override, or a dir
    that is no run dir, is refused in one line before anything is written."""
    import yaml

    run_dir = _copy(lossless_run, tmp_path)
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    config["report"]["max_tiles"] = 2
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))

    def tiles(*overrides):
        (run_dir / PROGRESS_VIDEO).unlink(missing_ok=True)
        proc = _report(run_dir, *overrides)
        assert proc.returncode == 0 and proc.stdout.strip() == str(RunDir(run_dir).report.resolve())
        return len(json.loads((run_dir / "videos" / "progress.json").read_text())["tiles"])

    assert tiles() == 2 and tiles("report.max_tiles=3") == 3
    assert tiles("report.progress_video=false", "report.max_tiles=4") == 3  # the last one's
    before = RunDir(run_dir).report.read_bytes()
    for bad, words in (
        ("report.max_tile=3", "max_tiles, max_failures"),
        ("report.max_tiles=many", "must be an integer"),
        ("report.max_failures=0", "report.max_failures"),
    ):
        proc = _report(run_dir, bad)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert RunDir(run_dir).report.read_bytes() == before
    proc = _report(tmp_path)
    assert proc.returncode == 2 and "is not a run dir" in proc.stderr
    assert not RunDir(tmp_path).report.exists()


def test_end_of_run_writes_and_prints_or_says_why_not(lossless_run, tmp_path, capsys):
    from rlrec.report import write_at_end

    run_dir = _copy(lossless_run, tmp_path)
    RunDir(run_dir).report.unlink()
    assert write_at_end(run_dir, ReportConfig(enabled=False)) is None
    assert not RunDir(run_dir).report.exists() and capsys.readouterr().out == ""
    path = write_at_end(run_dir, ReportConfig(progress_video=False))
    assert re.fullmatch(
        rf"rlrec: report {path.resolve()} \(written in [\d.]+ s\)\n", capsys.readouterr().out
    )
    # a report that fails does not fail the run: it says so
    assert write_at_end(tmp_path / "gone", ReportConfig()) is None
    assert "the report failed" in capsys.readouterr().err


@pytest.mark.slow
def test_a_stopped_run_writes_its_report_marked_stopped_until_resumed(tmp_path):
    """A run stopped by a signal writes its report as it ends, which says it was stopped and how
    to continue; the report of the resumed run that ends says no more."""
    run_dir = tmp_path / "run"
    args = [*FAST, "report.enabled=true", "recorder=none", f"hydra.run.dir={run_dir}"]
    proc = start_train([*args, "total_steps=100000000", "checkpoint_every=100000"], tmp_path)
    wait_for(lambda: any(m.get("train/lr") for m in read_jsonl(RunDir(run_dir).metrics)), proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out
    assert f"rlrec: report {RunDir(run_dir).report.resolve()} (written in" in out, out
    (stop,) = [m for m in read_jsonl(RunDir(run_dir).metrics) if m.get("event") == "stop"]
    page = RunDir(run_dir).report.read_text()
    assert f'data-stopped="{stop["step"]}">Stopped by SIGTERM at step {stop["step"]:,}' in page
    assert "<code>resume=auto</code>" in page

    run_train([*args, f"total_steps={stop['step'] + 256}", "resume=auto"], cwd=tmp_path)
    page = RunDir(run_dir).report.read_text()
    assert "data-stopped" not in page and '<span class="bad" data-health="stops">1<' in page
