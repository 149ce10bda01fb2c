"""RecordVectorVideo on real Gymnasium vector envs, in each autoreset mode: every clip, decoded
(lossless), equals the frames an independent vector env rendered (tests/record/gymref.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from gymnasium.wrappers.vector import RecordVideo as GymRecordVideo

from rlrec.checks import ConfigError
from rlrec.record import RecordVectorVideo, RenderHook
from rlrec.testing import decode
from tests.record.gymref import (
    CountRenders,
    actions_for,
    drive,
    make_vec,
    reference,
    render_counts,
)
from tests.record.recutil import sidecar

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
NEXT, SAME, DISABLED = MODES
CARTPOLE = "CartPole-v1"


def run(tmp_path, n, mode, steps, seed=0, env_id=CARTPOLE, vectorization="sync", **rec_kw):
    """Records a seeded run (lossless); returns the wrapper (closed) and the reference renders
    of the recorded envs by an independent vector env. ``env_kw``: of the sub-envs."""
    env_kw = rec_kw.pop("env_kw", {})
    wrappers = [RenderHook] if vectorization == "async" and mode is SAME else None
    vec = make_vec(env_id, n, mode, vectorization, wrappers=wrappers, **env_kw)
    actions = actions_for(vec, steps, seed)
    rec = RecordVectorVideo(vec, str(tmp_path), **{"lossless": True, **rec_kw})
    drive(rec, mode, actions, seed)
    rec.close()
    watch = rec.engine.env_idx
    return rec, reference(env_id, n, mode, actions, seed, watch, **env_kw)


def assert_frames(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: {got.shape} frames, expected {want.shape}"
    for j, (a, b) in enumerate(zip(got, want)):
        if not np.array_equal(a, b):
            bad = np.argwhere((a != b).any(-1))
            raise AssertionError(f"{what}: frame {j} of {len(want)} differs at {len(bad)} pixels")


def names(folder) -> list:
    return sorted(p.name for p in folder.glob("*.mp4"))


# ----------------------------------------------------------------------------- every mode
CASES = [
    pytest.param(CARTPOLE, {}, "sync", 3, 1, 90, id="cartpole-sync"),
    pytest.param(CARTPOLE, {}, "async", 2, 0, 90, id="cartpole-async"),
    pytest.param("InvertedPendulum-v5", dict(width=64, height=48), "sync", 2, 0, 60, id="mujoco"),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("env_id,env_kw,vectorization,n,first,steps", CASES)
def test_every_episode_matches_independent_renders(
    tmp_path, mode, env_id, env_kw, vectorization, n, first, steps
):
    seed = 7
    want_fps = 50 if env_id == CARTPOLE else 25  # render_fps 50; MuJoCo: 1 / dt
    kw = dict(env_kw=env_kw, env_idx=first, episode_trigger=lambda e: True)
    rec, ref = run(tmp_path, n, mode, steps, seed, env_id, vectorization, **kw)
    episodes = len(ref.starts[first])
    assert episodes >= 3, "the run is too short to cross episode boundaries"
    assert names(tmp_path) == sorted(f"rl-video-episode-{e}.mp4" for e in range(episodes))
    assert not rec.engine.errors
    for e in range(episodes):
        path = tmp_path / f"rl-video-episode-{e}.mp4"
        frames, fps = decode(str(path))
        # a fresh reset frame first, the terminal frame last; the final episode (still running
        # at close) ends on the last step
        assert_frames(frames, ref.episode_frames(first, e), f"{mode.name} episode {e}")
        assert fps == pytest.approx(rec.engine.fps) == pytest.approx(want_fps)
        meta = sidecar(path)
        assert meta["episodes"] == [e] and meta["frames"] == len(frames)
        assert meta["seed"] == (seed + first if e == 0 else None)  # later ones: autoresets
        assert meta["envs"][0]["end"] == ("cut" if ref.ends[first][e] is None else "terminated")


# ----------------------------------------------------------------------------- a grid
@pytest.mark.parametrize(
    "mode, n, env_idx, episodes",
    [(NEXT, 3, [0, 2], (1, 2)), (SAME, 3, [0, 2], (1, 2)), (NEXT, 2, None, (0,))],
    ids=["NEXT_STEP", "SAME_STEP", "default-every-env"],
)
def test_grid_tiles_match_independent_renders(tmp_path, mode, n, env_idx, episodes):
    """The recorded envs side by side (a 1x2 grid), each at the same moment as the other; by
    default every sub-env is recorded (Gymnasium's default)."""
    kw = dict(env_idx=env_idx) if env_idx else {}
    rec, ref = run(tmp_path, n, mode, 60, 3, episode_trigger=lambda e: e in episodes, **kw)
    watch = rec.engine.env_idx
    assert watch == (env_idx or [0, 1])
    for e in episodes:
        path = tmp_path / f"rl-video-episode-{e}.mp4"
        start, k = ref.starts[0][e], len(ref.episode_frames(0, e))
        want = np.concatenate([ref.timeline(i, start, k) for i in watch], axis=2)
        assert_frames(decode(str(path))[0], want, f"{mode.name} grid episode {e}")
        assert sidecar(path)["env_idx"] == watch


# ----------------------------------------------------------------------------- final episode
def test_final_episode_saved_on_close_or_dropped(tmp_path):
    steps = 40
    kw = dict(env_idx=0, episode_trigger=lambda e: True)
    rec, ref = run(tmp_path / "kept", 2, NEXT, steps, 1, **kw)
    last = len(ref.starts[0]) - 1
    assert ref.ends[0][last] is None, "the last episode must still run at close"
    frames, _ = decode(str(tmp_path / "kept" / f"rl-video-episode-{last}.mp4"))
    assert_frames(frames, ref.episode_frames(0, last), "final episode")
    assert len(frames) == steps - ref.starts[0][last] + 1
    run(tmp_path / "dropped", 2, NEXT, steps, 1, record_final_episode=False, **kw)
    assert names(tmp_path / "dropped") == sorted(f"rl-video-episode-{e}.mp4" for e in range(last))


# ----------------------------------------------------------------------------- triggers
def test_episode_trigger_selects_episodes(tmp_path):
    asked = []
    trigger = lambda e: asked.append(e) or e % 2 == 1  # noqa: E731
    rec, ref = run(tmp_path, 2, SAME, 80, 2, env_idx=0, episode_trigger=trigger)
    episodes = len(ref.starts[0])
    assert asked == list(range(episodes))  # once per episode of the recorded env
    odd = [e for e in range(episodes) if e % 2 == 1]
    assert names(tmp_path) == sorted(f"rl-video-episode-{e}.mp4" for e in odd)
    for e in odd:
        frames, _ = decode(str(tmp_path / f"rl-video-episode-{e}.mp4"))
        assert_frames(frames, ref.episode_frames(0, e), f"episode {e}")


def test_step_trigger_and_video_length(tmp_path):
    """``step_trigger(s)`` is asked with Gymnasium's step id (0 after the first step): the
    ``step-10`` clip starts on the state after step 11."""
    length, trigger = 6, lambda s: s in (10, 40)
    kw = dict(env_idx=0, step_trigger=trigger, video_length=length)
    rec, ref = run(tmp_path, 2, DISABLED, 60, 4, **kw)
    assert names(tmp_path) == ["rl-video-step-10.mp4", "rl-video-step-40.mp4"]
    for step_id in (10, 40):
        frames, _ = decode(str(tmp_path / f"rl-video-step-{step_id}.mp4"))
        # the clip starts on the state after step step_id + 1 (if that step ended the episode,
        # on the reset that followed it)
        step = step_id + 1
        e = max(e for e, start in enumerate(ref.starts[0]) if start <= step)
        end = ref.ends[0][e]
        k = length if end is None else min(length, end - step + 1)  # never across an episode end
        assert_frames(frames, ref.timeline(0, step, k), f"step {step}")


def test_episode_and_step_triggers_together_as_gymnasium(tmp_path):
    """Gymnasium's RecordVideo takes both triggers (a clip starts when either fires) and keeps
    them as attributes; so does the drop-in."""
    episode_trigger, step_trigger = (lambda e: e == 1), (lambda s: s == 3)
    triggers = dict(episode_trigger=episode_trigger, step_trigger=step_trigger)
    rec, ref = run(tmp_path, 2, NEXT, 60, 4, env_idx=0, video_length=2, **triggers)
    assert rec.episode_trigger is episode_trigger and rec.step_trigger is step_trigger
    assert ref.starts[0][1] > 4 + 2, "episode 1 must begin after the step clip"
    assert names(tmp_path) == ["rl-video-episode-1.mp4", "rl-video-step-3.mp4"]
    frames, _ = decode(str(tmp_path / "rl-video-step-3.mp4"))
    assert_frames(frames, ref.timeline(0, 4, 2), "step clip")  # Gymnasium's step id 3: step 4
    frames, _ = decode(str(tmp_path / "rl-video-episode-1.mp4"))
    assert_frames(frames, ref.timeline(0, ref.starts[0][1], 2), "episode clip")


def test_trigger_attributes_default_to_gymnasiums(tmp_path):
    from gymnasium.utils.save_video import capped_cubic_video_schedule

    rec = RecordVectorVideo(make_vec(CARTPOLE, 2, NEXT), str(tmp_path))
    rec.close()
    assert rec.step_trigger is None
    cubic = [capped_cubic_video_schedule(e) for e in range(2001)]
    assert [rec.episode_trigger(e) for e in range(2001)] == cubic


# ----------------------------------------------------------------------------- as Gymnasium's
class GymnasiumRecordVideo(GymRecordVideo):
    """Gymnasium's own vector RecordVideo, noting what each clip it saves holds: its frames, and
    how many of them a reset of other envs added (in DISABLED mode it takes a frame at every
    ``reset`` while recording, also at one that leaves env 0 running)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.saved: dict = {}
        self._partial = 0

    def reset(self, *, seed=None, options=None):
        partial = options is not None and not options["reset_mask"][0]
        out = super().reset(seed=seed, options=options)
        self._partial += partial and self.recording
        return out

    def stop_recording(self):
        if self.recorded_frames:
            self.saved[f"{self._video_name}.mp4"] = (len(self.recorded_frames), self._partial)
        self._partial = 0
        super().stop_recording()


SIDE_BY_SIDE = [
    # a step trigger fires while an episode's clip is open: that clip ends, the step's begins
    pytest.param(
        199,
        dict(step_trigger=lambda x: x == 100, episode_trigger=lambda x: x in (0, 3)),
        ["rl-video-episode-0.mp4", "rl-video-episode-3.mp4", "rl-video-step-100.mp4"],
        id="trigger-during-a-clip",
    ),
    pytest.param(
        150,
        dict(episode_trigger=lambda x: x in (1, 4), step_trigger=lambda x: x in (0, 30)),
        ["rl-video-episode-1.mp4", "rl-video-episode-4.mp4", "rl-video-step-0.mp4"]
        + ["rl-video-step-30.mp4"],
        id="both-triggers",
    ),
    # every clip cut by the next step trigger's, or ended by its episode; under NEXT_STEP step
    # id 25 is the step that resets env 0 (its clip starts on the reset state)
    pytest.param(
        199,
        dict(step_trigger=lambda x: x % 25 == 0, name_prefix="video-prefix"),
        sorted(f"video-prefix-step-{s}.mp4" for s in range(0, 200, 25)),
        id="step-triggers-name-prefix",
    ),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("steps,kwargs,want", SIDE_BY_SIDE)
def test_same_files_as_gymnasiums_record_video(tmp_path, mode, steps, kwargs, want):
    """Gymnasium's own wrapper and the drop-in on the same run (10 CartPole envs, Gymnasium's
    test suite's scenarios): the same files, each with Gymnasium's frames but for the documented
    differences (docs/recorder.md): SAME_STEP, the terminal frame Gymnasium drops; DISABLED, the
    frames Gymnasium adds at resets of other envs."""
    recs = {}
    for wrapper in (GymnasiumRecordVideo, RecordVectorVideo):
        vec = make_vec(CARTPOLE, 10, mode)
        actions = actions_for(vec, steps, seed=123)
        rec = recs[wrapper] = wrapper(vec, str(tmp_path / wrapper.__name__), **kwargs)
        drive(rec, mode, actions, seed=123)
        rec.close()
        assert names(tmp_path / wrapper.__name__) == want, wrapper
    theirs, ours = recs[GymnasiumRecordVideo], recs[RecordVectorVideo]
    assert sorted(theirs.saved) == want
    for clip in ours.clips:
        name = os.path.basename(clip.path)
        frames, partial = theirs.saved[name]
        if mode is SAME:  # Gymnasium drops an episode's terminal frame
            frames += sidecar(clip.path)["envs"][0]["end"] != "cut"
        if mode is DISABLED:
            frames -= partial
        assert clip.num_frames == frames, name


# ----------------------------------------------------------------------------- sidecar
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_sidecar_matches_episode_statistics(tmp_path, mode):
    vec = make_vec(CARTPOLE, 2, mode)
    actions = actions_for(vec, 90, seed=5)
    kw = dict(env_idx=0, lossless=True, episode_trigger=lambda e: e == 1)
    stats = RecordEpisodeStatistics(RecordVectorVideo(vec, str(tmp_path), **kw))
    episodes = []

    def keep(t, out):
        info = out[4]
        if "episode" in info and info["_episode"][0]:
            episodes.append((float(info["episode"]["r"][0]), int(info["episode"]["l"][0])))

    drive(stats, mode, actions, seed=5, on_step=keep)
    stats.close()
    assert len(episodes) >= 2
    path = tmp_path / "rl-video-episode-1.mp4"
    meta, (frames, fps), (ret, length) = sidecar(path), decode(str(path)), episodes[1]
    env = meta["envs"][0]
    assert (env["return"], env["length"]) == (pytest.approx(ret), length)
    assert env["end"] in ("terminated", "truncated")
    assert meta["frames"] == len(frames) == length + 1
    assert meta["fps"] == pytest.approx(fps)


# ----------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("vectorization,mode", [("sync", SAME), ("async", SAME), ("sync", NEXT)])
def test_only_recorded_envs_render(tmp_path, vectorization, mode):
    wrappers = [CountRenders] + ([RenderHook] if vectorization == "async" else [])
    vec = make_vec(CARTPOLE, 3, mode, vectorization, wrappers=wrappers)
    actions = actions_for(vec, 40, seed=0)
    clips = []
    kw = dict(env_idx=1, episode_trigger=lambda e: e == 1, on_clip=clips.append)
    rec = RecordVectorVideo(vec, str(tmp_path), **kw)
    drive(rec, mode, actions, seed=0)
    rec.flush()
    counts = render_counts(vec)
    rec.close()
    assert counts[0] == counts[2] == 0
    assert len(clips) == 1 and counts[1] == clips[0].num_frames > 1


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"video_aspect_ratio": (16, 9)}, "video_aspect_ratio"),
        ({"episode_trigger": 3}, "episode_trigger"),
        ({"video_length": -1}, "video_length"),
        ({"video_length": 1.5}, "video_length"),
        ({"video_length": 10, "length_sec": 1.0}, "length_sec"),
        ({"name_prefix": "a/b"}, "name_prefix"),
        ({"env_idx": 5}, "env_idx"),
        ({"env_idx": [0, 0]}, "env_idx"),
        ({"env_idx": "0"}, "env_idx"),
        ({"record_first_only": True, "env_idx": 1}, "record_first_only"),
        ({"quality": 11}, "quality"),
        ({"fps": -1}, "fps"),
        ({"preset": "warp"}, "preset"),
        ({"dt": 0}, "dt"),
    ],
)
def test_bad_arguments_fail_before_any_work(tmp_path, kwargs, match):
    with pytest.raises((ConfigError, ValueError, TypeError), match=match):
        RecordVectorVideo(make_vec(CARTPOLE, 2, NEXT), str(tmp_path / "v"), **kwargs)
    assert not (tmp_path / "v").exists()


def test_envs_it_cannot_record_are_refused(tmp_path):
    import gymnasium as gym

    with pytest.raises(ValueError, match="rgb_array"):
        RecordVectorVideo(gym.make_vec(CARTPOLE, 2), str(tmp_path / "v"))
    with pytest.raises(TypeError, match="VectorEnv"):
        RecordVectorVideo(gym.make(CARTPOLE, render_mode="rgb_array"), str(tmp_path / "v"))
    vec = make_vec(CARTPOLE, 2, SAME, "async")  # SAME_STEP without hooks: no terminal frames
    try:
        with pytest.raises(ValueError, match="RenderHook"):
            RecordVectorVideo(vec, str(tmp_path / "v"))
    finally:
        vec.close()
    assert not (tmp_path / "v").exists()


def test_bad_arguments_leave_same_step_sub_envs_unhooked(tmp_path):
    vec = make_vec(CARTPOLE, 2, SAME)
    with pytest.raises(ConfigError, match="quality"):
        RecordVectorVideo(vec, str(tmp_path / "v"), quality=0)
    assert not any(isinstance(e, RenderHook) for e in vec.envs)
    rec = RecordVectorVideo(vec, str(tmp_path / "v"), env_idx=1)
    assert isinstance(vec.envs[1], RenderHook) and not isinstance(vec.envs[0], RenderHook)
    rec.close()
