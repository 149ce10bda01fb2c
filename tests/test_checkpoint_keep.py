"""``checkpoint_keep``: a long run keeps the newest N periodic checkpoints of its own, removed only
once the new one is durable; never last.pt, never the newest, never another run's. A kill between
any write, rename and removal leaves ``resume=auto`` a complete checkpoint, and the resumed run
ends equal to the uninterrupted one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlrec.checks import ConfigError
from rlrec.config import validate
from rlrec.train import checkpoint as ckpt
from rlrec.train.runner import Runner
from tests.helpers import FAST, REPO, make_config, run_train

QUIET = [*FAST, "recorder=none", "eval_env.recorder.enabled=false"]
BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps


def _run(run_dir: Path, overrides) -> None:
    run_dir.mkdir(exist_ok=True)
    Runner(make_config([*QUIET, *overrides]), run_dir).run()


def _files(run_dir: Path):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _iters(*ks):
    return [f"iter_{k:06d}.pt" for k in ks]


def test_default_keeps_every_periodic_checkpoint_and_keep_2_the_newest_two(tmp_path):
    _run(tmp_path / "all", [f"total_steps={6 * BATCH}", "checkpoint_every=1"])
    assert _files(tmp_path / "all") == [*_iters(1, 2, 3, 4, 5, 6), "last.pt"]

    run_dir = tmp_path / "two"
    _run(run_dir, [f"total_steps={6 * BATCH}", "checkpoint_every=1", "checkpoint_keep=2"])
    assert _files(run_dir) == [*_iters(5, 6), "last.pt"]
    last = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert last["periodic"] == _iters(5, 6) and last["global_step"] == 6 * BATCH
    for name in _iters(5, 6):  # the kept ones are complete
        assert ckpt.load(run_dir / "checkpoints" / name)["global_step"] > 0


def test_a_resumed_run_removes_its_own_older_checkpoints_and_never_another_runs(tmp_path):
    run_dir = tmp_path / "run"
    _run(run_dir, [f"total_steps={4 * BATCH}", "checkpoint_every=1"])  # keeps all: 1..4
    _run(run_dir, ["resume=auto", f"total_steps={6 * BATCH}", "checkpoint_every=1",
                   "checkpoint_keep=2"])  # fmt: skip
    assert _files(run_dir) == [*_iters(5, 6), "last.pt"]  # its own 1..4 are gone

    # a new run in another run's dir, from that run's checkpoint of iteration 2: it removes the
    # checkpoints it wrote (3, overwritten, and 4), never the other run's (1, 2)
    other = tmp_path / "other"
    _run(other, [f"total_steps={2 * BATCH}", "checkpoint_every=1"])
    start = other / "checkpoints" / "iter_000002.pt"
    _run(other, [f"checkpoint={start}", f"total_steps={6 * BATCH}", "checkpoint_every=1",
                 "checkpoint_keep=2"])  # fmt: skip
    assert _files(other) == [*_iters(1, 2, 5, 6), "last.pt"]


@pytest.mark.parametrize("keep", [1, -1])
def test_a_setting_that_keeps_a_single_copy_is_refused_naming_the_key(keep):
    with pytest.raises(ConfigError, match=rf"checkpoint_keep={keep} is invalid: allowed values"):
        validate(make_config([f"checkpoint_keep={keep}"]))
    validate(make_config(["checkpoint_keep=2"]))


# ---------------------------------------------------------------------- kills
# train.py's main, killed (SIGKILL) right before or right after one file operation of the
# checkpoint writer: the rename of a checkpoint's temporary into place (os.replace), or the
# removal of an older periodic checkpoint (os.remove).
#   driver.py OP NAME COUNT WHEN overrides...   OP: replace | remove, NAME: the file's name,
#   COUNT: its COUNT-th such operation, WHEN: before | after
_DRIVER = """
import os
import signal
import sys

op, name, count, when = sys.argv[1:5]
sys.argv = [sys.argv[0], *sys.argv[5:]]
seen = [0]


def hook(real, target_of):
    def wrapped(*args, **kwargs):
        hit = os.path.basename(str(target_of(args))) == name
        if hit:
            seen[0] += 1
            hit = seen[0] == int(count)
        if hit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if hit and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    return wrapped


if op == "replace":
    os.replace = hook(os.replace, lambda a: a[1])
else:
    os.remove = hook(os.remove, lambda a: a[0])
from rlrec.run.cli import main  # noqa: E402

main()
"""

TOTAL = 6 * BATCH
KEEP = [*QUIET, f"total_steps={TOTAL}", "checkpoint_every=1", "checkpoint_keep=2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("keep_uninterrupted") / "run"
    run_train([*KEEP, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "op, name, count, when",
    [
        ("replace", "last.pt", 4, "before"),  # iteration 4's last.pt: written, not renamed
        ("replace", "last.pt", 4, "after"),  # renamed; iter_000004.pt not written yet
        ("replace", "iter_000004.pt", 1, "before"),  # written, not renamed
        ("replace", "iter_000004.pt", 1, "after"),  # durable; iter_000002.pt not removed yet
        ("remove", "iter_000002.pt", 1, "after"),  # removed
    ],
    ids=[
        "before-last-rename",
        "after-last-rename",
        "before-iter-rename",
        "before-removal",
        "after-removal",
    ],  # fmt: skip
)
def test_a_kill_around_each_write_rename_and_removal_resumes_to_the_same_run(
    tmp_path, uninterrupted, op, name, count, when
):
    from tests.test_fault_tolerance import _differences, _temporaries

    run_dir = tmp_path / "run"
    args = [*KEEP, f"hydra.run.dir={run_dir}"]
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    killed = subprocess.run(
        [sys.executable, str(driver), op, name, str(count), when, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr
    # resume=auto finds a complete checkpoint: iteration 3's, or 4's once a copy of it is durable
    found = ckpt.find_resume(run_dir / "checkpoints")
    assert found is not None
    durable = (name, when) != ("last.pt", "before")
    assert found[1]["global_step"] == (4 if durable else 3) * BATCH, found[0]

    run_train([*args, "resume=auto"], cwd=tmp_path)
    ref = ckpt.load(uninterrupted / "checkpoints" / "last.pt")
    ours = ckpt.load(run_dir / "checkpoints" / "last.pt")
    diffs = []
    for key in ("global_step", "iteration", "ppo", "rng", "next_obs", "periodic"):
        diffs += _differences(ref[key], ours[key], key)
    for stack in ("train_env", "eval_env"):
        for role in ("adapter", "autoreset"):
            diffs += _differences(ref[stack][role], ours[stack][role], f"{stack}.{role}")
    assert not diffs, diffs
    # the same checkpoints as the uninterrupted run: nothing lost, nothing left behind
    assert _files(run_dir) == _files(uninterrupted) == [*_iters(5, 6), "last.pt"]
    assert _temporaries(run_dir) == []
