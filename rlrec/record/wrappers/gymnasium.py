"""Recording a Gymnasium vector env: :class:`RecordVectorVideo`, a drop-in for
``gymnasium.wrappers.vector.RecordVideo``, and :class:`RenderHook`, the sub-env hook it renders
through (:class:`rlrec.envs.base.SubEnv`, under the name a user passes to ``make_vec``).

Every clip decision, frame and sidecar is the :class:`~rlrec.record.engine.ClipEngine`'s; this
module only turns the vector env's resets and steps into the engine's events, for each of
Gymnasium's autoreset modes (``metadata["autoreset_mode"]``):

- ``NEXT_STEP``: the step after a done env resets it (reward 0, not done); the wrapper sees the
  terminal state in that step's result, and the fresh reset state after the next step.
- ``DISABLED``: the caller resets done envs with ``reset(options={"reset_mask": mask})``.
- ``SAME_STEP``: the vector env resets a done env inside ``step``, so a wrapper outside it never
  sees the terminal state. A :class:`RenderHook` around each recorded sub-env renders it on a
  terminal step, before the vector env resets it, while a clip is open. For a ``SyncVectorEnv``
  the wrapper installs the hooks itself (``vec.envs[i]``); an ``AsyncVectorEnv`` must be built
  with them (``gym.make_vec(..., wrappers=[RenderHook])``), and without them SAME_STEP is refused.

Rendering renders only the recorded envs: ``vec.envs[i].render()`` for a ``SyncVectorEnv``; for
an ``AsyncVectorEnv`` with hooks one ``call`` that renders only the recorded sub-envs (the others
answer ``None``); without hooks ``vec.render()``, which renders every sub-env.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Sequence, Union

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from rlrec.envs.base import RENDER_METHOD, SubEnv
from rlrec.record import names
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Schedule, capped_cubic
from rlrec.record.wrappers.base import Arguments, RecorderWrapper

_KEY = "RecordVectorVideo"
_FPS = 30  # Gymnasium's RecordVideo: without render_fps, 30
# the settings' fields under this wrapper's own argument names, for its error messages
_ARGS = Arguments(_KEY, {"length_frames": "video_length", "dir": "video_folder"})
NEXT_STEP, SAME_STEP = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP


class RenderHook(SubEnv):
    """The sub-env hook through which :class:`RecordVectorVideo` renders a recorded sub-env
    (:class:`rlrec.envs.base.SubEnv`: only the named sub-envs render; while a clip is open a
    terminal step is rendered before a same-step autoreset replaces it). Add it to every sub-env
    of an ``AsyncVectorEnv`` in ``SAME_STEP`` mode:
    ``gym.make_vec(env_id, n, vectorization_mode="async", wrappers=[RenderHook], ...)``. It
    changes nothing else: steps, resets and renders pass through.
    """


class RecordVectorVideo(RecorderWrapper, VectorWrapper):
    """Records clips of a Gymnasium vector env's sub-envs (``render_mode="rgb_array"``).

    The positional arguments are those of ``gymnasium.wrappers.vector.RecordVideo``, in its
    order, so moving over is a change of import (where a meaning differs, it is said here):

    - ``video_folder``: where clips go (created);
    - ``video_aspect_ratio``: only ``(1, 1)``: the recorded envs are tiled into the most square
      grid (another ratio is refused rather than ignored);
    - ``record_first_only``: record env 0 only. Without it and without ``env_idx``, every sub-env
      is recorded, tiled (Gymnasium's default; each frame renders every sub-env);
    - ``episode_trigger`` / ``step_trigger``: callables as Gymnasium's (both: a clip starts when
      either fires); neither: the capped cubic schedule. ``episode_trigger(e)`` is asked at each
      reset of the first recorded env; ``step_trigger(s)`` after each step with Gymnasium's step
      id (0 after the first step), and the clip starts on the state after that step. A step
      trigger that fires while a clip is open ends that clip and starts its own, as Gymnasium's.
      Both are kept as attributes, as Gymnasium's (``episode_trigger`` is the capped cubic
      schedule when neither is given);
    - ``video_length``: frames per clip; 0 (default): whole episodes, terminal frame included in
      every autoreset mode. A clip never runs across an episode boundary;
    - ``name_prefix``: files are ``{name_prefix}-episode-{N}.mp4`` / ``-step-{N}.mp4``;
    - ``fps``: ``None``: real time (``1 / dt``); else the wanted fps: a frame every
      ``max(1, round(1 / (fps * dt)))`` steps, and the file says the real fps (Gymnasium instead
      writes every step at ``fps``, which plays faster or slower than real time);
    - ``disable_logger``, ``gc_trigger``: accepted and unused (no moviepy, no clip in memory).

    Keyword-only, rlrec's own: ``env_idx`` (one index or a list, tiled), ``length_sec`` (clip
    length in seconds of sim time, instead of ``video_length``), ``record_final_episode``
    (``close()`` saves the clip in progress; default True, as Gymnasium's ``close()``),
    ``lossless``, ``quality``, ``preset``, ``overlay``, ``filename``, ``on_error``, ``queue_size``,
    ``stall_timeout_sec`` (as in :class:`~rlrec.record.settings.RecorderConfig`), ``dt`` and
    ``on_clip`` (called with each :class:`~rlrec.record.encoder.ClipInfo` once the clip is on
    disk; they are also kept in :attr:`clips`). Each clip ``NAME.mp4`` gets a sidecar ``NAME.json``.

    ``dt``, the sim time of one step: the ``dt`` argument, else the sub-env's ``dt`` attribute
    (MuJoCo envs have one), else ``1 / metadata["render_fps"]``, else ``1 / 30`` (Gymnasium's
    default fps).
    """

    def __init__(
        self,
        env: VectorEnv,
        video_folder: Union[str, os.PathLike],
        video_aspect_ratio: Sequence[int] = (1, 1),
        record_first_only: bool = False,
        episode_trigger: Optional[Callable[[int], bool]] = None,
        step_trigger: Optional[Callable[[int], bool]] = None,
        video_length: int = 0,
        name_prefix: str = "rl-video",
        fps: Optional[float] = None,
        disable_logger: bool = True,
        gc_trigger: Optional[Callable[[int], bool]] = None,
        *,
        env_idx: Union[int, Sequence[int], None] = None,
        dt: Optional[float] = None,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        **options,
    ):
        triggers = dict(episode_trigger=episode_trigger, step_trigger=step_trigger)
        _ARGS.callables(gc_trigger=gc_trigger, on_clip=on_clip, **triggers)
        envs = _recorded(
            env, video_folder, video_aspect_ratio, video_length, record_first_only, env_idx
        )
        fields = dict(length_frames=video_length or None, fps=fps, dir=os.fspath(video_folder))
        cfg = _ARGS.config(env.num_envs, options, env_idx=envs, **fields)
        base = self._base = env.unwrapped
        self._sync = isinstance(base, SyncVectorEnv)
        self._hooked = self._sync or (  # an AsyncVectorEnv built with RenderHook
            isinstance(base, AsyncVectorEnv) and all(base.call("has_wrapper_attr", RENDER_METHOD))
        )
        self._mode = _autoreset_mode(env, base, self._hooked)
        super().__init__(env)
        # Gymnasium's attributes: the triggers as given (neither: its capped cubic schedule)
        self.episode_trigger = episode_trigger or (None if step_trigger else capped_cubic)
        self.step_trigger, self.name_prefix = step_trigger, name_prefix
        self.clips, self._user_on_clip = [], on_clip  # see RecorderWrapper._on_clip
        # Gymnasium's step ids: 0 after the first step (the engine counts 1 there)
        step_fn = None if step_trigger is None else lambda s: s > 0 and step_trigger(s - 1)
        schedule = Schedule.of(cfg, episode_fn=episode_trigger, step_fn=step_fn, restart=True)
        self.engine = ClipEngine(
            cfg,
            _source(env, dt, self._render),
            key=_KEY,
            on_clip=self._on_clip,
            name=names.prefixed(name_prefix, _KEY, 1),
            schedule=schedule,
        )
        # once the engine has checked every setting: the recorded sub-envs' hooks of a
        # SyncVectorEnv in SAME_STEP mode, installed here; an AsyncVectorEnv built with hooks
        # learns its indices
        self._hooks = {}
        if self._sync and self._mode is SAME_STEP:
            for i in envs:
                self._hooks[i] = base.envs[i] = RenderHook(base.envs[i], i)
        elif self._hooked and not self._sync:
            base.set_attr("index", list(range(self.num_envs)))
        self._watch, self._first = envs, envs[0]
        self._terminal, self._armed = False, False  # serve terminal frames; hooks armed
        self._pending = []  # NEXT_STEP: recorded envs the next step resets

    # ------------------------------------------------------------------ rendering
    def _render(self, env_idx):
        base, terminal = self._base, self._terminal
        if self._sync:  # SAME_STEP: a done env's terminal frame is its hook's
            envs = [(i, base.envs[i]) for i in env_idx]
            hooked = [
                e.rlrec_render((i,), terminal) if i in self._hooks else e.render() for i, e in envs
            ]
            return np.stack(hooked)
        if self._hooked:  # one round trip; only the wanted sub-envs render
            out = base.call(RENDER_METHOD, tuple(env_idx), terminal)
        else:  # every sub-env renders: the vector API has no render of one
            out = base.render()
        return np.stack([np.asarray(out[i]) for i in env_idx])

    def _sync_arming(self):
        """Arms the hooks while a clip is open: the next step's terminal frame is then kept."""
        armed = self.engine.recording
        if armed == self._armed:
            return
        self._armed = armed
        for hook in self._hooks.values():
            hook.armed = armed
        if self._hooked and not self._sync:
            recorded = self._watch
            self._base.set_attr("armed", [armed and i in recorded for i in range(self.num_envs)])

    # ------------------------------------------------------------------ the vector env API
    def reset(self, *, seed=None, options: Optional[Dict[str, Any]] = None):
        mask = (options or {}).get("reset_mask")  # read here: the vector env pops it
        mask = None if mask is None else np.array(mask, dtype=bool)
        out = self.env.reset(seed=seed, options=options)
        # the seed the vector env gave the first recorded sub-env
        if isinstance(seed, (int, np.integer)):
            seed = int(seed) + self._first
        elif seed is not None:
            seed = seed[self._first]
        # the recorded envs done at the last step that are reset here instead
        self._pending = [] if mask is None else [i for i in self._pending if not mask[i]]
        self.engine.on_reset(mask, seed)  # None: a full reset
        self._sync_arming()
        return out

    def step(self, actions):
        out = self.env.step(actions)
        _, reward, terminated, truncated, info = out
        engine = self.engine
        # the recorded envs this step ended: only they need engine events (the engine reports
        # on the recorded envs alone), so the other envs' flags are never looked at
        ended = [i for i in self._watch if terminated[i] or truncated[i]]
        if self._mode is NEXT_STEP:
            reset, self._pending = self._pending, ended
            if reset:  # this step reset the recorded envs done at the last one
                engine.on_reset(reset)
            engine.on_step(reward, terminated, truncated, info, self._first not in reset)
        elif self._mode is SAME_STEP:
            # the done envs are already reset: their terminal frames come from the hooks, and
            # their step info (read while a clip is open) from final_info
            if ended and engine.recording:
                info = _final_info(info, np.logical_or(terminated, truncated))
            self._terminal = bool(ended)
            try:
                engine.on_step(reward, terminated, truncated, info)
            finally:
                self._terminal = False
            if ended:
                engine.on_reset(ended)
            self._sync_arming()
        else:  # DISABLED: the caller resets done envs with reset(options={"reset_mask": ...})
            engine.on_step(reward, terminated, truncated, info)
        return out

    # ------------------------------------------------------------------ Gymnasium's API
    @property
    def video_folder(self) -> str:
        return self.engine.video_dir

    stop_recording = RecorderWrapper.end_clip  # Gymnasium's name for it


def _recorded(env, video_folder, video_aspect_ratio, video_length, first_only, env_idx):
    """The recorded sub-envs (``env_idx``, else env 0 with ``record_first_only``, else all), once
    what the settings' own check cannot see is refused, before any work."""
    if not isinstance(env, VectorEnv):
        raise TypeError(
            f"{_KEY}: env must be a gymnasium.vector.VectorEnv, got {type(env).__name__} "
            "(for a single env use gymnasium.wrappers.RecordVideo)"
        )
    if env.render_mode != "rgb_array":
        raise ValueError(
            f"{_KEY}: the vector env's render_mode is {env.render_mode!r}; the recorder needs "
            "render_mode='rgb_array' (e.g. gym.make_vec(..., render_mode='rgb_array'))"
        )
    if not isinstance(video_folder, (str, os.PathLike)) or not os.fspath(video_folder):
        _ARGS.refuse("video_folder", video_folder, "give a directory")
    if tuple(video_aspect_ratio) != (1, 1):
        rule = "the recorded envs are tiled into the most square grid; use (1, 1) (the default)"
        _ARGS.refuse("video_aspect_ratio", tuple(video_aspect_ratio), rule)
    _ARGS.whole(video_length, "video_length", 0, "frames per clip, an int >= 0 (0: whole episodes)")
    if env_idx is None:
        return [0] if first_only else list(range(env.num_envs))
    envs = _ARGS.env_idx(env_idx)
    if first_only and envs != [0]:
        _ARGS.refuse("env_idx", env_idx, "record_first_only=True records env 0: give one")
    return envs


def _source(env, dt, render):
    """What the engine records: the step's sim time ``dt`` (else the sub-env's ``dt``, else
    ``1 / render_fps``), and the sub-envs' time limit."""
    base = env.unwrapped
    if dt is None:
        dt = _sub_env_attr(base, "dt") or 1.0 / (env.metadata.get("render_fps") or _FPS)
    dt = _ARGS.positive(dt, "dt", "seconds of sim time per step, > 0")
    spec = getattr(base, "spec", None) or _sub_env_attr(base, "spec")
    return Source(env.num_envs, dt, "cpu", render, getattr(spec, "max_episode_steps", None))


def _sub_env_attr(base, name):
    """Attribute ``name`` of the first sub-env (through its wrappers); None where it has none."""
    if isinstance(base, (SyncVectorEnv, AsyncVectorEnv)) and base.call("has_wrapper_attr", name)[0]:
        return base.call("get_wrapper_attr", name)[0]
    return None


def _autoreset_mode(env, base, hooked):
    """The vector env's autoreset mode; ``SAME_STEP`` is refused where no hook can keep the
    terminal frames (``hooked``: a ``SyncVectorEnv``, or an ``AsyncVectorEnv`` built with them)."""
    mode = AutoresetMode(env.metadata.get("autoreset_mode", NEXT_STEP))
    if mode is SAME_STEP and not hooked:
        hook = "build it with gym.make_vec(..., wrappers=[rlrec.record.RenderHook]), "
        raise ValueError(
            f"{_KEY}: {type(base).__name__} resets a done sub-env inside step() "
            "(autoreset_mode=SAME_STEP), so its terminal frame is gone before this wrapper "
            f"sees it; {hook if isinstance(base, AsyncVectorEnv) else ''}or use autoreset_mode "
            "NEXT_STEP or DISABLED (vector_kwargs={'autoreset_mode': AutoresetMode.NEXT_STEP}), "
            "or a SyncVectorEnv"
        )
    return mode


def _final_info(info, done):
    """The step info of a SAME_STEP step as the engine reads it: ``success`` of the done envs from
    ``final_info`` (their terminal step's info), of the others from ``info``."""
    final = info.get("final_info")
    value = final.get("success") if isinstance(final, dict) else None
    if not isinstance(value, np.ndarray):
        return info
    mine = info.get("success")
    if isinstance(mine, np.ndarray) and mine.shape == value.shape:
        value = np.where(done, value, mine)
    return {**info, "success": value}
