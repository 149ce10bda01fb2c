"""ClipEngine driven by its two events, and the sidecar beside every clip, on the built-in env."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.record import ClipEngine, Schedule, Source, names
from rlrec.record.sidecar import sidecar_path
from tests.record.recutil import (
    Spy,
    assert_frames,
    assert_only_clips,
    decode,
    listing,
    make_stack,
    point_reach,
    random_actions,
    rec_cfg,
    sidecar,
)


def _run(stack, steps, seed=0):
    """Steps ``stack`` with seeded random actions; per step the rewards, dones and successes."""
    gen = torch.Generator().manual_seed(0)
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
    assert_only_clips(tmp_path, clips)
    for n, clip in enumerate(clips):
        assert clip.sidecar == sidecar_path(clip.path)
        side = sidecar(clip.path)
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
    side = sidecar(clips[0].path)
    assert side["frames"] == 4 and side["last_step"] == 3
    assert (side["envs"][0]["end"], side["envs"][0]["length"]) == ("cut", 3)


def _engine(tmp_path, max_steps=10, name_prefix=None, steps=None, **kw):
    """An engine of a spied built-in env of ``max_steps``-step episodes (an adapter: a Source as
    it is); ``kw``: settings, and the schedule's ``episode_fn``, ``step_fn``, ``provisional``.
    With ``steps``: driven that many steps (:func:`_drive`) and closed."""
    env, clips = Spy(point_reach(max_steps=max_steps)), []
    fields = ("trigger", "every", "length_frames", "record_final_episode")
    cfg = rec_cfg(**{k: kw.pop(k) for k in list(kw) if k in fields})
    name = None if name_prefix is None else names.prefixed(name_prefix, "recorder")
    schedule = Schedule.of(cfg, **kw)
    engine = ClipEngine(cfg, env, str(tmp_path), on_clip=clips.append, schedule=schedule, name=name)
    if steps is not None:
        _drive(engine, env, steps)
        engine.close()
    return engine, env, clips


def _drive(engine, env, steps, seed=0):
    """A seeded full reset, then ``steps`` steps of ``env`` told to ``engine``; a done env is reset
    at once (same-step autoreset, as AutoReset or a Genesis Forge env does it)."""
    env.reset(seed=seed)
    engine.on_reset(None, seed=seed)
    for _ in range(steps):
        out = env.step(torch.zeros(env.num_envs, 2))
        engine.on_step(*out[1:])
        done = (out[2] | out[3]).nonzero().flatten()
        if len(done):
            env.reset(env_idx=done)
            engine.on_reset(done)


def _names(clips):
    return [os.path.basename(c.path) for c in clips]


def test_callable_episode_trigger_is_asked_once_per_episode_and_names_like_gymnasium(tmp_path):
    asked = []
    trigger = lambda ep: asked.append(ep) or ep % 2 == 0  # noqa: E731
    # short clips end long before their episodes: no re-firing
    _, _, clips = _engine(tmp_path, 3, "rl-video", 12, episode_fn=trigger, length_frames=2)
    assert asked == [0, 1, 2, 3, 4]
    assert _names(clips) == [f"rl-video-episode-{e}.mp4" for e in (0, 2, 4)]
    # both callables (as Gymnasium's RecordVideo): a clip when either fires, each of its name
    asked.clear()
    kw = dict(episode_fn=lambda ep: asked.append(ep) or ep == 2, step_fn=lambda s: s == 1)
    _, _, clips = _engine(tmp_path / "both", 4, "v", 12, length_frames=2, **kw)
    assert asked == [0, 1, 2, 3]  # once per episode
    assert _names(clips) == ["v-step-1.mp4", "v-episode-2.mp4"]
    assert [c.episode for c in clips] == [0, 2]


def test_step_trigger_and_next_step_autoreset_frames(tmp_path):
    """Driven the way an autoreset-on-the-next-step vector env is: the step after the terminal
    one resets the env; it is counted but is not a frame (the reset frame is taken at on_reset)."""
    engine, env, clips = _engine(tmp_path, 4, "v", step_fn=lambda s: s == 2)
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
    assert _names(clips) == ["v-step-2.mp4"]
    assert_frames(clips[0].path, env.episodes[0][2:])
    assert engine.steps == 10


def test_bad_engine_arguments_are_refused_naming_them(tmp_path):
    with pytest.raises(ConfigError, match="name_prefix='../x'"):
        _engine(tmp_path, name_prefix="../x")
    with pytest.raises(ConfigError, match=r"recorder.dir \(or the run's video dir\) is not set"):
        ClipEngine(rec_cfg(), point_reach())
    assert listing(tmp_path) == []  # nothing written before the arguments were checked
    engine, _, _ = _engine(tmp_path, trigger="always")
    engine.render = lambda idx: np.zeros((1, 8, 8), np.uint8)
    with pytest.raises(TypeError, match=r"render\(\[0\]\) returned torch.uint8 \(1, 8, 8\)"):
        engine.on_reset(None)
    engine.close()


def test_provisional_clips_save_only_the_untriggered_episode_in_progress_at_close(tmp_path):
    # episodes 0, 1 (untriggered, dropped), 2 (in progress: 3 steps)
    kw = dict(episode_fn=lambda ep: ep == 0, provisional=True)
    engine, env, clips = _engine(tmp_path, 4, steps=11, **kw)
    assert [c.episode for c in clips] == [0, 2]
    for clip in clips:
        assert_frames(clip.path, env.episodes[clip.episode])
    assert_only_clips(tmp_path, clips)  # the dropped provisional clip left nothing behind
    assert engine.clips_started == 1  # provisional clips are not counted as started
    # with a length: the first frames of the last episode (episode 1, in progress: 4 steps)
    kw = dict(episode_fn=lambda ep: False, length_frames=2, provisional=True)
    _, env, clips = _engine(tmp_path / "short", 6, steps=10, **kw)
    assert [(c.episode, c.num_frames) for c in clips] == [(1, 2)]
    assert_frames(clips[0].path, env.episodes[1][:2])


def test_a_provisional_clip_never_holds_back_a_step_trigger(tmp_path):
    # the step trigger at step 2, mid-episode 0, which ends at step 5
    _, env, clips = _engine(tmp_path, 5, "v", 5, step_fn=lambda s: s == 2, provisional=True)
    # episode 0 from step 2 to its terminal frame; episode 1 in progress at close (its reset frame)
    assert _names(clips) == ["v-step-2.mp4", "v-step-5.mp4"]
    assert_frames(clips[0].path, env.episodes[0][2:6])
    assert_frames(clips[1].path, env.episodes[1])


def test_expect_end_turns_provisional_clips_off(tmp_path):
    engine, env, clips = _engine(tmp_path, 4, episode_fn=lambda ep: ep == 0, provisional=True)
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
    engine, env, clips = _engine(tmp_path / "a", 3, trigger="always")
    for k in range(2):  # two evaluations, each a full reset and one whole episode
        _drive(engine, env, 3, seed=k)
    engine.close()  # the second autoreset's clip is in progress: record_final_episode keeps it
    assert engine.clips_started == 4
    assert [c.num_frames for c in clips] == [4, 4, 1]  # the first autoreset's clip: dropped
    for k, clip in enumerate(clips[:2]):
        assert_frames(clip.path, env.episodes[2 * k])  # reset frame + 3 steps
        side = sidecar(clip.path)
        assert (side["seed"], side["envs"][0]["end"], side["frames"]) == (k, "truncated", 4)
    assert_only_clips(tmp_path / "a", clips)
    # length None: a full reset's one-frame clip cut by the next full reset; 1: one-frame clips
    for length in (None, 1):
        kw = dict(trigger="always", length_frames=length, record_final_episode=False)
        engine, env, clips = _engine(tmp_path / f"len{length}", **kw)
        for seed in (7, 8, 9):
            env.reset(seed=seed)
            engine.on_reset(None, seed=seed)
        engine.close()
        assert [c.num_frames for c in clips] == [1, 1] if length is None else [1, 1, 1]


def test_a_step_trigger_clip_that_a_reset_cuts_before_its_next_step_is_kept(tmp_path):
    """The step trigger fires mid-episode and the caller's full reset comes before the next step:
    the clip holds one real state of the episode (the one the trigger fired at), so it is kept,
    ending "cut", unlike the reset frame alone of an autoreset's clip (above)."""
    engine, env, clips = _engine(tmp_path, name_prefix="v", step_fn=lambda s: s == 2)
    _drive(engine, env, 2)
    assert engine.recording  # the trigger fired after step 2
    env.reset(seed=1)  # e.g. the caller's own full reset, before any further step
    engine.on_reset(None, seed=1)
    engine.close()
    assert _names(clips) == ["v-step-2.mp4"]
    assert_frames(clips[0].path, env.episodes[0][2:3])  # the state after step 2
    side = sidecar(clips[0].path)
    assert (side["frames"], side["envs"][0]["end"], side["envs"][0]["length"]) == (1, "cut", 0)
    assert engine.clips_started == engine.clips_saved == 1


