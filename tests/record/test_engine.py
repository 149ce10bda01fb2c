"""ClipEngine driven by its two events, and the sidecar beside every clip, on the built-in env."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs.builtin import PointReach
from rlrec.record import ClipEngine, Schedule, Source, names
from rlrec.record.sidecar import sidecar_path
from tests.record.recutil import Spy, decode, listing, make_stack, random_actions, rec_cfg


def _run(stack, steps, seed=0, gen_seed=0):
    """Steps ``stack`` with seeded random actions; per step the rewards, dones and successes."""
    gen = torch.Generator().manual_seed(gen_seed)
    stack.reset(seed=seed)
    log = []
    for _ in range(steps):
        _, reward, terminated, truncated, info = stack.step(random_actions(stack, gen))
        log.append((reward.clone(), terminated.clone(), truncated.clone(), info["success"].clone()))
    return log


def _episodes_of(log, env):
    """Per episode of ``env``: (return, length, end, success), from the step log."""
    out, ret, length, success = [], 0.0, 0, False
    for reward, term, trunc, succ in log:
        ret += float(reward[env])
        length += 1
        success |= bool(succ[env])
        if term[env] or trunc[env]:
            out.append((ret, length, "terminated" if term[env] else "truncated", success))
            ret, length, success = 0.0, 0, False
    return out


def test_every_clip_has_a_sidecar_saying_what_it_shows(tmp_path):
    stack, rec, _, clips = make_stack(
        tmp_path, num_envs=2, max_steps=12, trigger="always", env_idx=[0, 1], size=16
    )
    log = _run(stack, 40, seed=5)
    stack.close()
    eps0, eps1 = _episodes_of(log, 0), _episodes_of(log, 1)
    assert len(clips) >= 3
    assert sorted(listing(tmp_path)) == sorted(
        [os.path.basename(c.path) for c in clips] + [os.path.basename(c.sidecar) for c in clips]
    )
    for n, clip in enumerate(clips):
        assert clip.sidecar == sidecar_path(clip.path)
        with open(clip.sidecar) as f:
            side = json.load(f)
        with open(clip.path, "rb") as f:
            assert side["sha256"] == hashlib.sha256(f.read()).hexdigest()
        frames, _ = decode(clip.path)
        assert side["frames"] == clip.num_frames == len(frames)
        assert (side["height"], side["width"]) == frames.shape[1:3] == (16, 32)  # a 1x2 grid
        assert side["fps"] == pytest.approx(clip.fps)
        assert side["encoder"]["codec"] == "libx264rgb" and side["encoder"]["lossless"]
        assert side["env_idx"] == [0, 1] and side["kind"] == "train"
        assert side["episodes"][0] == clip.episode == n  # trigger=always: one clip per episode
        assert side["seed"] == (5 if n == 0 else None)  # later episodes began at autoresets
        e0 = side["envs"][0]
        if n == len(eps0):  # the episode in progress at close, saved by record_final_episode
            assert n == len(clips) - 1 and e0["end"] == "cut"
            assert side["last_step"] == 40 == side["first_step"] + e0["length"]
            continue
        # the clip follows env 0's episode from its reset to its terminal frame
        ret, length, end, success = eps0[n]
        assert (e0["env"], e0["length"], e0["end"], e0["success"]) == (0, length, end, success)
        assert e0["return"] == pytest.approx(ret, abs=1e-4)
        assert side["last_step"] - side["first_step"] == length == clip.num_frames - 1
        # env 1's episode of the clip's start: ended inside the clip, or cut by its end
        e1 = side["envs"][1]
        assert e1["episode"] == side["episodes"][1]
        if e1["end"] != "cut":
            done_at = sum(e[1] for e in eps1[: e1["episode"] + 1])
            assert side["first_step"] < done_at <= side["last_step"]


def test_a_clip_cut_by_its_length_says_cut(tmp_path):
    stack, rec, _, clips = make_stack(tmp_path, max_steps=30, trigger="always", length_frames=4)
    _run(stack, 10)
    stack.close()
    with open(clips[0].sidecar) as f:
        side = json.load(f)
    assert side["frames"] == 4 and side["envs"][0]["end"] == "cut"
    assert side["envs"][0]["length"] == 3 and side["last_step"] == 3


def _engine(tmp_path, env, name_prefix=None, **kw):
    """An engine of ``env`` (an adapter: a Source as it is); ``kw``: settings, and the
    schedule's ``episode_fn``, ``step_fn``, ``provisional``."""
    clips: list = []
    fields = ("trigger", "every", "length_frames", "record_final_episode")
    cfg = rec_cfg(**{k: kw.pop(k) for k in list(kw) if k in fields})
    name = None if name_prefix is None else names.prefixed(name_prefix, "recorder")
    engine = ClipEngine(
        cfg, env, str(tmp_path), on_clip=clips.append, schedule=Schedule.of(cfg, **kw), name=name
    )
    return engine, clips


