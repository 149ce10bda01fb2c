"""rlrec's video recorder (docs/recorder.md).

- :mod:`~rlrec.record.engine`: :class:`ClipEngine`, every clip of one recorder, driven by two
  events (``on_reset``, ``on_step``) from whatever wraps the env;
- :mod:`~rlrec.record.recorder`: :class:`Recorder`, the engine as an env layer between AutoReset and
  the adapter in rlrec's own stack;
- :mod:`~rlrec.record.schedule`: :class:`Schedule`, every decision of when a clip starts;
- :mod:`~rlrec.record.timing`: which steps become frames, and the file's fps;
- :mod:`~rlrec.record.frames`: a frame's layout (grid, even size) and its overlay;
- :mod:`~rlrec.record.encoder`: :class:`Encoder`, the thread that streams clips to ffmpeg;
- :mod:`~rlrec.record.ffmpeg`: :class:`FFmpegProcess`, one ffmpeg process per clip;
- :mod:`~rlrec.record.sidecar`: ``NAME.json`` beside each ``NAME.mp4``, what the clip shows;
- :mod:`~rlrec.record.gymnasium_vector`: :class:`RecordVectorVideo`, a drop-in for Gymnasium's
  vector ``RecordVideo``, and its sub-env hook :class:`RenderHook` (imported on first use);
- :mod:`~rlrec.record.genesis_forge`: :class:`VideoWrapper`, a drop-in for Genesis Forge's
  ``VideoWrapper`` (imported on first use: it imports genesis_forge and genesis);
- :mod:`~rlrec.record.maniskill`: :class:`RecordClips`, the recorder placed where ManiSkill's
  ``RecordEpisode`` goes (imported on first use of the name: it imports mani_skill).

Importing it loads torch and numpy (and rlrec.config and rlrec.envs.base, the only rlrec modules
it depends on); imageio-ffmpeg and Pillow are imported on first use.
"""

from rlrec.record.encoder import BATCH, ClipInfo, ClipJob, Encoder
from rlrec.record.engine import ClipEngine, RecorderError, ensure_video_dir
from rlrec.record.ffmpeg import (
    FINISH_TIMEOUT_S,
    STALL_TIMEOUT_S,
    EncoderError,
    FFmpegProcess,
    quality_to_crf,
)
from rlrec.record.frames import FrameMeta, draw_overlay, grid_shape, pad_even, tile
from rlrec.record.recorder import Recorder
from rlrec.record.schedule import Schedule, capped_cubic
from rlrec.record.sidecar import SIDECAR_VERSION, sha256_file, sidecar_path, write_sidecar
from rlrec.record.timing import check_dt, clip_length, real_fps, steps_per_frame

__all__ = [
    "BATCH",
    "ClipEngine",
    "ClipInfo",
    "ClipJob",
    "Encoder",
    "EncoderError",
    "FFmpegProcess",
    "FINISH_TIMEOUT_S",
    "FrameMeta",
    "RecordClips",
    "RecordVectorVideo",
    "Recorder",
    "RecorderError",
    "RenderHook",
    "SIDECAR_VERSION",
    "STALL_TIMEOUT_S",
    "Schedule",
    "VideoWrapper",
    "capped_cubic",
    "check_dt",
    "clip_length",
    "draw_overlay",
    "ensure_video_dir",
    "grid_shape",
    "pad_even",
    "quality_to_crf",
    "real_fps",
    "sha256_file",
    "sidecar_path",
    "steps_per_frame",
    "tile",
    "write_sidecar",
]

_LAZY = {
    "RecordVectorVideo": "gymnasium_vector",
    "RenderHook": "gymnasium_vector",
    "VideoWrapper": "genesis_forge",
    "RecordClips": "maniskill",
}


def __getattr__(name: str):
    """The framework wrappers are imported on first use: ``import rlrec.record`` loads no
    framework's vector module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
