"""rlrec's video recorder (docs/recorder.md): drop it into any loop.

The core knows no framework and imports neither Hydra nor any simulator or env library:

- :mod:`~rlrec.record.settings`: :class:`RecorderConfig`, the settings (checked by
  :meth:`RecorderConfig.check`), and :class:`Trigger`;
- :mod:`~rlrec.record.engine`: :class:`ClipEngine`, every clip of one recorder, driven by two
  events (``on_reset``, ``on_step``) from whatever wraps the env;
- :mod:`~rlrec.record.schedule`: :class:`Schedule`, every decision of when a clip starts;
- :mod:`~rlrec.record.names`: every clip's file name, and the parse of a name back;
- :mod:`~rlrec.record.timing`: which steps become frames, and the file's fps;
- :mod:`~rlrec.record.frames`: a frame's layout (grid, even size) and its overlay;
- :mod:`~rlrec.record.encoder`: :class:`Encoder`, the thread that streams clips to ffmpeg;
- :mod:`~rlrec.record.ffmpeg`: one ffmpeg process per clip;
- :mod:`~rlrec.record.sidecar`: ``NAME.json`` beside each ``NAME.mp4``, what the clip shows.

The wrappers that put the engine into an env stack (:mod:`rlrec.record.wrappers`) import their
framework and are imported on first use of their name here: :class:`Recorder` (rlrec's own env
stack), :class:`RecordVectorVideo` and its sub-env hook :class:`RenderHook` (Gymnasium),
:class:`RecordClips` (ManiSkill), :class:`VideoWrapper` (Genesis Forge).

Importing it loads torch and numpy, and of rlrec only ``rlrec.checks`` and ``rlrec.files``
(tests/record/test_portable.py); imageio-ffmpeg and Pillow are imported on first use.
"""

from rlrec.record.encoder import ClipInfo, Encoder
from rlrec.record.engine import ClipEngine, RecorderError, Source
from rlrec.record.ffmpeg import EncoderError
from rlrec.record.frames import FrameMeta
from rlrec.record.schedule import Schedule
from rlrec.record.settings import RecorderConfig, Trigger

# the wrappers, by the module of rlrec.record.wrappers that defines each
_LAZY = {
    "Recorder": "adapter",
    "RecordVectorVideo": "gymnasium",
    "RenderHook": "gymnasium",
    "RecordClips": "maniskill",
    "VideoWrapper": "genesis_forge",
}
__all__ = [
    "ClipEngine",
    "ClipInfo",
    "Encoder",
    "EncoderError",
    "FrameMeta",
    "RecorderConfig",
    "RecorderError",
    "Schedule",
    "Source",
    "Trigger",
    *_LAZY,
]


def __getattr__(name: str):
    """The wrappers are imported on first use: ``import rlrec.record`` loads no framework."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.wrappers.{module}"), name)
    globals()[name] = value
    return value
