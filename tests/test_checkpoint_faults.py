"""Checkpoints at the edges, through the runner on the built-in env: a file that would run code
is refused on every load path (and never runs), a damaged checkpoint is detected and skipped, a
run dir whose checkpoints are all unusable is not restarted from step 0, and a full disk while
writing a checkpoint loses nothing and says how to resume."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.train import checkpoint as ckpt
from tests.helpers import FAST
from tests.test_checkpoint import _payload_file, flip_tensor_bytes
from tests.trainutil import runner as _runner
from tests.trainutil import steps


def _files(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_run_checkpoint_loads_as_plain_data(tmp_path):
    """Every state that goes in (PPO, optimizer, obs normaliser, RNG streams, each env stack
    role, the built-in env's generator, the recorders, the config) loads with
    weights_only=True."""
    run_dir = tmp_path / "run"
    _runner(run_dir, ["total_steps=256"], base=FAST).run()  # both recorders: their states too
    data = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert {"agent", "optimizer", "obs_norm"} <= set(data["ppo"])
    for stack in ("train_env", "eval_env"):
        assert set(data[stack]) == {"adapter", "recorder", "autoreset"}
        assert data[stack]["recorder"] is not None
        assert isinstance(data[stack]["adapter"]["rng"], torch.Tensor)
    assert isinstance(data["rng"]["numpy"]["key"], torch.Tensor)
    assert data["config"]["env"]["name"] == "builtin"


# where each load path finds the payload, and the key its refusal must name
_PATHS = {
    "checkpoint": (["checkpoint={evil}"], "evil.pt", "checkpoint="),
    "eval_only": (["eval_only=true", "checkpoint={evil}"], "evil.pt", "checkpoint="),
    "resume_periodic": (["resume=auto"], "run/checkpoints/iter_000003.pt", "resume=auto"),
    "resume_last": (["resume=auto"], "run/checkpoints/last.pt", "resume=auto"),
}
_PATHS["eval_only_resume"] = (["eval_only=true", "resume=auto"], *_PATHS["resume_periodic"][1:])


@pytest.mark.parametrize("kind", ["torch", "pickle"])
@pytest.mark.parametrize("where", sorted(_PATHS))
def test_a_checkpoint_that_would_run_code_is_refused_on_every_path(tmp_path, where, kind):
    overrides, rel, key = _PATHS[where]
    evil, marker = tmp_path / rel, tmp_path / "pwned"
    evil.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run").mkdir(exist_ok=True)
    _payload_file(evil, marker, kind)
    before = _files(tmp_path)
    with pytest.raises(ConfigError) as e:
        try:
            _runner(tmp_path / "run", [o.format(evil=evil) for o in overrides])
        finally:  # checked first, whatever happened
            assert not marker.exists(), "loading the checkpoint ran its payload"
    assert isinstance(e.value, ckpt.UnsafeCheckpoint)
    assert key in str(e.value) and str(evil) in str(e.value)
    assert "would run code" in str(e.value)
    assert _files(tmp_path) == before


def test_a_damaged_last_pt_falls_back_to_the_newest_good_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _runner(run_dir, ["total_steps=512", "checkpoint_every=3"]).run()  # iter_000003, last (4)
    last = run_dir / "checkpoints" / "last.pt"
    flip_tensor_bytes(last)
    torch.load(last, weights_only=True)  # still readable: only the digest tells
    capsys.readouterr()

    with pytest.raises(ConfigError) as e:
        _runner(tmp_path / "other", [f"checkpoint={last}", "total_steps=768"])
    assert f"checkpoint={last} is damaged" in str(e.value)

    _runner(run_dir, ["resume=auto", "total_steps=768"]).run()
    err = capsys.readouterr().err
    assert f"warning: resume=auto: {last} is damaged" in err, err
    assert f"resuming from {run_dir / 'checkpoints' / 'iter_000003.pt'}" in err
    # continued from iteration 3: the line of iteration 4 (after that checkpoint) was moved
    # aside, and the resumed run wrote it again
    assert steps(run_dir, "loss/policy") == [128, 256, 384, 512, 640, 768]
    moved = run_dir / "superseded" / "1-step000000384" / "metrics.jsonl"
    assert [json.loads(x)["step"] for x in moved.read_text().splitlines()] == [512, 512]
    assert ckpt.load(last)["global_step"] == 768


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_resume_auto_stops_when_every_checkpoint_is_unusable(tmp_path, damage):
    run_dir = tmp_path / "run"
    _runner(run_dir, ["total_steps=512", "checkpoint_every=2"]).run()
    files = sorted((run_dir / "checkpoints").glob("*.pt"))
    assert [p.name for p in files] == ["iter_000002.pt", "iter_000004.pt", "last.pt"]
    for p in files:
        if damage == "flipped":
            flip_tensor_bytes(p)
        else:  # what a torn copy leaves
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    before = _files(run_dir)
    with pytest.raises(ConfigError) as e:
        _runner(run_dir, ["resume=auto", "total_steps=1024"])
    msg = str(e.value)
    assert msg.startswith(f"resume=auto: no checkpoint in {run_dir / 'checkpoints'} can be used")
    for p in files:
        assert str(p) in msg, (p, msg)
    assert "duplicate steps" in msg
    # nothing was started: no duplicate steps, no file touched or added
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert _files(run_dir) == before


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted at ``tmp_path/run/checkpoints`` (needs root), unmounted after."""
    mount_point = tmp_path / "run" / "checkpoints"
    mount_point.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)]
    proc = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({proc.stderr.strip()}); the ENOSPC path is "
            "also tested through /dev/full in tests/test_checkpoint.py"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def _fill(directory: Path) -> Path:
    """Writes ``directory/filler`` until the file system is full."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: close() has nothing left to write
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(OSError):
        (directory / "probe").write_bytes(b"\0" * 8192)
    (directory / "probe").unlink()
    return filler


def test_a_full_disk_while_checkpointing_loses_nothing_and_says_how_to_resume(small_disk):
    run_dir = small_disk.parent
    _runner(run_dir, ["total_steps=256", "checkpoint_every=1"]).run()
    saved = {p.name: p.read_bytes() for p in small_disk.glob("*.pt")}
    assert sorted(saved) == ["iter_000001.pt", "iter_000002.pt", "last.pt"]
    filler = _fill(small_disk)

    resumed = ["resume=auto", "total_steps=512", "checkpoint_every=1"]
    with pytest.raises(ckpt.CheckpointWriteError) as e:
        _runner(run_dir, resumed).run()
    msg = str(e.value)
    assert f"could not write checkpoint {small_disk / 'last.pt'}" in msg
    assert "No space left on device (the disk is full)" in msg and "intact" in msg
    assert f"python train.py resume=auto hydra.run.dir={run_dir}" in msg
    # the older checkpoints are untouched and no temporary is left
    assert sorted(p.name for p in small_disk.iterdir()) == sorted([*saved, "filler"])
    assert {p.name: p.read_bytes() for p in small_disk.glob("*.pt")} == saved

    os.unlink(filler)  # space is freed: the run continues from its last checkpoint
    _runner(run_dir, resumed).run()
    assert ckpt.load(small_disk / "last.pt")["global_step"] == 512
