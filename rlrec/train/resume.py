"""Where a run starts from, and the point a stop sends it back to.

- **Where a run starts from** (:func:`find`, a :class:`StartCheckpoint`): ``checkpoint=PATH``;
  with ``resume=auto`` the newest good checkpoint of the run dir (a damaged one is skipped with a
  warning naming it), once what a killed run left half-written is removed; or nothing, a new run.
  It is found before any work, so a bad path, or a checkpoint of another number of ranks, is
  refused before anything is built; :meth:`StartCheckpoint.check_compatible` refuses one of
  another env as soon as the envs are. :meth:`StartCheckpoint.restore` puts it back into PPO, the
  RNG streams and the env stacks.
- **The resume point** (:class:`ResumePoint`): what every checkpoint holds, the state as of the
  start of the rollout or evaluation in progress (kept while it runs), else as of now: a state an
  uninterrupted run also goes through, so ``resume=auto`` continues bit-exactly after a stop (or a
  recorder error). It writes the checkpoints, and knows the last one (what a diverged run names).
- **Several ranks** (docs/distributed.md): each rank's RNG streams, train env and next observation
  are its own. Rank 0 finds the checkpoint and tells the others which file; :meth:`ResumePoint.save`
  puts the other ranks' own entries into rank 0's checkpoint, under ``ranks``, and
  :meth:`StartCheckpoint.restore` gives each rank its own back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.config import Config
from rlrec.files import remove_quietly
from rlrec.layout import RunDir, periodic_iteration
from rlrec.obs import batch_size, map_obs, shape_of
from rlrec.train import checkpoint as ckpt
from rlrec.train import timeline
from rlrec.train.policy import start_data
from rlrec.train.stack import load_stack_state

# what each rank of several has of its own (the rest is the same on every rank): gathered into
# rank 0's checkpoints, under "ranks" for ranks 1..N-1
_PER_RANK = ("rng", "train_env", "next_obs")


@dataclass(frozen=True)
class StartCheckpoint:
    """The checkpoint a run starts from."""

    path: str  # the file, as named by checkpoint=PATH or found by resume=auto
    data: Dict[str, Any]  # its verified contents
    key: str  # the setting that named it, "checkpoint" or "resume": what a refusal names
    # resume=auto of a run that already ended (its total reached, its final evaluation done):
    # nothing to do, and nothing is written
    finished: bool = False

    @property
    def eval_due(self) -> bool:
        """Whether a stop cut the evaluation of the checkpoint's step short (it is redone first)."""
        return bool(self.data.get("eval_due"))

    def check_compatible(self, obs_shape, action_space) -> None:
        """Refuses a checkpoint trained on an env with other observation or action spaces."""
        saved_obs, saved_act = shape_of(self.data["obs_shape"]), self.data["action_space"]
        if saved_obs != shape_of(obs_shape) or saved_act != repr(action_space):
            raise ConfigError(
                f"{self.key} was trained on env {self.data.get('env_name')!r} with observations "
                f"{saved_obs} and actions {saved_act}; this env has observations "
                f"{shape_of(obs_shape)} and actions {action_space!r}"
            )

    def restore(self, rank: int, ppo, envs: Dict[str, Any], mode) -> Optional[torch.Tensor]:
        """Loads PPO, the global RNG streams and the env stacks (``envs`` by their checkpoint
        entry, ``train_env`` and ``eval_env``; loaded under ``mode``, the grad mode of the train
        env's rollouts, which update their tensors in place) with this rank's entries. Returns
        the saved next observation when the simulator state was saved with it (else collection
        starts new episodes)."""
        data = self.data
        if "policy" in data:  # an export (eval_only): the policy acts by itself
            return None
        if rank > 0:  # this rank's own entries; the rest is the same on every rank
            data = {**data, **data["ranks"][rank - 1], "eval_env": None}
        ppo.load_state_dict(data["ppo"])
        ckpt.set_rng_state(data["rng"])
        with mode:
            for key, env in envs.items():
                if env is not None and data.get(key):
                    load_stack_state(env, data[key])
        train, obs = envs["train_env"], data.get("next_obs")
        simulator = (data.get("train_env") or {}).get("adapter") is not None  # saved with it
        if obs is None or not simulator or train is None or batch_size(obs) != train.num_envs:
            return None
        return map_obs(lambda x: x.to(ppo.device), obs)


