"""Signals act at iteration boundaries only: the handler (``StopRequested`` in
rlrec/run/preempt.py) only sets the stop flag, so a SIGTERM that arrives in the middle of
``loss.backward()`` or in the middle of a checkpoint write lets that work finish; the run then
stops at the next boundary with a checkpoint, and ``resume=auto`` ends equal to the uninterrupted
run (tests/test_fault_tolerance.py's reference run and comparison)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlrec.train import checkpoint as ckpt
from tests.helpers import REPO, run_train
from tests.test_fault_tolerance import (
    BATCH,
    RESUMABLE,
    _assert_checkpoints_load,
    _assert_same_run,
    _temporaries,
    _train_steps,
)

# train.py's main with a SIGTERM sent to itself from inside the work named:
#   driver.py backward N     from a backward hook of the critic, in the N-th backward pass
#   driver.py write NAME     from the fsync of checkpoint NAME's temporary (written, not renamed)
# and the stop flag's handler wrapped to say where it ran.
_DRIVER = """
import os
import signal
import sys

import torch

from rlrec.ppo.ppo import PPO
from rlrec.run import preempt

where, at = sys.argv[1:3]
sys.argv = [sys.argv[0], *sys.argv[3:]]
inside = {"now": None, "handled": []}


def fire(what):
    inside["now"] = what
    os.kill(os.getpid(), signal.SIGTERM)  # its Python handler runs at the next bytecode: here
    for _ in range(1000):  # (bytecodes enough for the interpreter to run it)
        pass
    inside["now"] = None


handle = preempt.StopRequested._handle


def handled(self, signum, frame):
    inside["handled"].append(inside["now"])
    print(f"handler ran inside: {inside['now']}", flush=True)
    return handle(self, signum, frame)


preempt.StopRequested._handle = handled

if where == "backward":
    calls = [0]
    init = PPO.__init__

    def hook(module, grad_input, grad_output):
        calls[0] += 1
        if calls[0] == int(at):
            fire("backward")

    def hooked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.agent.critic.register_full_backward_hook(hook)

    PPO.__init__ = hooked_init
else:
    fsync = os.fsync

    def hooked_fsync(fd):
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            name = ""
        fsync(fd)
        if name.startswith(f".{at}.") and name.endswith(".part"):  # rlrec.files' temporaries
            fire("write")

    os.fsync = hooked_fsync
from rlrec.run.cli import main  # noqa: E402

main()
"""


NUM_UPDATES = 2 * 2  # FAST: algo.update_epochs x algo.num_minibatches backward passes


def _drive(tmp_path: Path, where: str, at: str, args) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(driver), where, at, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, at, saved_step",
    [
        # the second backward pass of iteration 3's update: the update finishes, then the stop
        ("backward", str(2 * NUM_UPDATES + 2), 3 * BATCH),
        # iteration 4's periodic checkpoint: last.pt is written first, then iter_000004.pt
        ("write", "last.pt", 4 * BATCH),
        ("write", "iter_000004.pt", 4 * BATCH),
    ],
    ids=["mid-backward", "mid-last.pt-write", "mid-periodic-write"],
)
def test_sigterm_inside_backward_or_a_checkpoint_write_stops_at_the_boundary(
    tmp_path, uninterrupted_resumable, where, at, saved_step
):
    run_dir = tmp_path / "run"
    args = [*RESUMABLE, f"hydra.run.dir={run_dir}"]
    # (last.pt: iteration 4's write is its first, which the signal lands in)
    stopped = _drive(tmp_path, where, at, args)
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 128 + signal.SIGTERM, out
    # the handler ran in the middle of that work, and did nothing there but set the flag
    assert f"handler ran inside: {where}" in out, out
    assert "Traceback" not in out
    # the work finished: the update's line is written; the checkpoint being written is complete
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == saved_step == max(_train_steps(run_dir))
    assert not saved.get("eval_due")
    if where == "write":
        assert ckpt.load(run_dir / "checkpoints" / "iter_000004.pt")["global_step"] == 4 * BATCH
    assert _temporaries(run_dir) == []

    resumed = run_train([*args, "resume=auto"], cwd=tmp_path)
    assert "done" in resumed.stdout
    _assert_same_run(uninterrupted_resumable, run_dir)
    _assert_checkpoints_load(run_dir)
