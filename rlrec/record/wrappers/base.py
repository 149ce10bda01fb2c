"""What every recorder wrapper shares: its :class:`~rlrec.record.engine.ClipEngine` and the calls
a user makes on a recorder, written once.

A wrapper puts :class:`RecorderWrapper` first among its bases, before its framework's wrapper
class (``class RecordVectorVideo(RecorderWrapper, VectorWrapper)``), sets ``self.engine`` and turns
its env's resets and steps into the engine's two events. Everything else a user reads or calls
(the figures of the clips: ``wrapper.engine``) is the engine's. A drop-in checks its arguments
and builds its settings through one :class:`Arguments` bound to its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NoReturn, Optional

import numpy as np

from rlrec.checks import ConfigError
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine
from rlrec.record.settings import RecorderConfig


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

    def record_next_episode(self):
        """Records the next episode of the (first) recorded env whatever the trigger says."""
        if self.engine is not None:
            self.engine.schedule.record_next_episode()

    def expect_end(self, steps_left: int):
        """The caller will step ``steps_left`` more times, then close (see
        :meth:`ClipEngine.expect_end`): with ``record_final_episode`` the episode in progress at
        the end gets a clip."""
        if self.engine is not None:
            self.engine.expect_end(steps_left)

    def end_clip(self):
        """Ends and saves the clip in progress now (e.g. when an evaluation stops early)."""
        if self.engine is not None:
            self.engine.end_clip()

    def flush(self):
        """Waits (bounded) until every ended clip is on disk and reported through ``on_clip``."""
        if self.engine is not None:
            self.engine.flush()

    def finish(self):
        """The env is stepped no more (:meth:`close` comes later): the clip in progress is saved
        if ``record_final_episode`` (else dropped), as at close, and waited for (bounded)."""
        engine = self.engine
        if engine is not None:
            engine.end_clip(keep=engine.cfg.record_final_episode)
            engine.flush()

    def poll(self):
        """Reports finished clips and encoder errors (see :meth:`ClipEngine.poll`)."""
        if self.engine is not None:
            self.engine.poll()

    def close(self, **kwargs):
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

    def _release(self):
        """What the wrapper undoes before its env closes (a hook it installed)."""

    def _on_clip(self, info):
        """The engine's ``on_clip`` of a wrapper that keeps ``clips``."""
        self.clips.append(info)
        if self._user_on_clip is not None:
            self._user_on_clip(info)


# RecorderConfig fields a drop-in takes by their own names (besides its framework's arguments)
OPTIONS = (
    "length_frames length_sec record_final_episode overlay filename queue_size stall_timeout_sec "
    "quality preset lossless on_error"
).split()


def _whole(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class Arguments:
    """The checks of a drop-in's arguments, before any work: each refusal is the one
    ConfigError ``{key}: {name}=... is invalid: {rule}`` (:meth:`refuse`). ``names`` maps a
    :class:`RecorderConfig` field to the drop-in's own argument name, for the settings' messages
    (``RecordVectorVideo.video_length``, not ``RecordVectorVideo.length_frames``)."""

    key: str
    names: Dict[str, str] = field(default_factory=dict)

    def refuse(self, name: str, value, rule: str) -> NoReturn:
        raise ConfigError(f"{self.key}: {name}={value!r} is invalid: {rule}")

    def env_idx(self, value) -> List[int]:
        """The ``env_idx`` argument, one int or a list of them, as a list (the range is checked
        with the rest of the settings)."""
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items or not all(map(_whole, items)):
            self.refuse("env_idx", value, "give one env index (an int) or a list of them")
        return [int(i) for i in items]

    def whole(self, value, name: str, least: int, rule: str) -> int:
        """An int argument (not a bool) of at least ``least``."""
        if not _whole(value) or value < least:
            self.refuse(name, value, rule)
        return int(value)

    def positive(self, value, name: str, rule: str) -> Optional[float]:
        """A numeric argument as a float: None stays None, else a finite number > 0."""
        number = _whole(value) or isinstance(value, (float, np.floating))
        if value is not None and not (number and math.isfinite(value) and value > 0):
            self.refuse(name, value, rule)
        return None if value is None else float(value)

    def callables(self, **arguments):
        """Each of ``arguments`` is a callable or None."""
        for name, fn in arguments.items():
            if fn is not None and not callable(fn):
                self.refuse(name, fn, "give a callable or None")

    def config(self, num_envs: int, options: Dict[str, Any], extra=(), **fields) -> RecorderConfig:
        """The drop-in's settings for ``num_envs`` envs, checked (:meth:`RecorderConfig.check`,
        naming ``names``): ``fields`` from its framework's arguments, ``options`` the
        :class:`RecorderConfig` fields its caller named (those of ``OPTIONS + extra`` that
        ``fields`` does not set); ConfigError naming any other."""
        allowed = [k for k in (*OPTIONS, *extra) if k not in fields]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ConfigError(
                f"{self.key} got an unknown argument {', '.join(map(repr, unknown))}: allowed are "
                f"its framework's arguments, its own and {', '.join(allowed)}"
            )
        cfg = RecorderConfig(**fields, **options)
        cfg.check(num_envs, self.key, self.names)
        return cfg
