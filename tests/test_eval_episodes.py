"""rlrec.train.evaluation: one evaluation is a full seeded reset, then episodes until each eval env
finished one (or eval_env.episodes in all); its clip starts on the reset and carries the
evaluation's tag; per-episode records (eval_episodes.jsonl), per-episode clips (eval_env.clips),
and the replay of a listed episode (rlrec.run.replay)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.layout import RunDir
from rlrec.train.evaluation import Evaluator, run_episodes
from rlrec.train.stack import make_env_stack, record_losses
from tests.helpers import FAST, REPO, make_config, read_metrics, run_train
from tests.record.recutil import decode_many


def _still(obs):  # does not move: every episode runs to the time limit
    return torch.zeros(obs.shape[0], 2)


def _seek(obs):  # heads for the goal: obs = position, velocity, goal - position
    return (3.0 * obs[:, 4:6] - obs[:, 2:4]).clamp(-1.0, 1.0)


def _records(run_dir):
    return [json.loads(line) for line in RunDir(run_dir).eval_episodes.read_text().splitlines()]


def _evaluate(cfg, tmp_path, *runs, clips=None):
    """An Evaluator of ``cfg`` in the run dir ``tmp_path``, each of ``runs`` (``policy, tag,
    stop, iteration``) run, its clips waited for; the figures of each, its records and losses."""
    on_clip = None if clips is None else clips.append
    ev = Evaluator(cfg.env, cfg.sim, cfg.eval_env, tmp_path, on_clip=on_clip)
    try:
        out = [ev.run(*run) for run in runs]
        ev.flush()
        losses = record_losses(ev.env)
    finally:
        if ev.recorder is not None:
            ev.recorder.close()
        ev.env.close()
    path = RunDir(tmp_path).eval_episodes
    return out, _records(tmp_path) if path.exists() else [], losses


def test_one_episode_per_eval_env_and_a_tagged_clip(fast_config, tmp_path):
    cfg = fast_config(["eval_env.num_envs=3", "env.max_episode_steps=12"])
    clips = []
    (first, second), _, _ = _evaluate(cfg, tmp_path, (_still, 640), (_still, 1280), clips=clips)
    assert first["eval/episodes"] == 3 and first["eval/length"] == 12.0
    del first["time/eval"], second["time/eval"]
    assert first == second  # the same seed: the same episodes
    assert [c.tag for c in clips] == [640, 1280]  # one clip per evaluation, tagged
    assert all(c.num_frames == 13 for c in clips)  # the reset frame and 12 steps


def test_episodes_in_all_one_record_each_with_the_seed_of_its_reset_and_stop_cuts_short(
    fast_config, tmp_path
):
    over = ["eval_env.num_envs=2", "eval_env.episodes=5", "env.max_episode_steps=4"]
    cfg = fast_config([*over, "eval_env.recorder.enabled=false"])
    stop = lambda: True  # noqa: E731  (before any episode ended)
    (out, cut), lines, _ = _evaluate(
        cfg, tmp_path, (_still, 640, lambda: False, 5), (_still, 1280, stop)
    )
    assert out["eval/episodes"] == 5 and cut == {}  # cut short: no figures, no records
    assert [r["episode"] for r in lines] == [0, 1, 2, 3, 4]
    assert {(r["step"], r["iteration"]) for r in lines} == {(640, 5)}
    seed = cfg.eval_env.seed
    # the full reset seeds env i with seed + i; the later episodes began at autoresets
    assert [(r["env"], r["seed"]) for r in lines[:2]] == [(0, seed), (1, seed + 1)]
    assert [r["seed"] for r in lines[2:]] == [None, None, None]
    assert all(r["length"] == 4 and r["ended"] == "truncated" for r in lines)
    assert all(r["success"] is False and r["clip"] is None for r in lines)


def test_run_episodes_calls_back_each_step_with_the_observation_acted_on(fast_config):
    """The eval loop on its own (a dataset writer's): each step's observation, action and what
    the env returned, from a full reset with the given seed; the first episode of each env."""
    cfg, seen = fast_config(["env.max_episode_steps=5"]), []
    env = make_env_stack(cfg.env, cfg.sim, 2, 0).env
    try:
        episodes = run_episodes(env, _still, 3, on_step=lambda *step: seen.append(step))
        with torch.inference_mode():  # (the env's tensors are inference tensors now)
            first_obs, _ = env.reset(seed=3)
    finally:
        env.close()
    assert [(e.env, e.first, e.length, e.success) for e in episodes] == [(0, True, 5, False)] + [
        (1, True, 5, False)
    ]
    assert len(seen) == 5 and torch.equal(seen[0][0], first_obs)
    for (_, _, result), (obs, action, _) in zip(seen, seen[1:]):
        assert torch.equal(obs, result[0]) and torch.equal(action, _still(obs))


def _mixed(fast_config, tmp_path, rule, extra=()):
    over = ["eval_env.num_envs=6", "env.max_episode_steps=14", "env.goal_radius=0.3"]
    cfg = fast_config([*over, f"eval_env.clips={rule}", "eval_env.recorder.lossless=true", *extra])
    _, lines, losses = _evaluate(cfg, tmp_path, (_seek, 256, lambda: False, 2))
    assert set(losses.values()) == {0}
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
    with pytest.raises(ConfigError, match="eval_env.clips_k"):
        make_config([*FAST, "eval_env.clips_k=0"])


@pytest.mark.parametrize("rule", ["worst", "best"])
def test_k_worst_and_best_by_return_and_no_clip_written_to_be_removed(
    fast_config, tmp_path, rule, monkeypatch, caplog
):
    """Only the chosen clips ever reach their names (and the log): the others are dropped in
    their temporary files; no file under a clip's name is removed to apply the rule."""
    removed, remove = [], os.remove
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
    over = ["eval_env.num_envs=6", "eval_env.episodes=3", "env.max_episode_steps=30"]
    over += ["env.goal_radius=0.2", f"eval_env.clips={rule}", "eval_env.recorder.enabled=false"]
    (out,), lines, _ = _evaluate(fast_config(over), tmp_path, (_seek, 64, lambda: False, 1))
    assert out["eval/episodes"] == len(lines) == 3
    named = {os.path.basename(r["clip"]) for r in lines if r["clip"]}
    if rule == "failed":
        assert named == {os.path.basename(r["clip"]) for r in lines if not r["success"]}
    else:
        assert len(named) == 3
    videos = tmp_path / "videos" / "eval"
    assert {f for f in os.listdir(videos) if f.endswith(".mp4")} == named
    for name in named:
        assert (
            json.loads((videos / name).with_suffix(".json").read_text())["envs"][0]["end"] != "cut"
        )


def test_failure_only_run_and_replay_frame_for_frame(tmp_path):
    """A training run keeping the failed eval episodes, then one of them replayed from its
    checkpoint: the same frames (lossless), and at another render size, the same length."""
    run = tmp_path / "run"
    args = [*FAST, "total_steps=512", "env.goal_radius=0.3", "eval_env.num_envs=4"]
    args += ["eval_env.clips=failed", "eval_env.recorder.lossless=true", "recorder.enabled=false"]
    proc = run_train([*args, f"hydra.run.dir={run}"], cwd=tmp_path)
    evals = [m for m in read_metrics(run) if "eval/return" in m]
    assert [m["step"] for m in evals] == [0, 256, 512]  # eval_env.at_start: step 0 first
    assert all(m["eval/clip"] == f"videos/eval/eval-step{m['step']:09d}.mp4" for m in evals)
    train = [m for m in read_metrics(run) if "train/lr" in m]
    assert train and all(m["record/clips_dropped"] == 0 for m in train)
    assert "recording lost" not in proc.stdout
    lines = _records(run)
    assert sorted({r["step"] for r in lines}) == [0, 256, 512] and len(lines) == 12
    for r in lines:  # a clip of its own exactly for each failed episode
        own = r["clip"] is not None and "-env" in r["clip"]
        assert own == (r["success"] is False) and (not own or (run / r["clip"]).exists())
    kept = {f for f in os.listdir(run / "videos" / "eval") if "-env" in f and f.endswith(".mp4")}
    assert kept == {os.path.basename(r["clip"]) for r in lines if r["success"] is False}
    # replay a failed episode of the last evaluation (last.pt is of its step)
    r = next(r for r in lines if r["step"] == 512 and r["success"] is False)
    cmd = [sys.executable, "-m", "rlrec.run.replay", str(run), "replay.step=512"]
    cmd += [f"replay.env={r['env']}"]
    env, clips = {**os.environ, "PYTHONPATH": str(REPO)}, []
    for extra in (
        [],
        ["env.render_width=64", "env.render_height=64", f"replay.dir={tmp_path}/big"],
    ):
        out = subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        clips.append(out.stdout.strip().splitlines()[-1].split("rlrec replay: ")[1])
    (tmp_path / "d").mkdir()
    a, b = decode_many([str(run / r["clip"]), clips[0]], (32, 32), tmp_path)
    (c,) = decode_many([clips[1]], (64, 64), tmp_path / "d")
    assert a.shape[0] == r["length"] + 1 and np.array_equal(a, b)
    assert c.shape == (a.shape[0], 64, 64, 3)


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
    for i in range(9):
        if i == 2:  # env 1's episode ends two steps early, at the 4th step
            inner.env.clock.elapsed[1] = 4
        env.step(torch.zeros(3, 2))
    clips = rec.settle({i: (None, 0.0) for i in range(3)})
    env.close()
    assert inner.calls[0] == [0, 1, 2]  # the full reset: one render of all
    assert len(inner.calls) == 1 + 6  # then one per step until the episodes end at step 6
    assert inner.calls[1:5] == [[0, 1, 2]] * 4 and inner.calls[5:] == [[0, 2]] * 2
    assert sorted(clips) == [0, 1, 2]  # one clip each, none for the episodes after autoresets


def test_the_evaluation_clip_names_the_episodes_of_its_tiles(fast_config, tmp_path):
    over = ["eval_env.num_envs=3", "eval_env.recorder.env_idx=[0,1]", "env.goal_radius=0.4"]
    cfg = fast_config([*over, "env.max_episode_steps=30"])
    _, records, _ = _evaluate(cfg, tmp_path, (_seek, 128, lambda: False, 1))
    lines = {r["env"]: r for r in records}
    side = json.loads((tmp_path / "videos" / "eval" / "eval-step000000128.json").read_text())
    last = side["frames"] - 1
    assert lines[0]["clip"] == lines[1]["clip"] == "videos/eval/eval-step000000128.mp4"
    assert lines[0]["frames"] == [0, last] and last == lines[0]["length"]
    assert lines[1]["frames"] == [0, min(last, lines[1]["length"])]
    assert lines[2]["clip"] is None and lines[2]["frames"] is None


def test_one_seed_for_one_episode_in_every_sidecar_and_record(fast_config, tmp_path):
    """The evaluation's clip of env 2 and env 2's own clip say the seed its record says, the
    env's own (eval_env.seed + 2), as a replay of env 2 (a recorder of env_idx=[2]) does."""
    over = ["eval_env.num_envs=3", "eval_env.recorder.env_idx=[2]", "eval_env.clips=all"]
    cfg = fast_config([*over, "env.max_episode_steps=5"])
    _, records, _ = _evaluate(cfg, tmp_path, (_still, 32, lambda: False, 1))
    (record,) = [r for r in records if r["env"] == 2]
    videos = tmp_path / "videos" / "eval"
    sides = [
        json.loads((videos / f"eval-step000000032{x}.json").read_text()) for x in ("", "-env002")
    ]
    assert [s["seed"] for s in sides] == [record["seed"]] * 2 == [cfg.eval_env.seed + 2] * 2
