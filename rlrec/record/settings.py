"""The recorder's settings: one plain dataclass, owned by the recorder and reused as the Hydra
schema of ``recorder`` and ``eval_env.recorder`` (no Hydra needed to build or check it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from rlrec.checks import (
    POSITIVE,
    SECONDS,
    Choice,
    ConfigError,
    check_fields,
    positive,
)
from rlrec.files import probe_dir

OnError = Choice("OnError", {"warn": "warn", "raise": "raise"}, module=__name__)
OnError.__doc__ = (
    "What an encoder failure does: log once and train on (warn), or stop the run (raise)."
)


class X264Preset(Choice):
    """x264's speed/size trade-off: slower presets make smaller files for more encoder CPU."""

    ultrafast = "ultrafast"
    superfast = "superfast"
    veryfast = "veryfast"
    faster = "faster"
    fast = "fast"
    medium = "medium"
    slow = "slow"
    slower = "slower"
    veryslow = "veryslow"


class Trigger(Choice):
    """When a clip starts. ``eval``: the first episode after each full reset."""

    cubic = "cubic"
    episode = "episode"
    step = "step"
    always = "always"
    eval = "eval"
    none = "none"


class View(Choice):
    """What a clip shows: the render camera, the policy's observation image (upscaled, nearest
    neighbour), or both side by side (docs/recorder.md, "Views")."""

    render = "render"
    obs = "obs"
    both = "both"


@dataclass
class RecorderConfig:
    """One recorder: which env, when, how long, how encoded."""

    # the range of each float field, applied by rlrec.checks.check_fields (not a field)
    FLOAT_RANGES = {"length_sec": SECONDS, "fps": POSITIVE, "stall_timeout_sec": SECONDS}

    enabled: bool = True
    trigger: Trigger = Trigger.cubic  # exactly one trigger
    every: Optional[int] = None  # N for trigger=episode (episodes) or trigger=step (env steps)
    length_frames: Optional[int] = None  # clip length in frames, or
    length_sec: Optional[float] = None  # in seconds of sim time; both None: the whole episode
    # None: 1 / env dt; a frame every max(1, round(1 / (fps * dt))) steps
    fps: Optional[float] = None
    env_idx: List[int] = field(default_factory=lambda: [0])  # several: tiled into a grid
    view: View = View.render  # render | obs (the policy's observation image) | both
    overlay: bool = False  # episode, step, reward, success drawn on the frames
    # a fixed name replaced atomically by each clip; None: one file per clip
    filename: Optional[str] = None
    dir: Optional[str] = None  # None: the run's video dir (<run dir>/videos/train or /eval)
    # close() (exit, exception, Ctrl-C, SIGTERM) saves the clip in progress
    record_final_episode: bool = True
    queue_size: int = 64  # frame buffers in flight between the training thread and the encoder
    # seconds a hung ffmpeg may stall training: then its clip is dropped and training goes on
    stall_timeout_sec: float = 10.0
    quality: int = 7  # 1..10 (imageio's scale; 7 = x264 crf 15)
    preset: X264Preset = X264Preset.ultrafast  # the encoder's CPU time against the file's size
    lossless: bool = False  # exact RGB (libx264rgb, qp 0): pixel-exact, fewer players
    on_error: OnError = OnError.warn  # warn: log once, training goes on | raise: fatal

    def check(self, num_envs: int, key: str = "recorder", names: Optional[Dict[str, str]] = None):
        """ConfigError unless these settings fit a batch of ``num_envs`` envs: the one check of a
        recorder's settings. Messages name ``{key}.{field}``; ``names`` maps a field to the
        caller's own argument name (a drop-in wrapper's: ``RecordVectorVideo.video_length``, not
        ``RecordVectorVideo.length_frames``)."""

        def n(f):
            return f"{key}.{(names or {}).get(f, f)}"

        def refuse(f, why):
            raise ConfigError(f"{n(f)}={getattr(self, f)!r} is invalid: {why}")

        for f in ("every", "length_frames", "queue_size"):
            positive(getattr(self, f), n(f), allow_none=f != "queue_size")
        # length_sec, fps, stall_timeout_sec (by their own names), trigger, preset, on_error, view
        check_fields(self, f"{key}.")
        if not 1 <= self.quality <= 10:
            refuse("quality", "must be in 1..10")
        if self.length_frames is not None and self.length_sec is not None:
            refuse("length_frames", f"{n('length_sec')} is set too: give at most one clip length")
        if (self.trigger in (Trigger.episode, Trigger.step)) != (self.every is not None):
            t, e = n("trigger"), n("every")  # exactly one trigger, with its count
            refuse(
                "every",
                f"{t}={self.trigger}: {t}=episode and {t}=step each needs {e} (a positive count), "
                "any other trigger none (a recorder has exactly one trigger)",
            )
        idx = self.env_idx
        if not idx or len(set(idx)) != len(idx) or not all(0 <= i < num_envs for i in idx):
            refuse("env_idx", f"give distinct indices in [0, {num_envs - 1}] (num_envs={num_envs})")
        name = self.filename
        # ffmpeg is handed file: and an absolute path, so this is about what the name means: one
        # visible file in the video dir (".mp4" is appended when missing), with room for the
        # temporary name beside it (.NAME.PID-N.part) under the 255-byte limit: no '/' or NUL,
        # not starting with '.', '-' or a space, not ending with a space
        plain = isinstance(name, str) and re.fullmatch(r"[^/\0.\s-]([^/\0]*[^/\0\s])?", name)
        if name is not None and not (
            plain and len(name.encode()) + 4 <= 200 + 4 * name.lower().endswith(".mp4")
        ):
            refuse(
                "filename",
                "must be a plain file name (no '/', not starting with '.', '-' or a space, at "
                "most 200 bytes), e.g. latest.mp4; .mp4 is appended when missing",
            )
        # a URL-like prefix (pipe:, file:, s3://...) is refused rather than taken as a directory of
        # that name: ffmpeg would read it as a protocol, and a user probably meant one
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", self.dir or "")  # ffmpeg's protocols
        if scheme:
            refuse(
                "dir",
                f"{scheme.group()} reads as a protocol (URL), and the recorder writes local files "
                f"only; give a directory path (./{self.dir} for a directory of that name)",
            )
        if recording(self) and self.dir:
            probe_dir(self.dir, n("dir"))


def check_view(cfg: RecorderConfig, image: bool, key: str):
    """ConfigError unless ``cfg.view`` can be shown of an env whose observation has an image
    (``image``) or not: view=obs and view=both show the policy's image."""
    if cfg.view != View.render and not image:
        raise ConfigError(
            f"{key}.view={cfg.view} shows the policy's observation image, and the env observes "
            f"none (state only, no 'rgb'): set env.obs_mode=rgb or rgb_state (where the env "
            f"observes images), or {key}.view=render"
        )


def recording(cfg: Optional[RecorderConfig]) -> bool:
    """Whether ``cfg`` asks for a recorder at all (the one answer: enabled, and a trigger)."""
    return cfg is not None and bool(cfg.enabled) and Trigger(cfg.trigger) is not Trigger.none
