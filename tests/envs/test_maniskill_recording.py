"""The original ManiSkill failure, as a test against the real simulator (CPU sim, lavapipe).

An eval stack ``AutoReset(Recorder(Spy(ManiSkill adapter)))`` with num_envs=2 is evaluated several
times, each evaluation preceded by a full seeded reset, while a separate collection stack steps in
between. Every eval clip must start on the freshly reset state (the frame of a fresh env reset with
the same seed), never on the previous episode's last frame, and end on the real terminal state.
Clips are lossless (libx264rgb) and lavapipe renders are pixel-deterministic, so frames compare
exactly.
"""

import numpy as np
import pytest
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.testing import FrameSpy, decode, sample_actions
from tests.envs.maniskill_util import make_env, pytestmark  # noqa: F401  (marks this module)

EVAL_LIMIT = 6  # steps per eval episode
TRAIN_LIMIT = 2  # short collection episodes, so the cubic schedule reaches episode 8 quickly
EVAL_SEED = 1000


def stack(tmp_path, kind, trigger, limit, seed, keep_frames):
    spy = FrameSpy(make_env(2, seed, max_episode_steps=limit), keep_frames=keep_frames)
    cfg = RecorderConfig(trigger=trigger, env_idx=[0], lossless=True, record_final_episode=False)
    clips = []
    rec = Recorder(spy, cfg, str(tmp_path / kind), kind=kind, on_clip=clips.append)
    return AutoReset(rec), rec, spy, clips


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three evaluations with collection steps in between; returns everything the tests check."""
    tmp = tmp_path_factory.mktemp("ms_rec")
    eval_env, eval_rec, eval_spy, eval_clips = stack(tmp, "eval", Trigger.eval, EVAL_LIMIT, 7, True)
    train_env, train_rec, train_spy, train_clips = stack(
        tmp, "train", Trigger.cubic, TRAIN_LIMIT, 3, False
    )
    stale = []  # env 0's frame right before each evaluation's full reset
    train_env.reset(seed=3)
    for k in range(3):
        for i in range(7):  # collection between evaluations (a separate env)
            train_env.step(sample_actions(train_env, seed=100 * k + i))
        stale.append(eval_env.unwrapped.render([0])[0].numpy().copy() if k else None)
        eval_env.reset(seed=EVAL_SEED)
        finished = torch.zeros(2, dtype=torch.bool)
        for i in range(3 * EVAL_LIMIT):
            _, _, term, trunc, info = eval_env.step(sample_actions(eval_env, seed=10 * k + i))
            finished |= term | trunc
            if finished.all():
                break
        # a few steps of env 0's next (autoreset) episode, as when eval envs finish at different
        # times
        for i in range(2):
            eval_env.step(sample_actions(eval_env, seed=999 + i))
        eval_rec.flush()
    for i in range(7 * TRAIN_LIMIT):  # collection continues until env 0 started episode 9
        train_env.step(sample_actions(train_env, seed=7000 + i))
    train_rec.flush()
    fresh = make_env(2, 12345, max_episode_steps=EVAL_LIMIT)
    fresh.reset(seed=EVAL_SEED)
    reference = fresh.render([0])[0].numpy().copy()
    fresh.close()
    out = dict(
        eval_clips=list(eval_clips),
        eval_spy=eval_spy,
        stale=stale,
        reference=reference,
        train_clips=list(train_clips),
        train_spy=train_spy,
        train_episodes=train_rec.engine.episode,
    )
    eval_env.close()
    train_env.close()
    return out


def test_every_eval_clip_starts_on_the_fresh_reset_state(run):
    clips = run["eval_clips"]
    assert len(clips) == 3, [c.path for c in clips]
    previous_last = None
    for k, clip in enumerate(clips):
        frames = decode(clip.path)[0]
        assert np.array_equal(frames[0], run["reference"]), (
            f"eval {k}: first frame is not the seeded reset state"
        )
        if k:
            # the failure seen in the field: the clip led by the previous episode's last frame
            assert not np.array_equal(frames[0], previous_last), (
                f"eval {k}: starts on the previous episode's last frame"
            )
            assert not np.array_equal(frames[0], run["stale"][k]), (
                f"eval {k}: starts on the pre-reset state"
            )
        previous_last = frames[-1]


def test_eval_clips_are_whole_episodes_ending_on_the_terminal_state(run):
    spy_episodes = run["eval_spy"].episodes
    # every eval episode of env 0 that the recorder recorded: the first after each full reset
    recorded = [ep for ep in spy_episodes if len(ep) == EVAL_LIMIT + 1]
    for clip in run["eval_clips"]:
        frames = decode(clip.path)[0]
        assert clip.num_frames == len(frames) == EVAL_LIMIT + 1  # reset frame + one per step
        matches = [ep for ep in recorded if all(np.array_equal(a, b) for a, b in zip(frames, ep))]
        assert matches, f"{clip.path}: frames differ from the states the env went through"
    for k in range(3):
        # episode 2k: recorded; episode 2k+1: the autoreset episode that followed it
        ended, after = spy_episodes[2 * k], spy_episodes[2 * k + 1]
        frames = decode(run["eval_clips"][k].path)[0]
        assert np.array_equal(frames[-1], ended[-1]), "the clip does not end on the terminal state"
        assert not np.array_equal(frames[-1], after[0]), (
            "the terminal frame was taken after the autoreset"
        )


def test_recorder_renders_only_the_recorded_env(run):
    for spy in (run["eval_spy"], run["train_spy"]):
        assert spy.render_requests and all(r == [0] for r in spy.render_requests)
    # nothing is rendered outside clips: one render per clip frame
    train = run["train_clips"]
    assert len(run["train_spy"].render_requests) == sum(c.num_frames for c in train)


def test_cubic_schedule_on_a_real_maniskill_env(run):
    assert run["train_episodes"] >= 9
    clips = run["train_clips"]
    assert [c.episode for c in clips] == [0, 1, 8]
    for c in clips:
        assert c.num_frames == TRAIN_LIMIT + 1
        assert c.fps == pytest.approx(20.0)  # PushCube's control rate: dt = 0.05 s