def find(cfg: Config, run_dir: Path, rank: int, world: int) -> Optional[StartCheckpoint]:
    """The checkpoint this run starts from, or None for a new run; a :class:`ConfigError` when it
    cannot be used. Several ranks: rank 0 finds it and tells the others which file (they read the
    same file); a refusal on rank 0 is raised on every rank. ``resume=auto`` of a training run:
    whether it already ended (then nothing changes), and else, on rank 0, what the run wrote after
    the checkpoint (all of it without one) moved aside (``rlrec.train.timeline``)."""
    key = "checkpoint" if cfg.checkpoint else "resume"
    start = error = None
    if rank == 0:
        try:
            start = _locate(cfg, Path(run_dir), key)
        except ConfigError as exc:
            error = exc
    # what rank 0 found, on every rank (with one rank: itself)
    found = distributed.broadcast({"path": start and start.path, "error": error and str(error)})
    if error is not None or found["error"]:  # rank 0's own error as raised (an UnsafeCheckpoint)
        raise error or ConfigError(found["error"])
    if rank > 0 and found["path"]:
        start = StartCheckpoint(found["path"], ckpt.load(found["path"]), key)
    # a training run that resume=auto continues in its own run dir
    restarts = not cfg.eval_only and cfg.checkpoint is None and cfg.resume == "auto"
    if start is not None:
        # a checkpoint keeps the envs and RNG streams of each rank that saved it: training
        # continues it with that many ranks only (evaluating it needs one process)
        saved = int(start.data.get("world_size", 1))
        if saved != world and not cfg.eval_only:
            how = "python train.py" if saved == 1 else f"torchrun --nproc-per-node {saved}"
            raise ConfigError(
                f"{start.path} was saved by a run of {saved} rank(s) and this run has {world} "
                f"(WORLD_SIZE): each rank's envs and RNG streams are in it, so it continues with "
                f"{saved} rank(s) only ({how} ...)"
            )
        ended = int(start.data["iteration"]) >= iterations(cfg, world) and not start.eval_due
        if restarts and ended:  # it ended: nothing to do, and nothing is written
            return replace(start, finished=True)
    if restarts and rank == 0:
        dirs = {"train": cfg.recorder.dir, "eval": cfg.eval_env.recorder.dir}
        videos = {kind: d or RunDir(run_dir).videos(kind) for kind, d in dirs.items()}
        saved = (None, None) if start is None else (Path(start.path), start.data)
        timeline.supersede(run_dir, *saved, videos)
    return start


