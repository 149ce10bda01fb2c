"""When clips start: the cubic schedule, no re-firing, step trigger, idle cost, resume."""

import numpy as np
import pytest

from tests.record.recutil import decode, listing, make_stack, zeros


def run_episodes(stack, n, steps_per_episode):
    for _ in range(n * steps_per_episode):
        stack.step(zeros(stack))


def test_cubic_schedule_records_exactly_episodes_0_1_8_27(tmp_path):
    # one-step episodes keep 1001 episodes cheap; frames are 16x16
    stack, rec, spy, clips = make_stack(tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False)
    stack.reset(seed=0)
    run_episodes(stack, 1001, 1)  # episodes 0..1000 finish; episode 1001 is in progress
    rec.flush()
    assert [c.episode for c in clips] == [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000]
    assert all(c.num_frames == 2 for c in clips)  # reset frame + terminal frame
    assert listing(tmp_path) == sorted(f"train-ep{e:06d}-step{e:09d}.mp4" for e in [c.episode for c in clips])
    # an idle recorder renders nothing: every render went into a clip
    assert spy.render_calls == sum(c.num_frames for c in clips)
    stack.close()


@pytest.mark.parametrize("trigger, every", [("always", None), ("cubic", None), ("episode", 2)])
def test_episode_trigger_never_fires_twice_in_one_episode(tmp_path, trigger, every):
    # clips of 3 frames end mid-episode (episodes have 10 steps): no second clip in that episode
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=10, trigger=trigger, every=every, length_frames=3)
    stack.reset(seed=0)
    run_episodes(stack, 9, 10)  # episodes 0..8; the last step's autoreset starts episode 9
    rec.flush()
    expected = {"always": list(range(9)), "cubic": [0, 1, 8], "episode": [0, 2, 4, 6, 8]}[trigger]
    assert [c.episode for c in clips] == expected  # episode 9's clip is still open
    assert all(c.num_frames == 3 for c in clips)
    assert spy.render_calls == 3 * len(expected) + rec.recording
    for clip in clips:
        frames, _ = decode(clip.path)
        assert np.array_equal(frames, np.stack(spy.episodes[clip.episode][:3]))
    stack.close()


def test_step_trigger(tmp_path):
    """every=10 with 4-step episodes (steps 0-4, 4-8, 8-12, ...): step 0 starts episode 0 at its
    reset; step 10 falls mid-episode 2 (a clip from there to its end); step 20 is the terminal
    step of episode 4, so the clip starts with episode 5's reset frame instead."""
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=4, trigger="step", every=10)
    stack.reset(seed=0)
    run_episodes(stack, 7, 4)
    rec.flush()
    assert [(c.episode, c.step, c.num_frames) for c in clips] == [(0, 0, 5), (2, 10, 3), (5, 20, 5)]
    frames, _ = decode(clips[1].path)
    assert np.array_equal(frames, np.stack(spy.episodes[2][2:]))
    frames, _ = decode(clips[2].path)
    assert np.array_equal(frames, np.stack(spy.episodes[5]))
    stack.close()


def test_eval_trigger_idle_between_evaluations(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, num_envs=4, max_steps=5, trigger="eval", kind="eval")
    for evaluation in range(3):
        stack.reset(seed=7)
        run_episodes(stack, 3, 5)  # env 0 plays 3 episodes and starts a 4th; only the 1st is recorded
    stack.close()
    assert [c.episode for c in clips] == [0, 4, 8] and all(c.num_frames == 6 for c in clips)
    assert spy.render_calls == 18


def test_state_dict_resume_continues_the_schedule(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False)
    stack.reset(seed=0)
    run_episodes(stack, 10, 1)  # episodes 0..9 finished, 10 in progress
    rec.flush()
    state = rec.state_dict()
    assert state["episode"] == 10 and state["steps"] == 10 and state["clips_saved"] == 3
    stack.close()

    # a resumed run: new env stack, state loaded before the first reset
    stack2, rec2, _, clips2 = make_stack(tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False)
    rec2.load_state_dict(state)
    stack2.reset(seed=1)  # episode 11
    run_episodes(stack2, 60, 1)  # episodes 11..70 finish
    rec2.flush()
    assert [c.episode for c in clips2] == [27, 64]
    assert clips2[0].step == 10 + 16  # the step counter went on too
    assert rec2.state_dict()["clips_saved"] == 5
    stack2.close()

    # resuming an older checkpoint into the same directory never overwrites a clip
    stack3, rec3, _, clips3 = make_stack(tmp_path, size=16, max_steps=1, trigger="cubic")
    rec3.load_state_dict({**state, "episode": 7, "steps": 8})
    stack3.reset(seed=2)  # episode 8 again, at step 8: the name exists
    stack3.step(zeros(stack3))
    stack3.close()
    assert clips3[0].path.endswith("train-ep000008-step000000008-1.mp4")
    assert len(listing(tmp_path)) == 6


def test_load_state_dict_rejects_foreign_state(tmp_path):
    _, rec, _, _ = make_stack(tmp_path)
    with pytest.raises(ValueError, match="recorder state"):
        rec.load_state_dict({"steps": 3})
    rec.close()
