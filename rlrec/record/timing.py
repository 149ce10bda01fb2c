"""How a clip's frames are timed: which steps become frames, the fps written into the file, and
how many frames a clip has. The one place where "the fps" is computed; pure functions, no state.
"""

from __future__ import annotations

from typing import Optional

from rlrec.checks import ConfigError
from rlrec.record.settings import RecorderConfig

__all__ = ["check_dt", "clip_length", "real_fps", "steps_per_frame"]


def check_dt(dt: float, key: str) -> None:
    """The env's dt must be a positive number for the file's fps to mean anything."""
    if dt is None or not dt > 0:
        raise ConfigError(f"{key}: the env reports dt={dt!r}; the recorder needs a positive env dt")


def steps_per_frame(fps: Optional[float], dt: float) -> int:
    """Env steps between two frames: ``max(1, round(1 / (fps * dt)))``; 1 when ``fps`` is None.

    The ``max`` keeps ``fps * dt > 2`` (asking for more frames than there are steps) from
    rounding to zero: every step is then a frame and the file's fps is ``1 / dt``.
    """
    return 1 if fps is None else max(1, round(1.0 / (fps * dt)))


def real_fps(steps_per_frame: int, dt: float) -> float:
    """The fps the frames really have, ``1 / (steps_per_frame * dt)``: what the file says."""
    return 1.0 / (steps_per_frame * dt)


def clip_length(cfg: RecorderConfig, fps: float) -> Optional[int]:
    """Frames per clip (None: the whole episode). Seconds are converted at the file's real fps."""
    if cfg.length_frames is not None:
        return int(cfg.length_frames)
    if cfg.length_sec is not None:
        return max(1, round(cfg.length_sec * fps))
    return None
