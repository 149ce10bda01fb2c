"""``checkpoint_keep``: a long run keeps the newest N periodic checkpoints of its own, removed only
once the new one is durable; never last.pt, never the newest, never another run's. A kill between
any write, rename and removal leaves ``resume=auto`` a complete checkpoint, and the resumed run
ends equal to the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrec.train import checkpoint as ckpt
from tests.helpers import run_train
from tests.trainutil import BATCH, QUIET, drive, runner, same_state, temporaries


def _run(run_dir: Path, overrides) -> None:
    runner(run_dir, overrides).run()


def _files(run_dir: Path):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _iters(*ks):
    return [f"iter_{k:06d}.pt" for k in ks]


EVERY = ["checkpoint_every=1"]
KEEP = [*EVERY, "checkpoint_keep=2"]


def test_default_keeps_every_periodic_checkpoint_and_keep_2_the_newest_two(tmp_path):
    _run(tmp_path / "all", [f"total_steps={6 * BATCH}", *EVERY])
    assert _files(tmp_path / "all") == [*_iters(1, 2, 3, 4, 5, 6), "last.pt"]
    run_dir = tmp_path / "two"
    _run(run_dir, [f"total_steps={6 * BATCH}", *KEEP])
    assert _files(run_dir) == [*_iters(5, 6), "last.pt"]
    last = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert last["periodic"] == _iters(5, 6) and last["global_step"] == 6 * BATCH
    for name in _iters(5, 6):  # the kept ones are complete
        assert ckpt.load(run_dir / "checkpoints" / name)["global_step"] > 0


def test_a_resumed_run_removes_its_own_older_checkpoints_and_never_another_runs(tmp_path):
    run_dir = tmp_path / "run"
    _run(run_dir, [f"total_steps={4 * BATCH}", *EVERY])  # keeps all: 1..4
    _run(run_dir, ["resume=auto", f"total_steps={6 * BATCH}", *KEEP])
    assert _files(run_dir) == [*_iters(5, 6), "last.pt"]  # its own 1..4 are gone
    # a new run in another run's dir, from that run's checkpoint of iteration 2: it removes the
    # checkpoints it wrote (3, overwritten, and 4), never the other run's (1, 2)
    other = tmp_path / "other"
    _run(other, [f"total_steps={2 * BATCH}", *EVERY])
    start = other / "checkpoints" / "iter_000002.pt"
    _run(other, [f"checkpoint={start}", f"total_steps={6 * BATCH}", *KEEP])
    assert _files(other) == [*_iters(1, 2, 5, 6), "last.pt"]


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

RUN = [*QUIET, f"total_steps={6 * BATCH}", *KEEP]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("keep_uninterrupted") / "run"
    run_train([*RUN, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
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
)
def test_a_kill_around_each_write_rename_and_removal_resumes_to_the_same_run(
    tmp_path, uninterrupted, op, name, count, when
):
    run_dir = tmp_path / "run"
    args = [*RUN, f"hydra.run.dir={run_dir}"]
    killed = drive(tmp_path, _DRIVER, [op, name, str(count), when, *args])
    assert killed.returncode == -9, killed.stdout + killed.stderr
    # resume=auto finds a complete checkpoint: iteration 3's, or 4's once a copy of it is durable
    found = ckpt.find_resume(run_dir / "checkpoints")
    assert found is not None
    durable = (name, when) != ("last.pt", "before")
    assert found[1]["global_step"] == (4 if durable else 3) * BATCH, found[0]

    run_train([*args, "resume=auto"], cwd=tmp_path)
    ref = ckpt.load(uninterrupted / "checkpoints" / "last.pt")
    ours = ckpt.load(run_dir / "checkpoints" / "last.pt")
    keys = ("global_step", "iteration", "ppo", "rng", "next_obs", "periodic")
    assert not same_state(ref, ours, keys)
    # the same checkpoints as the uninterrupted run: nothing lost, nothing left behind
    assert _files(run_dir) == _files(uninterrupted) == [*_iters(5, 6), "last.pt"]
    assert temporaries(run_dir) == []
