"""The recorder's settings: one plain dataclass, owned by the recorder and reused as the Hydra
schema of ``recorder`` and ``eval_env.recorder`` (no Hydra needed to build or check it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from rlrec.checks import (
    POSITIVE,
    SECONDS,
    Choice,
    ConfigError,
    check_floats,
    choice,
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


@dataclass
class RecorderConfig:
    """One recorder: which env, when, how long, how encoded."""

    # the range of each float field, applied by rlrec.checks.check_floats (not a field)
    FLOAT_RANGES = {"length_sec": SECONDS, "fps": POSITIVE, "stall_timeout_sec": SECONDS}

    enabled: bool = True
    trigger: Trigger = Trigger.cubic  # exactly one trigger
    every: Optional[int] = None  # N for trigger=episode (episodes) or trigger=step (env steps)
    length_frames: Optional[int] = None  # clip length in frames, or
    length_sec: Optional[float] = None  # in seconds of sim time; both None: the whole episode
    # None: 1 / env dt; a frame every max(1, round(1 / (fps * dt))) steps
    fps: Optional[float] = None
    env_idx: List[int] = field(default_factory=lambda: [0])  # several: tiled into a grid
    overlay: bool = False  # episode, step, reward, success drawn on the frames
    # a fixed name replaced atomically by each clip; None: one file per clip
    filename: Optional[str] = None
    dir: Optional[str] = None  # None: the run's video dir (<run dir>/videos/train or /eval)
    record_final_episode: bool = (
        True  # close() (exit, exception, Ctrl-C, SIGTERM) saves the clip in progress
    )
    queue_size: int = 64  # frame buffers in flight between the training thread and the encoder
    # seconds a hung ffmpeg may stall training: then its clip is dropped and training goes on
    stall_timeout_sec: float = 10.0
    quality: int = 7  # 1..10 (imageio's scale; 7 = x264 crf 15)
    preset: X264Preset = X264Preset.ultrafast  # the encoder's CPU time against the file's size
    lossless: bool = False  # exact RGB (libx264rgb, qp 0): pixel-exact, fewer players
    on_error: OnError = OnError.warn  # warn: log once, training goes on | raise: fatal


def validate_recorder(rec: RecorderConfig, key: str, num_envs: int) -> None:
    """Checks one recorder's settings against the env it will wrap."""
    positive(rec.every, f"{key}.every", allow_none=True)
    positive(rec.length_frames, f"{key}.length_frames", allow_none=True)
    check_floats(rec, f"{key}.")  # length_sec, fps
    positive(rec.queue_size, f"{key}.queue_size")
    if not 1 <= rec.quality <= 10:
        raise ConfigError(f"{key}.quality={rec.quality!r} is invalid: must be in 1..10")
    choice(rec, "preset", X264Preset, f"{key}.preset")
    choice(rec, "on_error", OnError, f"{key}.on_error")
    if rec.length_frames is not None and rec.length_sec is not None:
        raise ConfigError(
            f"{key}.length_frames and {key}.length_sec are both set: give at most one clip length"
        )
    choice(rec, "trigger", Trigger, f"{key}.trigger")
    trigger = rec.trigger
    if trigger in (Trigger.episode, Trigger.step) and rec.every is None:
        raise ConfigError(f"{key}.trigger={trigger.value} needs {key}.every (a positive count)")
    if trigger not in (Trigger.episode, Trigger.step) and rec.every is not None:
        raise ConfigError(
            f"{key}.every={rec.every} is set but {key}.trigger={trigger.value}: a recorder has "
            f"exactly one trigger; use {key}.trigger=episode or {key}.trigger=step with every"
        )
    if not rec.env_idx:
        raise ConfigError(f"{key}.env_idx is empty: give at least one env index")
    for i in rec.env_idx:
        if not 0 <= i < num_envs:
            raise ConfigError(
                f"{key}.env_idx={list(rec.env_idx)} is invalid: each index must be in "
                f"[0, {num_envs - 1}] (num_envs={num_envs})"
            )
    if len(set(rec.env_idx)) != len(rec.env_idx):
        raise ConfigError(f"{key}.env_idx={list(rec.env_idx)} repeats an index")
    name = rec.filename
    if name is not None:
        # ffmpeg is handed file: and an absolute path, so this is about what the name means: one
        # visible file in the video dir (".mp4" is appended when missing), with room for the
        # temporary name beside it (.NAME.PID-N.part) under the 255-byte limit
        rule = (
            "must be a plain file name (no '/', not starting with '.', '-' or a space, at most "
            "200 bytes), e.g. latest.mp4; .mp4 is appended when missing"
        )
        bad = not isinstance(name, str) or not name.strip() or name != name.strip()
        bad = bad or "/" in name or "\0" in name or name.startswith((".", "-"))
        if bad or len(name.encode()) + (0 if name.lower().endswith(".mp4") else 4) > 200:
            raise ConfigError(f"{key}.filename={name!r} is invalid: {rule}")
    if rec.dir:
        # a URL-like prefix (pipe:, file:, s3://...) is refused rather than taken as a directory
        # of that name: ffmpeg would read it as a protocol, and a user probably meant one
        import re

        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", rec.dir)  # ffmpeg's idea of a protocol
        if scheme:
            raise ConfigError(
                f"{key}.dir={rec.dir!r} is invalid: {scheme.group()} reads as a protocol (URL), "
                f"and the recorder writes local files only; give a directory path "
                f"(./{rec.dir} for a directory of that name)"
            )
    if rec.enabled and trigger is not Trigger.none and rec.dir:
        probe_dir(rec.dir, f"{key}.dir")
