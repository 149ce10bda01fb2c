"""What every clip contains: exactly its episode, from the fresh reset frame to the terminal frame.

PointReach frames are a pure function of state and the tests encode losslessly (libx264rgb,
qp 0), so decoded frames are compared with ``np.array_equal``.
"""

import numpy as np
import pytest
import torch

from rlrec.config import EvalEnvConfig
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from tests.record.recutil import (
    Spy,
    assert_frames,
    decode,
    decode_many,
    make_stack,
    point_reach,
    random_actions,
    rec_cfg,
    run_steps,
    zeros,
)


def assert_clip_is_episode_prefix(clip, spy):
    frames, _ = decode(clip.path)
    episode = np.stack(spy.episodes[clip.episode])
    assert clip.num_frames == len(frames)
    assert np.array_equal(frames, episode[: len(frames)])
    if clip.episode > 0:  # never a frame of the previous episode
        assert not np.array_equal(frames[0], spy.episodes[clip.episode - 1][-1])
    return frames, episode


@pytest.mark.parametrize("num_envs", [1, 8])
def test_clips_start_on_reset_frame_through_full_partial_and_auto_resets(tmp_path, num_envs):
    stack, rec, spy, clips = make_stack(tmp_path, num_envs=num_envs, max_steps=12, trigger="always")
    gen = torch.Generator().manual_seed(0)

    def run(n):
        run_steps(stack, n, lambda env: random_actions(env, gen))

    stack.reset(seed=0)
    for evaluation in range(3):
        run(15)  # AutoReset restarts env 0 at its terminal step (at 12 or on success)
        stack.reset(env_idx=[0])  # partial reset of the recorded env, mid-episode
        run(4)
        if num_envs > 1:
            stack.reset(env_idx=[1, 2])  # other envs: not a new episode of the recorded env
            run(1)
        stack.reset(seed=evaluation)  # full reset mid-episode: ends the clip, starts the next
        run(3)
    stack.close()
    assert [c.episode for c in clips] == list(range(len(spy.episodes)))
    assert len(clips) >= 10  # 1 + 3 x (autoreset, partial reset, full reset)
    for clip in clips:
        frames, episode = assert_clip_is_episode_prefix(clip, spy)
        assert len(frames) == len(episode)  # whole episode: reset frame + one per step


def test_terminal_frame_of_a_success_is_last(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, num_envs=2, max_steps=200, trigger="always")
    env = stack.unwrapped
    stack.reset(seed=2)
    for _ in range(200):
        direction = env.goal - env.pos
        act = direction / direction.norm(dim=1, keepdim=True).clamp(min=1e-6) - env.vel * 0.5
        _, _, term, _, info = stack.step(act)
        if bool(term[0]):
            break
    assert bool(term[0])
    rec.flush()
    (clip,) = clips
    # the last frame shows the agent inside the goal, rendered before AutoReset reset the env
    frames, episode = assert_clip_is_episode_prefix(clip, spy)
    assert len(frames) == len(episode)
    stack.close()


@pytest.mark.parametrize(
    "cfg, dt, expect_fps, picks",
    [
        (dict(length_frames=5), 0.05, 20.0, [0, 1, 2, 3, 4]),
        (dict(length_sec=0.3), 0.05, 20.0, [0, 1, 2, 3, 4, 5]),
        (dict(fps=10), 0.05, 10.0, [0, 2, 4, 6, 8, 10, 11]),  # terminal frame always taken
        (dict(fps=10, length_frames=3), 0.05, 10.0, [0, 2, 4]),
        (dict(fps=30), 0.01, 100 / 3, [0, 3, 6, 9, 11]),  # steps_per_frame 3: real fps 33.3
        (dict(fps=30), 0.1, 10.0, list(range(12))),  # dt * fps > 2: every step, no zero division
    ],
)
def test_lengths_and_cadence(tmp_path, cfg, dt, expect_fps, picks):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=11, dt=dt, trigger="always", **cfg)
    stack.reset(seed=3)
    run_steps(stack, 22)
    stack.close()
    assert len(clips) == 3  # episodes 0 and 1, and the final one in progress (1 frame)
    for clip in clips[:2]:
        assert decode(clip.path)[1] == pytest.approx(expect_fps, rel=1e-3)
        assert clip.fps == pytest.approx(expect_fps)
        assert_frames(clip.path, np.stack(spy.episodes[clip.episode])[picks])


