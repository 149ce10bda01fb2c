"""``train.py``'s main (``rlrec.run.cli.main``) in this process: a config error that only the runner
sees (``checkpoint=`` a file that is no checkpoint) removes what this run created, and nothing
else; ``--help`` lists the user's config groups."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

import rlrec.run.cli
from tests.helpers import FAST


def _tree(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _main(args: List[str], cwd: Path, monkeypatch, capsys):
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as exc:
        rlrec.run.cli.main()
    out = capsys.readouterr()
    return exc.value.code, out.out + out.err


def _mine(root: Path) -> str:
    """A dir holding only the user's notes.log (and so, to an old check, nothing but logs)."""
    (root / "mine").mkdir()
    (root / "mine" / "notes.log").write_text("my notes")
    return "hydra.run.dir=mine"


def _earlier(root: Path) -> str:
    """A run dir from an earlier run that wrote only its .hydra/ and train.log (it failed)."""
    (root / "old" / ".hydra").mkdir(parents=True)
    (root / "old" / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    (root / "old" / "train.log").write_text("the earlier run's log\n")
    return "hydra.run.dir=old"


def _here(root: Path) -> str:
    """hydra.run.dir=. is the working dir itself: never removed, only Hydra's files go."""
    (root / "notes.log").write_text("my notes")
    (root / "empty").mkdir()
    return "hydra.run.dir=."


def _outputs(root: Path) -> str:
    """Hydra's default run dir, outputs/DATE/TIME_ID, in an outputs/ that was there before."""
    (root / "outputs").mkdir()
    return "seed=1"


HYDRA = [".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"]


@pytest.mark.parametrize(
    "setup, left",
    [
        (_mine, ["mine", "mine/notes.log"]),  # Hydra's .hydra/ and train.log went
        (_earlier, ["old", *(f"old/{p}" for p in HYDRA), "old/train.log"]),
        (_here, ["empty", "notes.log"]),
        # the run dir Hydra made for the failing run (outputs/DATE/TIME_ID) goes, with the
        # parents this run made; a parent that existed before stays
        (lambda root: "hydra.run.dir=a/b/c", []),
        (lambda root: "seed=1", []),
        (_outputs, ["outputs"]),
    ],
    ids=["users-log", "earlier-run", "working-dir", "fresh-parents", "default", "outputs-kept"],
)
def test_config_error_removes_what_the_run_created_and_nothing_else(
    tmp_path, tmp_path_factory, monkeypatch, capsys, setup, left
):
    """``checkpoint=`` a file that is there (refuse_before_work passes it) and holds no
    checkpoint, outside the test's own tmp_path."""
    typo = tmp_path_factory.mktemp("damaged") / "last.pt"
    typo.write_bytes(b"not a checkpoint")
    before = {p: p.read_text() for p in tmp_path.rglob("*.log")}
    code, out = _main([*FAST, setup(tmp_path), f"checkpoint={typo}"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "checkpoint=" in out, out
    assert _tree(tmp_path) == left
    assert all(p.read_text().startswith(text) for p, text in before.items())


def test_help_lists_the_users_config_groups_only(tmp_path, monkeypatch, capsys):
    """``--help`` names the groups a user chooses from, not the ``schema/`` groups that type them
    (rlrec.config.register_configs), nor Hydra's own (under --hydra-help)."""
    code, out = _main(["--help"], tmp_path, monkeypatch, capsys)
    assert code in (0, None), out
    groups = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "env: builtin, genesis, gymnasium, maniskill" in groups, out
    assert "experiment: " in groups and "sim: cpu, gpu" in groups, out
    assert "schema" not in groups and "hydra/" not in groups, groups
    assert _tree(tmp_path) == []
