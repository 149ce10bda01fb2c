"""rlrec's video recorder (docs/recorder.md): drop it into any loop.

The core knows no framework and imports neither Hydra nor any simulator or env library:

- :mod:`~rlrec.record.settings`: :class:`RecorderConfig`, the settings (checked by
  :meth:`RecorderConfig.check`), and :class:`Trigger`;
- :mod:`~rlrec.record.engine`: :class:`ClipEngine`, every clip of one recorder, driven by two
  events (``on_reset``, ``on_step``) from whatever wraps the env, and its timing (which steps
  become frames, the file's fps, a clip's length in frames);
- :mod:`~rlrec.record.schedule`: :class:`Schedule`, every decision of when a clip starts;
- :mod:`~rlrec.record.names`: every clip's file name, and the parse of a name back;
- :mod:`~rlrec.record.frames`: a frame's layout (grid, even size) and its overlay;
- :mod:`~rlrec.record.encoder`: :class:`Encoder`, the thread that streams clips to ffmpeg;
- :mod:`~rlrec.record.ffmpeg`: one ffmpeg process per clip;
- :mod:`~rlrec.record.sidecar`: ``NAME.json`` beside each ``NAME.mp4``, what the clip shows.

The wrappers that put the engine into an env stack (:mod:`rlrec.record.wrappers`) import their
framework and are imported on first use of their name here: :class:`Recorder` (rlrec's own env
stack), :class:`RecordVectorVideo` and its sub-env hook :class:`RenderHook` (Gymnasium),
:class:`RecordClips` (ManiSkill), :class:`VideoWrapper` (Genesis Forge).

Each name is imported on first use: importing the package loads nothing (a config naming
:class:`RecorderConfig` loads no torch); none of them loads Hydra, OmegaConf or rlrec's config, and
the core's names load no rlrec.envs (the wrappers import ``rlrec.envs.base`` or their backend's
module; tests/record/test_portable.py); imageio-ffmpeg and Pillow are imported on first use.
"""

from rlrec import lazy

# each module of rlrec.record and the names it defines
_MODULES = {
    "encoder": "ClipInfo Encoder",
    "engine": "ClipEngine RecorderError Source",
    "ffmpeg": "EncoderError",
    "frames": "FrameMeta",
    "schedule": "Schedule",
    "settings": "RecorderConfig Trigger",
    "wrappers.adapter": "Recorder",
    "wrappers.gymnasium": "RecordVectorVideo RenderHook",
    "wrappers.maniskill": "RecordClips",
    "wrappers.genesis_forge": "VideoWrapper",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = list(_LAZY)
__getattr__ = lazy(__name__, _LAZY)
