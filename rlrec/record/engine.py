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

The layers it delegates to: every decision of when a clip starts (and whether an ended clip is
kept) is its :class:`~rlrec.record.schedule.Schedule`'s; each clip's file name is its ``name``
callable's (:mod:`rlrec.record.names`); which steps become frames, the file's fps and a clip's
length in frames are the engine's own (computed once, in its constructor); frames go to an
:class:`~rlrec.record.encoder.Encoder` thread, which writes each clip and its sidecar
(:mod:`rlrec.record.sidecar`); finished clips are reported through ``on_clip`` from the caller's
thread.
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

__all__ = ["ClipEngine", "RecorderError", "Source"]

_STATE_VERSION = 2  # 1: the schedule's keys (step_pending, step_fired_at) at the top level
_COUNTERS = ("episode", "steps", "clips_saved")  # the checkpointed counters, beside the schedule

Render = Callable[[List[int]], Any]  # env indices -> uint8 [k, H, W, 3] (tensor or array)


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
    render: Render
    max_episode_steps: Optional[int] = None


class _Recorded:
    """The values of the recorded envs, on the host: what the engine reads of a step.

    ``rows(reward, terminated, truncated, success)`` -> ``(reward, terminated, truncated,
    success or None)``, each a list over the recorded envs of plain Python values (floats, bools,
    ints), from per-env arrays or tensors ``[num_envs]``. Host values (numpy arrays, CPU tensors)
    are read in place through a slice where the recorded envs are contiguous (an index where they
    are not) and ``tolist()``; values on a device are gathered there into one ``[rows, k]``
    tensor and copied to the host at once: the step's one read-back.

    Plain values, not arrays: the step's bookkeeping while every recorded episode runs on is then
    a few operations of the interpreter (``any``, a list append), where each numpy call would
    cost the training thread ten times more right after a render has flushed its caches."""

    def __init__(self, env_idx: List[int], device: torch.device):
        first, k = env_idx[0], len(env_idx)
        self.env_np = np.asarray(env_idx, dtype=np.int64)
        self.every = np.ones(k, dtype=bool)  # what hits() says of a full reset
        contiguous = env_idx == list(range(first, first + k))
        self.take: Any = slice(first, first + k) if contiguous else self.env_np
        self.index = torch.tensor(env_idx, dtype=torch.long, device=device)

    def host(self, value: Any) -> Optional[list]:
        """``value``'s recorded entries as a list of Python values; None when ``value`` lives on
        a device."""
        if isinstance(value, torch.Tensor):
            return value[self.take].tolist() if value.is_cpu else None
        return np.asarray(value)[self.take].tolist()

    def hits(self, env_idx: Any) -> np.ndarray:
        """Which recorded envs a partial reset names (bool [k]): ``env_idx`` a list of ints, an
        int tensor/array or a bool mask ``[num_envs]``."""
        if isinstance(env_idx, torch.Tensor):
            # the one read-back of a reset (none for a host index, as AutoReset's CPU tensor)
            env_idx = env_idx.cpu().numpy()
        idx = np.asarray(env_idx).reshape(-1)
        if idx.dtype == np.bool_:  # a mask: the recorded envs' entries
            return idx[self.env_np]
        return (idx[:, None] == self.env_np).any(axis=0)

    def rows(self, reward: Any, terminated: Any, truncated: Any, success: Any) -> list:
        values = [reward, terminated, truncated] + ([] if success is None else [success])
        rows = [self.host(v) for v in values]
        if None in rows:  # on a device: one gather, one copy to the host
            index = self.index
            gathered = torch.stack(
                [torch.as_tensor(v).to(index.device).index_select(0, index) for v in values]
            )  # promoted to the widest dtype: bools become 0/1, rewards keep their values
            rows = gathered.cpu().tolist()
        return rows if success is not None else rows + [None]


# rewards of the recorded envs kept as plain rows until they are summed (in float32, in order)
_FOLD_ROWS = 256


