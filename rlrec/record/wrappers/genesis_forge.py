"""A drop-in for Genesis Forge's ``genesis_forge.wrappers.VideoWrapper``, recording with rlrec's
:class:`~rlrec.record.engine.ClipEngine`.

``VideoWrapper(env, ...)`` takes the arguments of both Genesis Forge revisions (0.5.3, and the
older one with ``record_final_episode``) and is used the same way: ``env = VideoWrapper(env, ...);
env.build(); env.reset(); ... env.step(actions) ...; env.close()``. It is a Genesis Forge
``Wrapper``, so the framework's RL wrappers (RslRlWrapper, SkrlEnvWapper) wrap it as before.

A ``GenesisEnv`` resets its finished envs *inside* ``step`` (``ManagedEnvironment.step`` calls
``self.reset(done_envs)`` before it returns), so a wrapper that only looks at what ``step``
returns never sees a terminal state, and sees a fresh reset state only as "some later step".
This wrapper therefore replaces the base env's ``reset`` (on the instance, at ``build()``; put
back at ``close()``) with a hook: a reset during ``step`` that names a recorded env renders their
terminal state first, while a clip is open (the one render the engine then takes for that step);
the engine is told of the step and then of the resets once ``step`` returns, and renders the fresh
state as the next clip's first frame. A reset outside ``step`` (``env.reset()``) is told right
away. Every render is forced (``force_render=True``): Genesis redraws only after
``scene.step()`` otherwise, and would hand back the pre-reset image after a reset.

Triggers, clip lengths, fps, file names, encoding and sidecars are the engine's
(docs/recorder.md). Differences from Genesis Forge: the episode trigger is asked once per episode,
at its reset (never again after a short clip); a clip never spans two episodes; the file's fps is
``1 / (steps_per_frame * dt)`` with ``steps_per_frame = max(1, round(1 / (fps * dt)))``;
``record_final_episode`` (default True) keeps a clip of the episode in progress on ``close()``
(see ``expect_end`` in :class:`VideoWrapper` for its cost); files are named
``train-ep{episode:06d}-step{step:09d}.mp4`` (or ``filename``), never overwriting one another.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch

try:
    from genesis_forge.wrappers.wrapper import Wrapper
except ImportError as e:  # an optional library's drop-in: say which extra brings it
    raise ImportError(
        f"rlrec.record.wrappers.genesis_forge needs Genesis Forge ({e}): "
        "pip install 'rlrec[genesis-forge]'"
    ) from None

from rlrec.checks import ConfigError
from rlrec.envs.genesis import camera_rows, render_camera
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine, Source
from rlrec.record.schedule import Schedule, capped_cubic
from rlrec.record.wrappers.base import Arguments, RecorderWrapper

KEY = "VideoWrapper"
_POSITIVE = "must be a positive number or None"
# the settings' fields under Genesis Forge's argument names, for the error messages
_ARGS = Arguments(KEY, {"length_sec": "video_length_sec", "dir": "out_dir"})


class VideoWrapper(RecorderWrapper, Wrapper):
    """Records clips of ``env_idx`` from the camera at ``env.unwrapped.<camera_attr>``.

    Genesis Forge's arguments: ``camera_attr``; ``video_length_sec`` (seconds of sim time; None:
    whole episodes); ``episode_trigger`` / ``step_trigger`` (callables, at most one; neither: the
    capped cubic schedule 0, 1, 8, 27, ..., 1000, 2000, ...); ``out_dir``; ``fps``; ``env_idx``
    (an int, or a list tiled into a grid); ``filename`` (one file replaced atomically by each
    clip); ``record_final_episode``; ``logging`` (print each saved clip's path). ``options``:
    other :class:`~rlrec.record.settings.RecorderConfig` keys (``lossless``, ``quality``,
    ``preset``, ``overlay``, ``length_frames``, ``queue_size``, ``stall_timeout_sec``,
    ``on_error``).
    ``on_clip``: called with each finished clip's :class:`~rlrec.record.encoder.ClipInfo`.
    Bad arguments raise :class:`~rlrec.checks.ConfigError` here, before anything is built.

    ``expect_end(steps_left)``: the run will step ``steps_left`` more times, then close. Without
    it, ``record_final_episode`` cannot know which episode is the last, so every episode that no
    trigger selects is recorded provisionally (a render every ``steps_per_frame`` steps, and
    encoding) and dropped when it ends; ``close()`` keeps the one in progress. After
    ``expect_end`` only the episodes that may still run at the end are recorded (provisionally
    too), and an earlier untriggered episode costs nothing.
    """

    def __init__(
        self,
        env,
        camera_attr: str = "camera",
        video_length_sec: Optional[float] = 8,
        episode_trigger: Optional[Callable[[int], bool]] = None,
        step_trigger: Optional[Callable[[int], bool]] = None,
        out_dir: str = "./videos",
        fps: float = 60,
        env_idx: Union[int, Sequence[int]] = 0,
        filename: Optional[str] = None,
        record_final_episode: bool = True,
        logging: bool = True,
        *,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        **options,
    ):
        super().__init__(env)
        if episode_trigger is not None and step_trigger is not None:  # as Genesis Forge's
            _ARGS.refuse("step_trigger", "<a callable>", "episode_trigger is given too: pass one")
        _ARGS.callables(episode_trigger=episode_trigger, step_trigger=step_trigger)
        if not isinstance(camera_attr, str) or not camera_attr:
            _ARGS.refuse("camera_attr", camera_attr, "must be an attribute name")
        if options.get("length_frames") is not None:
            video_length_sec = None  # length_frames replaces the default 8 s
        n = int(self.num_envs)
        cfg = _ARGS.config(
            n,
            options,
            length_sec=_ARGS.positive(video_length_sec, "video_length_sec", _POSITIVE),
            fps=_ARGS.positive(fps, "fps", _POSITIVE),
            env_idx=_ARGS.env_idx(env_idx),
            filename=filename,
            record_final_episode=bool(record_final_episode),
        )
        # Genesis Forge's attributes: the trigger as given (neither: the capped cubic schedule)
        self.episode_trigger = episode_trigger or (None if step_trigger else capped_cubic)
        self.step_trigger = step_trigger
        self._camera_attr, self._logging = camera_attr, logging
        self.clips, self._user_on_clip = [], on_clip  # see RecorderWrapper._on_clip
        base = self.unwrapped
        horizon = getattr(base, "max_episode_length_steps", None)
        horizon = None if horizon is None else int(horizon)
        source = Source(n, float(self.dt), getattr(base, "device", "cpu"), self._render, horizon)
        # record_final_episode without expect_end: every untriggered episode is recorded
        # provisionally, so close() has the one in progress to keep
        schedule = Schedule.of(
            cfg, episode_fn=episode_trigger, step_fn=step_trigger, provisional=True
        )
        self.engine = ClipEngine(
            cfg, source, out_dir, key=KEY, on_clip=self._on_clip, schedule=schedule
        )
        self._cam, self._rows = None, {}
        # the base env's reset (the bound method, or a hook someone set on the instance before
        # us: put back at close) while hooked
        self._base_reset = None
        self._own_reset = None
        self._in_step = False
        self._stepped_resets = []  # envs reset inside the current step
        self._terminal = None  # frames of the state before those resets

    # ------------------------------------------------------------------ Genesis Forge API
    @property
    def video_length_steps(self) -> Optional[int]:
        """Env steps per clip (None: whole episodes)."""
        n = self.engine.length
        return None if n is None else n * self.engine.steps_per_frame

    def build(self):
        """Builds the env, finds the camera and hooks the base env's ``reset``."""
        super().build()
        from genesis.vis.camera import Camera

        base, attr, env_idx = self.unwrapped, self._camera_attr, self.engine.env_idx
        cam = getattr(base, attr, None)
        if not isinstance(cam, Camera):
            what = "missing" if cam is None else type(cam).__name__
            cams = ", ".join(sorted(n for n, v in vars(base).items() if isinstance(v, Camera)))
            rule = f"{type(base).__name__}.{attr} is {what}, not a Genesis camera"
            _ARGS.refuse("camera_attr", attr, f"{rule}; its cameras: {cams or 'none'}")
        rows = camera_rows(base.scene, cam, int(self.num_envs))
        missing = [e for e in env_idx if e not in rows]
        if missing:
            rule = (
                f"camera {attr!r} draws envs {sorted(rows)} only (env {missing} not). Build the "
                "scene with gs.options.VisOptions(split_envs=True) and rendered_envs_idx "
                "covering the recorded envs"
            )
            _ARGS.refuse("env_idx", env_idx, rule)
        self._cam, self._rows = cam, rows
        if self._base_reset is None:
            self._own_reset = vars(base).get("reset")
            self._base_reset = base.reset
            base.reset = self._reset_hook

    def step(self, actions: torch.Tensor):
        self._in_step = True
        try:
            out = self.env.step(actions)
        finally:
            self._in_step = False
        _, rewards, term, trunc, extras = out
        resets, self._stepped_resets = self._stepped_resets, []
        n, dev = int(self.num_envs), self.engine.device
        if resets or term is None or trunc is None:
            # every env reset inside the step marked done (truncated where the env did not say
            # terminated): the engine must end the clip where the env reset
            zeros = torch.zeros(n, dtype=torch.bool, device=dev)
            term, trunc = (
                zeros if f is None else torch.as_tensor(f).to(dev).bool() for f in (term, trunc)
            )
            reset = zeros.clone()
            for envs in resets:
                reset[envs.to(dev).long()] = True
            trunc = trunc | (reset & ~term)
        reward = torch.zeros(n) if rewards is None else rewards
        try:
            self.engine.on_step(reward, term, trunc, extras if isinstance(extras, dict) else None)
        finally:
            self._terminal = None
        for envs in resets:
            self.engine.on_reset(envs)  # renders the fresh state if a clip starts
        return out

    def _release(self):
        """Puts the base env's ``reset`` back before the env closes."""
        base = self.unwrapped
        if vars(base).get("reset") == self._reset_hook:
            del base.reset  # the class's own reset again, or the one set on the instance before
            if self._own_reset is not None:
                base.reset = self._own_reset
        self._base_reset = None

    finish_recording = RecorderWrapper.end_clip  # Genesis Forge's name for it

    # ------------------------------------------------------------------ internals
    def _on_clip(self, info):
        if self._logging:
            print(f"Saving recording to {info.path}")
        super()._on_clip(info)

    def _render(self, env_idx):
        if self._terminal is not None:  # this step's terminal state, rendered before its reset
            return self._terminal
        if self._cam is None:
            raise ConfigError(f"{KEY}: call build() before reset() or step()")
        return self._draw(env_idx)

    def _draw(self, env_idx):
        """The camera's images of ``env_idx`` now (indexing copies them: owned)."""
        return render_camera(self._cam)[[self._rows[e] for e in env_idx]]

    def _reset_hook(self, env_ids=None, *args, **kwargs):
        if self._in_step:
            n, recorded = int(self.num_envs), self.engine.env_idx
            envs = torch.arange(n) if env_ids is None else torch.as_tensor(env_ids).reshape(-1)
            # a device read only while a clip is open (so the camera is there)
            if self._terminal is None and self.engine.recording:
                if set(envs.tolist()) & set(recorded):
                    self._terminal = self._draw(recorded)
            self._stepped_resets.append(envs)
        out = self._base_reset(env_ids, *args, **kwargs)
        if not self._in_step:
            self.engine.on_reset(env_ids)  # None: a full reset
        return out
