"""rlrec.train.evaluation: one evaluation is a full seeded reset, then episodes until each eval env
finished one; its clip starts on the reset and carries the evaluation's tag."""

from __future__ import annotations

import torch

from rlrec.train.evaluation import Evaluator


def _evaluator(cfg, tmp_path, clips):
    video_dir = str(tmp_path / "eval")
    return Evaluator(cfg.env, cfg.sim, cfg.eval_env, video_dir=video_dir, on_clip=clips.append)


def _still(obs):  # a policy that does not move: every episode runs to the time limit
    return torch.zeros(obs.shape[0], 2)


def test_one_episode_per_eval_env_and_a_tagged_clip(fast_config, tmp_path):
    cfg = fast_config(["eval_env.num_envs=3", "env.max_episode_steps=12"])
    clips = []
    ev = _evaluator(cfg, tmp_path, clips)
    try:
        first = ev.run(_still, tag=640)
        second = ev.run(_still, tag=1280)
        ev.recorder.flush()
    finally:
        ev.recorder.close()
        ev.env.close()
    assert first["eval/episodes"] == 3 and first["eval/length"] == 12.0
    assert first == second  # the same seed: the same episodes
    assert [c.tag for c in clips] == [640, 1280]  # one clip per evaluation, tagged
    assert all(c.num_frames == 13 for c in clips)  # the reset frame and 12 steps


def test_episodes_counts_episodes_in_all_and_stop_cuts_short(fast_config, tmp_path):
    cfg = fast_config(
        [
            "eval_env.num_envs=2",
            "eval_env.episodes=5",
            "env.max_episode_steps=4",
            "eval_env.recorder.enabled=false",
        ]
    )
    ev = _evaluator(cfg, tmp_path, [])
    try:
        assert ev.run(_still, tag=0)["eval/episodes"] == 5
        assert ev.run(_still, tag=0, stop=lambda: True) == {}  # stopped before any episode ended
    finally:
        ev.env.close()
