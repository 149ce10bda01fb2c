"""The Schedule on its own (every trigger decision and its state), and the engine's timing."""

import pytest

from rlrec.checks import ConfigError
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Schedule, Start, capped_cubic
from rlrec.record.settings import RecorderConfig, Trigger

CUBES = [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000]


def fired(schedule, episodes, steps_per_episode=1, full_reset=False):
    """The episodes (each reset after ``episode * steps_per_episode`` steps) that start a clip."""
    return [e for e in episodes if schedule.on_reset(e, e * steps_per_episode, full_reset)]


def never_terminal():
    return False


def test_episode_triggers():
    assert [e for e in range(5001) if capped_cubic(e)] == CUBES + [2000, 3000, 4000, 5000]
    assert fired(Schedule(Trigger.cubic), range(1001)) == CUBES
    assert fired(Schedule(Trigger.episode, 4), range(12)) == [0, 4, 8]
    assert fired(Schedule(Trigger.always), range(5)) == list(range(5))
    assert Schedule(Trigger.eval).on_reset(7, 0, True)
    assert not Schedule(Trigger.eval).on_reset(7, 0, False)
    assert fired(Schedule(Trigger.none), range(5), full_reset=True) == []
    # episodes alone never fire the step trigger: resets at steps 1, 4, 7, ... (never 3k)
    step = Schedule(Trigger.step, 3)
    assert [e for e in range(5) if step.on_reset(e, 3 * e + 1, True)] == []
    assert Schedule("cubic").trigger is Trigger.cubic  # names are accepted
    with pytest.raises(ValueError):
        Schedule("sometimes")


@pytest.mark.parametrize(
    "trigger, every", [("always", None), ("cubic", None), ("episode", 2), ("eval", None)]
)
def test_an_episode_trigger_fires_at_most_once_per_episode(trigger, every):
    s = Schedule(trigger, every)
    assert s.on_reset(0, 0, True)  # episode 0 is on every one of these schedules
    assert not s.on_reset(0, 0, True)  # asked again about the same episode
    s.record_next_episode()
    assert not s.on_reset(0, 5, True)  # not even when armed: the request waits for episode 1
    assert s.on_reset(1, 5, False)
    assert not s.on_reset(1, 5, False)
    # episode triggers never look at steps
    assert not s.asks_steps and not s.on_step(100, False, never_terminal)


def test_step_trigger_fires_on_multiples_of_every_and_on_a_terminal_step_at_the_next_reset():
    s = Schedule(Trigger.step, 10)
    assert s.asks_steps and s.on_reset(0, 0, True)  # step 0: at the first reset
    assert not s.on_reset(1, 4, False) and not s.on_reset(2, 8, False)
    calls = []

    def terminal():
        calls.append(1)
        return len(calls) == 3  # the step trigger's third fall (step 30) is a terminal step

    assert [t for t in range(1, 31) if s.on_step(t, False, terminal)] == [10, 20]
    assert len(calls) == 3  # the done flag is read only when the trigger falls
    # the terminal step's clip (one frame: useless) starts at the reset right after it, and only
    # there; a reset at a multiple of every that the trigger did not fire at starts one too
    assert s.state_dict()["step_pending"]
    assert s.on_reset(3, 30, False) and not s.state_dict()["step_pending"]
    assert not s.on_reset(4, 34, False)
    assert s.on_reset(5, 40, False)


def test_a_step_trigger_during_a_clip_starts_one_only_with_restart():
    calls = []
    s = Schedule(Trigger.step, step_fn=lambda t: calls.append(t) or t == 5)
    assert not s.on_step(5, True, never_terminal) and calls == []  # busy: not even asked
    # restart (Gymnasium's RecordVideo): the open clip gives way to the step trigger's
    s = Schedule(Trigger.step, step_fn=lambda t: t == 5, restart=True)
    assert s.on_step(5, True, never_terminal) is Start.step
    # both triggers at one reset: the step trigger's name, as Gymnasium's
    s = Schedule(Trigger.step, step_fn=lambda t: t == 9, episode_fn=lambda e: e == 1)
    assert s.on_reset(1, 9, False) is Start.step
    assert s.on_reset(2, 12, False) is None


def test_record_next_episode_once():
    s = Schedule(Trigger.cubic)
    assert fired(s, range(2, 5)) == []
    s.record_next_episode()
    assert fired(s, range(5, 8)) == [5]