@pytest.mark.parametrize("num_envs", [1, 8])
@pytest.mark.parametrize("length_frames", [8, None])
def test_maniskill_scenario_every_eval_clip_starts_on_its_own_reset(
    tmp_path, num_envs, length_frames
):
    """Eval env, five evaluations with the same eval seed, a clip length that does not divide the
    episode length (13 steps, 14 frames), evaluation 2 cut short after 3 steps."""
    cfg = EvalEnvConfig().recorder
    cfg.lossless, cfg.length_frames = True, length_frames
    env = point_reach(num_envs, size=32, max_steps=13)
    spy = Spy(env)
    clips = []
    rec = Recorder(spy, cfg, str(tmp_path), kind="eval", on_clip=clips.append)
    stack = AutoReset(rec)
    expected_first = []
    for evaluation in range(5):
        stack.reset(seed=1_000_000)  # the runner's full reset with the eval seed
        expected_first.append(env.render([0])[0].numpy().copy())
        gen = torch.Generator().manual_seed(evaluation)
        # until every eval env finished (13 steps)
        run_steps(stack, 3 if evaluation == 2 else 20, lambda env, g=gen: random_actions(env, g))
        rec.flush()
    stack.close()
    assert [c.kind for c in clips] == ["eval"] * 5  # one clip per evaluation, nothing else
    for evaluation, clip in enumerate(clips):
        frames, episode = assert_clip_is_episode_prefix(clip, spy)
        assert np.array_equal(frames[0], expected_first[evaluation])
        if evaluation == 2:
            assert len(frames) == 4  # cut short: ended by the next evaluation's full reset
        else:
            assert len(frames) == min(length_frames or len(episode), len(episode))
    assert all("eval-" in c.path for c in clips)
    assert clips == sorted(clips, key=lambda c: c.path)  # names sort chronologically


def test_grid_tiles_envs_and_counts_episodes_on_the_first(tmp_path):
    stack, rec, spy, clips = make_stack(
        tmp_path, num_envs=4, max_steps=6, trigger="always", env_idx=[1, 2, 3], watch=1
    )
    env = stack.unwrapped
    stack.reset(seed=4)
    first = env.render([1, 2, 3]).numpy()
    stack.reset(env_idx=[2])  # not the first recorded env: the clip goes on
    after = env.render([1, 2, 3]).numpy()
    run_steps(stack, 6)
    stack.close()
    assert [c.episode for c in clips] == [0, 1]
    frames, _ = decode(clips[0].path)
    assert frames.shape == (7, 64, 64, 3)  # 2x2 grid of 32x32 tiles; reset frame + 6 steps
    assert np.array_equal(frames[0, :32, :32], first[0])
    assert np.array_equal(frames[0, :32, 32:], first[1])
    assert np.array_equal(frames[0, 32:, :32], first[2])
    assert (frames[:, 32:, 32:] == 0).all()  # the unused tile
    assert np.array_equal(frames[-1, :32, :32], spy.episodes[0][-1])  # terminal frame of env 1
    assert not np.array_equal(first[1], after[1])  # env 2 was reset, yet the clip went on


def test_odd_frame_sizes_are_padded_not_scaled(tmp_path):
    env = PointReach(1, max_episode_steps=4, render_width=33, render_height=31, seed=0)
    clips = []
    stack = AutoReset(Recorder(env, rec_cfg(trigger="always"), str(tmp_path), on_clip=clips.append))
    stack.reset(seed=0)
    first = env.render([0])[0].numpy()
    run_steps(stack, 4)
    stack.close()
    frames, _ = decode(clips[0].path)
    assert frames.shape == (5, 32, 34, 3)
    assert np.array_equal(frames[0, :31, :33], first)
    assert (frames[:, 31:] == 0).all() and (frames[:, :, 33:] == 0).all()


