"""One owner of the run dir's layout (docs/architecture.md): the names that ``rlrec/layout.py``
spells are spelled nowhere else in rlrec, and they are the names on disk (this file spells them:
the oracle of the format)."""

from __future__ import annotations

import ast
from pathlib import Path

from rlrec.layout import PROGRESS_VIDEO, RunDir, SweepDir, periodic_iteration

PACKAGE = Path(__file__).resolve().parent.parent / "rlrec"
LAYOUT = PACKAGE / "layout.py"


def _strings(tree: ast.AST, skip: set) -> list:
    """The string constants of ``tree`` outside docstrings and the nodes of ``skip``."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring (or a bare expression: none is a path)
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def _names() -> set:
    """The layout's names: its string literals (not an f-string's parts: ``replay/step``)."""
    tree = ast.parse(LAYOUT.read_text())
    parts = {id(v) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for v in f.values}
    return {n.value for n in _strings(tree, parts)}


def _choice_values(tree: ast.AST) -> set:
    """The values of Enum members (``LoggerName.tensorboard = "tensorboard"``): names of a
    choice, not paths."""
    return {
        id(stmt.value)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        and any(getattr(b, "id", "").endswith(("Choice", "Enum")) for b in cls.bases)
        for stmt in cls.body
        if isinstance(stmt, ast.Assign)
    }


def test_no_layout_name_outside_the_layout_module():
    """Fails naming file:line of a layout name spelled outside rlrec/layout.py (an f-string's
    literal part counts: ``f"iter_{n:06d}.pt"``)."""
    names, found = _names(), []
    assert {"metrics.jsonl", "checkpoints", "iter_", "summary.csv", "lock"} <= names
    assert "replay" not in names and "step" not in names  # parts of f-strings
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == LAYOUT:
            continue
        tree = ast.parse(path.read_text())
        for node in _strings(tree, _choice_values(tree)):
            if node.value in names:
                found.append((str(path.relative_to(PACKAGE.parent)), node.lineno, node.value))
    lines = [f"{file}:{line}: {name!r}" for file, line, name in sorted(found)]
    assert not lines, "run-dir names outside rlrec/layout.py:\n" + "\n".join(lines)


def test_the_names_on_disk(tmp_path):
    run, sweep = RunDir(str(tmp_path)), SweepDir(tmp_path)
    assert run.progress_video == tmp_path / PROGRESS_VIDEO
    names = {
        "metrics.jsonl": run.metrics,
        "eval_episodes.jsonl": run.eval_episodes,
        "checkpoints/last.pt": run.last_checkpoint,
        "checkpoints/iter_000042.pt": run.periodic_checkpoint(42),
        "videos/eval": run.videos("eval"),
        "videos/progress.mp4": run.progress_video,
        "tensorboard": run.tensorboard,
        "report.html": run.report,
        ".hydra/config.yaml": run.hydra_config,
        ".hydra/overrides.yaml": run.hydra_overrides,
        ".rlrec.lock": run.lock,
        "replay/step000000500-env003": run.replay(500, 3),
        "summary.csv": sweep.summary,
        ".rlrec_summary/000007.json": sweep.row(7),
        ".rlrec_summary/running/000007.json": sweep.running_entry(7),
        ".rlrec_summary/attempt.json": sweep.attempt,
        ".rlrec_summary/stop.json": sweep.stop,
        ".rlrec_summary/lock": sweep.rows_lock,
    }
    assert names == {n: tmp_path / n for n in names}
    assert sweep.report == run.report and not sweep.is_sweep()
    sweep.rows.mkdir()
    assert sweep.is_sweep()
    assert periodic_iteration(run.periodic_checkpoint(1234567).name) == 1234567
    for name in ("last.pt", "iter_12.pt.part", ".iter_000001.pt.99-0.part", "iter_x.pt"):
        assert periodic_iteration(name) is None
