"""When clips start: the cubic schedule, no re-firing, step trigger, idle cost, resume."""

import os

import numpy as np
import pytest

from rlrec.record.schedule import capped_cubic
from tests.record.recutil import decode, listing, make_stack, zeros


def run_episodes(stack, n, steps_per_episode):
    for _ in range(n * steps_per_episode):
        stack.step(zeros(stack))


def test_cubic_schedule_records_exactly_episodes_0_1_8_27(tmp_path):
    # one-step episodes keep 1001 episodes cheap; frames are 16x16
    stack, rec, spy, clips = make_stack(
        tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False
    )
    stack.reset(seed=0)
    run_episodes(stack, 1001, 1)  # episodes 0..1000 finish; episode 1001 is in progress
    rec.flush()
    assert [c.episode for c in clips] == [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000]
    assert all(c.num_frames == 2 for c in clips)  # reset frame + terminal frame
    assert listing(tmp_path) == sorted(
        f"train-ep{e:06d}-step{e:09d}.{ext}"
        for e in [c.episode for c in clips]
        for ext in ("mp4", "json")  # each clip and its sidecar
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
    run_episodes(stack, 9, 10)  # episodes 0..8; the last step's autoreset starts episode 9
    rec.flush()
    expected = {"always": list(range(9)), "cubic": [0, 1, 8], "episode": [0, 2, 4, 6, 8]}[trigger]
    assert [c.episode for c in clips] == expected  # episode 9's clip is still open
    assert all(c.num_frames == 3 for c in clips)
    assert len(spy.render_requests) == 3 * len(expected) + rec.recording
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
    stack, rec, spy, clips = make_stack(
        tmp_path, num_envs=4, max_steps=5, trigger="eval", kind="eval"
    )
    for _evaluation in range(3):
        stack.reset(seed=7)
        run_episodes(
            stack, 3, 5
        )  # env 0 plays 3 episodes and starts a 4th; only the 1st is recorded
    stack.close()
    assert [c.episode for c in clips] == [0, 4, 8] and all(c.num_frames == 6 for c in clips)
    assert len(spy.render_requests) == 18


def test_state_dict_resume_continues_the_schedule(tmp_path):
    stack, rec, spy, clips = make_stack(
        tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False
    )
    stack.reset(seed=0)
    run_episodes(stack, 10, 1)  # episodes 0..9 finished, 10 in progress
    rec.flush()
    state = rec.state_dict()
    assert state["episode"] == 10 and state["steps"] == 10 and state["clips_saved"] == 3
    stack.close()

    # a resumed run: new env stack, state loaded before the first reset
    stack2, rec2, _, clips2 = make_stack(
        tmp_path, size=16, max_steps=1, trigger="cubic", keep_frames=False
    )
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
    assert len(listing(tmp_path)) == 12  # 6 clips and their sidecars


def test_load_state_dict_rejects_foreign_state(tmp_path):
    _, rec, _, _ = make_stack(tmp_path)
    with pytest.raises(ValueError, match="recorder state"):
        rec.load_state_dict({"steps": 3})
    rec.close()


def test_load_state_dict_names_the_version_found_and_reads_version_1(tmp_path):
    _, rec, _, _ = make_stack(tmp_path, trigger="step", every=10)
    with pytest.raises(ValueError, match="version 99"):
        rec.load_state_dict({**rec.state_dict(), "version": 99})
    with pytest.raises(ValueError, match="recorder schedule state of version 1: version 5"):
        rec.load_state_dict({**rec.state_dict(), "schedule": {"version": 5}})
    # version 1 (before the Schedule had a state of its own): its keys at the top level
    old = {
        "version": 1,
        "episode": 4,
        "steps": 40,
        "clips_saved": 2,
        "step_pending": True,
        "step_fired_at": 40,
    }
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
    run_episodes(stack, 1, total)
    final_episode = rec.engine.episode
    assert final_episode == 13 and rec.recording == final
    stack.close()
    if not final:  # record_final_episode=false: expect_end changes nothing
        assert [c.episode for c in clips] == [0, 1, 8]
        return
    assert [c.episode for c in clips] == [0, 1, 8, 13]
    frames, _ = decode(clips[-1].path)
    assert np.array_equal(frames, np.stack(spy.episodes[13]))  # from its reset frame to the end
    assert len(frames) == total - 91 + 1


def test_expect_end_without_a_time_limit_keeps_only_the_triggers_and_the_last_episode(tmp_path):
    """No max_episode_steps: any episode may still run at the end, so each one that starts after
    expect_end is recorded, provisionally: those that end before close are dropped, and the clips
    are the cubic trigger's and the episode in progress at close. Episodes end on success only
    (the policy heads for the goal)."""
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=None, trigger="cubic")
    env = stack.unwrapped

    def run(n):
        for _ in range(n):
            direction = env.goal - env.pos
            act = direction / direction.norm(dim=1, keepdim=True).clamp(min=1e-6) - env.vel * 0.5
            stack.step(act)

    stack.reset(seed=0)
    run(60)
    announced_in = rec.engine.episode
    assert not rec.recording
    renders = len(spy.render_requests)
    rec.expect_end(120)
    run(120)
    last = rec.engine.episode
    stack.close()
    later = list(range(announced_in + 1, last + 1))
    assert len(later) >= 3
    # every later episode was rendered whole, kept or not
    assert len(spy.render_requests) - renders == sum(len(spy.episodes[e]) for e in later)
    kept = sorted({e for e in later if capped_cubic(e)} | {last})
    assert len(kept) < len(later)
    assert [c.episode for c in clips if c.episode > announced_in] == kept
    assert clips[-1].episode == last
    frames, _ = decode(clips[-1].path)
    assert np.array_equal(frames, np.stack(spy.episodes[last]))
    # the dropped clips left no file behind
    names = [os.path.basename(p) for c in clips for p in (c.path, c.sidecar)]
    assert listing(tmp_path) == sorted(names)


def test_clips_carry_the_tag_current_at_their_start(tmp_path):
    stack, rec, spy, clips = make_stack(tmp_path, max_steps=4, trigger="always")
    assert rec.engine.tag is None
    stack.reset(seed=0)  # episode 0 starts with no tag
    rec.engine.tag = "a"
    run_episodes(stack, 1, 4)  # episode 0 ends, episode 1 starts with "a"
    rec.engine.tag = ("b", 2)  # changed in the middle of episode 1: its clip keeps "a"
    run_episodes(stack, 1, 4)  # episode 2 starts with ("b", 2)
    stack.close()
    assert [(c.episode, c.tag) for c in clips] == [(0, None), (1, "a"), (2, ("b", 2))]
