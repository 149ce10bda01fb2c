"""rlrec.record.RecordClips against the real ManiSkill3 simulator (CPU sim, lavapipe, 64x64).

Clips are lossless and lavapipe renders are pixel-deterministic, so decoded frames are compared
exactly with frames rendered independently: by a probe wrapper below RecordClips that renders the
env after every reset and step (the env's own render at the right moments), or by a second env
reset with the clip's seed.
"""

import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip(
    "mani_skill", reason="needs the maniskill extra: bash scripts/setup_maniskill.sh"
)
pytestmark = [
    pytest.mark.maniskill,
    pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning"),  # inside ManiSkill
]

import gymnasium as gym  # noqa: E402
import mani_skill.envs  # noqa: E402, F401
from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv  # noqa: E402

from rlrec.checks import ConfigError  # noqa: E402
from rlrec.envs.maniskill import render_rows  # noqa: E402
from rlrec.record import RecordClips  # noqa: E402
from rlrec.testing import decode  # noqa: E402
from tests.record.recutil import assert_only_clips, sidecar  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SIZE = 64
LIMIT = 5


def _load_gpu_check():
    """tools/device/physx_parts.py (the ManiSkill parts of the GPU check; it imports gpu_check
    from its own folder)."""
    folder = str(REPO / "tools" / "device")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("physx_parts")


def make(sim="cpu", num_envs=1):
    cpu = dict(sim_backend="physx_cpu", render_backend="cpu")
    kw = cpu if sim == "cpu" else dict(sim_backend="physx_cuda")
    camera = dict(width=SIZE, height=SIZE)
    kw.update(obs_mode="state", render_mode="rgb_array", human_render_camera_configs=camera)
    return gym.make("PushCube-v1", num_envs=num_envs, max_episode_steps=LIMIT, **kw)


class Probe(gym.Wrapper):
    """Below RecordClips: renders every env after each reset and step, and ends an episode of
    env 0 by termination at the given steps (counted over the whole run), as a task's fail
    condition would."""

    def __init__(self, env, terminate_at=()):
        super().__init__(env)
        self.frames = []  # (event, uint8 [N, H, W, 3])
        self.terminate_at = set(terminate_at)
        self.t = 0

    def _shot(self, event):
        base = self.env.unwrapped
        self.frames.append((event, render_rows(base, list(range(base.num_envs))).numpy()))

    def reset(self, **kw):
        out = self.env.reset(**kw)
        self._shot("reset")
        return out

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        self.t += 1
        if self.t in self.terminate_at:
            term = term.clone()
            term[0] = True
        self._shot("step")
        return obs, rew, term, trunc, info


