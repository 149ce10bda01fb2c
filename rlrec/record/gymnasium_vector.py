"""Recording a Gymnasium vector env: :class:`RecordVectorVideo`, a drop-in for
``gymnasium.wrappers.vector.RecordVideo``, and :class:`RenderHook`, the sub-env wrapper it uses.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from rlrec.checks import ConfigError
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine, env_index_list, positive_number
from rlrec.record.settings import OnError, RecorderConfig, Trigger, X264Preset

__all__ = ["RecordVectorVideo", "RenderHook"]

_KEY = "RecordVectorVideo"
_DEFAULT_FPS = 30  # Gymnasium's RecordVideo: without render_fps, 30


class RenderHook(gym.Wrapper):
    """A sub-env wrapper through which :class:`RecordVectorVideo` renders a recorded sub-env.

    While armed (a clip is open), a terminal step renders the terminal state right away, before a
    same-step autoreset of the vector env replaces it; :meth:`rlrec_frame` answers the recorder's
    render requests inside the sub-env's own process, so an ``AsyncVectorEnv`` renders only the
    recorded sub-envs. Add it to every sub-env of an ``AsyncVectorEnv`` in ``SAME_STEP`` mode:
    ``gym.make_vec(env_id, n, vectorization_mode="async", wrappers=[RenderHook], ...)``. It
    changes nothing else: steps, resets and renders pass through.
    """

    rlrec_render_hook = True

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.rlrec_index: Optional[int] = None  # this sub-env's index, set by the recorder
        self.rlrec_armed = False  # render the state of a terminal step
        self.rlrec_terminal_frame: Optional[np.ndarray] = None  # that render, until the next step

    def step(self, action):
        self.rlrec_terminal_frame = None
        out = self.env.step(action)
        if self.rlrec_armed and (out[2] or out[3]):
            self.rlrec_terminal_frame = np.array(self.env.render(), dtype=np.uint8)
        return out

    def rlrec_frame(self, wanted: Sequence[int], terminal: bool) -> Optional[np.ndarray]:
        """This sub-env's frame if its index is in ``wanted``, else None (nothing rendered).
        ``terminal``: the frame of the last step, the terminal one if the step ended an episode
        (kept from before the autoreset), else the current state."""
        if self.rlrec_index not in wanted:
            return None
        if terminal and self.rlrec_terminal_frame is not None:
            return self.rlrec_terminal_frame
        return np.asarray(self.env.render())


def _find_hook(env: gym.Env) -> Optional[RenderHook]:
    while True:
        if isinstance(env, RenderHook):
            return env
        if not isinstance(env, gym.Wrapper):
            return None
        env = env.env


class RecordVectorVideo(VectorWrapper):
    """Records clips of a Gymnasium vector env's sub-envs (``render_mode="rgb_array"``).

    The positional arguments are those of ``gymnasium.wrappers.vector.RecordVideo``, in its
    order, so moving over is a change of import (where a meaning differs, it is said here):

    - ``video_folder``: where clips go (created);
    - ``video_aspect_ratio``: only ``(1, 1)``: the recorded envs are tiled into the most square
      grid (another ratio is refused rather than ignored);
    - ``record_first_only``: record env 0 only. Without it and without ``env_idx``, every sub-env
      is recorded, tiled (Gymnasium's default; each frame renders every sub-env);
    - ``episode_trigger`` / ``step_trigger``: callables as Gymnasium's (at most one); neither:
      the capped cubic schedule. ``episode_trigger(e)`` is asked at each reset of the first
      recorded env; ``step_trigger(s)`` with the number of steps taken (0 at the first reset),
      and the clip starts on the state after step ``s`` (Gymnasium's step ids are one less);
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
    ``stall_timeout_sec`` (as in :class:`~rlrec.config.RecorderConfig`), ``dt`` and ``on_clip``
    (called with each :class:`~rlrec.record.encoder.ClipInfo` once the clip is on disk; they are
    also kept in :attr:`clips`). Each clip ``NAME.mp4`` gets a sidecar ``NAME.json``.

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
        length_sec: Optional[float] = None,
        record_final_episode: bool = True,
        lossless: bool = False,
        quality: int = 7,
        preset: Union[str, X264Preset] = X264Preset.ultrafast,
        overlay: bool = False,
        filename: Optional[str] = None,
        on_error: Union[str, OnError] = OnError.warn,
        queue_size: int = 64,
        stall_timeout_sec: float = 10.0,
        dt: Optional[float] = None,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
    ):
        # ---------------------------------------------------------------- checks, before any work
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
            raise ConfigError(f"{_KEY}: video_folder={video_folder!r} is invalid: give a directory")
        if tuple(video_aspect_ratio) != (1, 1):
            raise ConfigError(
                f"{_KEY}: video_aspect_ratio={tuple(video_aspect_ratio)!r} is not supported: "
                "the recorded envs are tiled into the most square grid; use (1, 1) (the default)"
            )
        for name, fn in (
            ("episode_trigger", episode_trigger),
            ("step_trigger", step_trigger),
            ("gc_trigger", gc_trigger),
            ("on_clip", on_clip),
        ):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{_KEY}: {name}={fn!r} is invalid: give a callable or None")
        if episode_trigger is not None and step_trigger is not None:
            raise ConfigError(
                f"{_KEY}: episode_trigger and step_trigger are both set: give at most one trigger"
            )
        if isinstance(video_length, bool) or not isinstance(video_length, (int, np.integer)):
            raise ConfigError(f"{_KEY}: video_length={video_length!r} is invalid: give an int >= 0")
        if video_length < 0:
            raise ConfigError(
                f"{_KEY}: video_length={video_length} is invalid: frames per clip, >= 0 "
                "(0: whole episodes)"
            )
        if video_length and length_sec is not None:
            raise ConfigError(
                f"{_KEY}: video_length={video_length} and length_sec={length_sec} are both set: "
                "give at most one clip length"
            )
        if not isinstance(name_prefix, str) or not name_prefix or "/" in name_prefix:
            raise ConfigError(
                f"{_KEY}: name_prefix={name_prefix!r} is invalid: a non-empty file name prefix "
                "without '/'"
            )
        base = env.unwrapped
        n = env.num_envs
        if env_idx is None:
            envs = [0] if record_first_only else list(range(n))
        else:
            envs = env_index_list(env_idx, _KEY)
            if record_first_only and envs != [0]:
                raise ConfigError(
                    f"{_KEY}: record_first_only=True and env_idx={env_idx!r} disagree: give one"
                )
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if isinstance(mode, str):
            mode = AutoresetMode(mode)
        self._async = isinstance(base, AsyncVectorEnv)
        self._sync = isinstance(base, SyncVectorEnv)
        async_hooks = False
        if self._async:
            async_hooks = all(base.call("has_wrapper_attr", "rlrec_render_hook"))
        if mode is AutoresetMode.SAME_STEP and not (self._sync or async_hooks):
            how = (
                "build it with the hook, gym.make_vec(..., vectorization_mode='async', "
                "wrappers=[rlrec.record.RenderHook]), "
                if self._async
                else ""
            )
            raise ValueError(
                f"{_KEY}: {type(base).__name__} resets a done sub-env inside step() "
                "(autoreset_mode=SAME_STEP), so its terminal frame is gone before this wrapper "
                f"sees it; {how}or use autoreset_mode NEXT_STEP or DISABLED "
                "(vector_kwargs={'autoreset_mode': AutoresetMode.NEXT_STEP}), or a SyncVectorEnv"
            )
        if dt is None:
            dt = self._sub_env_dt(base)
        if dt is None:
            render_fps = env.metadata.get("render_fps")
            dt = 1.0 / float(render_fps) if render_fps else 1.0 / _DEFAULT_FPS
        dt = positive_number(dt, _KEY, "dt", "seconds of sim time per step, > 0")
        cfg = RecorderConfig(
            trigger=Trigger.cubic,  # replaced by the callable, when one is given
            length_frames=int(video_length) or None,
            length_sec=length_sec,
            fps=fps,
            env_idx=envs,
            overlay=overlay,
            filename=filename,
            dir=os.fspath(video_folder),
            record_final_episode=record_final_episode,
            queue_size=queue_size,
            stall_timeout_sec=stall_timeout_sec,
            quality=quality,
            preset=preset,
            lossless=lossless,
            on_error=on_error,
        )
        # ---------------------------------------------------------------- the wrapper
        super().__init__(env)
        self._mode = mode
        self._env_idx = envs
        self._first = envs[0]
        self._base = base
        self.clips: List[ClipInfo] = []
        self._user_on_clip = on_clip
        self._terminal = False  # render requests serve the last step's terminal frames
        self._hooks: List[RenderHook] = []  # SyncVectorEnv, SAME_STEP: the recorded sub-envs'
        self._hook_of: Dict[int, RenderHook] = {}
        self._async_hooks = async_hooks
        self._armed = False
        self.engine = ClipEngine(
            cfg,
            num_envs=n,
            dt=float(dt),
            device="cpu",
            render=self._render,
            video_dir=None,
            key=_KEY,
            on_clip=self._on_clip,
            max_episode_steps=self._max_episode_steps(base),
            episode_trigger=episode_trigger,
            step_trigger=step_trigger,
            name_prefix=name_prefix,
        )
        # the sub-env hooks, once the engine has checked every setting
        if self._sync and mode is AutoresetMode.SAME_STEP:
            for i in envs:
                hook = _find_hook(base.envs[i])
                if hook is None:
                    hook = base.envs[i] = RenderHook(base.envs[i])
                hook.rlrec_index = i
                self._hooks.append(hook)
                self._hook_of[i] = hook
        elif async_hooks:
            base.set_attr("rlrec_index", list(range(n)))
        self._zeros = bytes(n)  # term.tobytes() of a bool [num_envs] array with no done env
        self._watch = np.asarray(envs, dtype=np.intp)
        self._pending: List[int] = []  # NEXT_STEP: recorded envs the next step resets
        self._closed = False

    # ------------------------------------------------------------------ sub-env facts
    def _sub_env_dt(self, base) -> Optional[float]:
        if self._sync:
            sub = base.envs[0]
            return float(sub.get_wrapper_attr("dt")) if sub.has_wrapper_attr("dt") else None
        if self._async:
            if base.call("has_wrapper_attr", "dt")[0]:
                return float(base.call("get_wrapper_attr", "dt")[0])
        return None

    @staticmethod
    def _max_episode_steps(base) -> Optional[int]:
        spec = getattr(base, "spec", None)
        steps = getattr(spec, "max_episode_steps", None) if spec is not None else None
        if steps is None and isinstance(base, SyncVectorEnv):
            sub_spec = base.envs[0].spec
            steps = sub_spec.max_episode_steps if sub_spec is not None else None
        return steps

    # ------------------------------------------------------------------ rendering
    def _render(self, env_idx: List[int]) -> np.ndarray:
        if self._sync:
            envs = self._base.envs
            if self._terminal and self._hooks:  # SAME_STEP: a done env's frame is its hook's
                frames = []
                for i in env_idx:
                    hook = self._hook_of.get(i)
                    frame = None if hook is None else hook.rlrec_terminal_frame
                    frames.append(envs[i].render() if frame is None else frame)
                return np.stack(frames)
            return np.stack([envs[i].render() for i in env_idx])
        if self._async_hooks:  # one round trip; only the wanted sub-envs render
            out = self._base.call("rlrec_frame", list(env_idx), self._terminal)
        else:  # every sub-env renders: the vector API has no render of one
            out = self._base.render()
        return np.stack([np.asarray(out[i]) for i in env_idx])

    def _sync_arming(self) -> None:
        """Arms the hooks while a clip is open: the next step's terminal frame is then kept."""
        armed = self.engine.recording
        if armed == self._armed:
            return
        self._armed = armed
        if self._hooks:
            for hook in self._hooks:
                hook.rlrec_armed = armed
        elif self._async_hooks:
            n = self.num_envs
            recorded = set(self._env_idx)
            self._base.set_attr("rlrec_armed", [armed and i in recorded for i in range(n)])

    def _on_clip(self, info: ClipInfo) -> None:
        self.clips.append(info)
        if self._user_on_clip is not None:
            self._user_on_clip(info)

    def _done_watched(self, terminated: np.ndarray, truncated: np.ndarray) -> List[int]:
        """The recorded envs that this step ended (only they need engine events: the engine
        reports on the recorded envs alone)."""
        if len(self._watch) == 1:
            i = self._first
            return [i] if terminated[i] or truncated[i] else []
        hit = np.logical_or(terminated[self._watch], truncated[self._watch])
        return self._watch[hit].tolist()

    # ------------------------------------------------------------------ the vector env API
    def reset(self, *, seed=None, options: Optional[Dict[str, Any]] = None):
        mask = None
        if options is not None and "reset_mask" in options:
            mask = np.array(options["reset_mask"], dtype=bool)  # the vector env pops it
        out = self.env.reset(seed=seed, options=options)
        if self._closed:
            return out
        if isinstance(seed, (int, np.integer)):
            first_seed = int(seed) + self._first  # the seed the vector env gave that sub-env
        elif seed is not None:
            first_seed = seed[self._first]
        else:
            first_seed = None
        if mask is None:
            self._pending = []
            self.engine.on_reset(env_idx=None, seed=first_seed)
        else:
            self._pending = [i for i in self._pending if not mask[i]]  # reset here instead
            hit = self._watch[mask[self._watch]].tolist()
            if hit:
                self.engine.on_reset(env_idx=hit, seed=first_seed)
        if self._hooks or self._async_hooks:
            self._sync_arming()
        return out

    def step(self, actions):
        out = self.env.step(actions)
        if self._closed:
            return out
        _, reward, terminated, truncated, info = out
        engine = self.engine
        mode = self._mode
        if not isinstance(terminated, np.ndarray) or not isinstance(truncated, np.ndarray):
            terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        zeros = self._zeros
        # no env done (a bool [num_envs] array of zero bytes): the idle path, no numpy op
        done = not (terminated.tobytes() == zeros and truncated.tobytes() == zeros)
        if mode is AutoresetMode.NEXT_STEP:
            stepped = True
            if self._pending:  # this step reset the recorded envs done at the last one
                reset, self._pending = self._pending, []
                engine.on_reset(env_idx=reset)
                stepped = self._first not in reset
            if done:
                self._pending = self._done_watched(terminated, truncated)
            if stepped:
                engine.on_step(reward, terminated, truncated, info)
            else:
                engine.on_step(reward, terminated, truncated, info, stepped=False)
        elif mode is AutoresetMode.SAME_STEP:
            if not done:
                engine.on_step(reward, terminated, truncated, info)
            else:
                # the done envs are already reset: their terminal frames come from the hooks,
                # and their step info (read while a clip is open) from final_info
                if engine.recording:
                    info = _final_info(info, np.logical_or(terminated, truncated))
                self._terminal = True
                try:
                    engine.on_step(reward, terminated, truncated, info)
                finally:
                    self._terminal = False
                reset = self._done_watched(terminated, truncated)
                if reset:
                    engine.on_reset(env_idx=reset)
            self._sync_arming()
        else:  # DISABLED: the caller resets done envs with reset(options={"reset_mask": ...})
            engine.on_step(reward, terminated, truncated, info)
        return out

    # ------------------------------------------------------------------ recorder API
    @property
    def recording(self) -> bool:
        """Whether a clip is open."""
        return self.engine.recording

    @property
    def video_folder(self) -> str:
        return self.engine.video_dir

    def record_next_episode(self) -> None:
        """The next episode of the first recorded env gets a clip, whatever the trigger says."""
        self.engine.record_next_episode()

    def end_clip(self) -> None:
        """Ends and saves the clip in progress now."""
        self.engine.end_clip()

    def flush(self) -> None:
        """Waits (bounded) until every ended clip is on disk and in :attr:`clips`."""
        self.engine.flush()

    def close(self, **kwargs: Any) -> None:
        """Saves the clip in progress (``record_final_episode``), waits for the encoder (bounded),
        then closes the vector env. Idempotent."""
        if not self._closed:
            self._closed = True
            try:
                self.engine.close()
            finally:
                self.env.close(**kwargs)


def _final_info(info: Dict[str, Any], done: np.ndarray) -> Dict[str, Any]:
    """The step info of a SAME_STEP step: the done envs' entries from ``final_info`` (their
    terminal step's info), the others' from ``info``."""
    final = info.get("final_info")
    if not isinstance(final, dict):
        return info
    merged = dict(info)
    for key, value in final.items():
        if key.startswith("_") or not isinstance(value, np.ndarray):
            continue
        mine = info.get(key)
        if isinstance(mine, np.ndarray) and mine.shape == value.shape:
            merged[key] = np.where(done.reshape(done.shape + (1,) * (value.ndim - 1)), value, mine)
        else:
            merged[key] = value
    return merged
