"""scripts/benchlib.py, the benchmarks' harness: ``--write-docs`` replaces the text between a
script's markers and refuses a file without them before any work; the run folders it makes are
removed at exit (those alone); a run's metrics are read line by line while it writes them, and
it is stopped where asked."""

from __future__ import annotations

import importlib
import sys
import tempfile

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))

import benchlib as bl  # noqa: E402

DOCS = "# Benchmarks\n\n<!-- bench:bench_x -->\nold table\n<!-- /bench:bench_x -->\n\nafter\n"
SCRIPTS = sorted(p.stem for p in (REPO / "scripts").glob("bench_*.py") if p.stem != "bench_sb3_ppo")


def test_write_docs_replaces_the_text_between_the_markers_and_nothing_else(tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOCS.replace("bench_x", "bench_y") + DOCS)
    b = bl.Bench("scripts/bench_x.py", "doc")
    b.parser.add_argument("--rounds", type=int, default=1)
    b.args(["--write-docs", str(docs), "--rounds", "3"])
    b.table(["", "steps/s"], [["none", "1,000"], ["idle", "999"]])
    b.finish()
    text = docs.read_text()
    assert text.startswith(DOCS.replace("bench_x", "bench_y"))  # the other bench's text as it was
    assert "old table" in text and text.count("old table") == 1 and text.endswith("\n\nafter\n")
    block = text.split("<!-- bench:bench_x -->\n")[1].split("<!-- /bench:bench_x -->")[0]
    assert block.startswith("`python scripts/bench_x.py --rounds 3` (")  # no --write-docs
    table = ["|      | steps/s |", "| ---- | ------- |", "| none | 1,000   |", "| idle | 999     |"]
    assert block.splitlines()[2:] == table
    assert "| none | 1,000   |" in capsys.readouterr().out  # printed as written


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_refuses_a_docs_file_without_its_markers_before_any_work(
    script, tmp_path, monkeypatch, capsys
):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOCS)  # bench_x's markers only
    monkeypatch.setattr(sys, "argv", [script, "--write-docs", str(docs)])
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(script).main()
    assert exit.value.code == 2
    assert f"needs one <!-- bench:{script} --> and, after it, one" in capsys.readouterr().err
    assert docs.read_text() == DOCS and list(tmp_path.iterdir()) == [docs]


def test_run_dirs_removes_what_it_made_only_and_keep_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    other = tmp_path / "bench_x_not_mine"  # the same prefix, made by someone else
    other.mkdir()
    runs, kept = bl.RunDirs(), bl.RunDirs(keep=True)
    made = [runs.new("bench_x_"), runs.new("bench_x_")]
    (made[0] / "videos").mkdir()
    runs.remove()
    runs.remove()  # nothing left: a no-op
    assert other.is_dir() and not any(d.exists() for d in made)
    mine = kept.new("bench_y_")
    kept.remove()
    assert mine.is_dir() and str(mine) in capsys.readouterr().out
    kept.made.clear()  # left to tmp_path


def test_follow_stops_a_run_where_asked_and_keeps_its_lines(tmp_path):
    metrics = tmp_path / "m.jsonl"
    writer = (  # each line written in two parts, flushed apart: read whole, once
        "import sys, time\n"
        "with open(sys.argv[1], 'a', buffering=1) as f:\n"
        "    for i in range(1000):\n"
        "        f.write('{\"step\": '); f.flush(); time.sleep(0.01); f.write(f'{i}}}\\n')\n"
    )
    r = bl.follow(
        [sys.executable, "-c", writer, str(metrics)], metrics, lambda t, x: x["step"] == 5
    )
    steps = [x["step"] for _, x in r["lines"]]
    assert steps[:6] == list(range(6)) and len(steps) < 1000 and r["wall"] < 60
    with pytest.raises(RuntimeError, match="exited 3"):
        bl.follow([sys.executable, "-c", "raise SystemExit(3)"], metrics)
