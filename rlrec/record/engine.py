"""The recorder engine: every clip of one recorder, driven by two events from what wraps the env.

:class:`ClipEngine` knows no framework. It is told, by its wrapper, of

- :meth:`ClipEngine.on_reset`, right after the env reset some (or all) of its envs: the start of a
  new episode of the recorded env. It ends any clip still open (a full reset mid-episode ends the
  clip there; a clip that a partial reset began and that saw no step, that reset's frame only, is
  dropped), counts the episode, asks the schedule, and if a clip starts renders the fresh reset
  state as the clip's first frame;
- :meth:`ClipEngine.on_step`, right after each step, before anything resets the envs that finished:
  while a clip is open, a frame every ``steps_per_frame`` steps counted from the clip's start, and
  always the terminal frame of the recorded env, which ends the clip.

and it renders through one callable, ``render(env_idx) -> uint8 [k, H, W, 3]`` of the current
state (its ``render`` attribute). The wrappers of :mod:`rlrec.record.wrappers` (rlrec's own
:class:`~rlrec.record.wrappers.adapter.Recorder`, below AutoReset in rlrec's env stack, and the
drop-ins for other frameworks' loops) are thin callers of these two events.

While no clip is open it renders nothing and reads nothing back from the device (the step trigger
reads the recorded env's done flag once every ``every`` steps), so an armed idle engine costs a call
and two counter increments per step.

The layers it delegates to: every decision of when a clip starts (and why: a provisional clip
is kept by ``close()`` alone) is its :class:`~rlrec.record.schedule.Schedule`'s; each clip's file
name is its ``name`` callable's (:mod:`rlrec.record.names`); which steps become frames, the file's
fps and a clip's length in frames are the engine's own (computed once, in its constructor);
frames go to an :class:`~rlrec.record.encoder.Encoder` thread, which writes each clip and its
sidecar (:mod:`rlrec.record.sidecar`); finished clips are reported through ``on_clip`` from the
caller's thread.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.files import probe_dir
from rlrec.record import names
from rlrec.record.encoder import ClipInfo, ClipJob, Encoder
from rlrec.record.ffmpeg import encoder_settings
from rlrec.record.frames import FrameMeta, draw_overlay
from rlrec.record.schedule import Schedule, Start
from rlrec.record.settings import RecorderConfig

log = logging.getLogger(__name__)


_STATE_VERSION = 2  # 1: the schedule's keys (step_pending, step_fired_at) at the top level
_COUNTERS = ("episode", "steps", "clips_saved")  # the checkpointed counters, beside the schedule
# steps whose values a clip keeps as plain rows until it sums them (numpy, a few calls for all)
_FOLD_ROWS = 256


class RecorderError(RuntimeError):
    """An encoder failure, raised in the caller's thread when ``on_error=raise``."""


@dataclass
class Source:
    """The envs a recorder records: ``render(env_idx) -> uint8 [k, H, W, 3]`` of the current
    state, ``max_episode_steps`` the time limit (for ``record_final_episode``). An
    :class:`~rlrec.envs.base.EnvAdapter` is one as it is."""

    num_envs: int
    dt: float
    device: Any
    render: Callable[[List[int]], Any]  # env indices -> uint8 [k, H, W, 3] (tensor or array)
    max_episode_steps: Optional[int] = None


