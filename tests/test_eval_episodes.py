"""Per-episode eval records (eval_episodes.jsonl), per-episode clips (eval_env.clips), the
evaluation at start, and the replay of a listed episode (rlrec.run.replay)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.layout import RunDir
from rlrec.train.evaluation import Evaluator
from rlrec.train.stack import record_losses
from tests.helpers import FAST, make_config, read_metrics, run_train
from tests.record.recutil import decode_many


def _evaluator(cfg, tmp_path):
    video_dir = str(tmp_path / "videos" / "eval")
    return Evaluator(cfg.env, cfg.sim, cfg.eval_env, tmp_path, video_dir=video_dir)


def _still(obs):  # does not move: every episode runs to the time limit
    return torch.zeros(obs.shape[0], 2)


def _seek(obs):  # heads for the goal: obs = position, velocity, goal - position
    return (3.0 * obs[:, 4:6] - obs[:, 2:4]).clamp(-1.0, 1.0)


def _records(tmp_path):
    return [json.loads(line) for line in RunDir(tmp_path).eval_episodes.read_text().splitlines()]


def test_one_record_per_episode_with_the_seed_of_its_reset(fast_config, tmp_path):
    cfg = fast_config(
        [
            "eval_env.num_envs=2",
            "eval_env.episodes=5",
            "env.max_episode_steps=4",
            "eval_env.recorder.enabled=false",
        ]
    )
    ev = _evaluator(cfg, tmp_path)
    try:
        ev.run(_still, tag=640, iteration=5)
        ev.run(_still, tag=1280, stop=lambda: True)  # cut short: no records
    finally:
        ev.env.close()
    lines = _records(tmp_path)
    assert [r["episode"] for r in lines] == [0, 1, 2, 3, 4]
    assert {(r["step"], r["iteration"]) for r in lines} == {(640, 5)}
    seed = cfg.eval_env.seed
    # the full reset seeds env i with seed + i; the later episodes began at autoresets
    assert [(r["env"], r["seed"]) for r in lines[:2]] == [(0, seed), (1, seed + 1)]
    assert [r["seed"] for r in lines[2:]] == [None, None, None]
    assert all(r["length"] == 4 and r["ended"] == "truncated" for r in lines)
    assert all(r["success"] is False and r["clip"] is None for r in lines)


def _mixed(fast_config, tmp_path, rule, extra=()):
    cfg = fast_config(
        [
            "eval_env.num_envs=6",
            "env.max_episode_steps=14",
            "env.goal_radius=0.3",
            f"eval_env.clips={rule}",
            "eval_env.recorder.lossless=true",
            *extra,
        ]
    )
    ev = _evaluator(cfg, tmp_path)
    try:
        ev.run(_seek, tag=256, iteration=2)
        ev.flush()
        losses = record_losses(ev.env)
    finally:
        ev.env.close()
    assert losses == {
        "record/clips_dropped": 0,
        "record/frames_dropped": 0,
        "record/encoder_stalls": 0,
    }
    lines = _records(tmp_path)
    failed = {r["env"] for r in lines if not r["success"]}
    assert failed and len(failed) < len(lines)  # the goal radius makes some episodes fail
    return lines


def test_failed_clips_keep_exactly_the_failed_episodes(fast_config, tmp_path):
    lines = _mixed(fast_config, tmp_path, "failed")
    on_disk = sorted(f for f in os.listdir(tmp_path / "videos" / "eval") if "-env" in f)
    with_clip = {r["env"]: r for r in lines if r["clip"] and "-env" in r["clip"]}
    assert set(with_clip) == {r["env"] for r in lines if not r["success"]}
    names = {f"eval-step000000256-env{e:03d}{x}" for e in with_clip for x in (".mp4", ".json")}
    assert set(on_disk) == names
    for env, r in with_clip.items():
        side = json.loads((tmp_path / r["clip"]).with_suffix(".json").read_text())
        assert side["frames"] == r["frames"][1] + 1 == r["length"] + 1
        assert side["envs"][0]["env"] == env and side["envs"][0]["success"] is False
        # one seed for one episode: the env's own, in the sidecar as in the record
        assert side["seed"] == r["seed"] == 1_000_000 + env


@pytest.mark.parametrize("rule", ["worst", "best"])
def test_k_worst_and_best_by_return_and_no_clip_written_to_be_removed(
    fast_config, tmp_path, rule, monkeypatch, caplog
):
    """Only the chosen clips ever reach their names (and the log): the others are dropped in
    their temporary files; no file under a clip's name is removed to apply the rule."""
    removed = []
    remove = os.remove
    monkeypatch.setattr(os, "remove", lambda path: removed.append(str(path)) or remove(path))
    with caplog.at_level("INFO", logger="rlrec.record.engine"):
        lines = _mixed(fast_config, tmp_path, rule, ["eval_env.clips_k=2"])
    ranked = sorted(lines, key=lambda r: r["return"], reverse=rule == "best")
    kept = {r["env"] for r in lines if r["clip"] and "-env" in r["clip"]}
    assert kept == {r["env"] for r in ranked[:2]}
    assert len([f for f in os.listdir(tmp_path / "videos" / "eval") if "-env" in f]) == 4
    assert [p for p in removed if not os.path.basename(p).startswith(".")] == []
    saved = [m for m in caplog.messages if m.startswith("saved eval clip") and "-env" in m]
    assert sorted(saved) == sorted(
        f"saved eval clip {tmp_path / r['clip']} ({r['length'] + 1} frames)"
        for r in lines
        if r["env"] in kept
    )


