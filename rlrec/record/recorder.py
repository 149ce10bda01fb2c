"""The recorder in rlrec's env stack: an env wrapper between AutoReset and the adapter.

Sitting below AutoReset, it sees every ``reset`` (full or partial) and every ``step`` of the
adapter, before AutoReset resets the envs that finished, and hands each to its
:class:`~rlrec.record.engine.ClipEngine`, which decides and records the clips (docs/recorder.md
has the full semantics): the fresh reset state is a clip's first frame and the terminal state its
last. Renders go through the adapter's ``render(env_idx)``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from rlrec.envs.base import EnvAdapter, EnvWrapper
from rlrec.record.encoder import ClipInfo, Encoder
from rlrec.record.engine import ClipEngine, RecorderError, ensure_video_dir
from rlrec.record.schedule import Schedule
from rlrec.record.settings import RecorderConfig

__all__ = ["Recorder", "RecorderError", "ensure_video_dir"]


class Recorder(EnvWrapper):
    """Records clips of ``cfg.env_idx`` into ``video_dir`` (``cfg.dir`` overrides it).

    ``kind`` ("train" or "eval") goes into file names and :class:`ClipInfo`; ``on_clip`` is called
    with each clip once it is complete on disk, from the training thread (during a later
    ``step``/``reset``/``flush``/``close``). Bad settings raise ConfigError here, before any work;
    then the video directory is created.

    ``tag``: any value the caller sets (e.g. the training step of the evaluation being recorded);
    each clip keeps the tag current at its first frame, and its :class:`ClipInfo` carries it.
    """

    def __init__(
        self,
        env: EnvAdapter,
        cfg: RecorderConfig,
        video_dir: Optional[str],
        kind: str = "train",
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
    ):
        super().__init__(env)
        self.engine = ClipEngine(
            cfg,
            num_envs=env.num_envs,
            dt=env.dt,
            device=env.device,
            render=env.render,
            video_dir=video_dir,
            kind=kind,
            on_clip=on_clip,
            max_episode_steps=getattr(env, "max_episode_steps", None),
        )
        self._on_step = self.engine.on_step

    # ------------------------------------------------------------------ env interface
    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        self.engine.on_reset(env_idx, seed)
        return out

    def step(self, action):
        out = self.env.step(action)
        self._on_step(out[1], out[2], out[3], out[4])
        return out

    def close(self) -> None:
        """Saves the clip in progress if ``record_final_episode`` (else drops it), waits for the
        encoder, reports the last clips, closes the env. Idempotent."""
        if self.engine.closed:
            return
        try:
            self.engine.close()
        finally:
            self.env.close()

    # ------------------------------------------------------------------ runner API
    def record_next_episode(self) -> None:
        """Records the next episode of the recorded env whatever the trigger says."""
        self.engine.record_next_episode()

    def expect_end(self, steps_left: int) -> None:
        """See :meth:`ClipEngine.expect_end`: the caller will call :meth:`step` ``steps_left``
        more times, then :meth:`close`."""
        self.engine.expect_end(steps_left)

    def end_clip(self) -> None:
        """Ends (and saves) the clip in progress now, e.g. when an evaluation stops early."""
        self.engine.end_clip()

    def flush(self) -> None:
        """Waits until every ended clip is on disk and reported through ``on_clip``."""
        self.engine.flush()

    def poll(self) -> None:
        """Reports finished clips and encoder errors (see :meth:`ClipEngine.poll`)."""
        self.engine.poll()

    def state_dict(self) -> Dict[str, Any]:
        """Counters and schedule, for checkpoints."""
        return self.engine.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues the schedule of a checkpoint (call it before the first reset)."""
        self.engine.load_state_dict(state)

    # ------------------------------------------------------------------ the engine's figures
    @property
    def tag(self) -> Any:
        return self.engine.tag

    @tag.setter
    def tag(self, value: Any) -> None:
        self.engine.tag = value

    @property
    def on_clip(self) -> Optional[Callable[[ClipInfo], None]]:
        return self.engine.on_clip

    @on_clip.setter
    def on_clip(self, value: Optional[Callable[[ClipInfo], None]]) -> None:
        self.engine.on_clip = value

    pending = property(lambda self: self.engine.pending)
    recording = property(lambda self: self.engine.recording)
    cfg: RecorderConfig = property(lambda self: self.engine.cfg)  # type: ignore[assignment]
    kind: str = property(lambda self: self.engine.kind)  # type: ignore[assignment]
    key: str = property(lambda self: self.engine.key)  # type: ignore[assignment]
    schedule: Schedule = property(lambda self: self.engine.schedule)  # type: ignore[assignment]
    env_idx: List[int] = property(lambda self: self.engine.env_idx)  # type: ignore[assignment]
    episode: int = property(lambda self: self.engine.episode)  # type: ignore[assignment]
    steps: int = property(lambda self: self.engine.steps)  # type: ignore[assignment]
    clips_saved: int = property(lambda self: self.engine.clips_saved)  # type: ignore[assignment]
    clips_started: int = property(lambda self: self.engine.clips_started)  # type: ignore
    errors: List[str] = property(lambda self: self.engine.errors)  # type: ignore[assignment]
    fps: float = property(lambda self: self.engine.fps)  # type: ignore[assignment]
    steps_per_frame: int = property(lambda self: self.engine.steps_per_frame)  # type: ignore
    length: Optional[int] = property(lambda self: self.engine.length)  # type: ignore
    video_dir: str = property(lambda self: self.engine.video_dir)  # type: ignore[assignment]
    filename: Optional[str] = property(lambda self: self.engine.filename)  # type: ignore
    _encoder: Encoder = property(lambda self: self.engine._encoder)  # type: ignore[assignment]
    _closed: bool = property(lambda self: self.engine.closed)  # type: ignore[assignment]
