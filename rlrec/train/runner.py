"""The training loop: collect, update, evaluate, checkpoint, log, each a call to its owner.

The runner owns two env stacks composed by ``rlrec.train.stack``, with their own num_envs and seeds:
``AutoReset(Recorder(adapter))`` for collection and for evaluation. PPO acts and stores its
transitions (``rlrec.ppo``), the evaluator runs evaluations (``rlrec.train.evaluation``), the logger
keeps episode statistics (``rlrec.train.logger``), the recorders decide their clips
(``rlrec.record``).
"""

from __future__ import annotations

import copy
import random
import signal
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.config import Config, to_container
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.factory import resolve_device, use_device
from rlrec.ppo.ppo import PPO
from rlrec.record import ClipInfo, RecorderError
from rlrec.run import preempt
from rlrec.train import checkpoint as ckpt
from rlrec.train.evaluation import Evaluator
from rlrec.train.logger import RunLogger
from rlrec.train.stack import (
    load_stack_state,
    make_env_stack,
    recorder_of,
    simulator_saved,
    stack_state,
)

# what each rank of several has of its own (the rest is the same on every rank): gathered into
# rank 0's checkpoints, under "ranks" for ranks 1..N-1
_PER_RANK = ("rng", "train_env", "next_obs")

# entries of Runner.state() built afresh on each call: a snapshot need not copy them
_FRESH = frozenset(
    {"global_step", "iteration", "rng", "obs_shape", "action_space", "env_name", "config"}
)


