"""``train.py``'s main (``rlrec.run.cli.main``) in this process: a config error that only the runner
sees (``checkpoint=`` a file that is no checkpoint) removes what this run created, and nothing
else."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

import rlrec.run.cli
from tests.helpers import FAST


@pytest.fixture
def typo(tmp_path_factory) -> str:
    """``checkpoint=`` a file that is there (refuse_before_work passes it) and holds no checkpoint,
    outside the test's own tmp_path."""
    path = tmp_path_factory.mktemp("damaged") / "last.pt"
    path.write_bytes(b"not a checkpoint")
    return f"checkpoint={path}"


def _tree(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _main(args: List[str], cwd: Path, monkeypatch, capsys):
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["train.py", *FAST, *args])
    with pytest.raises(SystemExit) as exc:
        rlrec.run.cli.main()
    out = capsys.readouterr()
    return exc.value.code, out.out + out.err


def test_config_error_keeps_a_run_dir_that_holds_the_users_log(tmp_path, monkeypatch, capsys, typo):
    """hydra.run.dir=/some/dir holding only the user's notes.log (and so, to the old check,
    nothing but logs): the typo leaves it as it was."""
    work, mine = tmp_path / "work", tmp_path / "mine"
    work.mkdir()
    mine.mkdir()
    (mine / "notes.log").write_text("my notes")
    code, out = _main([f"hydra.run.dir={mine}", typo], work, monkeypatch, capsys)
    assert code == 2 and "checkpoint=" in out, out
    assert _tree(mine) == ["notes.log"]  # Hydra's .hydra/ and train.log went, the notes stay
    assert (mine / "notes.log").read_text() == "my notes"
    assert _tree(work) == []


def test_config_error_keeps_the_working_dir(tmp_path, monkeypatch, capsys, typo):
    """hydra.run.dir=. is the working dir itself: never removed, only Hydra's files go."""
    (tmp_path / "notes.log").write_text("my notes")
    (tmp_path / "empty").mkdir()
    code, out = _main(["hydra.run.dir=.", typo], tmp_path, monkeypatch, capsys)
    assert code == 2 and "checkpoint=" in out, out
    assert tmp_path.is_dir()
    assert _tree(tmp_path) == ["empty", "notes.log"]


def test_config_error_keeps_an_earlier_runs_logs_and_config(tmp_path, monkeypatch, capsys, typo):
    """A run dir from an earlier run that wrote only its .hydra/ and train.log (it failed, say):
    pointing a new run at it with a typo removes none of them."""
    work, old = tmp_path / "work", tmp_path / "old"
    work.mkdir()
    (old / ".hydra").mkdir(parents=True)
    (old / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    (old / "train.log").write_text("the earlier run's log\n")
    code, out = _main([f"hydra.run.dir={old}", typo], work, monkeypatch, capsys)
    assert code == 2, out
    assert _tree(old) == [
        ".hydra",
        ".hydra/config.yaml",
        ".hydra/hydra.yaml",
        ".hydra/overrides.yaml",
        "train.log",
    ]
    assert (old / "train.log").read_text().startswith("the earlier run's log\n")


def test_config_error_removes_the_fresh_run_dir_and_its_empty_parents(
    tmp_path, monkeypatch, capsys, typo
):
    """The run dir Hydra made for the failing run (outputs/DATE/TIME_ID) goes, with the parents
    this run made; a parent that existed before stays."""
    code, out = _main([typo], tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert _tree(tmp_path) == []
    (tmp_path / "outputs").mkdir()
    code, out = _main([typo], tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert _tree(tmp_path) == ["outputs"]
    code, out = _main([f"hydra.run.dir={tmp_path}/a/b/c", typo], tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert _tree(tmp_path) == ["outputs"]


def test_help_lists_the_users_config_groups_only(tmp_path, monkeypatch, capsys):
    """``--help`` names the groups a user chooses from, not the ``schema/`` groups that type them
    (rlrec.config.register_configs)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    with pytest.raises(SystemExit) as exc:
        rlrec.run.cli.main()
    out = capsys.readouterr().out
    assert exc.value.code in (0, None), out
    groups = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "env: builtin, genesis, gymnasium, maniskill" in groups, out
    assert "experiment: " in groups and "sim: cpu, gpu" in groups, out
    assert "schema" not in groups, groups
    assert "hydra/" not in groups, groups  # Hydra's own groups stay under --hydra-help
    assert _tree(tmp_path) == []
