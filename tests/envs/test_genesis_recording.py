"""The recorder on real Genesis: the Genesis Forge VideoWrapper behaviours, each as a test.

Stack under test: ``AutoReset(Recorder(Spy(GenesisAdapter(FrankaReach))))`` on the CPU backend,
2 envs, 64x64 frames, episodes of a few steps. The Spy (below the recorder) keeps env 0's frame
after every reset and step; rendering does not change a Genesis scene, so it observes without
disturbing. Clips are lossless (libx264rgb), so decoded frames are the rendered frames; frames
of two scenes are compared with ``RENDER_ATOL`` (see genesis_util).

Genesis Forge's VideoWrapper defects that these rule out: the reset and terminal frames were never
captured (autoreset inside step), the episode trigger re-fired within an episode after a short
clip, the final episode was never saved on close, every step was rendered even when not recording,
``dt * fps > 2`` divided by zero, and ``torch.any(a or b)`` failed on batched tensors.
"""

import os

import numpy as np
import pytest
import torch

pytest.importorskip("genesis", reason="needs the genesis extra: bash scripts/setup_genesis.sh")
pytestmark = pytest.mark.genesis


from rlrec.envs.autoreset import AutoReset  # noqa: E402
from rlrec.record import Recorder  # noqa: E402
from rlrec.record.settings import RecorderConfig, Trigger  # noqa: E402
from rlrec.testing import FrameSpy, decode  # noqa: E402
from tests.envs.genesis_util import RENDER_ATOL, diff, make_genesis  # noqa: E402

N = 2
DT = 0.02  # FrankaReach's env step: 50 frames per second of sim time


@pytest.fixture(scope="module")
def adapters():
    """Two scenes for the whole module: the env under test and a fresh reference env."""
    env, ref = make_genesis(N, limit=5, seed=3), make_genesis(N, limit=5, seed=99)
    yield env, ref
    env.close()
    ref.close()


@pytest.fixture
def make_stack(adapters, tmp_path):
    env = adapters[0]
    stacks = []

    def build(limit, **rec):
        env.max_episode_steps = limit
        spy = FrameSpy(env, close_inner=False)
        kind = rec.pop("kind", "eval")
        rec.setdefault("lossless", True)
        cfg = RecorderConfig(**rec)
        clips = []
        recorder = Recorder(spy, cfg, str(tmp_path / "videos"), kind=kind, on_clip=clips.append)
        stack = AutoReset(recorder)
        stacks.append(stack)
        return stack, recorder, spy, clips

    yield build
    for stack in stacks:
        stack.close()


def zeros():
    return torch.zeros(N, 7)


def wiggle(i):
    g = torch.Generator().manual_seed(i)
    return torch.rand(N, 7, generator=g) * 2 - 1


# --------------------------------------------------------------------------- evaluation clips


def test_each_evaluation_starts_on_its_own_fresh_reset_frame_and_ends_on_the_terminal_frame(
    make_stack, adapters
):
    limit = 4
    stack, rec, spy, clips = make_stack(limit, trigger=Trigger.eval, record_final_episode=False)
    seeds = [1000, 1001, 1002]
    stale = []
    for k, seed in enumerate(seeds):
        stale.append(stack.unwrapped.render([0])[0].numpy().copy())  # env 0 before the full reset
        stack.reset(seed=seed)
        for i in range(limit):
            stack.step(wiggle(10 * k + i))
        for i in range(2):  # env 0's next (autoreset) episode goes on between evaluations
            stack.step(wiggle(500 + 10 * k + i))
        rec.flush()
    assert [c.episode for c in clips] == [0, 2, 4]
    ref = adapters[1]
    ref.max_episode_steps = limit
    for k, (clip, seed) in enumerate(zip(clips, seeds)):
        frames, fps = decode(clip.path)
        ref.reset(seed=seed)
        fresh = ref.render([0])[0].numpy()
        assert diff(frames[0], fresh) <= RENDER_ATOL, (
            f"eval {k}: first frame is not the fresh reset state"
        )
        assert diff(frames[0], stale[k]) > RENDER_ATOL, (
            f"eval {k}: first frame is the pre-reset state"
        )
        if k:
            previous, _ = decode(clips[k - 1].path)
            assert diff(frames[0], previous[-1]) > RENDER_ATOL, (
                f"eval {k}: starts on the previous clip's last frame"
            )
        # the whole episode, frame for frame, ending on the terminal state before autoreset
        episode = spy.episodes[2 * k]
        after = spy.episodes[2 * k + 1][0]  # first frame of the autoreset episode
        assert clip.num_frames == len(frames) == limit + 1 and fps == pytest.approx(1 / DT)
        assert all(diff(a, b) <= RENDER_ATOL for a, b in zip(frames, episode))
        assert diff(frames[-1], episode[-1]) <= RENDER_ATOL
        assert diff(frames[-1], after) > RENDER_ATOL, "terminal frame taken after the autoreset"


