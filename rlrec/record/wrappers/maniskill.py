"""``RecordClips``: rlrec's recorder for ManiSkill3, where users put ManiSkill's ``RecordEpisode``.

::

    env = gym.make("PushCube-v1", num_envs=16, render_mode="rgb_array", ...)
    env = RecordClips(env, output_dir="videos", save_trajectory=False, ignore_terminations=True)
    env = ManiSkillVectorEnv(env, 16, ignore_terminations=True, record_metrics=True)

It is a ``gymnasium.Wrapper`` around the ManiSkill ``BaseEnv`` (CPU or GPU sim), below the vector
wrapper, so it sees every step before the vector wrapper resets the done envs and every reset
(full, or partial through ``options={"env_idx": ...}``, which is how ``ManiSkillVectorEnv``
auto-resets inside its ``step``). Every clip decision, frame, file and sidecar is rlrec's
:class:`~rlrec.record.engine.ClipEngine`; this module only turns the wrapper's calls into the
engine's events and renders the recorded envs (``rlrec.envs.maniskill.render_rows``: pending GPU
writes finished, the rows of the recorded envs copied out of the camera buffer).

``RecordEpisode``'s arguments keep their meaning; trajectories (``save_trajectory=True``, its
default) are written by a ``RecordEpisode(save_video=False)`` inside this wrapper.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import Callable, Optional

import gymnasium as gym
import torch

from rlrec.checks import ConfigError
from rlrec.envs.maniskill import render_rows
from rlrec.record import names
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Schedule
from rlrec.record.settings import Trigger, recording
from rlrec.record.wrappers.base import Arguments, RecorderWrapper

log = logging.getLogger(__name__)

KEY = "RecordClips"
# rlrec names whose meaning a RecordEpisode argument already carries
RENAMED = {
    "dir": "output_dir",
    "fps": "video_fps",
    "length_frames": "max_steps_per_video",
    "length_sec": "max_steps_per_video",
    "overlay": "info_on_video",
    "record_final_episode": "save_on_reset",
}
RENDER_MODES = ["rgb_array", "sensors", "all", None]
# the arguments that take True or False only
BOOLS = "save_trajectory save_video info_on_video save_on_reset clean_on_close record_reward"
BOOLS += " record_env_state avoid_overwriting_video ignore_terminations"
# RecordEpisode's arguments (its trajectories), passed on
TRAJECTORY = "save_trajectory trajectory_name save_on_reset clean_on_close record_reward"
TRAJECTORY += " record_env_state source_type source_desc"
# the settings' fields under RecordEpisode's names, for the messages
ARGS = Arguments(KEY, RENAMED)


class RecordClips(RecorderWrapper, gym.Wrapper):
    """Records clips of a ManiSkill env: each starts on the fresh reset frame of an episode of the
    first recorded env and ends on its true terminal frame (or after ``max_steps_per_video``).

    RecordEpisode's arguments, with the same meaning:

    - ``output_dir``: where the clips (``NAME.mp4`` and its ``NAME.json`` sidecar) go.
    - ``save_trajectory`` (True), ``trajectory_name``, ``record_reward``, ``record_env_state``,
      ``clean_on_close``, ``source_type``, ``source_desc``: trajectories, written by ManiSkill's
      own ``RecordEpisode(save_video=False)`` inside this wrapper.
    - ``save_video``: False records no clips.
    - ``info_on_video``: episode, step, reward/return and success drawn on the frames.
    - ``save_on_reset``: a clip always ends (and is saved) at the recorded env's reset; this one
      decides whether ``close()`` saves the clip in progress (``record_final_episode``).
    - ``save_video_trigger``: ``f(step) -> bool``, asked with the wrapper's step count; a clip
      starts when it says True (and no clip is open).
    - ``max_steps_per_video``: a clip has at most this many steps (``N + 1`` frames, the reset
      frame included); None: the whole episode. Clips never span two episodes.
    - ``video_fps``: every step is a frame and the file plays at this fps (ManiSkill's default
      30); None: real time, ``1 / control_timestep``.
    - ``avoid_overwriting_video``: either value; rlrec never overwrites a file (a taken name gets
      ``-1``, ``-2``, ...).
    - ``render_substeps``: only False.

    rlrec's own:

    - ``ignore_terminations``: as the vector wrapper's (``ManiSkillVectorEnv`` / ``CPUGymWrapper``)
      with the same name: True when it ignores terminations, so an episode ends at truncation
      only. A recorded env stepped again after it terminated, without a reset, is logged once.
    - ``name_prefix``: files ``{name_prefix}-episode-{N}.mp4`` (or ``-step-{N}`` with a step
      trigger); default ``video-epNNNNNN-stepNNNNNNNNN.mp4``.
    - ``on_clip``: called with each saved clip's :class:`~rlrec.record.encoder.ClipInfo`.
    - ``trigger``, ``every``, ``env_idx`` (default ``[0]``; several are tiled into a grid),
      ``filename``, ``quality``, ``preset``, ``lossless``, ``queue_size``, ``stall_timeout_sec``,
      ``on_error``: as in ``RecorderConfig`` (docs/recorder.md). Default trigger: ``always``.
    """

    def __init__(
        self,
        env: gym.Env,
        output_dir: str,
        save_trajectory: bool = True,
        trajectory_name: Optional[str] = None,
        save_video: bool = True,
        info_on_video: bool = False,
        save_on_reset: bool = True,
        save_video_trigger: Optional[Callable[[int], bool]] = None,
        max_steps_per_video: Optional[int] = None,
        clean_on_close: bool = True,
        record_reward: bool = True,
        record_env_state: bool = True,
        video_fps: Optional[float] = 30,
        render_substeps: bool = False,
        avoid_overwriting_video: bool = False,
        source_type: Optional[str] = None,
        source_desc: Optional[str] = None,
        *,
        ignore_terminations: bool = False,
        name_prefix: Optional[str] = None,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        **recorder,
    ):
        args = dict(locals())
        base, cfg = _checked(args)
        self.output_dir = os.fspath(output_dir)
        self.ignore_terminations = ignore_terminations
        # the first recorded env terminated and was not reset yet; that was logged
        self._ended_unreset, self._warned = False, False
        self._base, self._first = base, int(cfg.env_idx[0])
        self._render_fn = None if base.render_mode in ("rgb_array", None) else base.render
        if save_video and recording(cfg):
            from mani_skill.utils import gym_utils

            # video_fps: every step is a frame, played at video_fps (RecordEpisode's meaning): the
            # engine times frames as if a step lasted 1 / video_fps seconds
            dt = base.control_timestep if video_fps is None else 1.0 / video_fps
            horizon = gym_utils.find_max_episode_steps_value(env)
            self.engine = ClipEngine(
                cfg,
                Source(base.num_envs, float(dt), base.device, self._render, horizon),
                self.output_dir,
                kind="video",
                key=KEY,
                on_clip=on_clip,
                schedule=Schedule.of(cfg, step_fn=save_video_trigger),
                name=None if name_prefix is None else names.prefixed(name_prefix, KEY),
            )
        if save_trajectory:  # last: RecordEpisode creates its files when it is built
            from mani_skill.utils.wrappers.record import RecordEpisode

            kw = {k: args[k] for k in TRAJECTORY.split()}
            env = RecordEpisode(env, self.output_dir, save_video=False, **kw)
        super().__init__(env)

    # ------------------------------------------------------------------ the engine's events

    def _render(self, env_idx):
        return render_rows(self._base, env_idx, self._render_fn)

    def reset(self, *, seed=None, options=None, **kwargs):
        out = self.env.reset(seed=seed, options=options, **kwargs)
        engine = self.engine
        if engine is not None:
            episode = engine.episode  # it counts the first recorded env's episodes
            # the first recorded env's new episode's seed: ManiSkill's own episode seed, which it
            # sets only on a seeded reset (or with enhanced_determinism)
            seeds = getattr(self._base, "_episode_seed", None)
            seeded = seed is not None or getattr(self._base, "_enhanced_determinism", False)
            known = seeded and seeds is not None and len(seeds) > self._first
            # options env_idx None: a full reset
            engine.on_reset(
                (options or {}).get("env_idx"), int(seeds[self._first]) if known else None
            )
            self._ended_unreset = self._ended_unreset and engine.episode == episode
        return out

    def step(self, action):
        if self._ended_unreset and not self._warned:
            self._warned = True
            log.warning(
                "%s: env %d is stepped after its episode terminated, without a reset: its clip "
                "ended at the termination. If the vector wrapper ignores terminations "
                "(ignore_terminations=True), pass ignore_terminations=True to RecordClips too.",
                KEY,
                self._first,
            )
        self._ended_unreset = False
        out = self.env.step(action)
        engine = self.engine
        if engine is not None:
            n = self._base.num_envs
            reward, term, trunc = (torch.as_tensor(x).reshape(n) for x in out[1:4])
            if self.ignore_terminations:
                term = torch.zeros_like(term)
            was_recording = engine.recording
            engine.on_step(reward, term, trunc, out[4])
            if was_recording and not self.ignore_terminations:
                # a clip was open, so its frame was rendered and the flags read anyway
                self._ended_unreset = bool(term[self._first]) and not bool(trunc[self._first])
        return out

    # ------------------------------------------------------------------ RecordEpisode's methods

    def flush_video(self, save: bool = True, **_ignored):
        """Ends the clip in progress now and saves it (RecordEpisode's ``flush_video``)."""
        if save:
            self.end_clip()

    def flush_trajectory(self, *args, **kwargs):
        """RecordEpisode's ``flush_trajectory`` (only with ``save_trajectory=True``)."""
        if not hasattr(self.env, "flush_trajectory"):
            raise RuntimeError(f"{KEY}.flush_trajectory needs save_trajectory=True")
        return self.env.flush_trajectory(*args, **kwargs)


def _checked(args):
    """The ManiSkill env under ``args["env"]`` and the recorder's settings of ``RecordClips``'s
    arguments (``args``: its call's), checked before any work: what the settings' own check
    cannot see first."""
    from mani_skill.envs.sapien_env import BaseEnv

    a, recorder = SimpleNamespace(**args), dict(args["recorder"])
    base = getattr(a.env, "unwrapped", None)
    if not isinstance(base, BaseEnv):
        raise ConfigError(
            f"{KEY}: env must be a ManiSkill env (gym.make of a ManiSkill task, before any "
            f"vector wrapper), got {type(a.env).__name__}"
        )
    for k in sorted(set(recorder) & set(RENAMED)):  # the first one
        raise ConfigError(f"{KEY}: {k}= is RecordEpisode's {RENAMED[k]}= here")
    if not isinstance(a.output_dir, (str, os.PathLike)) or not os.fspath(a.output_dir):
        ARGS.refuse("output_dir", a.output_dir, "a directory path")
    for name in BOOLS.split():
        if not isinstance(args[name], bool):
            ARGS.refuse(name, args[name], "allowed values are True, False")
    if a.render_substeps is not False:
        rule = "allowed value is False (frames are taken once per env step)"
        ARGS.refuse("render_substeps", a.render_substeps, rule)
    steps = a.max_steps_per_video
    if steps is not None:
        rule = "a positive int or None (the whole episode)"
        steps = ARGS.whole(steps, "max_steps_per_video", 1, rule) + 1  # and the reset frame
    rule = "a positive number or None (real time, 1 / control_timestep)"
    ARGS.positive(a.video_fps, "video_fps", rule)
    ARGS.callables(save_video_trigger=a.save_video_trigger)
    if a.save_video_trigger is not None and "trigger" in recorder:
        rule = "save_video_trigger and trigger are both set: give at most one trigger"
        ARGS.refuse("trigger", recorder["trigger"], rule)
    if base.render_mode not in RENDER_MODES:
        rule = "allowed values are rgb_array, sensors, all (or None: the human render camera)"
        ARGS.refuse("the env's render_mode", base.render_mode, rule)
    if "env_idx" in recorder:
        recorder["env_idx"] = ARGS.env_idx(recorder["env_idx"])
    cfg = ARGS.config(
        base.num_envs,
        {"trigger": Trigger.always, **recorder},
        extra=("trigger", "every", "env_idx"),
        overlay=a.info_on_video,
        record_final_episode=a.save_on_reset,
        length_frames=steps,
    )
    return base, cfg
