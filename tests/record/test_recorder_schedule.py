"""When clips start: the cubic schedule, no re-firing, step trigger, idle cost, resume."""

import pytest

from rlrec.record.schedule import capped_cubic
from tests.record.recutil import assert_frames, assert_only_clips, listing, make_stack, run_steps


def test_cubic_schedule_records_exactly_episodes_0_1_8_27(tmp_path):
    # one-step episodes keep 1001 episodes cheap; frames are 16x16
    stack, rec, spy, clips = make_stack(
        tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False
    )
    stack.reset(seed=0)
    run_steps(stack, 1001)  # episodes 0..1000 finish; episode 1001 is in progress
    rec.flush()
    episodes = [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000]
    assert [(c.episode, c.num_frames) for c in clips] == [(e, 2) for e in episodes]  # reset, end
    assert listing(tmp_path) == sorted(
        f"train-ep{e:06d}-step{e:09d}.{ext}" for e in episodes for ext in ("mp4", "json")
    )
    # an idle recorder renders nothing: every render went into a clip
    assert len(spy.render_requests) == sum(c.num_frames for c in clips)
    stack.close()


@pytest.mark.parametrize("trigger, every", [("always", None), ("cubic", None), ("episode", 2)])
def test_episode_trigger_never_fires_twice_in_one_episode(tmp_path, trigger, every):
    # clips of 3 frames end mid-episode (episodes have 10 steps): no second clip in that episode
    stack, rec, spy, clips = make_stack(
        tmp_path, max_steps=10, trigger=trigger, every=every, length_frames=3
    )
    stack.reset(seed=0)
    run_steps(stack, 9 * 10)  # episodes 0..8; the last step's autoreset starts episode 9
    rec.flush()
    expected = {"always": list(range(9)), "cubic": [0, 1, 8], "episode": [0, 2, 4, 6, 8]}[trigger]
    assert [c.episode for c in clips] == expected  # episode 9's clip is still open
    assert len(spy.render_requests) == 3 * len(expected) + rec.recording
    for clip in clips:
        assert_frames(clip.path, spy.episodes[clip.episode][:3])
    stack.close()


def test_step_trigger(tmp_path):
    """every=10 with 4-step episodes (steps 0-4, 4-8, 8-12, ...): step 0 starts episode 0 at its
    reset; step 10 falls mid-episode 2 (a clip from there to its end); step 20 is the terminal
    step of episode 4, so the clip starts with episode 5's reset frame instead."""
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=4, trigger="step", every=10)
    stack.reset(seed=0)
    run_steps(stack, 7 * 4)
    rec.flush()
    assert [(c.episode, c.step, c.num_frames) for c in clips] == [(0, 0, 5), (2, 10, 3), (5, 20, 5)]
    assert_frames(clips[1].path, spy.episodes[2][2:])
    assert_frames(clips[2].path, spy.episodes[5])
    stack.close()


def test_eval_trigger_idle_between_evaluations(tmp_path):
    stack, rec, spy, clips = make_stack(
        tmp_path, num_envs=4, max_steps=5, trigger="eval", kind="eval"
    )
    for _evaluation in range(3):
        stack.reset(seed=7)
        run_steps(stack, 3 * 5)  # env 0 plays 3 episodes and starts a 4th; only the 1st recorded
    stack.close()
    assert [c.episode for c in clips] == [0, 4, 8] and all(c.num_frames == 6 for c in clips)
    assert len(spy.render_requests) == 18


def test_state_dict_resume_continues_the_schedule(tmp_path):
    def stack_of():
        return make_stack(tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False)

    stack, rec, spy, clips = stack_of()
    stack.reset(seed=0)
    run_steps(stack, 10)  # episodes 0..9 finished, 10 in progress
    rec.flush()
    state = rec.state_dict()
    assert state["episode"] == 10 and state["steps"] == 10 and state["clips_saved"] == 3
    stack.close()
    # a resumed run: new env stack, state loaded before the first reset
    stack, rec, _, clips = stack_of()
    rec.load_state_dict(state)
    stack.reset(seed=1)  # episode 11
    run_steps(stack, 60)  # episodes 11..70 finish
    rec.flush()
    assert [c.episode for c in clips] == [27, 64]
    assert clips[0].step == 10 + 16  # the step counter went on too
    assert rec.state_dict()["clips_saved"] == 5
    stack.close()
    # resuming an older checkpoint into the same directory never overwrites a clip
    stack, rec, _, clips = stack_of()
    rec.load_state_dict({**state, "episode": 7, "steps": 8})
    stack.reset(seed=2)  # episode 8 again, at step 8: the name exists
    run_steps(stack, 1)
    stack.close()
    assert clips[0].path.endswith("train-ep000008-step000000008-1.mp4")
    assert len(listing(tmp_path)) == 12  # 6 clips and their sidecars