@pytest.mark.parametrize("rule", ["failed", "all"])
def test_every_clip_is_of_an_episode_the_evaluation_counted(fast_config, tmp_path, rule):
    """6 eval envs, eval_env.episodes=3: the clips of the first episodes the evaluation did not
    count (still running when it stopped, or ending on its last step past the 3) are dropped;
    each clip on disk is named by a record, each record's clip is on disk."""
    cfg = fast_config(
        [
            "eval_env.num_envs=6",
            "eval_env.episodes=3",
            "env.max_episode_steps=30",
            "env.goal_radius=0.2",
            f"eval_env.clips={rule}",
            "eval_env.recorder.enabled=false",
        ]
    )
    ev = _evaluator(cfg, tmp_path)
    try:
        out = ev.run(_seek, tag=64, iteration=1)
        ev.flush()
    finally:
        ev.env.close()
    lines = _records(tmp_path)
    assert out["eval/episodes"] == len(lines) == 3
    named = {os.path.basename(r["clip"]) for r in lines if r["clip"]}
    if rule == "failed":
        assert named == {os.path.basename(r["clip"]) for r in lines if not r["success"]}
    else:
        assert len(named) == 3
    videos = tmp_path / "videos" / "eval"
    assert {f for f in os.listdir(videos) if f.endswith(".mp4")} == named
    for name in named:
        side = json.loads((videos / name).with_suffix(".json").read_text())
        assert side["envs"][0]["end"] != "cut"


def test_bad_clip_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="eval_env.clips_k"):
        make_config([*FAST, "eval_env.clips_k=0"])