def _owned(value: Any) -> Any:
    """A copy of ``value`` that shares no tensor and no container with it."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_owned(v) for v in value)
    return copy.deepcopy(value)


class Runner:
    """Builds everything from a validated :class:`Config` and runs training or evaluation."""

    def __init__(self, cfg: Config, run_dir: Path, device: Optional[torch.device] = None):
        """``device``: what ``rlrec.envs.factory.resolve_device(cfg.sim)`` gave (resolved here
        when None); the envs, the policy and the normaliser all live on it."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        # several ranks (docs/distributed.md): rank r seeds its RNGs seed + r and its env i
        # seed + r * num_envs + i, as env r * num_envs + i of one process with them all would be
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.main = self.rank == 0  # evaluates, records, logs and writes files
        # one device for everything of this rank (cuda:<local rank> with several ranks), made
        # torch's current device so that what follows the current device agrees with it
        self.device = resolve_device(cfg.sim) if device is None else torch.device(device)
        use_device(self.device)
        self.env_seed = cfg.seed + self.rank * cfg.env.num_envs
        self.resume_data = self._find_checkpoint()  # fails before any work on a bad path
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed + self.rank)
        np.random.seed(cfg.seed + self.rank)
        torch.manual_seed(cfg.seed + self.rank)
        self.global_step = 0
        self.iteration = 0
        self.train_env: Optional[AutoReset] = None
        self.eval_env: Optional[AutoReset] = None
        self.evaluator: Optional[Evaluator] = None
        self.logger: Optional[RunLogger] = None
        self.last_eval: Dict[str, float] = {}
        self.stop = preempt.run_flag()  # a sweep's, when this process runs its jobs
        self._obs: Optional[torch.Tensor] = None  # the train env's next observation
        self._resume_point: Optional[dict] = None  # see _train_loop
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up
    def _find_checkpoint(self) -> Optional[dict]:
        """The checkpoint to start from. Several ranks: rank 0 finds it and tells the others
        which file (they read the same file); a refusal on rank 0 is raised on every rank."""
        if self.world == 1:
            return self._find_checkpoint_here()
        found: Dict[str, Any] = {}
        if self.main:
            try:
                data = self._find_checkpoint_here()
                found = {"path": None if data is None else data.pop("_path")}
            except ConfigError as exc:
                found = {"error": str(exc)}
            else:
                self._found = data
        found = distributed.broadcast(found)
        if "error" in found:
            raise ConfigError(found["error"])
        data = self._found if self.main else (found["path"] and ckpt.load(found["path"]))
        if data:
            self._check_world(data, found["path"])
        return data or None

    def _check_world(self, data: dict, path: Any) -> None:
        """A checkpoint keeps the envs and RNG streams of each rank that saved it: training
        continues it with that many ranks only (evaluating it needs one process)."""
        saved = int(data.get("world_size", 1))
        if saved != self.world and not self.cfg.eval_only:
            how = "python train.py" if saved == 1 else f"torchrun --nproc-per-node {saved}"
            raise ConfigError(
                f"{path} was saved by a run of {saved} rank(s) and this run has {self.world} "
                f"(WORLD_SIZE): each rank's envs and RNG streams are in it, so it continues with "
                f"{saved} rank(s) only ({how} ...)"
            )

    def _find_checkpoint_here(self) -> Optional[dict]:
        data = self._locate_checkpoint()
        if data is not None and self.world == 1:
            where = self.cfg.checkpoint or self.run_dir / "checkpoints"
            self._check_world(data, where)
        return data

    def _locate_checkpoint(self) -> Optional[dict]:
        cfg = self.cfg
        if cfg.checkpoint is not None:
            data = ckpt.load(cfg.checkpoint)
            if self.world > 1:
                data["_path"] = str(cfg.checkpoint)
            return data
        if cfg.resume == "auto":
            # what a killed run left half-written, here and in recorder dirs outside the run dir
            recorder_dirs = [r.dir for r in (cfg.recorder, cfg.eval_env.recorder) if r.dir]
            preempt.remove_stale_temporaries(self.run_dir, recorder_dirs)
            # the newest good checkpoint (a damaged one is skipped with a warning naming it)
            found = ckpt.find_resume(self.run_dir / "checkpoints", key="resume")
            if found is not None and self.world > 1:
                found[1]["_path"] = str(found[0])
            if found is None and cfg.eval_only:  # else it would evaluate an untrained policy
                raise ConfigError(
                    f"eval_only=true resume=auto found no checkpoint to evaluate in "
                    f"{self.run_dir / 'checkpoints'}: give checkpoint=PATH, or "
                    "hydra.run.dir=<the run dir that holds checkpoints/>"
                )
            return None if found is None else found[1]
        if cfg.eval_only:
            raise ConfigError("eval_only=true needs checkpoint=PATH (the checkpoint to evaluate)")
        return None

    def _build(self) -> None:
        cfg = self.cfg
        videos = self.run_dir / "videos"
        if not cfg.eval_only:
            self.train_env = make_env_stack(
                cfg.env,
                cfg.sim,
                cfg.env.num_envs,
                self.env_seed,
                cfg.recorder if self.main else None,  # rank 0 alone records
                video_dir=str(videos / "train"),
                kind="train",
                on_clip=self._on_clip,
                device=self.device,
            )
        if (cfg.eval_env.enabled or cfg.eval_only) and self.main:  # rank 0 alone evaluates
            self.eval_env = make_env_stack(
                cfg.env,
                cfg.sim,
                cfg.eval_env.num_envs,
                cfg.eval_env.seed,
                cfg.eval_env.recorder,
                video_dir=str(videos / "eval"),
                kind="eval",
                on_clip=self._on_clip,
                device=self.device,
            )
            self.evaluator = Evaluator(self.eval_env, cfg.eval_env)
        env = self.train_env or self.eval_env
        self.obs_shape = tuple(env.single_observation_space.shape)
        self.action_space = env.single_action_space
        if self.resume_data is not None:
            ckpt.check_compatible(
                self.resume_data,
                self.obs_shape,
                repr(self.action_space),
                key="checkpoint" if cfg.checkpoint else "resume",
            )
        self.ppo = PPO(cfg.algo, env.single_observation_space, self.action_space, self.device)
        # env steps per iteration over all ranks (env.num_envs is per rank)
        self.batch_size = self.world * cfg.env.num_envs * cfg.algo.num_steps
        self.num_iterations = max(1, cfg.total_steps // self.batch_size)
        if not self.main:
            return  # rank 0 alone logs
        self.logger = RunLogger(
            cfg.logger, self.run_dir, self.num_iterations * self.batch_size, to_container(cfg)
        )
        if self.world > 1:
            print(
                f"rlrec: {self.world} ranks ({distributed.backend_name()}) x env.num_envs="
                f"{cfg.env.num_envs} x algo.num_steps={cfg.algo.num_steps}: a global batch of "
                f"{self.batch_size} env steps per iteration, {self.num_iterations} iterations",
                flush=True,
            )

    def _on_clip(self, clip: ClipInfo) -> None:
        """A clip is on disk: log it at the step its caller tagged it with (an eval clip finishes
        encoding after its evaluation), or now."""
        if self.logger is not None:
            step = self.global_step if clip.tag is None else int(clip.tag)
            self.logger.log_clip(step, clip.kind, clip.path, clip.fps, clip.num_frames)

    # ------------------------------------------------------------------ checkpoints
    def state(self, next_obs: Optional[torch.Tensor]) -> dict:
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "ppo": self.ppo.state_dict(),
            "rng": ckpt.rng_state(),
            "train_env": None if self.train_env is None else stack_state(self.train_env),
            "eval_env": None if self.eval_env is None else stack_state(self.eval_env),
            "next_obs": next_obs,
            "obs_shape": self.obs_shape,
            "action_space": repr(self.action_space),
            "env_name": self.cfg.env.name,
            "config": to_container(self.cfg),
        }

    def save_checkpoint(
        self, next_obs: Optional[torch.Tensor], periodic: bool = False, state: Optional[dict] = None
    ) -> Optional[Path]:
        """Writes ``state`` (default: the state as of now) to last.pt (and iter_NNNNNN.pt).
        Several ranks (every rank calls it): rank 0 writes, with each other rank's RNG streams,
        train env and next observation gathered into ``ranks``; the others return None."""
        state = self.state(next_obs) if state is None else state
        if self.world > 1:
            parts = distributed.gather({k: state[k] for k in _PER_RANK})
            if parts is None:
                return None
            state = {**state, "world_size": self.world, "ranks": parts[1:]}
        if self.logger is not None and self.logger.awaiting:
            # no checkpoint before the eval lines of the steps it covers (a resumed run would
            # not redo those evaluations): their clips are waited for (bounded), then written
            if self.evaluator is not None:
                self.evaluator.flush()
            self.logger.write_awaiting()
        directory = self.run_dir / "checkpoints"
        # a full disk: CheckpointWriteError names the file and the resume command
        ckpt.save(directory / "last.pt", state, run_dir=self.run_dir)
        if periodic:
            ckpt.save(directory / f"iter_{self.iteration:06d}.pt", state, run_dir=self.run_dir)
        return directory / "last.pt"

    def _restore(self) -> Optional[torch.Tensor]:
        """Loads the checkpoint found at start-up; returns the saved next observation when the
        simulator state was saved with it (else collection starts new episodes)."""
        data = self.resume_data
        if data is None:
            return None
        if self.rank > 0:  # this rank's own entries; the rest is the same on every rank
            data = {**data, **data["ranks"][self.rank - 1], "eval_env": None}
        self.ppo.load_state_dict(data["ppo"])
        self.global_step = int(data["global_step"])
        self.iteration = int(data["iteration"])
        ckpt.set_rng_state(data["rng"])
        with self.rollout_mode():  # the train env's tensors, as its rollouts will update them
            for env, key in ((self.train_env, "train_env"), (self.eval_env, "eval_env")):
                if env is not None and data.get(key):
                    load_stack_state(env, data[key])
        obs = data.get("next_obs")
        if (
            self.train_env is not None
            and simulator_saved(data.get("train_env"))
            and obs is not None
            and obs.shape[0] == self.cfg.env.num_envs
        ):
            return obs.to(self.device)
        return None

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> Dict[str, float]:
        """One evaluation of the current policy; its clip is tagged with this step."""
        deterministic = self.cfg.eval_env.deterministic
        return self.evaluator.run(
            lambda obs: self.ppo.act_inference(obs, deterministic),
            tag=self.global_step,
            stop=self._cut,
        )

    def _cut(self) -> bool:
        """Whether a stop signal cuts the evaluation (or rollout) in progress short. Several
        ranks: an evaluation (rank 0's alone) runs to its end, and the stop is agreed at the end
        of the next rollout (:meth:`_stop_agreed`)."""
        return self.world == 1 and bool(self.stop)

    def _stop_agreed(self) -> bool:
        """One process: the stop flag. Several ranks: one all-reduce of it, so that a signal to any
        rank stops every rank at the same iteration (each then exits with that signal)."""
        if self.world == 1:
            return bool(self.stop)
        signum = distributed.agree_signal(self.stop.signum)
        if signum is not None and self.stop.signum is None:
            self.stop.signum = signum
        return signum is not None

    def _evaluate_and_log(self) -> bool:
        """Evaluates and logs the eval line; False (nothing logged) when a stop cut it short."""
        if self._cut():
            return False
        t0 = time.perf_counter()
        metrics = self.evaluate()
        if self._cut():  # figures of fewer episodes than asked: not an eval line
            return False
        if metrics:
            metrics["time/eval"] = time.perf_counter() - t0
            self.last_eval = metrics
            # the eval line names its clip: it goes to metrics.jsonl once the clip is on disk
            clip = "eval" if self.evaluator.recorded else None
            self.logger.log(self.global_step, metrics, clip=clip)
        return True

    # ------------------------------------------------------------------ training
    def rollout_mode(self):
        """The grad mode of the train env's rollouts (and of its reset and restore, whose tensors
        the rollouts update in place): ``torch.inference_mode()``, or with ``algo.compile``
        ``torch.no_grad()``. A compiled rollout captures the policy step's CUDA graph; on torch
        before 2.11 a first capture inside inference mode makes every later capture outside it
        (the update's) fail with "Inplace update to inference tensor outside InferenceMode"."""
        return torch.no_grad() if self.cfg.algo.compile else torch.inference_mode()

    def collect(self, obs: torch.Tensor) -> torch.Tensor:
        """One rollout of ``algo.num_steps`` steps into PPO's storage; returns the next
        observation. Stops early (the rollout then is incomplete) when a stop was requested."""
        with self.rollout_mode():
            return self._collect(obs)

    def _collect(self, obs: torch.Tensor) -> torch.Tensor:
        env, ppo = self.train_env, self.ppo
        for _ in range(self.cfg.algo.num_steps):
            action = ppo.act(obs)
            obs, reward, terminated, truncated, info = env.step(action)
            ppo.process_env_step(reward, terminated, truncated, info)
            if self.logger is not None:  # rank 0 alone logs
                self.logger.episodes.add(info)
            if self.stop:
                return obs
        ppo.compute_returns(obs)
        return obs

    def train(self) -> Dict[str, float]:
        cfg = self.cfg
        self.ppo.init_storage(self.train_env.num_envs)
        next_obs = self._restore()
        # a stop cut the evaluation of the checkpoint's step short: it is redone first
        eval_due = bool(self.resume_data is not None and self.resume_data.get("eval_due"))
        rec = recorder_of(self.train_env)
        # record_final_episode: the episode in progress at the end gets its clip
        if rec is not None:
            rec.expect_end((self.num_iterations - self.iteration) * cfg.algo.num_steps)
        if next_obs is None:
            with self.rollout_mode():
                next_obs, _ = self.train_env.reset(seed=self.env_seed)
        self._obs = next_obs
        try:
            self._train_loop(eval_due)
        except RecorderError:
            # recorder.on_error=raise: the checkpoint of the last completed update, then the error
            # (several ranks: the others are not there to gather; the periodic ones stand)
            if self.world == 1:
                self.save_checkpoint(self._obs, state=self._resume_point)
            raise
        # stopped: the state as of the start of the interrupted rollout or evaluation; else now
        self.save_checkpoint(self._obs, state=self._resume_point)
        return self.last_eval

    def _train_loop(self, eval_due: bool) -> None:
        """Iterations until the total or a stop. ``self._resume_point`` is the state as of the
        start of the rollout or evaluation in progress (None between them: the state as of now),
        so a stop or a recorder error checkpoints a state that an uninterrupted run also went
        through, and ``resume=auto`` continues bit-exactly."""
        cfg = self.cfg
        if eval_due and self.evaluator is not None and self.iteration < self.num_iterations:
            if not self._evaluation():
                return
            self._periodic_checkpoint()
        start, start_step = time.perf_counter(), self.global_step
        while self.iteration < self.num_iterations and not (self.world == 1 and self.stop):
            self._resume_point = self._snapshot()
            lr = self.ppo.set_schedule(1.0 - self.iteration / self.num_iterations)
            t0 = time.perf_counter()
            self._obs = self.collect(self._obs)
            if self._stop_agreed():
                return  # the interrupted rollout is dropped: its start is checkpointed
            self.iteration += 1
            self.global_step += self.batch_size
            t1 = time.perf_counter()
            losses = self.ppo.update()
            self._resume_point = None
            t2 = time.perf_counter()
            self._log_iteration(
                losses,
                lr,
                t1 - t0,
                t2 - t1,
                (self.global_step - start_step) / max(t2 - start, 1e-9),
            )
            if self.evaluator is not None:
                if (
                    self.iteration % cfg.eval_env.every == 0
                    and self.iteration < self.num_iterations
                ):
                    if not self._evaluation():
                        return
                else:
                    self.evaluator.poll()  # an eval clip finished encoding since the evaluation
            self._periodic_checkpoint()
        if self.world > 1:
            self._stop_agreed()  # a signal during the last update: every rank exits with it
        if self.evaluator is not None and not self.stop:
            self._evaluation()  # the final one

    def _periodic_checkpoint(self) -> None:
        if self.iteration % self.cfg.checkpoint_every == 0:
            self.save_checkpoint(self._obs, periodic=True)

    def _snapshot(self, eval_due: bool = False) -> dict:
        """The checkpoint of this moment, kept while a rollout or an evaluation runs, in a form
        that they cannot change: what they change (normaliser, env stacks, next observation, and
        whatever else the state holds) is copied; the model and the optimizer, which only
        ``ppo.update()`` changes (after which the snapshot is dropped), are shared, and the
        entries that ``state()`` builds afresh (RNG states, config, counters) are taken as they
        are. Under 1 ms at the default sizes (see docs/sweeps.md)."""
        state = self.state(self._obs)
        out = {k: v if k in _FRESH else _owned(v) for k, v in state.items() if k != "ppo"}
        out["ppo"] = {
            k: v if k in ("agent", "optimizer") else _owned(v) for k, v in state["ppo"].items()
        }
        out["eval_due"] = eval_due  # a resumed run evaluates first
        return out

    def _evaluation(self) -> bool:
        """One evaluation and its eval line; False when a stop cut it short: then nothing is
        logged and the checkpoint is the state before it, marked ``eval_due``."""
        self._resume_point = self._snapshot(eval_due=True)
        self.evaluator.poll()  # an eval clip finished encoding since the last evaluation
        if not self._evaluate_and_log():
            return False
        self._resume_point = None
        return True

    def _log_iteration(
        self, losses: Dict[str, float], lr: float, collect_s: float, learn_s: float, sps: float
    ) -> None:
        metrics: Dict[str, float] = {
            **losses,
            "train/lr": lr,
            "time/collect": collect_s,
            "time/learn": learn_s,
            "sps/collect": self.batch_size / max(collect_s, 1e-9),
            "sps/total": sps,
        }
        if self.logger is None:  # rank 0 alone logs
            return
        if self.iteration % self.cfg.logger.log_every == 0 or self.iteration == self.num_iterations:
            metrics.update(self.logger.episodes.summary())
            self.logger.log(self.global_step, metrics)
        self.logger.progress(self.global_step, sps)

    # ------------------------------------------------------------------ entry points
    def run(self) -> Dict[str, float]:
        """Trains (or, with eval_only, evaluates the checkpoint); always closes cleanly."""
        t0 = time.perf_counter()
        self.stop.install()
        try:
            if self.cfg.eval_only:
                self._restore()
                self._evaluate_and_log()
            else:
                self.train()
        finally:
            self.stop.uninstall()
            self.close()
        self._summary(time.perf_counter() - t0)
        return self.last_eval

    def _summary(self, seconds: float) -> None:
        if not self.main:
            return
        ev = self.last_eval
        parts = [
            f"rlrec: {'stopped by signal' if self.stop else 'done'} in {seconds:.1f}s",
            f"{self.global_step:,} env steps",
        ]
        if ev:
            figures = f"eval return {ev['eval/return']:.3f}, length {ev['eval/length']:.1f}"
            if "eval/success" in ev:
                figures += f", success {ev['eval/success']:.3f}"
            parts.append(figures)
        parts.append(f"run dir {self.run_dir}")
        if self.stop:
            parts.append(f"signal {signal.Signals(self.stop.signum).name}")
            if not self.cfg.eval_only:
                parts.append(
                    f"to continue: the same command + resume=auto hydra.run.dir={self.run_dir}"
                )
        print(" | ".join(parts), flush=True)

    def close(self) -> None:
        """Closes recorders (saving the episode in progress), envs and loggers, every one of them
        even when one fails (e.g. a RecorderError of a last clip); then raises the first error.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors: List[BaseException] = []
        for env in (self.train_env, self.eval_env):
            if env is None:
                continue
            rec = recorder_of(env)
            for close in (rec.close if rec is not None else None, env.close):
                if close is None:
                    continue
                try:
                    close()  # record_final_episode: the recorder saves the clip in progress
                except BaseException as exc:  # the rest are still closed
                    errors.append(exc)
        if self.logger is not None:
            try:
                self.logger.close()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
