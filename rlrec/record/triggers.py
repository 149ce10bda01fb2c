"""When a clip starts and how its frames are timed: pure functions, no state.

Episode triggers are asked once per episode of the recorded env, at its reset, so they cannot
fire twice in one episode. The step trigger is asked after each step (see ``Recorder.step``).
"""

from __future__ import annotations

from typing import Optional

from rlrec.config import ConfigError, RecorderConfig, Trigger


def capped_cubic(episode: int) -> bool:
    """True for episodes 0, 1, 8, 27, ..., 729, 1000, 2000, 3000, ... (Gymnasium's schedule)."""
    if episode < 1000:
        return round(episode ** (1.0 / 3)) ** 3 == episode
    return episode % 1000 == 0


def episode_fires(trigger: Trigger, every: Optional[int], episode: int, full_reset: bool) -> bool:
    """Whether the episode ``episode`` of the recorded env, just reset, starts a clip.

    ``full_reset``: the reset was ``reset(env_idx=None)`` (an AutoReset naming every env is not
    one); the ``eval`` trigger records the first episode after each full reset, i.e. one clip per
    evaluation.
    """
    if trigger is Trigger.cubic:
        return capped_cubic(episode)
    if trigger is Trigger.episode:
        return episode % int(every) == 0  # type: ignore[arg-type]
    if trigger is Trigger.always:
        return True
    if trigger is Trigger.eval:
        return full_reset
    return False  # step (handled per step) and none


def steps_per_frame(fps: Optional[float], dt: float) -> int:
    """Env steps between two frames: ``max(1, round(1 / (fps * dt)))``; 1 when ``fps`` is None.

    The ``max`` keeps ``fps * dt > 2`` (asking for more frames than there are steps) from
    rounding to zero: every step is then a frame and the file's fps is ``1 / dt``.
    """
    if fps is None:
        return 1
    return max(1, round(1.0 / (fps * dt)))


def clip_length(cfg: RecorderConfig, fps: float) -> Optional[int]:
    """Frames per clip (None: the whole episode). Seconds are converted at the file's real fps."""
    if cfg.length_frames is not None:
        return int(cfg.length_frames)
    if cfg.length_sec is not None:
        return max(1, round(cfg.length_sec * fps))
    return None


def check_dt(dt: float, key: str) -> None:
    """The env's dt must be a positive number for the file's fps to mean anything."""
    if dt is None or not dt > 0:
        raise ConfigError(f"{key}: the env reports dt={dt!r}; the recorder needs a positive env dt")