class _Clip:
    """The clip being recorded: bookkeeping and the statistics its sidecar reports, per recorded
    env, of the episode each env was in at the clip's first frame."""

    def __init__(self, episodes: List[int], first: int, seed: Any, provisional: bool, autoreset):
        k = len(episodes)
        self.steps = 0  # env steps since the first frame
        self.frames = 0
        self.first_step = first
        self.last_step = first  # the step count at the last frame taken
        self.seed = seed
        # on the host, over the recorded envs. ``ret`` and ``length`` are up to date after
        # fold(): while every recorded episode runs on, a step only appends its rewards to
        # ``pending`` (plain values); they are summed in float32 in step order, as ``ret += r``
        # would have, when the rows are many, before anything reads the sums, and before an
        # episode ends (``pending`` thus always holds steps where every recorded env was live)
        self.ret = np.zeros(k, dtype=np.float32)
        self.length = np.zeros(k, dtype=np.int64)
        self.pending: List[list] = []
        self.all_live = True  # no episode ended: the step's bookkeeping is then an append
        self.terminated = np.zeros(k, dtype=bool)
        self.truncated = np.zeros(k, dtype=bool)
        self.success: Optional[np.ndarray] = None  # None: the env reports no success
        self.episodes = episodes  # each recorded env's episode at the first frame
        # provisional (Schedule.provisional): dropped when its episode ends, kept only by close()
        self.provisional = provisional
        self.autoreset = autoreset  # it began at a partial reset (an autoreset)

    def fold(self) -> None:
        """Adds the pending rows to ``ret`` (float32, in step order) and ``length``."""
        pending = self.pending
        if pending:
            rows = np.asarray(pending, dtype=np.float32).reshape(len(pending), -1)
            # add.accumulate adds row after row (no pairwise summation): the float32 sums of
            # ``ret += r`` step by step, bit for bit
            self.ret = np.add.accumulate(np.concatenate((self.ret[None], rows)), axis=0)[-1]
            self.length += len(pending)
            pending.clear()

    def add_step(self, r: list, term: list, trunc: list, s: Optional[list]) -> bool:
        """Adds a step's values of the recorded envs (plain lists); whether the first recorded
        env's episode ended."""
        # the episodes still running: each is live until it terminates or is truncated
        live = True if self.all_live else ~(self.terminated | self.truncated)
        done = False
        if self.all_live and not (any(term) or any(trunc)):
            # every recorded episode runs on: its rewards wait to be summed
            self.pending.append(r)
            if len(self.pending) >= _FOLD_ROWS:
                self.fold()
        else:  # an episode ended (or ended before): numpy over the recorded envs
            self.fold()
            t, u = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
            self.ret += np.where(live, np.asarray(r, dtype=np.float32), np.float32(0))
            self.length += live
            self.terminated |= live & t
            self.truncated |= live & u & ~t
            self.all_live = False  # an episode ended, now or before
            done = bool(t[0] or u[0])
        if s is not None:
            if self.success is None:  # the env reports success
                self.success = np.zeros(len(term), dtype=bool)
            if any(s):
                self.success |= np.asarray(s, dtype=bool) & live
        return done

    def summary(self, kind: str, env_idx: List[int]) -> Dict[str, Any]:
        """What the clip's sidecar says of its episodes (plain data, from the host arrays)."""
        self.fold()
        success = [None] * len(env_idx) if self.success is None else self.success.tolist()
        cut = np.where(self.truncated, "truncated", "cut")
        ends = np.where(self.terminated, "terminated", cut).tolist()
        values = zip(env_idx, self.episodes, self.ret.tolist(), self.length.tolist(), success, ends)
        keys = ("env", "episode", "return", "length", "success", "end")
        envs = [dict(zip(keys, row)) for row in values]  # float32 -> exact floats
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
            "envs": envs,
        }