def test_partial_reset_of_another_env_leaves_the_recorded_env_and_its_clip(make_stack):
    stack, rec, spy, clips = make_stack(
        20, trigger=Trigger.always, env_idx=[0], record_final_episode=False
    )
    stack.reset(seed=5)
    for i in range(3):
        stack.step(wiggle(i))
    before = stack.unwrapped.render([0, 1])
    stack.reset(env_idx=[1])  # e.g. AutoReset of env 1 alone
    after = stack.unwrapped.render([0, 1])
    assert diff(after[0], before[0]) <= RENDER_ATOL, (
        "a partial reset of env 1 changed env 0's image"
    )
    assert diff(after[1], before[1]) > RENDER_ATOL, "env 1's image does not show its reset"
    assert rec.recording and rec.engine.episode == 0, (
        "a reset of another env ended or restarted env 0's clip"
    )
    for i in range(2):
        stack.step(wiggle(10 + i))
    rec.end_clip()
    rec.flush()
    frames, _ = decode(clips[0].path)
    assert len(frames) == 6 and all(
        diff(a, b) <= RENDER_ATOL for a, b in zip(frames, spy.episodes[0])
    )


# --------------------------------------------------------------------------- triggers


def test_capped_cubic_trigger_counts_episodes_of_the_recorded_env(make_stack):
    """Episodes are counted on env_idx (env 1), not on every reset of any env."""
    limit = 2
    stack, rec, spy, clips = make_stack(limit, trigger=Trigger.cubic, env_idx=[1], kind="train")
    stack.reset(seed=0)
    for _ in range(9 * limit + 1):  # env 1 starts its episodes 1..9
        stack.step(zeros())
        stack.reset(env_idx=[0])  # many extra episodes of env 0, which must not count
    rec.flush()
    assert rec.engine.episode == 9
    assert [c.episode for c in clips] == [0, 1, 8]
    assert all(c.num_frames == limit + 1 for c in clips)
    # nothing rendered outside clips, and only the recorded env (Spy's own renders are not counted)
    assert all(r == [1] for r in spy.render_requests)
    assert len(spy.render_requests) == sum(c.num_frames for c in clips)


