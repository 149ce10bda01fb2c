"""Preemption against time-out under submitit, tested as submitit tests its own requeue
(submitit/slurm/test_slurm.py: ``test_requeuing_checkpointable``): a mocked SLURM, a mocked
``_requeue``, a clock moved forward. The job is a real rlrec run in this process
(``rlrec.run.cli``'s single run, as a submitit job runs it), stopped by submitit's signal at a
chosen collection step, with submitit's own signal handler behind rlrec's."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from rlrec.ppo.ppo import PPO
from rlrec.run import cli
from rlrec.train import checkpoint as ckpt
from tests.helpers import FAST, compose_cfg, read_metrics

submitit = pytest.importorskip("submitit")
from submitit.core import job_environment, utils  # noqa: E402
from submitit.slurm import slurm  # noqa: E402
from submitit.slurm.test_slurm import mocked_slurm  # noqa: E402

BATCH = 8 * 16  # FAST: env.num_envs * algo.num_steps
TOTAL = 12 * BATCH
ARGS = [*FAST, f"total_steps={TOTAL}", "checkpoint_every=100", "torch_threads=1"]


class _HydraJob:
    """A checkpointable job as the Hydra submitit launcher submits one: ``checkpoint`` resubmits
    the same callable with the same arguments (hydra_submitit_launcher's ``checkpoint``)."""

    def __call__(self, *args):
        raise AssertionError("not run by this test: the job body runs in the test itself")

    def checkpoint(self, *args):
        return submitit.helpers.DelayedSubmission(self, *args)


@pytest.fixture
def clock(monkeypatch):
    """``time.time`` ahead of the real clock by what the test adds (submitit's own
    ``fast_forward_clock`` freezes it; rlrec's bounded waits need it to move)."""
    offset = [0.0]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])

    def forward(minutes: float) -> None:
        offset[0] += minutes * 60

    return forward


def _run(run_dir: Path, job, signal_at=None, after_minutes=0.0, clock=None):
    """One attempt of the job: submitit's handler for its signal as submitit installs it
    (``JobEnvironment._handle_signals``), then rlrec's single run, which takes the signal at
    the ``signal_at``-th collection step, ``after_minutes`` into the attempt."""
    env = slurm.SlurmJobEnvironment()
    delayed = utils.DelayedSubmission.load(job.paths.submitted_pickle)
    handler = job_environment.SignalHandler(env, job.paths, delayed)
    usr = env._usr_sig()
    previous = signal.signal(usr, handler.checkpoint_and_try_requeue)
    original, calls = PPO.act, [0]

    def act(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == signal_at:
            clock(after_minutes)
            os.kill(os.getpid(), usr)
        return original(self, *args, **kwargs)

    try:
        with patch.object(PPO, "act", act):
            return cli._single(compose_cfg([*ARGS, f"hydra.run.dir={run_dir}"]), run_dir)
    finally:
        signal.signal(usr, previous)


def _steps(run_dir: Path):
    return [m["step"] for m in read_metrics(run_dir) if "loss/policy" in m]


def _saved(run_dir: Path):
    return ckpt.load(run_dir / "checkpoints" / "last.pt")


@pytest.mark.slow
def test_preempted_job_is_requeued_one_that_timed_out_too_often_is_not(tmp_path, clock, capsys):
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    reference.mkdir()
    run_dir.mkdir()
    cli._single(compose_cfg([*ARGS, f"hydra.run.dir={reference}"]), reference)
    with mocked_slurm() as mock:
        executor = slurm.SlurmExecutor(folder=tmp_path / "submitit", max_num_timeout=1)
        executor.update_parameters(time=60)  # a 60 minutes limit
        job = executor.submit(_HydraJob())
    usr = int(slurm.SlurmJobEnvironment._usr_sig())
    requeue = "submitit.slurm.slurm.SlurmJobEnvironment._requeue"
    steps = [0]
    with mock.job_context(job.job_id):
        assert os.environ["SUBMITIT_EXECUTOR"] == "slurm"
        # preempted 30 minutes in (not timed out): checkpointed, then requeued, time-outs left:
        # 1; the requeued job resumes (resume=auto by default) and times out 50 minutes in: a
        # time-out is allowed (max_num_timeout=1), so requeued again, none left; times out once
        # more: not requeued ("timed-out too many times"), its checkpoint written
        for minutes, at, left in ((30, 3, 1), (50, 3, 0), (55, 2, None)):
            raises = (
                pytest.raises(SystemExit)
                if left is not None
                else pytest.raises(utils.UncompletedJobError, match="timed-out too many times")
            )
            with patch(requeue, return_value=None) as requeued, raises:
                _run(run_dir, job, at * 16 + 5, minutes, clock)
            if left is None:
                requeued.assert_not_called()
                assert "the job is not requeued" in capsys.readouterr().err
            else:
                requeued.assert_called_once_with(left)
            steps.append(_saved(run_dir)["global_step"])
            assert steps[-1] == steps[-2] + at * BATCH
    # resume=auto continues it (here by hand: no more requeues) to the end of the run
    with mock.job_context(job.job_id):
        cli._single(compose_cfg([*ARGS, "resume=auto", f"hydra.run.dir={run_dir}"]), run_dir)
    assert _steps(run_dir) == _steps(reference) == list(range(BATCH, TOTAL + 1, BATCH))
    ours, ref = _saved(run_dir), _saved(reference)
    assert ours["global_step"] == TOTAL
    for k, v in ref["ppo"]["agent"].items():
        assert torch.equal(v, ours["ppo"]["agent"][k]), k
    events = [
        (m["event"], m["step"], m.get("signal")) for m in read_metrics(run_dir) if "event" in m
    ]
    assert events == [
        (e, s, usr if e == "stop" else None) for s in steps[1:] for e in ("stop", "resume")
    ]