def test_failure_only_run_and_replay_frame_for_frame(tmp_path):
    """A training run keeping the failed eval episodes, then one of them replayed from its
    checkpoint: the same frames (lossless), and at another render size, the same length."""
    run = tmp_path / "run"
    args = [
        *FAST,
        "total_steps=512",  # 4 iterations; evaluations at steps 0, 256, 512
        "env.goal_radius=0.3",
        "eval_env.num_envs=4",
        "eval_env.clips=failed",
        "eval_env.recorder.lossless=true",
        "recorder.enabled=false",
        f"hydra.run.dir={run}",
    ]
    proc = run_train(args, cwd=tmp_path)
    evals = [m for m in read_metrics(run) if "eval/return" in m]
    assert [m["step"] for m in evals] == [0, 256, 512]  # eval_env.at_start: step 0 first
    assert all(m["eval/clip"] == f"videos/eval/eval-step{m['step']:09d}.mp4" for m in evals)
    train = [m for m in read_metrics(run) if "train/lr" in m]
    assert train and all(m["record/clips_dropped"] == 0 for m in train)
    assert "recording lost" not in proc.stdout
    lines = [json.loads(x) for x in RunDir(run).eval_episodes.read_text().splitlines()]
    assert sorted({r["step"] for r in lines}) == [0, 256, 512] and len(lines) == 12
    for r in lines:  # a clip of its own exactly for each failed episode
        own = r["clip"] is not None and "-env" in r["clip"]
        assert own == (r["success"] is False)
        if own:
            assert (run / r["clip"]).exists()
    kept = {f for f in os.listdir(run / "videos" / "eval") if "-env" in f and f.endswith(".mp4")}
    assert kept == {os.path.basename(r["clip"]) for r in lines if r["success"] is False}
    # replay a failed episode of the last evaluation (last.pt is of its step)
    r = next(r for r in lines if r["step"] == 512 and r["success"] is False)
    env = {**os.environ, "PYTHONPATH": str(__import__("tests.helpers").helpers.REPO)}
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "rlrec.run.replay", str(run), "replay.step=512"]
    out = subprocess.run(
        [*cmd, f"replay.env={r['env']}"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    clip = out.stdout.strip().splitlines()[-1].split("rlrec replay: ")[1]
    a, b = decode_many([str(run / r["clip"]), clip], (32, 32), tmp_path)
    assert a.shape[0] == r["length"] + 1 and np.array_equal(a, b)
    big = subprocess.run(
        [*cmd, f"replay.env={r['env']}", "env.render_width=64", "env.render_height=64"]
        + ["replay.dir=" + str(tmp_path / "big")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert big.returncode == 0, big.stderr
    (tmp_path / "d").mkdir()
    (c,) = decode_many([str(tmp_path / "big" / "videos" / "eval" / "eval-step000000512.mp4")],
                       (64, 64), tmp_path / "d")  # fmt: skip
    assert c.shape == (a.shape[0], 64, 64, 3)


def test_a_lost_eval_clip_is_said_on_its_line_and_in_the_last_console_line(tmp_path, capsys):
    from rlrec.config import LoggerConfig
    from rlrec.train.logger import RunLogger, summary

    logger = RunLogger(LoggerConfig(name="none", progress=False), tmp_path, 100, {})
    logger.log(256, {"eval/return": 1.0}, clip="eval")  # its clip never comes
    logger.close()
    (line,) = read_metrics(tmp_path)
    assert line["eval/clip"] is None and line["eval/clip_lost"] is True
    losses = {"record/clips_dropped": 2, "record/frames_dropped": 40, "record/encoder_stalls": 0}
    summary(1.0, 100, {}, tmp_path, None, True, losses)
    out = capsys.readouterr().out
    assert "recording lost clips_dropped 2, frames_dropped 40" in out
    assert "encoder_stalls" not in out  # named when nonzero


def test_episode_clips_render_once_per_step_only_the_envs_still_recorded(fast_config, tmp_path):
    """One batched render per frame step, of the envs whose clip is open: an env whose episode
    ended is not rendered again, and an autoreset starts no clip."""
    from rlrec.envs.autoreset import AutoReset
    from rlrec.envs.base import EnvWrapper
    from rlrec.envs.factory import make_adapter
    from rlrec.record.wrappers.episodes import EpisodeClips

    class Count(EnvWrapper):
        calls: list = []

        def render(self, env_idx):
            self.calls.append(list(env_idx))
            return self.env.render(env_idx)

    cfg = fast_config(["env.max_episode_steps=6"])
    inner = Count(make_adapter(cfg.env, cfg.sim, 3, 0))
    rec = EpisodeClips(inner, cfg.eval_env.recorder, str(tmp_path))
    env = AutoReset(rec)
    env.reset(seed=0)
    steps = [torch.zeros(3, 2)] * 9
    for i, a in enumerate(steps):
        if i == 2:  # env 1's episode ends two steps early, at the 4th step
            inner.env.clock.elapsed[1] = 4
        env.step(a)
    clips = rec.settle({i: (None, 0.0) for i in range(3)})
    env.close()
    assert inner.calls[0] == [0, 1, 2]  # the full reset: one render of all
    assert len(inner.calls) == 1 + 6  # then one per step until the episodes end at step 6
    assert inner.calls[1:5] == [[0, 1, 2]] * 4 and inner.calls[5:] == [[0, 2]] * 2
    assert sorted(clips) == [0, 1, 2]  # one clip each, none for the episodes after autoresets


def test_the_evaluation_clip_names_the_episodes_of_its_tiles(fast_config, tmp_path):
    cfg = fast_config(
        [
            "eval_env.num_envs=3",
            "eval_env.recorder.env_idx=[0,1]",
            "env.max_episode_steps=30",
            "env.goal_radius=0.4",
        ]
    )
    ev = _evaluator(cfg, tmp_path)
    try:
        ev.run(_seek, tag=128, iteration=1)
        ev.recorder.flush()  # the clip is reported: the records go out naming it
    finally:
        ev.env.close()
    lines = {r["env"]: r for r in _records(tmp_path)}
    side = json.loads((tmp_path / "videos" / "eval" / "eval-step000000128.json").read_text())
    last = side["frames"] - 1
    assert lines[0]["clip"] == lines[1]["clip"] == "videos/eval/eval-step000000128.mp4"
    assert lines[0]["frames"] == [0, last] and last == lines[0]["length"]
    assert lines[1]["frames"] == [0, min(last, lines[1]["length"])]
    assert lines[2]["clip"] is None and lines[2]["frames"] is None


def test_one_seed_for_one_episode_in_every_sidecar_and_record(fast_config, tmp_path):
    """The evaluation's clip of env 2 and env 2's own clip say the seed its record says, the
    env's own (eval_env.seed + 2), as a replay of env 2 (a recorder of env_idx=[2]) does."""
    cfg = fast_config(
        [
            "eval_env.num_envs=3",
            "eval_env.recorder.env_idx=[2]",
            "eval_env.clips=all",
            "env.max_episode_steps=5",
        ]
    )
    ev = _evaluator(cfg, tmp_path)
    try:
        ev.run(_still, tag=32, iteration=1)
        ev.flush()
    finally:
        ev.env.close()
    (record,) = [r for r in _records(tmp_path) if r["env"] == 2]
    videos = tmp_path / "videos" / "eval"
    sides = [
        json.loads((videos / f"eval-step000000032{x}.json").read_text()) for x in ("", "-env002")
    ]
    assert [s["seed"] for s in sides] == [record["seed"]] * 2 == [cfg.eval_env.seed + 2] * 2