# three envs, each a black 4x4 frame
_BLANK = Source(3, 0.1, "cpu", lambda idx: np.zeros((len(idx), 4, 4, 3), np.uint8))


def _sidecars(tmp_path, env_idx, events):
    """Drives a trigger=always engine of ``_BLANK`` recording ``env_idx`` through ``events``
    (``("reset", env_idx)`` or ``("step", reward, terminated, truncated, info)``); returns its
    sidecars."""
    paths = []
    engine = ClipEngine(
        rec_cfg(env_idx=env_idx), _BLANK, str(tmp_path), on_clip=lambda c: paths.append(c.path)
    )
    for event in events:
        if event[0] == "reset":
            engine.on_reset(event[1])
        else:
            engine.on_step(*event[1:])
    engine.close()
    return [sidecar(p) for p in paths]


def test_the_sidecar_is_the_same_whatever_form_the_step_values_take(tmp_path):
    """Host arrays, CPU tensors and tensors without a numpy dtype (bfloat16, read through the
    gathered copy a device takes) give the same sidecars; resets named by lists, tuples, index
    tensors and bool masks count the recorded envs' episodes alike."""
    f, t = False, True
    events = [
        (None,),
        ([0.5, 9.0, 0.25], [f, f, f], [f, f, f], [0, 0, 1]),
        ([1.5, 9.0, -0.5], [f, t, t], [f, f, f], [1, 0, 0]),  # env 2 ends, env 1 too
        ([1, 2],),
        ([2.0, 9.0, 4.0], [f, f, f], [f, f, t], [0, 0, 1]),  # env 2 ends again
        ([f, f, t],),
        ([0.25, 9.0, 1.0], [t, f, f], [t, f, f], [0, 0, 0]),  # env 0 ends: the clip too
        ([0],),
        ([1.0, 9.0, 1.0], [f, f, f], [f, f, f], [0, 0, 0]),
    ]

    def bfloat16(v):
        v = np.asarray(v)
        return torch.as_tensor(v.astype(np.float32)).bfloat16() if v.dtype.kind == "f" else v

    forms = {
        "numpy": np.asarray,
        "tensor": lambda v: torch.as_tensor(np.asarray(v)),
        "bfloat16": lambda v: torch.as_tensor(bfloat16(v)),
        "lists": lambda v: list(np.asarray(v).tolist()),
    }
    results = {}
    for name, host in forms.items():
        steps = [
            ("reset", None if e[0] is None else host(e[0]))
            if len(e) == 1
            else ("step", *map(host, e[:3]), {"success": host(e[3])})
            for e in events
        ]
        sides = _sidecars(tmp_path / name, [0, 2], steps)
        results[name] = [(s["episodes"], s["first_step"], s["last_step"], s["envs"]) for s in sides]
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
    """A step's rewards wait as plain rows and are summed later, many at a time: the sidecar's
    returns are still ``ret += reward`` in float32 step by step (not a float64 sum, nor a pairwise
    one), through an episode that ends after hundreds of such steps while another runs on, and
    lengths count the steps of each episode."""
    rng = np.random.default_rng(0)
    steps, ends_at = 700, 600  # env_idx[1]'s episode terminates at step 600, env_idx[0]'s runs on
    rewards = rng.standard_normal((steps, 3)) * 10.0 ** rng.integers(-3, 4, (steps, 3))
    rewards = rewards.astype(np.float32)
    term = np.zeros((steps, 3), bool)
    term[ends_at - 1, env_idx[1]] = True
    events = [("reset", None)]
    for r, d in zip(rewards, term):
        events.append(
            ("step", torch.from_numpy(r), torch.from_numpy(d), torch.zeros(3, dtype=torch.bool))
        )
    (side,) = _sidecars(tmp_path, env_idx, events)
    first_env, second_env = side["envs"]

    def in_order(column):
        ret = np.float32(0)
        for r in column:
            ret = np.float32(ret + r)
        return float(ret)

    column = rewards[:, env_idx[0]]
    expected = (in_order(column), in_order(rewards[:ends_at, env_idx[1]]))
    assert (first_env["return"], second_env["return"]) == expected
    # the test tells the sums apart: a float64 or a pairwise float32 sum would differ
    assert float(np.float32(column.astype(np.float64).sum())) != expected[0]
    assert float(column.sum()) != expected[0]
    assert (first_env["length"], first_env["end"]) == (steps, "cut")
    assert (second_env["length"], second_env["end"]) == (ends_at, "terminated")