def test_expect_end_records_every_episode_that_may_be_in_progress_at_the_end():
    s = Schedule(Trigger.eval, record_final_episode=True)  # without full resets: never fires
    s.expect_end(steps=0, steps_left=100, horizon=10)
    # an episode reset after s steps lasts at most 10 steps: it may run at step 100 if s >= 90
    assert fired(s, range(11), steps_per_episode=10) == [9, 10]
    s.expect_end(steps=100, steps_left=50, horizon=10)  # a new announcement replaces the old one
    resets = [(11, 120), (12, 139), (13, 140), (14, 150)]
    assert [e for e, t in resets if s.on_reset(e, t, False)] == [13, 14]
    # without a time limit: every episode from now on
    s = Schedule(Trigger.eval, record_final_episode=True)
    assert fired(s, range(3), steps_per_episode=5) == []
    s.expect_end(steps=15, steps_left=1000, horizon=None)
    assert fired(s, range(3, 8), steps_per_episode=5) == [3, 4, 5, 6, 7]
    # without record_final_episode: nothing
    s = Schedule(Trigger.eval, record_final_episode=False)
    s.expect_end(steps=0, steps_left=10, horizon=10)
    assert fired(s, range(5), steps_per_episode=2) == []
    with pytest.raises(ValueError, match="steps_left"):
        Schedule(Trigger.eval, record_final_episode=True).expect_end(0, -1, 10)


def test_expect_end_records_untriggered_episodes_provisionally():
    """In the last ``horizon`` steps an episode the trigger selects is the trigger's clip, every
    other one a provisional clip (kept only if it is in progress at close)."""
    s = Schedule(Trigger.cubic, record_final_episode=True)
    s.expect_end(steps=0, steps_left=100, horizon=10)
    resets = {7: 85, 8: 91, 9: 93, 10: 96}  # episode: the step count at its reset
    starts = {e: s.on_reset(e, steps, False) for e, steps in resets.items()}
    assert starts == {7: None, 8: Start.episode, 9: Start.provisional, 10: Start.provisional}
    s.record_next_episode()
    assert s.on_reset(11, 95, False) is Start.episode


def test_state_round_trip_and_a_bad_version():
    s = Schedule(Trigger.step, 10)
    assert s.on_reset(0, 0, True)
    assert not s.on_step(10, False, lambda: True)  # pending
    state = s.state_dict()
    assert state == {"version": Schedule.STATE_VERSION, "step_pending": True, "step_fired_at": 10}
    resumed = Schedule(Trigger.step, 10)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.on_reset(1, 13, False)  # the pending clip starts at the resumed run's reset
    assert not Schedule(Trigger.step, 10).on_reset(1, 13, False)  # a fresh schedule: not due
    assert s.on_reset(1, 10, False) and s.on_step(20, False, never_terminal)  # fired at step 20
    resumed = Schedule(Trigger.step, 10)
    resumed.load_state_dict(s.state_dict())
    assert not resumed.on_reset(2, 20, False)  # not a second time at step 20
    assert Schedule(Trigger.step, 10).on_reset(2, 20, False)
    with pytest.raises(ValueError, match=r"recorder schedule state of version 1: version 7"):
        s.load_state_dict({"version": 7, "step_pending": False, "step_fired_at": -1})
    with pytest.raises(ValueError, match="version None"):
        s.load_state_dict({"step_pending": True})


def _timing(tmp_path, dt, **settings):
    """``(steps_per_frame, fps, length)`` of an engine of ``settings`` over an env of ``dt``."""
    engine = ClipEngine(RecorderConfig(**settings), Source(1, dt, "cpu", None), str(tmp_path))
    engine.close()
    return engine.steps_per_frame, pytest.approx(engine.fps), engine.length


@pytest.mark.parametrize(
    "dt, settings, timing",
    [
        (0.05, {}, (1, 20.0, None)),
        (1 / 30, dict(fps=30), (1, 30.0, None)),
        (0.01, dict(fps=10), (10, 10.0, None)),
        (0.01, dict(fps=30, length_sec=0.5), (3, 100 / 3, 17)),  # at the real fps, 33.3
        # dt * fps > 2: round(1 / (fps * dt)) is 0; Genesis Forge divided by it, rlrec takes
        # every step
        (0.1, dict(fps=30), (1, 10.0, None)),
        (0.05, dict(fps=1000), (1, 20.0, None)),
        (0.05, dict(length_frames=7), (1, 20.0, 7)),
        (0.05, dict(length_sec=0.5), (1, 20.0, 10)),
        (0.05, dict(length_sec=0.01), (1, 20.0, 1)),
    ],
)
def test_steps_per_frame_real_fps_and_clip_length(tmp_path, dt, settings, timing):
    assert _timing(tmp_path, dt, **settings) == timing


@pytest.mark.parametrize("dt", [None, 0.0, -0.1])
def test_an_env_without_a_positive_dt_is_refused(tmp_path, dt):
    with pytest.raises(ConfigError, match=rf"recorder: the env reports dt={dt}; .* dt > 0"):
        _timing(tmp_path, dt)
