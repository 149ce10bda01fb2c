"""rlrec.train.resume on its own: the resume point kept during a rollout, and where a run starts
from (the runner end to end is tests/test_runner.py and tests/test_fault_tolerance.py)."""

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.train import checkpoint as ckpt
from rlrec.train import resume
from tests.helpers import FAST, make_config


def test_the_resume_point_is_the_kept_state_until_cleared_then_the_state_as_of_now(tmp_path):
    agent = {"w": torch.zeros(2)}
    live = {"global_step": 0, "next_obs": torch.zeros(3), "ppo": {"agent": agent, "obs_norm": {}}}
    cfg = make_config(FAST)
    point = resume.ResumePoint(lambda: {**live, "ppo": dict(live["ppo"])}, tmp_path, cfg)
    assert point.state()["global_step"] == 0 and "eval_due" not in point.state()
    point.keep(eval_due=True)
    live["next_obs"].add_(1)  # the rollout changes the live state in place
    live["global_step"] = 16
    kept = point.state()
    assert kept["eval_due"] and kept["global_step"] == 0
    assert torch.equal(kept["next_obs"], torch.zeros(3))  # a copy of its own
    assert kept["ppo"]["agent"] is agent  # the model is shared: only the update changes it
    point.clear()
    assert point.state()["global_step"] == 16


def test_a_checkpoint_of_another_world_size_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "two.pt"
    ckpt.save(path, {"global_step": 0, "iteration": 0, "world_size": 2})
    cfg = make_config([*FAST, f"checkpoint={path}"])
    with pytest.raises(ConfigError, match=r"saved by a run of 2 rank\(s\) and this run has 1"):
        resume.find(cfg, tmp_path / "run", rank=0, world=1)
    with pytest.raises(ConfigError) as e:  # resume=auto names the file it found
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
        ckpt.save(path.parent / "run" / "checkpoints" / "last.pt", ckpt.load(path))
        resume.find(make_config([*FAST, "resume=auto"]), tmp_path / "run", rank=0, world=1)
    assert str(e.value).startswith(f"{tmp_path / 'run' / 'checkpoints' / 'last.pt'} was saved")
    start = resume.find(
        make_config([*FAST, f"checkpoint={path}", "eval_only=true"]), tmp_path, 0, 1
    )
    assert start.path == str(path) and start.key == "checkpoint" and not start.eval_due


def test_resume_auto_in_a_new_run_dir_starts_fresh(tmp_path):
    assert resume.find(make_config([*FAST, "resume=auto"]), tmp_path, rank=0, world=1) is None


def test_a_stop_in_the_last_update_leaves_the_final_evaluation_due_then_the_run_ends(
    tmp_path, monkeypatch, capsys
):
    """A stop that comes during the last update skips the final evaluation: the checkpoint says
    it is due, resume=auto does it (one final eval line), and resuming the ended run again
    changes nothing."""
    import signal

    from rlrec.ppo.ppo import PPO
    from rlrec.run.preempt import StopRequested
    from rlrec.train.runner import Runner
    from tests.helpers import read_metrics

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = [*FAST, "total_steps=512", "recorder=none", "eval_env.recorder.enabled=false"]
    runner = Runner(make_config(args), run_dir, stop=StopRequested())
    update = PPO.update

    def last_update_stopped(self):
        if runner.iteration == runner.num_iterations:
            runner.stop.signum = signal.SIGTERM  # what the handler does
        return update(self)

    with monkeypatch.context() as m:
        m.setattr(PPO, "update", last_update_stopped)
        runner.run()
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == 512 and saved["eval_due"] is True
    evals = lambda: [x["step"] for x in read_metrics(run_dir) if "eval/return" in x]  # noqa: E731
    assert evals() == [0, 256]  # eval_env.at_start, then iteration 2's

    Runner(make_config([*args, "resume=auto"]), run_dir).run()
    assert evals() == [0, 256, 512]
    assert not ckpt.load(run_dir / "checkpoints" / "last.pt").get("eval_due")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    again = Runner(make_config([*args, "resume=auto"]), run_dir)
    again.run()
    assert "rlrec: done already" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