def test_step_trigger(make_stack):
    stack, rec, spy, clips = make_stack(
        10, trigger=Trigger.step, every=4, length_frames=3, kind="train"
    )
    stack.reset(seed=1)
    for i in range(18):
        stack.step(wiggle(i))
    rec.flush()
    assert [c.step for c in clips] == [0, 4, 8, 12, 16]  # step 0: the first reset
    frames_of = {c.step: decode(c.path)[0] for c in clips}
    # the state after step s of the run is frame s - 10 * e of episode e = (s - 1) // 10 (episodes
    # of 10 steps: a reset frame, then one per step; step 10 is episode 0's terminal state)
    for start, frames in frames_of.items():
        assert len(frames) == 3
        for j, frame in enumerate(frames):
            s = start + j
            e = max(0, (s - 1) // 10)
            assert diff(frame, spy.episodes[e][s - 10 * e]) <= RENDER_ATOL


def test_episode_trigger_fires_once_per_episode_with_short_clips(make_stack):
    stack, rec, spy, clips = make_stack(8, trigger=Trigger.always, length_frames=2)
    stack.reset(seed=2)
    for _ in range(15):  # episodes 0 and 1 (steps 1-8, 9-15)
        stack.step(zeros())
    rec.flush()
    assert [c.episode for c in clips] == [0, 1] and all(c.num_frames == 2 for c in clips)


# --------------------------------------------------------------------------- timing


def test_length_in_seconds_uses_the_sim_dt(make_stack):
    stack, rec, spy, clips = make_stack(20, trigger=Trigger.always, length_sec=0.12)
    stack.reset(seed=3)
    for i in range(8):
        stack.step(wiggle(i))
    rec.flush()
    frames, fps = decode(clips[0].path)
    assert (
        fps == pytest.approx(50.0) and clips[0].num_frames == len(frames) == 6
    )  # 0.12 s at 50 fps


@pytest.mark.parametrize("asked, steps_per_frame, real", [(30.0, 2, 25.0), (200.0, 1, 50.0)])
def test_fps_snaps_to_the_dt_grid_and_the_file_says_the_real_fps(
    make_stack, asked, steps_per_frame, real
):
    limit = 6
    stack, rec, spy, clips = make_stack(
        limit, trigger=Trigger.eval, fps=asked, record_final_episode=False
    )
    stack.reset(seed=4)
    for i in range(limit):
        stack.step(wiggle(i))
    rec.flush()
    frames, fps = decode(clips[0].path)
    assert clips[0].fps == pytest.approx(real) and fps == pytest.approx(real)
    expected = spy.episodes[0][
        ::steps_per_frame
    ]  # every steps_per_frame-th state from the reset ...
    assert (
        len(frames) == len(expected) == limit // steps_per_frame + 1
    )  # ... and the terminal state
    assert all(diff(a, b) <= RENDER_ATOL for a, b in zip(frames, expected))


# --------------------------------------------------------------------------- files


def test_fixed_filename_is_replaced_atomically(make_stack, tmp_path):
    limit = 3
    stack, rec, spy, clips = make_stack(
        limit, trigger=Trigger.always, filename="latest.mp4", record_final_episode=False
    )
    stack.reset(seed=6)
    for i in range(limit):  # episode 0 ends; the autoreset starts episode 1's clip
        stack.step(wiggle(i))
    rec.flush()
    path = str(tmp_path / "videos" / "latest.mp4")
    first, _ = decode(path)
    stack.step(wiggle(50))  # mid-clip: the file is still the whole previous clip
    mid, _ = decode(path)
    assert np.array_equal(mid, first) and len(first) == limit + 1
    for i in range(limit - 1):
        stack.step(wiggle(60 + i))
    rec.flush()
    second, _ = decode(path)
    assert [c.path for c in clips] == [path, path]
    assert len(second) == limit + 1 and diff(second[0], first[0]) > RENDER_ATOL
    assert all(diff(a, b) <= RENDER_ATOL for a, b in zip(second, spy.episodes[1]))
    stack.close()  # drops episode 2's clip (record_final_episode=False) and its temporary file
    assert sorted(os.listdir(tmp_path / "videos")) == ["latest.json", "latest.mp4"]
    assert np.array_equal(decode(path)[0], second)


def test_final_episode_is_saved_on_close(adapters, tmp_path):
    env = adapters[0]
    env.max_episode_steps = 50
    spy = FrameSpy(env, close_inner=False)
    clips = []
    cfg = RecorderConfig(trigger=Trigger.always, record_final_episode=True, lossless=True)
    stack = AutoReset(Recorder(spy, cfg, str(tmp_path), kind="train", on_clip=clips.append))
    stack.reset(seed=8)
    for i in range(3):
        stack.step(wiggle(i))
    stack.close()
    stack.close()  # idempotent
    assert len(clips) == 1 and os.path.exists(clips[0].path)
    frames, _ = decode(clips[0].path)
    assert len(frames) == 4 and all(
        diff(a, b) <= RENDER_ATOL for a, b in zip(frames, spy.episodes[0])
    )
