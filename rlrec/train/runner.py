"""The training loop: collect, update, evaluate, checkpoint, log, each a call to its owner.

The runner owns two env stacks composed by ``rlrec.train.stack``, with their own num_envs and seeds:
``AutoReset(Recorder(adapter))`` for collection and for evaluation. PPO acts and stores its
transitions (``rlrec.ppo``), the evaluator runs evaluations (``rlrec.train.evaluation``), the logger
keeps episode statistics (``rlrec.train.logger``), the recorders decide their clips
(``rlrec.record``); ``rlrec.train.resume`` holds where the run starts from and the point a stop
sends it back to.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from rlrec import distributed
from rlrec.config import Config, to_container
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.device import use_device
from rlrec.envs.factory import resolve_device
from rlrec.ppo.ppo import PPO
from rlrec.record import ClipInfo, RecorderError
from rlrec.run import preempt
from rlrec.train import checkpoint as ckpt
from rlrec.train import resume
from rlrec.train.divergence import Watch, state_tensors
from rlrec.train.evaluation import Evaluator
from rlrec.train.logger import RunLogger, summary
from rlrec.train.stack import make_env_stack, record_losses, recorder_of, stack_state


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
        # fails before any work on a bad path
        self.start = resume.find(cfg, self.run_dir, self.rank, self.world)
        # checkpoint_keep: a resumed run's own periodic checkpoints are named in its checkpoint
        resumed = self.start is not None and self.start.key == "resume"
        self.retention = ckpt.Retention(cfg.checkpoint_keep, self.start.data if resumed else None)
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        ckpt.seed_rng(cfg.seed + self.rank)
        self.global_step = 0
        self.iteration = 0
        self.train_env: Optional[AutoReset] = None
        self.eval_env: Optional[AutoReset] = None
        self.evaluator: Optional[Evaluator] = None
        self.logger: Optional[RunLogger] = None
        self.last_eval: Dict[str, float] = {}
        self.losses: Dict[str, int] = {}  # the recorders' losses as they closed
        self.stop = preempt.run_flag()  # a sweep's, when this process runs its jobs
        self._obs: Optional[torch.Tensor] = None  # the train env's next observation
        self.resume_point = resume.ResumePoint(self.state)  # see _train_loop
        self._closed = False
        if self.start is not None and self.start.finished:
            # resume=auto of a run that ended: nothing is built, nothing written
            self.global_step = int(self.start.data["global_step"])
            return
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up
    def _build(self) -> None:
        cfg = self.cfg
        if not cfg.eval_only:
            recorder = cfg.recorder if self.main else None  # rank 0 alone records
            self.train_env = self._stack("train", cfg.env.num_envs, self.env_seed, recorder)
        if (cfg.eval_env.enabled or cfg.eval_only) and self.main:  # rank 0 alone evaluates
            self.evaluator = Evaluator(
                cfg.env, cfg.sim, cfg.eval_env, self.run_dir, on_clip=self._on_clip,
                video_dir=str(self.run_dir / "videos" / "eval"), device=self.device,
            )  # fmt: skip
            self.eval_env = self.evaluator.env
        env = self.train_env or self.eval_env
        self.obs_shape = tuple(env.single_observation_space.shape)
        self.action_space = env.single_action_space
        if self.start is not None:
            self.start.check_compatible(self.obs_shape, self.action_space)
        self.ppo = PPO(cfg.algo, env.single_observation_space, self.action_space, self.device)
        # the finite check after every update (rlrec.train.divergence)
        self.watch = Watch(cfg.algo.num_steps, cfg.env.num_envs, self.device, self.run_dir)
        # env steps per iteration over all ranks (env.num_envs is per rank)
        self.batch_size = self.world * cfg.env.num_envs * cfg.algo.num_steps
        self.num_iterations = resume.iterations(cfg, self.world)
        if not self.main:
            return  # rank 0 alone logs
        self.logger = RunLogger(
            cfg.logger, self.run_dir, self.num_iterations * self.batch_size, to_container(cfg)
        )
        distributed.announce(cfg.env.num_envs, cfg.algo.num_steps, self.num_iterations)

    def _stack(self, kind: str, num_envs: int, seed: int, recorder) -> AutoReset:
        """The ``kind`` ("train" or "eval") env stack, its clips in videos/<kind>."""
        return make_env_stack(
            self.cfg.env,
            self.cfg.sim,
            num_envs,
            seed,
            recorder,
            video_dir=str(self.run_dir / "videos" / kind),
            kind=kind,
            on_clip=self._on_clip,
            device=self.device,
        ).env

    def _on_clip(self, clip: ClipInfo) -> None:
        """A clip is on disk: log it at the step its caller tagged it with (an eval clip finishes
        encoding after its evaluation), or now."""
        if self.logger is not None:
            step = self.global_step if clip.tag is None else int(clip.tag)
            self.logger.log_clip(step, clip.kind, clip.path, clip.fps, clip.num_frames)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """The checkpoint of this moment (``rlrec.train.resume`` reads it back)."""
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "ppo": self.ppo.state_dict(),
            "rng": ckpt.rng_state(),
            "train_env": None if self.train_env is None else stack_state(self.train_env),
            "eval_env": None if self.eval_env is None else stack_state(self.eval_env),
            "next_obs": self._obs,
            "obs_shape": self.obs_shape,
            "action_space": repr(self.action_space),
            "env_name": self.cfg.env.name,
            "config": to_container(self.cfg),
        }

    def save_checkpoint(self, state: Optional[dict] = None, periodic: bool = False) -> None:
        """Writes ``state`` (default: the state as of now) to last.pt (and iter_NNNNNN.pt).
        Several ranks (every rank calls it): rank 0 writes, with the other ranks' own entries."""
        state = resume.gather_ranks(self.state() if state is None else state, self.world)
        if state is None:
            return  # not rank 0
        if self.logger is not None and self.logger.awaiting:
            # no checkpoint before the eval lines of the steps it covers (a resumed run would
            # not redo those evaluations): their clips are waited for (bounded), then written
            if self.evaluator is not None:
                self.evaluator.flush()
            self.logger.write_awaiting()
        # a full disk: CheckpointWriteError names the file and the resume command
        iteration = self.iteration if periodic else None
        path = ckpt.write(self.run_dir, state, iteration, self.retention)
        self.watch.saved(path, state["global_step"])

    def _restore(self) -> Optional[torch.Tensor]:
        """Loads the checkpoint found at start-up; returns the saved next observation when the
        simulator state was saved with it (else collection starts new episodes)."""
        if self.start is None:
            return None
        self.global_step = int(self.start.data["global_step"])
        self.iteration = int(self.start.data["iteration"])
        self.watch.saved(self.start.path, self.global_step, in_run_dir=self.cfg.resume == "auto")
        envs = {"train_env": self.train_env, "eval_env": self.eval_env}
        return self.start.restore(self.rank, self.ppo, envs, self.rollout_mode())

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> bool:
        """One evaluation of the current policy (its clip tagged with this step) and its eval line;
        False, with nothing logged, when a stop cut it short."""
        if self._cut():
            return False
        t0 = time.perf_counter()
        deterministic = self.cfg.eval_env.deterministic
        metrics = self.evaluator.run(
            lambda obs: self.ppo.act_inference(obs, deterministic),
            tag=self.global_step,
            stop=self._cut,
            iteration=self.iteration,
        )
        if self._cut():  # figures of fewer episodes than asked: not an eval line
            return False
        if metrics:
            metrics["time/eval"] = time.perf_counter() - t0
            self.last_eval = metrics
            # the eval line names its clip: it goes to metrics.jsonl once the clip is on disk
            clip = "eval" if self.evaluator.recorded else None
            self.logger.log(self.global_step, metrics, clip=clip)
        return True

    def _evaluation(self) -> bool:
        """:meth:`evaluate` with the state before it as the resume point, marked ``eval_due``: a
        stop that cuts it short checkpoints that state, and the resumed run redoes it first."""
        self.resume_point.keep(eval_due=True)
        self.evaluator.poll()  # an eval clip finished encoding since the last evaluation
        if not self.evaluate():
            return False
        self.resume_point.clear()
        return True

    def _cut(self) -> bool:
        """Whether a stop signal cuts the evaluation (or rollout) in progress short. Several
        ranks: an evaluation (rank 0's alone) runs to its end, and the stop is agreed at the end
        of the next rollout (``StopRequested.agreed``)."""
        return self.world == 1 and bool(self.stop)

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
        env, ppo = self.train_env, self.ppo
        with self.rollout_mode():
            self.watch.begin(obs)
            for _ in range(self.cfg.algo.num_steps):
                action = ppo.act(obs)
                obs, reward, terminated, truncated, info = env.step(action)
                self.watch.step(obs, reward, info)  # batched device work, read after the update
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
        rec = recorder_of(self.train_env)
        # record_final_episode: the episode in progress at the end gets its clip
        if rec is not None:
            rec.expect_end((self.num_iterations - self.iteration) * cfg.algo.num_steps)
        if next_obs is None:
            with self.rollout_mode():
                next_obs, _ = self.train_env.reset(seed=self.env_seed)
        self._obs = next_obs
        try:
            # a stop cut the evaluation of the checkpoint's step short: it is redone first; a new
            # run evaluates the untrained policy first (eval_env.at_start)
            if self.start is None:
                due = cfg.eval_env.at_start and self.iteration == 0
            else:
                due = self.start.eval_due
            self._train_loop(eval_due=due)
        except RecorderError:
            # recorder.on_error=raise: the checkpoint of the last completed update, then the error
            # (several ranks: the others are not there to gather; the periodic ones stand)
            if self.world == 1:
                self.save_checkpoint(self.resume_point.state())
            raise
        # stopped: the state as of the start of the interrupted rollout or evaluation; else now
        state = self.resume_point.state()
        self.save_checkpoint(state)
        if self.stop and self.logger is not None:
            self.logger.event(int(state["global_step"]), "stop", signal=int(self.stop.signum))
        return self.last_eval

    def _train_loop(self, eval_due: bool) -> None:
        """Iterations until the total or a stop. The resume point is the state as of the start of
        the rollout or evaluation in progress (between them, the state as of now), so a stop or a
        recorder error checkpoints a state that an uninterrupted run also went through, and
        ``resume=auto`` continues bit-exactly."""
        cfg = self.cfg
        if eval_due and self.evaluator is not None and self.iteration < self.num_iterations:
            if not self._evaluation():
                return
            if self.iteration > 0:  # the evaluation at start (step 0) has no checkpoint of its own
                self._periodic_checkpoint()
        start, start_step = time.perf_counter(), self.global_step
        while self.iteration < self.num_iterations and not self._cut():
            self.resume_point.keep()
            lr = self.ppo.set_schedule(1.0 - self.iteration / self.num_iterations)
            t0 = time.perf_counter()
            try:
                self._obs = self.collect(self._obs)
            except Exception as exc:  # e.g. sampling from a policy fed non-finite observations
                diverged = self.watch.after_error(self._at(ahead=1))
                if diverged is not None:
                    raise diverged from exc
                raise
            if self.stop.agreed():
                return  # the interrupted rollout is dropped: its start is checkpointed
            self.iteration += 1
            self.global_step += self.batch_size
            t1 = time.perf_counter()
            losses = self.ppo.update()
            # Diverged on a non-finite value: nothing is logged, evaluated or saved from it
            self.watch.check(losses, state_tensors(self.ppo), self._at())
            self.resume_point.clear()
            t2 = time.perf_counter()
            sps = (self.global_step - start_step) / max(t2 - start, 1e-9)
            self._log_iteration(losses, lr, t1 - t0, t2 - t1, sps)
            if self.evaluator is not None:
                if self.iteration % cfg.eval_env.every or self.iteration >= self.num_iterations:
                    self.evaluator.poll()  # an eval clip finished encoding since the evaluation
                elif not self._evaluation():
                    return
            self._periodic_checkpoint()
        if self.world > 1:
            self.stop.agreed()  # a signal during the last update: every rank exits with it
        if self.evaluator is not None and not self.stop:
            self._evaluation()  # the final one
        elif self.evaluator is not None and self.iteration >= self.num_iterations:
            # a stop during the last update: the final evaluation is still due (resume=auto does
            # it; without the mark the run would count as ended)
            self.resume_point.keep(eval_due=True)

    def _at(self, ahead: int = 0) -> str:
        """The words "iteration I (step S)" of this iteration, or (``ahead=1``) of the one
        collecting."""
        step = self.global_step + ahead * self.batch_size
        return f"iteration {self.iteration + ahead} (step {step})"

    def _periodic_checkpoint(self) -> None:
        if self.iteration % self.cfg.checkpoint_every == 0:
            self.save_checkpoint(periodic=True)

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
            metrics.update(record_losses(self.train_env, self.eval_env))  # cumulative
            self.logger.log(self.global_step, metrics)
        self.logger.progress(self.global_step, sps)

    # ------------------------------------------------------------------ entry points
    def run(self) -> Dict[str, float]:
        """Trains (or, with eval_only, evaluates the checkpoint); always closes cleanly."""
        if self.start is not None and self.start.finished:
            print(
                f"rlrec: done already: {self.start.path} is at the end of the run "
                f"({int(self.start.data['global_step']):,} env steps); nothing to do | "
                f"run dir {self.run_dir}",
                flush=True,
            )
            return self.last_eval
        t0 = time.perf_counter()
        self.stop.install()
        try:
            if self.cfg.eval_only:
                self._restore()
                self.evaluate()
            else:
                self.train()
        finally:
            self.stop.uninstall()
            self.close()
        if self.main:
            secs, resumable = time.perf_counter() - t0, not self.cfg.eval_only
            stopped = self.stop.signum
            summary(
                secs,
                self.global_step,
                self.last_eval,
                self.run_dir,
                stopped,
                resumable,
                self.losses,
            )
        return self.last_eval

    def close(self) -> None:
        """Closes recorders (saving the episode in progress), envs and loggers, every one of them
        even when one fails (e.g. a RecorderError of a last clip); then raises the first error.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        # record_final_episode: a recorder saves the clip in progress as it closes
        layers = [x for env in (self.train_env, self.eval_env) for x in (recorder_of(env), env)]
        errors: List[BaseException] = []
        # the evaluator writes the episode records whose clip never came
        for layer in [*layers, self.evaluator, self.logger]:
            try:
                if layer is not None:
                    layer.close()
            except BaseException as exc:  # the rest are still closed
                errors.append(exc)
        self.losses = record_losses(self.train_env, self.eval_env)  # for the last console line
        if errors:
            raise errors[0]
