"""The recorder: an env wrapper between AutoReset and the adapter that turns episodes into clips.

Sitting below AutoReset, it sees (docs/recorder.md has the full semantics):

- every ``reset`` naming the recorded env: the start of a new episode. It ends any clip still
  open (a full reset mid-episode ends the clip there), counts the episode, asks the schedule, and
  if a clip starts renders the fresh reset state as the clip's first frame;
- every ``step``: while a clip is open, a frame every ``steps_per_frame`` steps counted from the
  clip's start, and always the terminal frame of the recorded env (rendered before AutoReset
  resets it), which ends the clip.

While no clip is open it renders nothing and its steps read nothing back from the device (the step
trigger reads the recorded env's done flag once every ``every`` steps), so an armed idle recorder
costs two counter increments per step.

The layers it delegates to: every decision of when a clip starts is the
:class:`~rlrec.record.schedule.Schedule`'s; which steps become frames and the file's fps come from
:mod:`rlrec.record.timing`; frames go to an :class:`~rlrec.record.encoder.Encoder` thread, and
finished clips are reported through ``on_clip`` from the training thread.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from rlrec.config import ConfigError, RecorderConfig, validate_recorder
from rlrec.envs.base import EnvAdapter, EnvWrapper, as_env_index
from rlrec.record.encoder import ClipInfo, ClipJob, Encoder
from rlrec.record.frames import FrameMeta, draw_overlay
from rlrec.record.schedule import Schedule
from rlrec.record.timing import check_dt, clip_length, real_fps, steps_per_frame

log = logging.getLogger(__name__)

__all__ = ["Recorder", "RecorderError", "ensure_video_dir"]

_STATE_VERSION = 2  # 1: the schedule's keys (step_pending, step_fired_at) at the top level


class RecorderError(RuntimeError):
    """An encoder failure, raised in the training thread when ``on_error=raise``."""


def ensure_video_dir(path: Optional[str], key: str) -> str:
    """Creates ``path`` and checks that files can be created in it; ConfigError naming ``key``."""
    if not path:
        raise ConfigError(f"{key} is not set: the recorder needs a directory for its videos")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rlrec-probe-"):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={path!r} cannot be used as the video directory: {err}") from err
    return path


@dataclass
class _Clip:
    """The clip being recorded (training-thread bookkeeping)."""

    steps: int = 0  # env steps since the first frame
    frames: int = 0
    # return of the recorded envs since the first frame (overlay)
    ret: Optional[torch.Tensor] = None


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
        self.key = "recorder" if kind == "train" else f"{kind}_env.recorder"
        validate_recorder(cfg, self.key, env.num_envs)
        check_dt(env.dt, self.key)
        self.cfg = cfg
        self.kind = kind
        self.on_clip = on_clip
        self.tag: Any = None
        self.schedule = Schedule(cfg.trigger, cfg.every, cfg.record_final_episode)
        self._asks_steps = self.schedule.asks_steps
        self.env_idx: List[int] = [int(i) for i in cfg.env_idx]
        self._first = self.env_idx[0]  # episodes are counted on the first recorded env
        self._index = torch.tensor(self.env_idx, dtype=torch.long, device=env.device)
        self.steps_per_frame = steps_per_frame(cfg.fps, env.dt)
        self.fps = real_fps(self.steps_per_frame, env.dt)  # written into the file
        self.length = clip_length(cfg, self.fps)  # frames per clip, None: whole episode
        if cfg.dir:
            video_dir = ensure_video_dir(cfg.dir, f"{self.key}.dir")
        else:
            video_dir = ensure_video_dir(video_dir, f"{self.key}.dir (or the run's video dir)")
        # absolute: a relative dir means the working directory at start-up, whatever happens later
        self.video_dir = os.path.abspath(video_dir)
        # validate_recorder refused names that are not one plain file; .mp4 is added when missing
        name = cfg.filename
        self.filename = name if name is None or name.lower().endswith(".mp4") else name + ".mp4"
        self._encoder = Encoder(
            cfg.queue_size, name=f"rlrec-encoder-{kind}", stall_timeout=cfg.stall_timeout_sec
        )
        # counters (checkpointed)
        self.episode = -1  # index of the recorded env's current episode; -1 before the first reset
        self.steps = 0  # calls of step()
        self.clips_saved = 0
        # runtime state
        self._episode_steps = 0
        self._clip: Optional[_Clip] = None
        self.errors: List[str] = []
        self._closed = False

    # ------------------------------------------------------------------ env interface
    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        if self._closed:
            return out
        # A full reset is reset(env_idx=None), as the runner does to start an evaluation.
        # AutoReset always names the envs it resets, even when all of them finished on the same
        # step (or num_envs == 1), and such a reset must not count as a new evaluation.
        full = env_idx is None
        if full:
            hit = True
        elif isinstance(env_idx, torch.Tensor):  # on the sim's device: one read-back
            hit = bool((as_env_index(env_idx, self.num_envs, self.device) == self._first).any())
        else:  # a list of indices: no tensor, no device round trip
            hit = any(int(i) == self._first for i in env_idx)
        if hit:
            self._new_episode(full)
        self.poll()
        return out

    def step(self, action):
        out = self.env.step(action)
        self.steps += 1
        self._episode_steps += 1
        if self._clip is None and not self._asks_steps:  # the armed idle path: two increments
            if self._encoder.pending:
                self.poll()
            return out
        if self._closed:
            return out
        obs, reward, terminated, truncated, info = out
        first = self._first
        clip = self._clip
        if clip is not None:
            clip.steps += 1
            # the only device read-back per step, and only while recording
            done = bool(terminated[first] | truncated[first])
            if self.cfg.overlay:
                clip.ret = clip.ret + reward[self._index].float()
            if done or clip.steps % self.steps_per_frame == 0:
                # the terminal frame is always taken: it is rendered here, before AutoReset
                # (above us) resets the env and replaces it
                self._capture(reward, info)
            if done or (self.length is not None and clip.frames >= self.length):
                self._end_clip(keep=True)
        elif self.schedule.on_step(self.steps, lambda: bool(terminated[first] | truncated[first])):
            self._start_clip()  # trigger=step, idle: the done flag is read when the trigger falls
        if self._encoder.pending:
            self.poll()
        return out

    # ------------------------------------------------------------------ runner API
    def record_next_episode(self) -> None:
        """Records the next episode of the recorded env whatever the trigger says."""
        self.schedule.record_next_episode()

    def expect_end(self, steps_left: int) -> None:
        """The caller will call :meth:`step` ``steps_left`` more times, then :meth:`close`.

        With ``record_final_episode``, every episode of the recorded env that begins within the
        last ``max_episode_steps`` steps (every episode from now on if the env has no limit) is
        recorded, so the episode in progress at ``close()`` has a clip, which ``close()`` saves.
        Call it before the final episode begins (e.g. once, before the training loop)."""
        horizon = getattr(self.env, "max_episode_steps", None)
        self.schedule.expect_end(self.steps, steps_left, horizon)

    def end_clip(self) -> None:
        """Ends (and saves) the clip in progress now, e.g. when an evaluation stops early."""
        if self._clip is not None:
            self._end_clip(keep=True)
        self.poll()

    def flush(self) -> None:
        """Waits until every ended clip is on disk and reported through ``on_clip``."""
        self._encoder.flush()
        self.poll()

    def close(self) -> None:
        """Saves the clip in progress if ``record_final_episode`` (else drops it), waits for the
        encoder, reports the last clips, closes the env. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._clip is not None:
                self._end_clip(keep=self.cfg.record_final_episode)
            self._encoder.close()
            self.poll()
        finally:
            self.env.close()

    @property
    def pending(self) -> bool:
        """Whether finished clips (or encoder errors) wait for :meth:`poll`."""
        return self._encoder.pending

    @property
    def recording(self) -> bool:
        return self._clip is not None

    def state_dict(self) -> Dict[str, Any]:
        """Counters and schedule, for checkpoints."""
        return {
            "version": _STATE_VERSION,
            "episode": self.episode,
            "steps": self.steps,
            "clips_saved": self.clips_saved,
            "schedule": self.schedule.state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues the schedule of a checkpoint. Call it before the first reset: a clip already
        open belongs to the schedule being replaced and is discarded."""
        missing = {"episode", "steps", "clips_saved"} - set(state)
        version = state.get("version", _STATE_VERSION)
        if missing or version not in (1, _STATE_VERSION):
            raise ValueError(
                f"not a recorder state of version {_STATE_VERSION} (or 1): version {version!r}, "
                f"missing keys {sorted(missing)}"
            )
        schedule = state.get("schedule")
        # version 1 kept the schedule's keys at the top level; none: a fresh one
        if schedule is None:
            keys = ("step_pending", "step_fired_at")
            schedule = {
                "version": Schedule.STATE_VERSION,
                **{k: state[k] for k in keys if k in state},
            }
        self.schedule.load_state_dict(schedule)
        if self._clip is not None:
            self._end_clip(keep=False)
        self.episode = int(state["episode"])
        self.steps = int(state["steps"])
        self.clips_saved = int(state["clips_saved"])

    # ------------------------------------------------------------------ internals
    def _new_episode(self, full_reset: bool) -> None:
        if self._clip is not None:
            self._end_clip(keep=True)  # an episode boundary always ends the clip
        self.episode += 1
        self._episode_steps = 0
        if self.schedule.on_reset(self.episode, self.steps, full_reset):
            self._start_clip()

    def _start_clip(self) -> None:
        self._clip = _Clip()
        if self.cfg.overlay:
            self._clip.ret = torch.zeros(len(self.env_idx), device=self.device)
        name = self.filename or f"{self.kind}-ep{self.episode:06d}-step{self.steps:09d}.mp4"
        job = ClipJob(
            path=os.path.join(self.video_dir, name),
            fixed_name=self.filename is not None,
            kind=self.kind,
            episode=self.episode,
            step=self.steps,
            fps=self.fps,
            quality=self.cfg.quality,
            preset=self.cfg.preset,
            lossless=self.cfg.lossless,
            overlay=draw_overlay if self.cfg.overlay else None,
            tag=self.tag,
        )
        self._encoder.open(job)
        self._capture(None, None)
        if self.length is not None and self._clip.frames >= self.length:
            self._end_clip(keep=True)  # a one-frame clip

    def _capture(self, reward: Optional[torch.Tensor], info: Optional[dict]) -> None:
        clip = self._clip
        assert clip is not None
        frames = self.env.render(self.env_idx)
        k = len(self.env_idx)
        if (
            frames.dtype != torch.uint8
            or frames.dim() != 4
            or frames.shape[0] != k
            or frames.shape[-1] != 3
        ):
            raise TypeError(
                f"{type(self.unwrapped).__name__}.render({self.env_idx}) returned {frames.dtype} "
                f"{tuple(frames.shape)}; the recorder needs uint8 [{k}, H, W, 3]"
            )
        meta = None
        if self.cfg.overlay:
            success = info.get("success") if info else None
            meta = FrameMeta(
                episode=self.episode,
                episode_step=self._episode_steps,
                reward=None if reward is None else reward[self._index].float().cpu(),
                ret=None if reward is None else clip.ret.cpu(),  # type: ignore[union-attr]
                success=None if success is None else success[self._index].cpu(),
            )
        # The encoder copies the frames into one of its reusable CPU buffers: the one copy the
        # training thread pays (device -> CPU on a GPU). On the CPU too, so that a frame waiting
        # for the encoder can never be changed by a later step or render, even from an adapter
        # whose render broke the owned-copy contract.
        self._encoder.frame(frames, meta)
        clip.frames += 1

    def _end_clip(self, keep: bool) -> None:
        self._clip = None
        self._encoder.end(keep)

    def poll(self) -> None:
        """Reports finished clips (``on_clip``) and encoder errors, in the calling thread. Runs
        on every step and reset; call it to report clips of an env that is not being stepped.

        A fixed-name clip is moved to its name right before its ``on_clip``, so the file there is
        that clip while ``on_clip`` runs (a consumer that reads it later links or copies it)."""
        results = self._encoder.results(place=False)
        for i, result in enumerate(results):
            try:
                result = self._encoder.place(result)
                if isinstance(result, ClipInfo):
                    self.clips_saved += 1
                    log.info(
                        "saved %s clip %s (%d frames)", self.kind, result.path, result.num_frames
                    )
                    if self.on_clip is not None:
                        self.on_clip(result)
                else:
                    self._report(result)
            except BaseException:  # on_error=raise, or on_clip failed: the rest wait for later
                self._encoder.requeue(results[i + 1 :])
                raise

    def _report(self, message: str) -> None:
        self.errors.append(message)
        if self.cfg.on_error == "raise":
            raise RecorderError(f"{self.key}: {message} ({self.key}.on_error=raise)")
        if len(self.errors) == 1:  # once; later failures are only appended to .errors
            text = (
                f"{self.key}: {message}. Training goes on without this clip; earlier clips are "
                f"intact; later encoder errors are collected in Recorder.errors. Set "
                f"{self.key}.on_error=raise to make this fatal."
            )
            log.error(text)