def iterations(cfg: Config, world: int) -> int:
    """The run's number of iterations: ``total_steps`` over the env steps of one iteration of
    every rank (at least one)."""
    return max(1, cfg.total_steps // (world * cfg.env.num_envs * cfg.algo.num_steps))


def _locate(cfg, run_dir, key):
    path = cfg.checkpoint
    if path is not None:  # eval_only=true: an export too (rlrec.train.policy)
        data = start_data(cfg.checkpoint, cfg.eval_only) or ckpt.load(cfg.checkpoint)
        began = ckpt.blowup(data)
        if began and not cfg.eval_only:  # named by its twin from before it, if there is one
            try:
                found = ckpt.find_resume(Path(path).parent, quiet=True)
            except ConfigError:  # none there can be used
                found = None
            before = "none from before it is beside it"
            if found is not None:
                before = f"checkpoint={found[0]} (step {found[1]['global_step']}) is from before it"
            raise ConfigError(
                f"checkpoint={path} was written after the blow-up that began at {began}: its "
                f"values are finite but ruined, and training from it diverges again; {before}. "
                "Give a checkpoint from before the blow-up, or start afresh, with other settings "
                "(a lower algo.learning_rate, say)"
            )
        return StartCheckpoint(str(path), data, key)
    if cfg.resume != "auto":
        return None  # (eval_only=true without either: refused with the config)
    # the newest good checkpoint (a damaged one is skipped with a warning naming it)
    found = ckpt.find_resume(RunDir(run_dir).checkpoints)
    if found is None and cfg.eval_only:  # else it would evaluate an untrained policy
        raise ConfigError(
            f"eval_only=true resume=auto found no checkpoint to evaluate in "
            f"{RunDir(run_dir).checkpoints}: give checkpoint=PATH, or "
            "hydra.run.dir=<the run dir that holds checkpoints/>"
        )
    return found and StartCheckpoint(str(found[0]), found[1], key)


class ResumePoint:
    """What a checkpoint holds: the state as of the start of the rollout or evaluation in progress,
    kept in memory while it runs (:meth:`keep`, until :meth:`clear`), and between them the state as
    of now. Either is a state that an uninterrupted run also goes through, so ``resume=auto``
    continues bit-exactly from a stop (or a recorder error) too. :meth:`save` writes it.

    ``now``: the run's state as of now; ``before_write``: what goes to disk before each
    checkpoint (the eval lines of the steps it covers: a resumed run does not redo them);
    ``protect()``: the checkpoint file name that ``checkpoint_keep`` must not remove now (the
    one before a blow-up, ``Watch.protected``)."""

    def __init__(
        self,
        now: Callable[[], dict],
        run_dir: Path,
        cfg: Config,
        start: Optional[StartCheckpoint] = None,
        before_write: Callable[[], None] = lambda: None,
        protect: Callable[[], Optional[str]] = lambda: None,
    ):
        self._now, self._before_write, self.protect, self.cfg = now, before_write, protect, cfg
        self._kept = None
        self.paths, self.world = RunDir(Path(run_dir)), distributed.world_size()
        # checkpoint_keep: the newest N of the run's own periodic checkpoints (0: all). Its own are
        # those it wrote, named in each of its checkpoints (``periodic``: the names that may still
        # be on disk, oldest first), so a run resumed with resume=auto knows them too and removes
        # an older one that a kill left; a checkpoint another run wrote (one checkpoint=PATH
        # started from, included) is never removed, nor is last.pt
        names = start.data.get("periodic") or [] if start and start.key == "resume" else []
        self.own = [str(n) for n in names if periodic_iteration(str(n)) is not None]
        # the last checkpoint written or started from that no blow-up was under way in (what a
        # diverged run names): (path, its step, whether resume=auto in the run dir finds it, the
        # file of it that the next checkpoint does not write again: the periodic checkpoint of its
        # iteration beside it, if it is there)
        self.last = None
        if start is not None:
            path = Path(start.path)
            twin = path.with_name(self.paths.periodic_checkpoint(int(start.data["iteration"])).name)
            kept = str(twin) if twin != path and twin.is_file() else start.path
            self.last = (start.path, int(start.data["global_step"]), cfg.resume == "auto", kept)

    def keep(self, eval_due: bool = False) -> None:
        """A rollout (or, ``eval_due``, an evaluation, which a run resumed from this point redoes
        first) starts: the state as of now is kept in a form that it cannot change. What it
        changes (normaliser, env stacks, next observation, and whatever else the state holds) is
        copied; the model and the optimizer, which only ``ppo.update()`` changes (after which the
        point is cleared), are shared."""
        state = self._now()
        ppo = {k: v if k in ("agent", "optimizer") else _owned(v) for k, v in state["ppo"].items()}
        kept = {k: _owned(v) for k, v in state.items() if k != "ppo"}
        self._kept = {**kept, "ppo": ppo, "eval_due": eval_due}

    def clear(self) -> None:
        """The rollout's update (or the evaluation) is done: the point is the state as of now."""
        self._kept = None

    def state(self) -> dict:
        """The state a checkpoint holds now."""
        return self._now() if self._kept is None else self._kept

    def periodic(self, iteration: int) -> None:
        """After ``iteration``: its periodic checkpoint, every ``checkpoint_every`` iterations."""
        if iteration % self.cfg.checkpoint_every == 0:
            self.save(iteration)

    def save(self, iteration: Optional[int] = None, alone: bool = False) -> int:
        """Writes :meth:`state` to last.pt (and, given its ``iteration``, to iter_NNNNNN.pt) after
        ``before_write``; returns its step. Several ranks: every rank calls it, and rank 0 writes,
        with the other ranks' own entries; ``alone`` (a recorder error, which the other ranks do
        not see): nothing, they are not there to gather (the periodic checkpoints stand). A full
        disk: CheckpointWriteError names the file and the resume command."""
        state = self.state()
        step = int(state["global_step"])
        if self.world > 1:  # rank 0's, each other rank's own entries under "ranks"; None on those
            parts = None if alone else distributed.gather({k: state[k] for k in _PER_RANK})
            if parts is None:  # another rank, or alone
                return step
            state = {**state, "world_size": self.world, "ranks": parts[1:]}
        self._before_write()
        last = self.paths.last_checkpoint
        periodic = iteration and self.paths.periodic_checkpoint(iteration)
        own = sorted({*self.own, *([periodic.name] if periodic else [])}, key=periodic_iteration)
        for path in filter(None, (last, periodic)):  # each durable (fsynced, renamed, ...)
            ckpt.save(path, {**state, "periodic": own}, run_dir=self.paths.root)
        # then the older ones beyond the newest N, but never the one before a blow-up (protect)
        retain, protected = self.cfg.checkpoint_keep, self.protect()
        old = own[:-retain] if retain > 0 else []
        for name in set(old) - {protected}:
            remove_quietly(self.paths.checkpoints / name)
        self.own = [n for n in old if n == protected] + own[len(old) :]
        if not ckpt.blowup(state):
            self.last = (str(last), step, True, str(periodic or last))
        elif self.last is not None and self.last[0] == str(last):  # last.pt is ruined now
            twin = self.last[3]  # (its periodic twin stays: protected)
            self.last = None if twin == str(last) else (twin, self.last[1], True, twin)
        return step


def _owned(value):
    """A copy of ``value`` that shares no tensor and no container with it."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_owned(v) for v in value)
    return copy.deepcopy(value)