@pytest.mark.parametrize("overlay", [True, False])
def test_overlay_draws_text_only_in_the_corner_and_lossy_frames_stay_close(tmp_path, overlay):
    """The overlay changes only the top-left corner of each frame. The default encoding (yuv420p,
    crf 15, playable everywhere) is lossy: 4:2:0 chroma smears the colour edges of the discs.
    Tolerance: mean absolute error <= 3 per channel (measured ~1.2-1.7), far below the
    difference between a reset frame and a terminal frame."""
    stack, rec, spy, clips = make_stack(
        tmp_path, size=96, max_steps=20, trigger="always", overlay=overlay, lossless=False
    )
    stack.reset(seed=5)
    run_steps(stack, 20)
    stack.close()
    frames, _ = decode(clips[0].path)
    episode = np.stack(spy.episodes[0]).astype(int)
    assert len(frames) == 21
    err = np.abs(frames[:, 60:].astype(int) - episode[:, 60:]).mean(axis=(1, 2, 3))
    assert (err <= 3).all()  # the rest untouched (within the encoding's loss)
    assert np.abs(frames[0, 60:].astype(int) - episode[-1, 60:]).mean() > 2 * err[0]
    corner = np.abs(frames[:, :20, :40].astype(int) - episode[:, :20, :40]).mean(axis=(1, 2, 3))
    assert (corner > 10).all() if overlay else (corner <= 3).all()  # the text


class SharedBufferRender(PointReach):
    """Breaks the owned-copy contract on purpose: render() returns one buffer, overwritten by the
    next render. The recorder's one copy must keep every queued frame intact anyway."""

    def render(self, env_idx):
        frames = super().render(env_idx)
        if not hasattr(self, "_buffer") or self._buffer.shape != frames.shape:
            self._buffer = torch.empty_like(frames)
        return self._buffer.copy_(frames)


@pytest.mark.parametrize("queue_size", [1, 2, 3, 64])
def test_queued_frames_survive_a_renderer_that_reuses_its_buffer(tmp_path, queue_size):
    # queue_size bounds the encoder's reusable frame buffers: with 1 to 3 the training thread
    # waits for buffers all the time, and every frame must still arrive once, in order
    env = SharedBufferRender(1, max_episode_steps=40, render_width=32, render_height=32, seed=0)
    spy = Spy(env)
    clips = []
    cfg = rec_cfg(trigger="always", queue_size=queue_size)
    stack = AutoReset(rec := Recorder(spy, cfg, str(tmp_path), on_clip=clips.append))
    stack.reset(seed=0)
    for _ in range(40):
        run_steps(stack, 1)
        assert rec.engine.encoder.buffers <= queue_size
    stack.close()
    assert_frames(clips[0].path, spy.episodes[0])


# every frame sent reaches the file, for every clip length 1..64 and a spread up to 600, at 30
# and 50 fps (moviepy-based recorders drop the last frame of about half of these at 50 fps)
LENGTHS = list(range(1, 65)) + [65, 100, 127, 128, 129, 256, 333, 599, 600]


@pytest.mark.parametrize("fps", [30, 50])
def test_every_frame_reaches_the_file(tmp_path, fps):
    """One recorder, whole-episode clips; episode k is truncated after LENGTHS[k] - 1 steps, so its
    clip has LENGTHS[k] frames and ends on the terminal frame (the progress bar's last column is
    lit only there, so that frame differs from every other one). A one-frame clip is a clip cut
    by the next full reset right after its reset frame."""
    env = point_reach(max_steps=None, dt=1.0 / fps)
    clips, last_sent = [], {}
    rec = Recorder(env, rec_cfg(trigger="always"), str(tmp_path), on_clip=clips.append)
    for episode, length in enumerate(LENGTHS):
        env.max_episode_steps = max(1, length - 1)
        rec.reset(seed=episode)  # a full reset: ends nothing (the last clip ended), starts a clip
        for _ in range(length - 1):
            _, _, _, truncated, _ = rec.step(zeros(env))
        assert length == 1 or bool(truncated[0])
        last_sent[episode] = env.render([0])[0].numpy().copy()
    rec.close()  # the one-frame clip of the first episode was ended by the second reset
    assert [c.num_frames for c in clips] == LENGTHS
    out = tmp_path / "decoded"
    out.mkdir()
    decoded = decode_many([c.path for c in clips], (16, 16), out)
    for clip, frames in zip(clips, decoded):
        assert len(frames) == clip.num_frames, clip.path
        assert np.array_equal(frames[-1], last_sent[clip.episode]), clip.path
    for clip in (clips[0], clips[-1]):
        assert decode(clip.path)[1] == fps  # the real fps is in the file