def test_load_state_dict_rejects_foreign_state_names_the_version_and_reads_version_1(tmp_path):
    _, rec, _, _ = make_stack(tmp_path, trigger="step", every=10)
    with pytest.raises(ValueError, match="recorder state"):
        rec.load_state_dict({"steps": 3})
    with pytest.raises(ValueError, match="version 99"):
        rec.load_state_dict({**rec.state_dict(), "version": 99})
    with pytest.raises(ValueError, match="recorder schedule state of version 1: version 5"):
        rec.load_state_dict({**rec.state_dict(), "schedule": {"version": 5}})
    # version 1 (before the Schedule had a state of its own): its keys at the top level
    old = dict(version=1, episode=4, steps=40, clips_saved=2, step_pending=True, step_fired_at=40)
    rec.load_state_dict(old)
    state = rec.state_dict()
    assert (state["episode"], state["steps"], state["clips_saved"]) == (4, 40, 2)
    assert state["schedule"] == {"version": 1, "step_pending": True, "step_fired_at": 40}
    rec.close()


@pytest.mark.parametrize("final", [True, False])
def test_expect_end_gives_the_final_episode_a_clip(tmp_path, final):
    """Episodes of 7 steps, "rollouts" of 16: the last rollout (steps 80-96) starts episodes 12 (at
    step 84) and 13 (at 91), and 13 is in progress at close. Arming once per rollout (as the runner
    did) recorded episode 12 and missed 13. With the end announced once, up front, every episode
    that begins within the last 7 steps is recorded: 13 only, besides the cubic 0, 1 and 8."""
    stack, rec, spy, clips = make_stack(
        tmp_path, max_steps=7, trigger="cubic", record_final_episode=final
    )
    stack.reset(seed=0)
    total = 6 * 16
    rec.expect_end(total)
    run_steps(stack, total)
    assert rec.engine.episode == 13 and rec.recording == final
    stack.close()
    # record_final_episode=false: expect_end changes nothing
    assert [c.episode for c in clips] == [0, 1, 8] + [13] * final
    if final:  # from its reset frame to the end
        assert len(assert_frames(clips[-1].path, spy.episodes[13])) == total - 91 + 1


def test_expect_end_without_a_time_limit_keeps_only_the_triggers_and_the_last_episode(tmp_path):
    """No max_episode_steps: any episode may still run at the end, so each one that starts after
    expect_end is recorded, provisionally: those that end before close are dropped, and the clips
    are the cubic trigger's and the episode in progress at close. Episodes end on success only
    (the policy heads for the goal)."""
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=None, trigger="cubic")
    env = stack.unwrapped

    def to_goal(_):
        direction = env.goal - env.pos
        return direction / direction.norm(dim=1, keepdim=True).clamp(min=1e-6) - env.vel * 0.5

    stack.reset(seed=0)
    run_steps(stack, 60, to_goal)
    announced_in = rec.engine.episode
    assert not rec.recording
    renders = len(spy.render_requests)
    rec.expect_end(120)
    run_steps(stack, 120, to_goal)
    last = rec.engine.episode
    stack.close()
    later = list(range(announced_in + 1, last + 1))
    assert len(later) >= 3
    # every later episode was rendered whole, kept or not
    assert len(spy.render_requests) - renders == sum(len(spy.episodes[e]) for e in later)
    kept = sorted({e for e in later if capped_cubic(e)} | {last})
    assert len(kept) < len(later)
    assert [c.episode for c in clips if c.episode > announced_in] == kept
    assert_frames(clips[-1].path, spy.episodes[last])
    assert_only_clips(tmp_path, clips)  # the dropped clips left no file behind


def test_clips_carry_the_tag_current_at_their_start(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=4, trigger="always")
    assert rec.engine.tag is None
    stack.reset(seed=0)  # episode 0 starts with no tag
    rec.engine.tag = "a"
    run_steps(stack, 4)  # episode 0 ends, episode 1 starts with "a"
    rec.engine.tag = ("b", 2)  # changed in the middle of episode 1: its clip keeps "a"
    run_steps(stack, 4)  # episode 2 starts with ("b", 2)
    stack.close()
    assert [(c.episode, c.tag) for c in clips] == [(0, None), (1, "a"), (2, ("b", 2))]
