"""Real small runs of the built-in env for the report's tests (one of each kind per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, run_train

# five evaluations (the untrained policy at step 0, then iterations 1..4 of 128 steps), each
# with its clip, checkpoints of each; a goal radius and sampled actions that reach it in some
# episodes: clips of several lengths
RUN = [*FAST, "total_steps=512", "env.goal_radius=0.4", "eval_env.deterministic=false"]
RUN += ["eval_env.every=1", "checkpoint_every=1"]


def _run(tmp: Path, *args: str) -> tuple:
    """The run dir and the console output of a run of ``args`` that writes its report."""
    run_dir = tmp / "run"
    # recorder=none: eval clips only; tests.helpers.FAST turns the report off for the other tests
    args = [*args, "recorder=none", "report.enabled=true", f"hydra.run.dir={run_dir}"]
    proc = run_train(args, cwd=tmp)
    report = f"rlrec: report {(run_dir / 'report.html').resolve()} (written in"
    assert report in proc.stdout, proc.stdout
    return run_dir, proc.stdout


@pytest.fixture(scope="session")
def lossless_run(tmp_path_factory) -> Path:
    """A run whose eval clips are lossless (libx264rgb): pixels compare exactly."""
    return _run(tmp_path_factory.mktemp("lossless"), *RUN, "eval_env.recorder.lossless=true")[0]


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Path:
    """A run with the default encoding (H.264 yuv420p), as users get it."""
    return _run(tmp_path_factory.mktemp("default"), *RUN)[0]


@pytest.fixture(scope="session")
def short_run(tmp_path_factory) -> tuple:
    """A run of one iteration (one training point a curve: episodes of 10 steps end in its 16)
    with evaluations before and after it: its run dir and its console output."""
    args = [*FAST, "total_steps=128", "env.max_episode_steps=10", "eval_env.every=1"]
    return _run(tmp_path_factory.mktemp("short"), *args)
