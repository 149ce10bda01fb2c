from rlrec.config import RecorderConfig, Trigger
from rlrec.record.triggers import capped_cubic, clip_length, episode_fires, steps_per_frame


def test_capped_cubic_schedule():
    fired = [e for e in range(5001) if capped_cubic(e)]
    assert fired == [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000, 2000, 3000, 4000, 5000]


def test_episode_triggers():
    assert [e for e in range(12) if episode_fires(Trigger.episode, 4, e, False)] == [0, 4, 8]
    assert all(episode_fires(Trigger.always, None, e, False) for e in range(5))
    assert episode_fires(Trigger.eval, None, 7, True) and not episode_fires(Trigger.eval, None, 7, False)
    assert not any(episode_fires(t, 3, e, True) for t in (Trigger.none, Trigger.step) for e in range(5))


def test_steps_per_frame_and_real_fps():
    assert steps_per_frame(None, 0.05) == 1
    assert steps_per_frame(30, 1 / 30) == 1
    assert steps_per_frame(10, 0.01) == 10
    assert steps_per_frame(30, 0.01) == 3  # real fps 33.3
    # dt * fps > 2: round(1 / (fps * dt)) is 0; Genesis Forge divided by it, rlrec takes every step
    assert steps_per_frame(30, 0.1) == 1
    assert steps_per_frame(1000, 0.05) == 1


def test_clip_length():
    assert clip_length(RecorderConfig(), 20.0) is None
    assert clip_length(RecorderConfig(length_frames=7), 20.0) == 7
    assert clip_length(RecorderConfig(length_sec=0.5), 20.0) == 10
    assert clip_length(RecorderConfig(length_sec=0.01), 20.0) == 1