class _Recorded:
    """The values of the recorded envs, on the host: what the engine reads of a step.

    :meth:`rows` turns per-env arrays or tensors ``[num_envs]`` into lists over the recorded envs
    of plain Python values. Host values (numpy arrays, CPU tensors) are read in place through a
    slice where the recorded envs are contiguous (an index where they are not) and ``tolist()``;
    values on a device are gathered there into one ``[rows, k]`` tensor and copied to the host
    at once: the step's one read-back. Plain values, not arrays: a recording step's bookkeeping
    is then a list append (each numpy call would cost the training thread ten times more right
    after a render has flushed its caches)."""

    def __init__(self, env_idx, device):
        first, k = env_idx[0], len(env_idx)
        self.env_idx, self.env_np = env_idx, np.asarray(env_idx)
        contiguous = env_idx == list(range(first, first + k))
        self.take = slice(first, first + k) if contiguous else self.env_np
        self.index = torch.tensor(env_idx, device=device)

    def host(self, value):
        """``value``'s recorded entries as a list; None when ``value`` lives on a device."""
        if isinstance(value, torch.Tensor):
            return value[self.take].tolist() if value.is_cpu else None
        return np.asarray(value)[self.take].tolist()

    def hits(self, env_idx):
        """Which recorded envs a reset names (a list of bools over them): ``env_idx`` None (every
        env), a list of ints, an int tensor/array or a bool mask ``[num_envs]``."""
        if env_idx is None:
            return [True] * len(self.env_idx)
        if isinstance(env_idx, torch.Tensor):
            # the one read-back of a reset (none for a host index, as AutoReset's CPU tensor)
            env_idx = env_idx.cpu().numpy()
        idx = np.asarray(env_idx).reshape(-1)
        if idx.dtype == np.bool_:  # a mask: the recorded envs' entries
            return idx[self.env_np].tolist()
        named = set(idx.tolist())
        return [i in named for i in self.env_idx]

    def rows(self, values):
        rows = [self.host(v) for v in values]
        if None in rows:  # on a device: one gather, one copy to the host
            index = self.index
            # promoted to the widest dtype: bools become 0/1, rewards keep their values
            gathered = [torch.as_tensor(v).to(index.device).index_select(0, index) for v in values]
            rows = torch.stack(gathered).cpu().tolist()
        return rows


class _Clip:
    """The clip being recorded: bookkeeping and the statistics its sidecar reports, per recorded
    env, of the episode each env was in at the clip's first frame.

    A step only appends its row (reward, terminated, truncated, success of the recorded envs, as
    plain values) to ``rows``; :meth:`fold` sums them with numpy, many at a time: in float32 and
    in step order (``np.add.accumulate``: bit for bit the sums of ``ret += reward`` step by step),
    each env's up to the step its episode ended. It runs every ``_FOLD_ROWS`` steps and before
    anything reads the sums."""

    def __init__(self, episodes, first, seed, provisional, autoreset):
        k = len(episodes)
        self.steps = self.frames = 0  # env steps since the first frame; frames taken
        self.first_step = self.last_step = first  # the step counts at the first and last frame
        self.seed, self.episodes = seed, episodes  # each recorded env's episode at the first frame
        # provisional (Schedule.provisional): dropped when its episode ends, kept only by close()
        self.provisional = provisional
        self.autoreset = autoreset  # it began at a partial reset (an autoreset)
        self.rows = []
        self.no_success = [0] * k  # the row's success where the env reports none
        self.reports_success = False
        self.ret = np.zeros(k, dtype=np.float32)
        self.length = np.zeros(k, dtype=np.int64)
        # per env: terminated, truncated, succeeded within the clip, and its episode over
        self.terminated, self.truncated, self.success, self.over = np.zeros((4, k), dtype=bool)

    def add(self, row):
        """Adds a step's row (3 lists, or 4 with success); whether the first env's episode
        ended."""
        if len(row) == 3:
            row.append(self.no_success)
        else:
            self.reports_success = True
        self.rows.append(row)
        if len(self.rows) >= _FOLD_ROWS:
            self.fold()
        return bool(row[1][0] or row[2][0])

    def fold(self):
        """Adds the rows to the sums (float32, in step order) of the episodes still running."""
        if not self.rows:
            return
        reward, term, trunc, success = np.asarray(self.rows, dtype=np.float32).transpose(1, 0, 2)
        self.rows = []
        term, trunc = term != 0, trunc != 0
        done = term | trunc
        # live at a step: its episode had not ended before it (the terminal step counts)
        live = ~np.logical_or.accumulate(np.concatenate((self.over[None], done[:-1])), axis=0)
        summed = np.concatenate((self.ret[None], np.where(live, reward, np.float32(0))))
        self.ret = np.add.accumulate(summed, axis=0)[-1]
        self.length += live.sum(axis=0)
        self.terminated |= (live & term).any(axis=0)
        self.truncated |= (live & trunc & ~term).any(axis=0)
        self.success |= (live & (success != 0)).any(axis=0)
        self.over |= done.any(axis=0)

    def summary(self, kind, env_idx):
        """What the clip's sidecar says of its episodes (plain data, from the host arrays)."""
        self.fold()
        success = self.success.tolist() if self.reports_success else [None] * len(env_idx)
        cut = np.where(self.truncated, "truncated", "cut")
        ends = np.where(self.terminated, "terminated", cut).tolist()
        values = zip(env_idx, self.episodes, self.ret.tolist(), self.length.tolist(), success, ends)
        keys = ("env", "episode", "return", "length", "success", "end")
        seed = self.seed  # numpy and torch numbers as plain ones; anything else json cannot write
        # is written as its repr (write_sidecar)
        seed = seed.tolist() if isinstance(seed, (np.integer, torch.Tensor)) else seed
        return {
            "kind": kind,
            "env_idx": list(env_idx),
            "episodes": list(self.episodes),
            "seed": seed,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "envs": [dict(zip(keys, row)) for row in values],  # float32 -> exact floats
        }


