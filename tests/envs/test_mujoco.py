"""``+experiment=mujoco`` (CleanRL's continuous-control PPO settings: tests/test_experiments.py) on
a real MuJoCo env."""

from __future__ import annotations

import pytest

pytest.importorskip("mujoco")  # gymnasium[mujoco]

from tests.helpers import read_metrics, run_train


def test_the_preset_trains_logs_the_training_return_and_records_clips(tmp_path):
    run_dir = tmp_path / "run"
    args = "+experiment=mujoco env.id=InvertedPendulum-v4 env.kwargs.width=48 env.kwargs.height=48"
    args += " total_steps=512 algo.num_steps=256 algo.num_minibatches=4 algo.update_epochs=2"
    args += " eval_env.num_envs=2 eval_env.every=1 logger=none"
    run_train([*args.split(), f"hydra.run.dir={run_dir}"], tmp_path)
    lines = read_metrics(run_dir)
    train = [line for line in lines if "train/return" in line]
    assert [line["step"] for line in train] == [256, 512]
    # the untrained pendulum falls within a few dozen steps: several episodes per rollout
    assert all(line["train/episodes"] >= 2 and line["train/return"] > 0 for line in train)
    evals = [line for line in lines if "eval/return" in line]
    assert [line["step"] for line in evals] == [0, 256, 512]
    assert all(line["eval/clip"] for line in evals)
    assert len(list((run_dir / "videos" / "eval").glob("*.mp4"))) == 3
    assert list((run_dir / "videos" / "train").glob("*.mp4"))
    assert (run_dir / "checkpoints" / "last.pt").is_file()


def test_mujocos_warnings_go_to_the_runs_log_not_the_working_directory(tmp_path):
    """HalfCheetah-v4's model sets ``settotalmass``, which mujoco 3+ warns of: MuJoCo would write
    the warning to MUJOCO_LOG.TXT in the working directory; the run writes it to its own log."""
    import mujoco

    if int(mujoco.__version__.split(".")[0]) < 3:
        pytest.skip("mujoco < 3 does not warn of settotalmass")
    run_dir = tmp_path / "run"
    args = "env=gymnasium env.id=HalfCheetah-v4 env.num_envs=2 total_steps=64 algo.num_steps=32"
    args += " algo.num_minibatches=2 algo.update_epochs=1 eval_env.enabled=false recorder=none"
    args += " logger=none logger.progress=false report.enabled=false"
    proc = run_train([*args.split(), f"hydra.run.dir={run_dir}"], tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # the working directory
    log = (run_dir / "train.log").read_text()
    assert "MuJoCo: compiler attribute 'settotalmass' is deprecated" in log, log
    assert "WARNING: compiler attribute" not in proc.stdout + proc.stderr  # MuJoCo's own print