class ClipEngine:
    """Records clips of ``cfg.env_idx`` of ``source`` (a :class:`Source`, or an env adapter)
    into ``video_dir`` (``cfg.dir`` overrides it). See the module docstring for its two events.

    ``kind`` ("train", "eval", ...) goes into :class:`ClipInfo` and the sidecars; ``key`` names
    the settings in error messages; ``on_clip`` is called with each clip once it (and its
    sidecar) is on disk, from the caller's thread (during a later event, ``poll``, ``flush`` or
    ``close``). ``schedule``: when clips start and which are kept (default: ``cfg``'s);
    ``name``: each clip's file name (:mod:`rlrec.record.names`; ``cfg.filename`` wins). Bad
    settings raise ConfigError here, before any work (:meth:`RecorderConfig.check`); then the
    video directory is created. ``tag``: any value the caller sets; each clip keeps the tag
    current at its first frame (its name and :class:`ClipInfo` carry it)."""

    def __init__(
        self,
        cfg: RecorderConfig,
        source: Any,
        video_dir: Optional[str] = None,
        *,
        kind: str = "train",
        key: Optional[str] = None,
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        schedule: Optional[Schedule] = None,
        name: Optional[names.Name] = None,
    ):
        self.key = key or ("recorder" if kind == "train" else f"{kind}_env.recorder")
        cfg.check(int(source.num_envs), self.key)
        dt = source.dt
        if dt is None or not dt > 0:  # the file's fps means nothing without it
            raise ConfigError(f"{self.key}: the env reports dt={dt!r}; the recorder needs dt > 0")
        self.cfg = cfg
        dt = float(dt)
        self.device = torch.device(source.device)
        self.render = source.render
        self.max_episode_steps = getattr(source, "max_episode_steps", None)
        self.kind = kind
        self.on_clip = on_clip
        self.tag: Any = None
        self.schedule = schedule if schedule is not None else Schedule.of(cfg)
        self._asks_steps = self.schedule.asks_steps
        self.name = names.fixed(cfg.filename) if cfg.filename else name or names.default
        self.env_idx: List[int] = [int(i) for i in cfg.env_idx]
        self._recorded = _Recorded(self.env_idx, self.device)
        # the timing, computed here only: env steps between two frames, max(1, ...) so that
        # fps * dt > 2 takes every step (at 1 / dt) rather than rounding to 0
        self.steps_per_frame = 1 if cfg.fps is None else max(1, round(1.0 / (cfg.fps * dt)))
        self.fps = 1.0 / (self.steps_per_frame * dt)  # what the frames really have: the file's
        # frames per clip (None: the whole episode), seconds converted at the file's real fps
        self.length = cfg.length_frames
        if cfg.length_sec is not None:
            self.length = max(1, round(cfg.length_sec * self.fps))
        # the clips' directory, created and probed (ConfigError): cfg.dir, else video_dir;
        # absolute: a relative dir means the working directory at start-up
        where = f"{self.key}.dir (or the run's video dir)"
        if not (cfg.dir or video_dir):
            raise ConfigError(f"{where} is not set: the recorder needs a directory for its videos")
        probed = probe_dir(cfg.dir or video_dir, where, use="the video directory", create=True)
        self.video_dir = os.path.abspath(probed)
        # a holding schedule's clips are of engines encoding side by side (per-episode clips):
        # one x264 thread each
        hold, threads = self.schedule.hold, 1 if self.schedule.hold else None
        name = f"rlrec-encoder-{kind}"
        self.encoder = Encoder(cfg.queue_size, name, cfg.stall_timeout_sec, hold, threads)
        self._waiting = self.encoder.waiting  # true while finished clips wait for poll()
        # counters (checkpointed)
        self.episode = -1  # index of the recorded env's current episode; -1 before the first reset
        self.steps = 0  # steps seen
        self.clips_saved = 0
        self.clips_started = 0  # in this process (a caller compares it before and after)
        # each recorded env's episode index, on the CPU (numpy): a reset costs no torch op (a
        # cold one costs far more than a step of a small env), read when a clip starts
        self._episodes = np.full(len(self.env_idx), -1, dtype=np.int64)
        self._seed: Any = None  # the seed of the reset that began the recorded env's episode
        self._episode_steps = 0
        self._clip: Optional[_Clip] = None
        self.errors: List[str] = []
        self.closed = False

    # ------------------------------------------------------------------ events
    def on_reset(self, env_idx: Any = None, seed: Any = None) -> None:
        """The env just reset ``env_idx`` (None: a full reset of every env; a list of ints, an
        int tensor or a bool mask ``[num_envs]``) with ``seed`` (kept for the sidecar)."""
        if self.closed:
            return
        # A full reset is reset(env_idx=None), as the runner does to start an evaluation; AutoReset
        # always names the envs it resets (even all of them): not a new evaluation.
        full = env_idx is None
        hits = self._recorded.every if full else self._recorded.hits(env_idx)
        self._episodes += hits
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
            self._episode_steps = 0
            start = self.schedule.on_reset(self.episode, self.steps, full)
            if start:
                self._start_clip(start, autoreset=not full)
        if self._waiting:
            self.poll()

    def on_step(
        self,
        reward: Any,
        terminated: Any,
        truncated: Any,
        info: Optional[dict] = None,
        stepped: bool = True,
    ) -> None:
        """The env just stepped (before anything resets the envs that finished). ``stepped``:
        False when this call reset the recorded env instead of stepping it (an autoreset inside
        the env's step, announced with :meth:`on_reset` first): counted, but not a frame."""
        self.steps += 1
        self._episode_steps += 1
        if self._clip is None and not self._asks_steps:  # the armed idle path: two increments
            if self._waiting:  # finished clips to report
                self.poll()
            return
        if self.closed:
            return
        clip = self._clip
        if self._asks_steps:
            busy = clip is not None and not clip.provisional
            first = self.env_idx[0]  # episodes are counted on the first recorded env

            def terminal() -> bool:  # read only when the step trigger falls
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
            # the recorded envs' values on the host, as plain values (the only device read-back
            # per step, and only while recording)
            r, term, trunc, s = self._recorded.rows(reward, terminated, truncated, success)
            done = clip.add_step(r, term, trunc, s)
            full = self.length is not None and clip.frames >= self.length
            if not full and (done or clip.steps % self.steps_per_frame == 0):
                # the terminal frame is always taken: it is rendered here, before anything
                # resets the env and replaces it
                self._capture(r, s)
                full = self.length is not None and clip.frames >= self.length
            # a full provisional clip stays open, taking no more frames, until its episode ends
            # (dropped) or close() keeps it
            if done or (full and not clip.provisional):
                self._end_clip(keep=not clip.provisional)
        if self._waiting:
            self.poll()

    # ------------------------------------------------------------------ caller API
    def expect_end(self, steps_left: int) -> None:
        """The caller will report ``steps_left`` more steps, then call :meth:`close`: with
        ``record_final_episode``, every episode of the recorded env that begins within the last
        ``max_episode_steps`` steps (every one if the env has no limit) is recorded, provisionally
        where no trigger selects it, so the episode in progress at ``close()`` has a clip and no
        other is kept (:meth:`Schedule.expect_end`)."""
        self.schedule.expect_end(self.steps, steps_left, self.max_episode_steps)

    def end_clip(self, keep: bool = True) -> None:
        """Ends the clip in progress now, e.g. when an evaluation stops early: saved, or dropped
        (``keep=False``) without being encoded to its end."""
        self._end_clip(keep=keep)
        self.poll()

    def flush(self) -> None:
        """Waits (bounded) until every ended clip is on disk and reported through ``on_clip``."""
        self.encoder.flush()
        self.poll()

    def close(self) -> None:
        """Saves the clip in progress if ``record_final_episode`` (else drops it), waits for the
        encoder (bounded), reports the last clips. Idempotent."""
        if self.closed:
            return
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

    def load_state_dict(self, state: Dict[str, Any]) -> None:
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

    def poll(self) -> None:
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
    def _start_clip(self, start: Start, autoreset: bool = False) -> None:
        provisional = start is Start.provisional
        by_step = start is Start.step or (provisional and self._asks_steps)
        at = names.ClipStart(self.kind, self.episode, self.steps, by_step, self.tag)
        self.clips_started += not provisional
        clip = self._clip = _Clip(
            self._episodes.tolist(), self.steps, self._seed, provisional, autoreset
        )
        path = os.path.join(self.video_dir, self.name(at))
        job = ClipJob(
            info=ClipInfo(path, self.kind, self.episode, self.steps, 0, self.fps, self.tag),
            fixed_name=bool(self.cfg.filename),
            encoding=encoder_settings(self.cfg.quality, self.cfg.lossless, self.cfg.preset),
            overlay=draw_overlay if self.cfg.overlay else None,
        )
        self.encoder.open(job)
        self._capture()
        if self.length is not None and clip.frames >= self.length and not provisional:
            self._end_clip(keep=True)  # a one-frame clip

    def _capture(self, reward: Optional[list] = None, success: Optional[list] = None) -> None:
        """Renders the recorded envs and queues the frame; ``reward`` and ``success``: the
        recorded envs' values of the step that led to it (lists; None on a first frame)."""
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
            ret = None if reward is None else clip.ret.copy()
            meta = FrameMeta(self.episode, self._episode_steps, reward, ret, success)
        # The encoder copies the frames into one of its reusable CPU buffers: the one copy the
        # caller's thread pays (device -> CPU on a GPU). On the CPU too, so that a frame waiting
        # for the encoder can never be changed by a later step or render, even from a render
        # that broke the owned-copy contract.
        self.encoder.frame(frames, meta)
        clip.frames += 1
        clip.last_step = clip.first_step + clip.steps

    def _end_clip(self, keep: bool) -> None:
        """Ends the clip in progress (if any): saved (``keep``, where the schedule's rule keeps
        it too), or dropped."""
        clip, self._clip = self._clip, None
        if clip is None:
            return
        if keep and self.schedule.keep is not None:
            success = None if clip.success is None else bool(clip.success[0])
            clip.fold()
            keep = bool(self.schedule.keep(self.env_idx[0], success, float(clip.ret[0])))
        summary = clip.summary(self.kind, self.env_idx) if keep else None
        self.encoder.end(keep, summary)