class ClipEngine:
    """Records clips of ``cfg.env_idx`` of ``source`` (a :class:`Source`, or an env adapter)
    into ``video_dir`` (``cfg.dir`` overrides it). See the module docstring for its two events.

    ``kind`` ("train", "eval", ...) goes into :class:`ClipInfo` and the sidecars; ``key`` names
    the settings in error messages; ``on_clip`` is called with each clip once it (and its
    sidecar) is on disk, from the caller's thread (during a later event, ``poll``, ``flush`` or
    ``close``). ``schedule``: when clips start (default: ``cfg``'s); ``name``: each clip's file
    name (:mod:`rlrec.record.names`; ``cfg.filename`` wins). Bad settings raise ConfigError
    here, before any work (:meth:`RecorderConfig.check`); then the video directory is created.
    ``tag``: any value the caller sets; each clip keeps the tag current at its first frame (its
    name and :class:`ClipInfo` carry it)."""

    def __init__(
        self,
        cfg: RecorderConfig,
        source,
        video_dir: Optional[str] = None,
        *,
        kind: str = "train",
        key: str = "recorder",
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        schedule: Optional[Schedule] = None,
        name: Optional[names.Name] = None,
    ):
        cfg.check(int(source.num_envs), key)
        dt = source.dt
        if dt is None or not dt > 0:  # the file's fps means nothing without it
            raise ConfigError(f"{key}: the env reports dt={dt!r}; the recorder needs dt > 0")
        # the clips' directory, created and probed (ConfigError): cfg.dir, else video_dir;
        # absolute: a relative dir means the working directory at start-up
        where = f"{key}.dir (or the run's video dir)"
        if not (cfg.dir or video_dir):
            raise ConfigError(f"{where} is not set: the recorder needs a directory for its videos")
        probed = probe_dir(cfg.dir or video_dir, where, use="the video directory", create=True)
        self.video_dir = os.path.abspath(probed)
        self.cfg, self.key, self.kind, self.on_clip = cfg, key, kind, on_clip
        self.device = torch.device(source.device)
        self.render = source.render
        self.max_episode_steps = source.max_episode_steps
        self.tag = None
        self.schedule = schedule or Schedule.of(cfg)
        self._asks_steps = self.schedule.asks_steps
        self.name = names.fixed(cfg.filename) if cfg.filename else name or names.default
        self.env_idx = [int(i) for i in cfg.env_idx]
        self._recorded = _Recorded(self.env_idx, self.device)
        # the timing, computed here only: env steps between two frames, max(1, ...) so that
        # fps * dt > 2 takes every step (at 1 / dt) rather than rounding to 0
        self.steps_per_frame = 1 if cfg.fps is None else max(1, round(1.0 / (cfg.fps * dt)))
        self.fps = 1.0 / (self.steps_per_frame * dt)  # what the frames really have: the file's
        # frames per clip (None: the whole episode), seconds converted at the file's real fps
        self.length = cfg.length_frames
        if cfg.length_sec is not None:
            self.length = max(1, round(cfg.length_sec * self.fps))
        self._max_frames = self.length or float("inf")
        self._encoding = encoder_settings(cfg.quality, cfg.lossless, cfg.preset)
        # a holding schedule's clips are of engines encoding side by side (per-episode clips):
        # one x264 thread each
        hold = self.schedule.hold
        args = (cfg.queue_size, f"rlrec-encoder-{kind}", cfg.stall_timeout_sec, hold)
        self.encoder = Encoder(*args, 1 if hold else None)
        self._waiting = self.encoder.waiting  # true while finished clips wait for poll()
        # counters: the episode of the recorded env (-1 before the first reset) and the steps
        # seen (checkpointed, with clips_saved), the clips started in this process
        self.episode, self.steps, self.clips_saved, self.clips_started = -1, 0, 0, 0
        # each recorded env's episode index, plain ints: a reset costs no torch op (a cold one
        # costs far more than a step of a small env), read when a clip starts
        self._episodes = [-1] * len(self.env_idx)
        self._seed = None  # the seed of the reset that began the recorded env's episode
        self._episode_start = 0  # the step count at that reset
        self._clip = None
        self.errors = []
        self.closed = False

    # ------------------------------------------------------------------ events
    def on_reset(self, env_idx=None, seed=None):
        """The env just reset ``env_idx`` (None: a full reset of every env; a list of ints, an
        int tensor or a bool mask ``[num_envs]``) with ``seed`` (kept for the sidecar)."""
        if self.closed:
            return
        # A full reset is reset(env_idx=None), as the runner does to start an evaluation; AutoReset
        # always names the envs it resets (even all of them): not a new evaluation.
        hits = self._recorded.hits(env_idx)
        self._episodes = [e + h for e, h in zip(self._episodes, hits)]
        clip = self._clip
        if hits[0]:  # a new episode of the first recorded env
            self._seed = seed
            if clip is not None:
                # an episode boundary always ends the clip. Dropped: a provisional clip, and one
                # that a partial reset (an autoreset) began and that saw no step, only that
                # reset's frame (an autoreset right before the caller's full reset). Kept: a step
                # trigger's clip cut before its next step (a real state, "cut")
                self._end_clip(keep=not clip.provisional and (clip.steps > 0 or not clip.autoreset))
            self.episode += 1
            self._episode_start = self.steps
            start = self.schedule.on_reset(self.episode, self.steps, env_idx is None)
            if start:
                self._start_clip(start, autoreset=env_idx is not None)
        if self._waiting:
            self.poll()

    def on_step(
        self,
        reward,
        terminated,
        truncated,
        info: Optional[dict] = None,
        stepped: bool = True,
    ):
        """The env just stepped (before anything resets the envs that finished). ``stepped``:
        False when this call reset the recorded env instead of stepping it (an autoreset inside
        the env's step, announced with :meth:`on_reset` first): counted, but not a frame."""
        self.steps += 1
        clip = self._clip
        if clip is None and not self._asks_steps:  # the armed idle path: one increment
            if self._waiting:  # finished clips to report
                self.poll()
            return
        if self.closed:
            return
        if self._asks_steps:
            busy = clip is not None and not clip.provisional
            first = self.env_idx[0]  # episodes are counted on the first recorded env

            def terminal():  # read only when the step trigger falls
                return bool(torch.as_tensor(terminated)[first] or torch.as_tensor(truncated)[first])

            start = self.schedule.on_step(self.steps, busy, terminal)
            if start:
                if clip is not None:
                    # it gives way: a provisional clip is dropped, and so is (restart) a clip
                    # that holds only the state the new one starts on
                    self._end_clip(keep=busy and (clip.steps > 0 or stepped))
                self._start_clip(start)
                clip = None  # the new clip's first frame is this state
        if clip is not None and stepped:
            clip.steps += 1
            success = info.get("success") if info else None
            values = (reward, terminated, truncated) + (() if success is None else (success,))
            # the recorded envs' values on the host, as plain values (the only device read-back
            # per step, and only while recording)
            row = self._recorded.rows(values)
            done = clip.add(row)
            if clip.frames < self._max_frames and (done or clip.steps % self.steps_per_frame == 0):
                # the terminal frame is always taken: it is rendered here, before anything
                # resets the env and replaces it
                self._capture(row)
            # a full provisional clip stays open, taking no more frames, until its episode ends
            # (dropped) or close() keeps it
            if done or (clip.frames >= self._max_frames and not clip.provisional):
                self._end_clip(keep=not clip.provisional)
        if self._waiting:
            self.poll()

    # ------------------------------------------------------------------ caller API
    def expect_end(self, steps_left: int):
        """The caller will report ``steps_left`` more steps, then call :meth:`close`: with
        ``record_final_episode``, every episode of the recorded env that begins within the last
        ``max_episode_steps`` steps (every one if the env has no limit) is recorded, provisionally
        where no trigger selects it, so the episode in progress at ``close()`` has a clip and no
        other is kept (:meth:`Schedule.expect_end`)."""
        self.schedule.expect_end(self.steps, steps_left, self.max_episode_steps)

    def end_clip(self, keep: bool = True):
        """Ends the clip in progress now, e.g. when an evaluation stops early: saved, or dropped
        (``keep=False``) without being encoded to its end."""
        self._end_clip(keep=keep)
        self.poll()

    def flush(self):
        """Waits (bounded) until every ended clip is on disk and reported through ``on_clip``."""
        self.encoder.flush()
        self.poll()

    def close(self):
        """Saves the clip in progress if ``record_final_episode`` (else drops it), waits for the
        encoder (bounded), reports the last clips. Idempotent."""
        if not self.closed:
            self.closed = True
            self._end_clip(keep=self.cfg.record_final_episode)
            self.encoder.close()
            self.poll()

    @property
    def pending(self) -> bool:
        """Whether finished clips (or encoder errors) wait for :meth:`poll`."""
        return bool(self._waiting)

    @property
    def recording(self) -> bool:
        return self._clip is not None

    def losses(self) -> Dict[str, int]:
        """What this recorder lost so far: clips that never reached disk (each one of
        :attr:`errors`), the frames handed over for them, and the encoder's stalls."""
        return {"clips_dropped": len(self.errors), **self.encoder.losses()}

    def state_dict(self) -> Dict[str, Any]:
        """Counters and schedule, for checkpoints."""
        counters = {k: getattr(self, k) for k in _COUNTERS}
        return {"version": _STATE_VERSION, **counters, "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]):
        """Continues the schedule of a checkpoint. Call it before the first reset: a clip already
        open belongs to the schedule being replaced and is discarded."""
        missing = set(_COUNTERS) - set(state)
        version = state.get("version", _STATE_VERSION)
        if missing or version not in (1, _STATE_VERSION):
            raise ValueError(
                f"not a recorder state of version {_STATE_VERSION} (or 1): version {version!r}, "
                f"missing keys {sorted(missing)}"
            )
        # version 1 kept the schedule's keys (its version 1) at the top level
        self.schedule.load_state_dict(state.get("schedule", {**state, "version": 1}))
        self._end_clip(keep=False)
        for k in _COUNTERS:
            setattr(self, k, int(state[k]))

    def poll(self):
        """Reports finished clips (``on_clip``) and encoder errors, in the calling thread. Runs
        on every event; call it to report clips of an env that is not being stepped.

        A fixed-name clip is moved to its name right before its ``on_clip``, so the file there is
        that clip while ``on_clip`` runs (a consumer that reads it later links or copies it)."""
        # on_error=raise, or on_clip failed: the rest wait in the encoder for a later poll
        for result in self.encoder.results():
            if isinstance(result, ClipInfo):
                self.clips_saved += 1
                log.info("saved %s clip %s (%d frames)", self.kind, result.path, result.num_frames)
                if self.on_clip is not None:
                    self.on_clip(result)
                continue
            self.errors.append(result)
            if self.cfg.on_error == "raise":
                raise RecorderError(f"{self.key}: {result} ({self.key}.on_error=raise)")
            if len(self.errors) == 1:  # once; later failures are only appended to .errors
                log.error(
                    f"{self.key}: {result}. Recording goes on without this clip (later errors "
                    f"are only collected in .errors); {self.key}.on_error=raise makes this fatal."
                )

    # ------------------------------------------------------------------ internals
    def _start_clip(self, start, autoreset=False):
        provisional = start is Start.provisional
        by_step = start is Start.step or (provisional and self._asks_steps)
        at = names.ClipStart(self.kind, self.episode, self.steps, by_step, self.tag)
        self.clips_started += not provisional
        self._clip = _Clip(self._episodes, self.steps, self._seed, provisional, autoreset)
        path = os.path.join(self.video_dir, self.name(at))
        info = ClipInfo(path, self.kind, self.episode, self.steps, 0, self.fps, self.tag)
        overlay = draw_overlay if self.cfg.overlay else None
        self.encoder.open(ClipJob(info, bool(self.cfg.filename), self._encoding, overlay))
        self._capture()
        if self._max_frames == 1 and not provisional:
            self._end_clip(keep=True)  # a one-frame clip

    def _capture(self, row=None):
        """Renders the recorded envs and queues the frame; ``row``: the recorded envs' values of
        the step that led to it (None on a first frame)."""
        clip = self._clip
        frames, k = self.render(self.env_idx), len(self.env_idx)
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(frames)
        tensor = isinstance(frames, torch.Tensor)
        if not (tensor and frames.dtype == torch.uint8 and frames.ndim == 4) or (
            frames.shape[::3] != (k, 3)
        ):
            what = f"{frames.dtype} {tuple(frames.shape)}" if tensor else type(frames).__name__
            raise TypeError(
                f"{self.key}: render({self.env_idx}) returned {what}; the recorder needs uint8 "
                f"[{k}, H, W, 3]"
            )
        meta = None
        if self.cfg.overlay:
            # what the overlay shows (reward and return, and success where the env reports it),
            # made here: the encoder thread reads it later, and the clip's return changes
            clip.fold()
            reward, ret, success = (None, None, None) if row is None else (row[0], clip.ret, row[3])
            episode_step = self.steps - self._episode_start
            meta = FrameMeta(self.episode, episode_step, reward, ret, success)
        # The encoder copies the frames into one of its reusable CPU buffers: the one copy the
        # caller's thread pays (device -> CPU on a GPU). On the CPU too, so that a frame waiting
        # for the encoder can never be changed by a later step or render, even from a render
        # that broke the owned-copy contract.
        self.encoder.frame(frames, meta)
        clip.frames += 1
        clip.last_step = clip.first_step + clip.steps

    def _end_clip(self, keep):
        """Ends the clip in progress (if any): saved (``keep``), or dropped."""
        clip, self._clip = self._clip, None
        if clip is not None:
            self.encoder.end(keep, clip.summary(self.kind, self.env_idx) if keep else None)
