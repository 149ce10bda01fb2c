"""What every recorder wrapper shares: its :class:`~rlrec.record.engine.ClipEngine` and the calls
a user makes on a recorder, written once.

A wrapper puts :class:`RecorderWrapper` first among its bases, before its framework's wrapper
class (``class RecordVectorVideo(RecorderWrapper, VectorWrapper)``), sets ``self.engine`` and turns
its env's resets and steps into the engine's two events. Everything else a user reads or calls
(the figures of the clips: ``wrapper.engine``) is the engine's.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from rlrec.checks import ConfigError
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine
from rlrec.record.settings import RecorderConfig

__all__ = ["RecorderWrapper", "check_callables", "env_index_list", "positive_number"]
__all__ += ["recorder_config"]


class RecorderWrapper:
    """The recorder calls of a wrapper around one engine (``engine``: None where the wrapper
    records nothing, e.g. ``RecordClips(save_video=False)``).

    ``clips``: the clips on disk so far (for wrappers that keep them, through :meth:`_on_clip`).
    """

    engine: Optional[ClipEngine] = None
    clips: List[ClipInfo]
    _user_on_clip: Optional[Callable[[ClipInfo], None]] = None
    _recorder_closed = False

    @property
    def recording(self) -> bool:
        """Whether a clip is open."""
        return self.engine is not None and self.engine.recording

    @property
    def errors(self) -> List[str]:
        """The encoder failures so far (the first is also logged)."""
        return [] if self.engine is None else self.engine.errors

    def record_next_episode(self) -> None:
        """Records the next episode of the (first) recorded env whatever the trigger says."""
        if self.engine is not None:
            self.engine.schedule.record_next_episode()

    def expect_end(self, steps_left: int) -> None:
        """The caller will step ``steps_left`` more times, then close (see
        :meth:`ClipEngine.expect_end`): with ``record_final_episode`` the episode in progress at
        the end gets a clip."""
        if self.engine is not None:
            self.engine.expect_end(steps_left)

    def end_clip(self) -> None:
        """Ends and saves the clip in progress now (e.g. when an evaluation stops early)."""
        if self.engine is not None:
            self.engine.end_clip()

    def flush(self) -> None:
        """Waits (bounded) until every ended clip is on disk and reported through ``on_clip``."""
        if self.engine is not None:
            self.engine.flush()

    def poll(self) -> None:
        """Reports finished clips and encoder errors (see :meth:`ClipEngine.poll`)."""
        if self.engine is not None:
            self.engine.poll()

    def close(self, **kwargs: Any) -> None:
        """Saves the clip in progress if ``record_final_episode`` (else drops it), waits for the
        encoder (bounded), reports the last clips, then closes the env. Idempotent."""
        if self._recorder_closed:
            return
        self._recorder_closed = True
        try:
            if self.engine is not None:
                self.engine.close()
        finally:
            self._release()
            super().close(**kwargs)  # type: ignore[misc]  # the framework's wrapper: the env

    def _release(self) -> None:
        """What the wrapper undoes before its env closes (a hook it installed)."""

    def _on_clip(self, info: ClipInfo) -> None:
        """The engine's ``on_clip`` of a wrapper that keeps ``clips``."""
        self.clips.append(info)
        if self._user_on_clip is not None:
            self._user_on_clip(info)


def env_index_list(value: Any, key: str) -> List[int]:
    """A wrapper's ``env_idx`` argument, one int or a list of them, as a list; ConfigError naming
    ``key`` otherwise (the range is checked with the rest of the settings)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in items
    ):
        raise ConfigError(
            f"{key}: env_idx={value!r} is invalid: give one env index (an int) or a list of them"
        )
    return [int(i) for i in items]


def positive_number(value: Any, key: str, name: str, rule: str) -> Optional[float]:
    """A wrapper's numeric argument as a float: None stays None, else a finite number > 0, or a
    ConfigError ``{key}: {name}=... is invalid: {rule}``."""
    if value is None:
        return None
    number = isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
    if not number or not math.isfinite(value) or not value > 0:
        raise ConfigError(f"{key}: {name}={value!r} is invalid: {rule}")
    return float(value)


def check_callables(key: str, **arguments: Any) -> None:
    """ConfigError naming ``key`` and the argument unless each of ``arguments`` is a callable or
    None."""
    for name, fn in arguments.items():
        if fn is not None and not callable(fn):
            raise ConfigError(f"{key}: {name}={fn!r} is invalid: give a callable or None")


# RecorderConfig fields a drop-in takes by their own names (besides its framework's arguments)
OPTIONS = ("length_frames", "length_sec", "record_final_episode", "overlay", "filename")
OPTIONS += ("queue_size", "stall_timeout_sec", "quality", "preset", "lossless", "on_error")


def recorder_config(
    key: str, num_envs: int, names: Dict[str, str], options: Dict[str, Any], extra=(), **fields: Any
) -> RecorderConfig:
    """A drop-in's settings for ``num_envs`` envs, checked (:meth:`RecorderConfig.check`, its
    messages naming ``names``: a field under the drop-in's argument name): ``fields`` from its
    framework's arguments, ``options`` the :class:`RecorderConfig` fields its caller named (those
    of ``OPTIONS + extra`` that ``fields`` does not set); ConfigError naming any other."""
    allowed = [k for k in OPTIONS + tuple(extra) if k not in fields]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{key} got an unknown argument {', '.join(map(repr, unknown))}: allowed are its "
            f"framework's arguments, its own and {', '.join(allowed)}"
        )
    cfg = RecorderConfig(**fields, **options)
    cfg.check(num_envs, key, names)
    return cfg