def test_callable_episode_trigger_is_asked_once_per_episode_and_names_like_gymnasium(tmp_path):
    env = PointReach(1, max_episode_steps=3, render_width=16, render_height=16, seed=0)
    asked = []
    engine, clips = _engine(
        tmp_path,
        env,
        episode_fn=lambda ep: asked.append(ep) or ep % 2 == 0,
        name_prefix="rl-video",
        length_frames=2,  # short clips end long before their episodes: no re-firing
    )
    _drive(engine, env, 12)
    engine.close()
    assert asked == [0, 1, 2, 3, 4]
    assert [os.path.basename(c.path) for c in clips] == [
        "rl-video-episode-0.mp4",
        "rl-video-episode-2.mp4",
        "rl-video-episode-4.mp4",
    ]


def test_step_trigger_and_next_step_autoreset_frames(tmp_path):
    """Driven the way an autoreset-on-the-next-step vector env is: the step after the terminal
    one resets the env; it is counted but is not a frame (the reset frame is taken at on_reset)."""
    env = Spy(PointReach(1, max_episode_steps=4, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(tmp_path, env, step_fn=lambda s: s == 2, name_prefix="v")
    env.reset(seed=0)
    engine.on_reset(None, seed=0)
    pending_reset = False
    for _ in range(10):
        if pending_reset:  # this "step" resets the env instead of stepping it
            env.reset(env_idx=[0])
            engine.on_reset([0])
            engine.on_step(np.zeros(1), np.zeros(1, bool), np.zeros(1, bool), stepped=False)
            pending_reset = False
            continue
        out = env.step(torch.zeros(1, 2))
        engine.on_step(out[1].numpy(), out[2].numpy(), out[3].numpy(), {})
        pending_reset = bool(out[2][0] | out[3][0])
    engine.close()
    # step 2 starts a clip mid-episode 0 (its frames: after steps 2, 3, 4 = terminal)
    assert [os.path.basename(c.path) for c in clips] == ["v-step-2.mp4"]
    frames, _ = decode(clips[0].path)
    assert np.array_equal(frames, np.stack(env.episodes[0][2:]))
    assert engine.steps == 10


def test_episode_and_step_triggers_together_start_a_clip_when_either_fires(tmp_path):
    """As Gymnasium's RecordVideo: both callables given, each starts clips of its own name."""
    env = PointReach(1, max_episode_steps=4, render_width=16, render_height=16, seed=0)
    asked = []
    engine, clips = _engine(
        tmp_path,
        env,
        episode_fn=lambda ep: asked.append(ep) or ep == 2,
        step_fn=lambda s: s == 1,
        name_prefix="v",
        length_frames=2,
    )
    _drive(engine, env, 12)
    engine.close()
    assert asked == [0, 1, 2, 3]  # once per episode
    names = [os.path.basename(c.path) for c in clips]
    assert names == ["v-step-1.mp4", "v-episode-2.mp4"]
    assert [c.episode for c in clips] == [0, 2]


def test_bad_engine_arguments_are_refused_naming_them(tmp_path):
    env = PointReach(1, render_width=16, render_height=16)
    with pytest.raises(ConfigError, match="name_prefix='../x'"):
        _engine(tmp_path, env, name_prefix="../x")
    with pytest.raises(ConfigError, match=r"recorder.env_idx=\[3\]"):
        ClipEngine(rec_cfg(env_idx=[3]), Source(1, 0.1, "cpu", env.render), str(tmp_path))
    with pytest.raises(ConfigError, match=r"recorder.dir \(or the run's video dir\) is not set"):
        ClipEngine(rec_cfg(), env)
    assert listing(tmp_path) == []  # nothing written before the arguments were checked


def test_settings_are_checked_once_and_again_only_when_changed(tmp_path, monkeypatch):
    """A run's recorder settings are checked before any work (rlrec.config.validate) and the
    engine is then built from the same object: the check (its directory probe included) runs
    once; a setting changed since is checked again."""
    from rlrec.record import settings

    probes = []
    monkeypatch.setattr(settings, "probe_dir", lambda *a, **k: probes.append(a))
    env = PointReach(2, render_width=16, render_height=16)
    cfg = rec_cfg(dir=str(tmp_path / "videos"))
    cfg.check(2, "recorder")
    engine = ClipEngine(cfg, env)
    engine.close()
    assert len(probes) == 1 and os.path.isdir(cfg.dir)  # probed once, then created
    cfg.env_idx = [2]
    with pytest.raises(ConfigError, match=r"recorder.env_idx=\[2\] is invalid"):
        cfg.check(2, "recorder")
    with pytest.raises(ConfigError, match=r"eval_env.recorder.env_idx=\[2\]"):
        cfg.check(2, "eval_env.recorder")


def test_render_returning_the_wrong_thing_is_a_clear_error(tmp_path):
    engine, _ = _engine(
        tmp_path,
        PointReach(1, render_width=16, render_height=16),
        trigger="always",
    )
    engine.render = lambda idx: np.zeros((1, 8, 8), np.uint8)
    with pytest.raises(TypeError, match=r"render\(\[0\]\) returned torch.uint8 \(1, 8, 8\)"):
        engine.on_reset(None)
    engine.close()


def _drive(engine, env, steps):
    """Same-step autoreset, as AutoReset (or a Genesis Forge env) does it."""
    env.reset(seed=0)
    engine.on_reset(None, seed=0)
    for _ in range(steps):
        out = env.step(torch.zeros(env.num_envs, 2))
        engine.on_step(*out[1:])
        done = out[2] | out[3]
        if done.any():
            env.reset(env_idx=done.nonzero().flatten())
            engine.on_reset(done.nonzero().flatten())


def test_provisional_clips_saves_the_untriggered_episode_in_progress_at_close(tmp_path):
    env = Spy(PointReach(1, max_episode_steps=4, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(tmp_path, env, episode_fn=lambda ep: ep == 0, provisional=True)
    _drive(engine, env, 11)  # episodes 0, 1 (untriggered, dropped), 2 (in progress: 3 steps)
    engine.close()
    assert [c.episode for c in clips] == [0, 2]
    assert np.array_equal(decode(clips[0].path)[0], np.stack(env.episodes[0]))
    assert np.array_equal(decode(clips[1].path)[0], np.stack(env.episodes[2]))
    # the dropped provisional clip left nothing behind
    assert sorted(listing(tmp_path)) == sorted(
        [os.path.basename(c.path) for c in clips] + [os.path.basename(c.sidecar) for c in clips]
    )
    assert engine.clips_started == 1  # provisional clips are not counted as started


def test_provisional_clips_with_a_length_keeps_the_first_frames_of_the_last_episode(tmp_path):
    env = Spy(PointReach(1, max_episode_steps=6, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(
        tmp_path, env, episode_fn=lambda ep: False, length_frames=2, provisional=True
    )
    _drive(engine, env, 10)  # episode 1 in progress (4 steps)
    engine.close()
    assert [(c.episode, c.num_frames) for c in clips] == [(1, 2)]
    assert np.array_equal(decode(clips[0].path)[0], np.stack(env.episodes[1][:2]))


def test_a_provisional_clip_never_holds_back_a_step_trigger(tmp_path):
    env = Spy(PointReach(1, max_episode_steps=5, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(
        tmp_path, env, step_fn=lambda s: s == 2, provisional=True, name_prefix="v"
    )
    _drive(engine, env, 5)  # the step trigger at step 2, mid-episode 0, which ends at step 5
    engine.close()
    # episode 0 from step 2 to its terminal frame; episode 1 in progress at close (its reset frame)
    assert [os.path.basename(c.path) for c in clips] == ["v-step-2.mp4", "v-step-5.mp4"]
    assert np.array_equal(decode(clips[0].path)[0], np.stack(env.episodes[0][2:6]))
    assert np.array_equal(decode(clips[1].path)[0], np.stack(env.episodes[1]))


def test_expect_end_turns_provisional_clips_off(tmp_path):
    env = Spy(PointReach(1, max_episode_steps=4, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(tmp_path, env, episode_fn=lambda ep: ep == 0, provisional=True)
    engine.expect_end(11)
    _drive(engine, env, 11)
    engine.close()
    assert not engine.schedule.provisional
    # the schedule's arming: only episode 2 (begun within the last 4 steps) besides episode 0
    assert [c.episode for c in clips] == [0, 2]
    assert len(env.render_requests) == 5 + 4  # episode 1 was never rendered


def test_an_autoreset_clip_that_a_reset_ends_before_any_step_is_dropped(tmp_path):
    """A vector env that autoresets inside step starts the recorded env's next episode right after
    the last step of an evaluation; the caller's full reset then ends that clip on its reset frame
    alone. Such a clip is dropped. Kept: a one-frame clip that a full reset began (ended by the
    next full reset), one asked for (length_frames=1), and the one-frame clip in progress at
    close (record_final_episode)."""
    env = Spy(PointReach(1, max_episode_steps=3, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(tmp_path / "a", env, trigger="always")

    def episode(steps):
        for _ in range(steps):
            out = env.step(torch.zeros(1, 2))
            engine.on_step(out[1], out[2], out[3], out[4])
            if bool(out[2][0] | out[3][0]):  # the autoreset inside the vector env's step
                env.reset(env_idx=[0])
                engine.on_reset([0])

    for k in range(2):  # two evaluations, each a full reset and one whole episode
        env.reset(seed=k)
        engine.on_reset(None, seed=k)
        episode(3)
    engine.close()  # the second autoreset's clip is in progress: record_final_episode keeps it
    assert engine.clips_started == 4
    assert [c.num_frames for c in clips] == [4, 4, 1]  # the first autoreset's clip: dropped
    for k, clip in enumerate(clips[:2]):
        frames, _ = decode(clip.path)
        assert np.array_equal(frames, np.stack(env.episodes[2 * k]))  # reset frame + 3 steps
        with open(clip.sidecar) as f:
            side = json.load(f)
        assert (side["seed"], side["envs"][0]["end"], side["frames"]) == (k, "truncated", 4)
    assert sorted(listing(tmp_path / "a")) == sorted(
        os.path.basename(p) for c in clips for p in (c.path, c.sidecar)
    )

    # length None: a full reset's one-frame clip cut by the next full reset; 1: one-frame clips
    for length in (None, 1):
        engine, clips = _engine(
            tmp_path / f"len{length}",
            env,
            trigger="always",
            length_frames=length,
            record_final_episode=False,
        )
        for seed in (7, 8, 9):
            env.reset(seed=seed)
            engine.on_reset(None, seed=seed)
        engine.close()
        assert [c.num_frames for c in clips] == [1, 1] if length is None else [1, 1, 1]


def test_a_step_trigger_clip_that_a_reset_cuts_before_its_next_step_is_kept(tmp_path):
    """The step trigger fires mid-episode and the caller's full reset comes before the next step:
    the clip holds one real state of the episode (the one the trigger fired at), so it is kept,
    ending "cut", unlike the reset frame alone of an autoreset's clip (above)."""
    env = Spy(PointReach(1, max_episode_steps=10, render_width=16, render_height=16, seed=0))
    engine, clips = _engine(tmp_path, env, step_fn=lambda s: s == 2, name_prefix="v")
    env.reset(seed=0)
    engine.on_reset(None, seed=0)
    for _ in range(2):
        out = env.step(torch.zeros(1, 2))
        engine.on_step(out[1], out[2], out[3], out[4])
    assert engine.recording  # the trigger fired after step 2
    env.reset(seed=1)  # e.g. the caller's own full reset, before any further step
    engine.on_reset(None, seed=1)
    engine.close()
    assert [os.path.basename(c.path) for c in clips] == ["v-step-2.mp4"]
    frames, _ = decode(clips[0].path)
    assert np.array_equal(frames, np.stack(env.episodes[0][2:3]))  # the state after step 2
    with open(clips[0].sidecar) as f:
        side = json.load(f)
    assert (side["frames"], side["envs"][0]["end"], side["envs"][0]["length"]) == (1, "cut", 0)
    assert engine.clips_started == engine.clips_saved == 1


# three envs, each a black 4x4 frame
_BLANK = Source(3, 0.1, "cpu", lambda idx: np.zeros((len(idx), 4, 4, 3), np.uint8))


def _drive_forms(tmp_path, name, events, host):
    """Drives a trigger=always engine of 3 envs recording [0, 2] through ``events``, each value
    handed over as ``host(array)``; returns its sidecars (the parts that say what they show)."""
    sidecars = []
    engine = ClipEngine(
        rec_cfg(env_idx=[0, 2]), _BLANK,
        str(tmp_path / name), on_clip=lambda c: sidecars.append(c.sidecar),
    )  # fmt: skip
    for event in events:
        if event[0] == "reset":
            engine.on_reset(None if event[1] is None else host(event[1]))
        else:
            reward, term, trunc, success = (np.asarray(v) for v in event[1:])
            info = {"success": host(success)}
            engine.on_step(host(reward), host(term), host(trunc), info)
    engine.close()
    out = []
    for path in sidecars:
        with open(path) as f:
            side = json.load(f)
        out.append((side["episodes"], side["first_step"], side["last_step"], side["envs"]))
    return out


def test_the_sidecar_is_the_same_whatever_form_the_step_values_take(tmp_path):
    """Host arrays, CPU tensors and tensors without a numpy dtype (bfloat16, read through the
    gathered copy a device takes) give the same sidecars; resets named by lists, tuples, index
    tensors and bool masks count the recorded envs' episodes alike."""
    f, t = False, True
    step = lambda r, term, trunc, s: ("step", r, term, trunc, s)  # noqa: E731
    events = [
        ("reset", None),
        step([0.5, 9.0, 0.25], [f, f, f], [f, f, f], [0, 0, 1]),
        step([1.5, 9.0, -0.5], [f, t, t], [f, f, f], [1, 0, 0]),  # env 2 ends, env 1 too
        ("reset", [1, 2]),
        step([2.0, 9.0, 4.0], [f, f, f], [f, f, t], [0, 0, 1]),  # env 2 ends again
        ("reset", [f, f, t]),
        step([0.25, 9.0, 1.0], [t, f, f], [t, f, f], [0, 0, 0]),  # env 0 ends: the clip too
        ("reset", [0]),
        step([1.0, 9.0, 1.0], [f, f, f], [f, f, f], [0, 0, 0]),
    ]
    forms = {
        "numpy": lambda v: np.asarray(v),
        "tensor": lambda v: torch.as_tensor(np.asarray(v)),
        "bfloat16": lambda v: (
            torch.as_tensor(np.asarray(v, dtype=np.float32)).bfloat16()
            if np.asarray(v).dtype != np.bool_ and np.asarray(v).dtype.kind == "f"
            else torch.as_tensor(np.asarray(v))
        ),
        "lists": lambda v: list(np.asarray(v).tolist()),
    }
    results = {name: _drive_forms(tmp_path, name, events, host) for name, host in forms.items()}
    expected = results.pop("numpy")
    assert all(r == expected for r in results.values()), results
    first, second = expected  # env 0's two episodes: one ended in the clip, one cut by close
    assert first[:3] == ([0, 0], 0, 4)
    e0, e2 = first[3]
    assert (e0["return"], e0["length"], e0["end"], e0["success"]) == (4.25, 4, "terminated", True)
    # env 2's episode of the clip's start ended at its second step (terminated)
    assert (e2["return"], e2["length"], e2["end"], e2["success"]) == (-0.25, 2, "terminated", True)
    assert second[:3] == ([1, 2], 4, 5)  # env 2: episode 2 began at the reset by mask
    assert [e["end"] for e in second[3]] == ["cut", "cut"]


@pytest.mark.parametrize("env_idx", [[0, 2], [1, 2]])  # recorded envs apart, and side by side
def test_a_long_clips_returns_are_the_float32_sums_in_step_order(tmp_path, env_idx):
    """While every recorded episode runs on, a step's rewards wait as plain rows and are summed
    later, many at a time: the sidecar's returns are still ``ret += reward`` in float32 step by
    step (not a float64 sum, nor a pairwise one), through an episode that ends after hundreds of
    such steps while another runs on, and lengths count the steps of each episode."""
    rng = np.random.default_rng(0)
    steps, ends_at = 700, 600  # env_idx[1]'s episode terminates at step 600, env_idx[0]'s runs on
    rewards = rng.standard_normal((steps, 3)) * 10.0 ** rng.integers(-3, 4, (steps, 3))
    rewards = rewards.astype(np.float32)
    engine = ClipEngine(
        rec_cfg(env_idx=env_idx), _BLANK,
        str(tmp_path), on_clip=lambda c: None,
    )  # fmt: skip
    sidecars = []
    engine.on_clip = lambda c: sidecars.append(c.sidecar)
    engine.on_reset(None)
    second = env_idx[1]
    for n in range(steps):
        term = np.zeros(3, bool)
        term[second] = n + 1 == ends_at
        engine.on_step(
            torch.from_numpy(rewards[n]), torch.from_numpy(term), torch.zeros(3, dtype=torch.bool)
        )
    engine.close()
    with open(sidecars[0]) as f:
        first_env, second_env = json.load(f)["envs"]

    def in_order(column, n):
        ret = np.float32(0)
        for r in column[:n]:
            ret = np.float32(ret + r)
        return float(ret)

    expected = (in_order(rewards[:, env_idx[0]], steps), in_order(rewards[:, second], ends_at))
    assert (first_env["return"], second_env["return"]) == expected
    # the test tells the sums apart: a float64 or a pairwise float32 sum would differ
    assert float(np.float32(rewards[:, env_idx[0]].astype(np.float64).sum())) != expected[0]
    assert float(rewards[:, env_idx[0]].sum()) != expected[0]
    assert (first_env["length"], first_env["end"]) == (steps, "cut")
    assert (second_env["length"], second_env["end"]) == (ends_at, "terminated")