def actions(env, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand((env.num_envs, *env.single_action_space.shape), generator=g) * 2 - 1


@pytest.fixture(scope="module", autouse=True)
def one_env():
    """One env alive for the whole module: SAPIEN's render device lives while any env does, and
    bringing it up again on lavapipe costs about 30 s, each time the last env is freed."""
    env = make()
    yield env
    env.close()


# --------------------------------------------------------------------------- the example


def test_example_eval_clips_start_on_a_fresh_seeded_reset(tmp_path):
    """examples/maniskill_own_loop.py on the CPU sim: 2 eval envs, 3 evaluations. Frame 0 of every
    eval clip is a second env's render right after a reset with the clip's seed, and never the
    previous clip's last frame."""
    gc = _load_gpu_check()
    out = tmp_path / "run"
    cmd = gc.own_loop_command(out, "cpu", 2, 1, SIZE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the example imports rlrec from this checkout
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    clips = gc.own_loop_clips(out / "eval")
    assert sorted(Path(d).name for d in clips) == ["env0", "env1"]
    for d, metas in clips.items():
        i = int(Path(d).name[3:])
        # gymnasium's vector env seeds sub-env i with seed + i; evaluation k resets with 1000 + k
        assert [m["seed"] for m in metas] == [1000 + k + i for k in range(3)]
    rows = gc.own_loop_first_frames(out / "eval", "cpu", SIZE, 2)
    assert len(rows) == 6
    assert all(r["frames"] == gc.OWN_LOOP_STEPS + 1 for r in rows)
    assert all(r["to_reset"] == 0.0 for r in rows), rows
    prev = [r["to_previous_last"] for r in rows if r["to_previous_last"] is not None]
    assert len(prev) == 4 and all(d > 1.0 for d in prev), rows


# --------------------------------------------------------------------------- the wrapper


def vector(probe, out, ignore=False, **kw):
    """``ManiSkillVectorEnv(RecordClips(probe))`` with auto_reset (lossless clips, no
    trajectories); ``ignore``: the vector wrapper ignores terminations."""
    kw = dict(save_trajectory=False, lossless=True, **kw)
    rec = RecordClips(probe, out, **kw)
    return ManiSkillVectorEnv(
        rec, rec.unwrapped.num_envs, auto_reset=True, ignore_terminations=ignore
    )


def assert_shots(clips, expected):
    assert len(clips) == len(expected)
    for clip, want in zip(clips, expected):
        frames = decode(clip.path)[0]
        assert len(frames) == len(want) and all(np.array_equal(a, b) for a, b in zip(frames, want))


def test_partial_resets_in_step_terminal_frames_sidecar_and_final_clip(tmp_path):
    """ManiSkillVectorEnv(RecordClips(...)) with auto_reset: the vector wrapper resets the done env
    inside step (options={"env_idx": ...}). Each clip starts on the frame of that reset and ends
    on the true terminal state (a termination, then a truncation); close() saves the clip in
    progress (save_on_reset)."""
    probe, clips = Probe(make(), terminate_at={3}), []
    env = vector(probe, tmp_path, video_fps=None, on_clip=clips.append)
    env.reset(seed=11)
    rewards = []
    for i in range(3 + LIMIT + 2):  # episode 1 terminates at 3, episode 2 truncates, 2 more steps
        rewards.append(float(env.step(actions(env, i))[1][0]))
    env.close()
    # the probe saw: reset, 3 steps, (in-step) reset, LIMIT steps, reset, 2 steps
    events = [e for e, _ in probe.frames]
    assert events == ["reset", *["step"] * 3, "reset", *["step"] * LIMIT, "reset", "step", "step"]
    shots = [f[0] for _, f in probe.frames]
    expect = [shots[0:4], shots[4 : 5 + LIMIT], shots[5 + LIMIT :]]
    assert_shots(clips, expect)
    # terminal frames are the terminal states, not the fresh state of the reset that followed
    for k in (0, 1):
        last, nxt = decode(clips[k].path)[0][-1], expect[k + 1][0]
        assert np.abs(last.astype(int) - nxt.astype(int)).mean() > 1.0
    s = [sidecar(c.path) for c in clips]
    assert s[0]["seed"] == 11 and s[1]["seed"] is None  # unseeded partial reset: not known
    assert [x["fps"] for x in s] == [20.0] * 3  # video_fps=None: real time, 1 / 0.05 s
    assert [x["frames"] for x in s] == [4, LIMIT + 1, 3]
    ends = [(x["envs"][0]["end"], x["envs"][0]["length"]) for x in s]
    assert ends == [("terminated", 3), ("truncated", LIMIT), ("cut", 2)]
    assert s[0]["envs"][0]["return"] == pytest.approx(sum(rewards[:3]), rel=1e-5)
    assert s[1]["envs"][0]["return"] == pytest.approx(sum(rewards[3 : 3 + LIMIT]), rel=1e-5)


def test_the_autoreset_after_an_evaluation_leaves_no_one_frame_clip(tmp_path):
    """ManiSkillVectorEnv resets the finished env inside the last step of an evaluation, which
    starts a clip (trigger always); the next evaluation's full reset ends it on that reset frame
    alone, and it is dropped (as RecordEpisode drops one-frame videos). The next clip starts on
    the full reset's frame."""
    probe, clips = Probe(make()), []
    env = vector(probe, tmp_path, ignore=True, on_clip=clips.append)
    env.reset(seed=21)
    for i in range(LIMIT):  # truncates; the vector wrapper resets env 0 inside this last step
        env.step(actions(env, i))
    env.reset(seed=22)
    for i in range(2):
        env.step(actions(env, 100 + i))
    env.close()
    events = [e for e, _ in probe.frames]
    assert events == ["reset", *["step"] * LIMIT, "reset", "reset", "step", "step"]
    shots = [f[0] for _, f in probe.frames]
    assert_shots(clips, [shots[: 1 + LIMIT], shots[2 + LIMIT :]])  # not the autoreset's frame
    assert [sidecar(c.path)["seed"] for c in clips] == [21, 22]
    assert_only_clips(tmp_path, clips)


def test_ignore_terminations_records_to_truncation_and_a_mismatch_is_logged(tmp_path, caplog):
    probe, clips = Probe(make(), terminate_at={2}), []
    kw = dict(ignore_terminations=True, max_steps_per_video=3, on_clip=clips.append)
    env = vector(probe, tmp_path / "a", ignore=True, **kw)
    env.reset(seed=3)
    for i in range(LIMIT):
        env.step(actions(env, i))
    env.close()
    # max_steps_per_video=3: 4 frames (the reset frame and 3 steps), the termination at step 2
    # ignored as the vector wrapper ignores it; the second clip: the next episode's reset frame
    shots = [f[0] for _, f in probe.frames]
    assert len(clips) == 2
    assert_shots(clips[:1], [shots[:4]])
    assert sidecar(clips[0].path)["fps"] == 30.0  # video_fps default: every step, played at 30
    # RecordClips not told that terminations are ignored: its clip ends at the termination, and
    # the step after it (no reset) is logged once
    env = vector(Probe(make(), terminate_at={2}), tmp_path / "b", ignore=True)
    env.reset(seed=3)
    with caplog.at_level(logging.WARNING, logger="rlrec.record.wrappers.maniskill"):
        for i in range(4):
            env.step(actions(env, i))
    env.close()
    msgs = [r.getMessage() for r in caplog.records if r.name == "rlrec.record.wrappers.maniskill"]
    assert len(msgs) == 1 and "ignore_terminations=True" in msgs[0]


def test_save_on_reset_false_drops_the_clip_in_progress_and_trajectories_still_save(tmp_path):
    rec = RecordClips(make(), tmp_path, save_on_reset=False, trajectory_name="traj", lossless=True)
    rec.reset(seed=0)
    for i in range(2):
        rec.step(actions(rec.unwrapped, i))
    rec.close()
    assert not list(tmp_path.glob("*.mp4"))
    # save_trajectory=True (RecordEpisode's default): ManiSkill's RecordEpisode writes them
    assert (tmp_path / "traj.h5").is_file() and (tmp_path / "traj.json").is_file()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(render_substeps=True), "render_substeps=True .* allowed value is False"),
        (dict(max_steps_per_video=0), "max_steps_per_video=0 .* positive int"),
        (dict(video_fps=-1), "video_fps=-1 .* positive number or None"),
        (dict(video_fps=float("nan")), "video_fps=nan"),
        (dict(save_video="yes"), "save_video='yes' .* True, False"),
        (dict(env_idx=[3]), r"env_idx=\[3\] .* \[0, 0\]"),
        (dict(trigger="bogus"), "trigger='bogus' .* always"),
        (dict(trigger="episode"), "needs RecordClips.every"),
        (dict(fps=10), "fps= is RecordEpisode's video_fps="),
        (dict(output_dir_typo=1), "unknown argument 'output_dir_typo'.* lossless"),
        (dict(save_video_trigger=3), "save_video_trigger=3 .* callable"),
        (dict(save_video_trigger=lambda s: True, trigger="always"), "both set"),
        (dict(quality=11), "quality=11 .* 1..10"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(one_env, tmp_path, kwargs, match):
    out = tmp_path / "videos"
    with pytest.raises(ConfigError, match=match):
        RecordClips(one_env, output_dir=out, save_trajectory=True, **kwargs)
    assert not out.exists()  # neither the video dir nor a trajectory file was made


def test_a_non_maniskill_env_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="env must be a ManiSkill env"):
        RecordClips(gym.make("CartPole-v1"), output_dir=tmp_path / "v")
    assert not (tmp_path / "v").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU sim needs CUDA")
def test_gpu_batch_partial_resets_of_another_env_and_of_the_recorded_env(tmp_path):
    """physx_cuda, 4 envs: a partial reset of env 2 alone (env 0's clip goes on), then of env 0
    by the vector wrapper inside step; every clip's frames are the probe's renders of env 0 (GPU:
    within a small tolerance)."""
    probe, clips = Probe(make("gpu", num_envs=4), terminate_at={3}), []
    env = vector(probe, tmp_path, env_idx=[0], on_clip=clips.append)
    env.reset(seed=5)
    env.reset(options={"env_idx": torch.tensor([2], device=env.device)})  # not the recorded env
    for i in range(3 + 2):
        env.step(actions(env, i).to(env.device))
    env.close()
    shots = [f[0] for _, f in probe.frames]  # env 0: full reset, reset of env 2, steps, ...
    want = [[shots[0], *shots[2:5]], shots[5:8]]  # the partial reset of env 2 is no frame
    assert len(clips) == 2
    for clip, expect in zip(clips, want):
        frames = decode(clip.path)[0]
        assert len(frames) == len(expect)
        for a, b in zip(frames, expect):
            assert np.abs(a.astype(np.float32) - b.astype(np.float32)).mean() <= 0.5
