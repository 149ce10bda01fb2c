"""scripts/metrics_tail.py, shared by the benchmarks that time ``train.py`` from outside: the run
folders they make are removed at exit (those alone), and a run's metrics are read line by line
while it writes them."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from metrics_tail import MetricsTail, RunDirs  # noqa: E402


def test_remove_deletes_the_folders_it_made_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    other = tmp_path / "bench_x_not_mine"  # the same prefix, made by someone else
    other.mkdir()
    runs = RunDirs()
    made = [runs.new("bench_x_"), runs.new("bench_x_")]
    for d in made:
        assert d.parent == tmp_path and d.is_dir()
        (d / "videos").mkdir()
        (d / "videos" / "clip.mp4").write_bytes(b"0")
    runs.remove()
    assert not any(d.exists() for d in made)
    assert other.is_dir()
    runs.remove()  # nothing left to remove: a no-op


def test_keep_runs_keeps_them_and_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    runs = RunDirs()
    runs.keep = True
    made = runs.new("bench_y_")
    runs.remove()
    assert made.is_dir()
    assert str(made) in capsys.readouterr().out


def test_metrics_tail_returns_complete_lines_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path, time.time())
    assert tail.read() == []  # not written yet
    with open(path, "w") as f:
        f.write(json.dumps({"step": 1}) + "\n" + '{"step": 2')  # the second line half written
        f.flush()
        assert [rec for _, rec in tail.read()] == [{"step": 1}]
        f.write("}\n")
        f.flush()
        got = tail.read()
    assert [rec for _, rec in got] == [{"step": 2}]
    assert all(t >= 0 for t, _ in got)
    assert tail.read() == []
