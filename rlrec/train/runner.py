"""The training loop: collect, update, evaluate, checkpoint, log, each a call to its owner (the env
stacks, PPO, the evaluator, the logger, the divergence watch, the resume point every checkpoint
holds), which decides for itself what this rank does: rank 0 alone writes files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from rlrec import distributed
from rlrec.config import Config, to_container
from rlrec.envs.device import use_device
from rlrec.envs.factory import resolve_device
from rlrec.layout import RunDir
from rlrec.obs import shape_of
from rlrec.ppo.ppo import PPO
from rlrec.record import ClipInfo, RecorderError
from rlrec.train import checkpoint as ckpt
from rlrec.train import resume
from rlrec.train.divergence import Watch, state_tensors
from rlrec.train.evaluation import Evaluator
from rlrec.train.logger import RunLogger, summary
from rlrec.train.stack import close_all, make_env_stack, record_losses, recorder_of, stack_state


class Runner:
    """Builds everything from a validated :class:`Config` and runs training or evaluation.
    ``device``: what ``rlrec.envs.factory.resolve_device(cfg.sim)`` gave (None: resolved here), for
    the envs, the policy and the normaliser; ``stop``: the entry point's stop flag (None: unset)."""

    def __init__(self, cfg: Config, run_dir: Path, device=None, stop=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        # rank r (docs/distributed.md) seeds its RNGs seed + r, its envs r * num_envs + i
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.main = self.rank == 0  # builds the recorders and the eval env
        # one device for all of this rank (cuda:<local rank>), made torch's current device
        self.device = resolve_device(cfg.sim) if device is None else torch.device(device)
        use_device(self.device)
        self.env_seed = cfg.seed + self.rank * cfg.env.num_envs
        self.start = resume.find(cfg, self.run_dir, self.rank, self.world)  # a bad path fails here
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        ckpt.seed_rng(cfg.seed + self.rank)
        self.global_step = self.iteration = 0
        self.train_env = self.eval_env = None  # the env stacks (AutoReset)
        self.evaluator, self.logger = None, None  # Evaluator, RunLogger
        self.last_eval: Dict[str, float] = {}
        self.losses: Dict[str, int] = {}  # the recorders' losses as they closed
        self.stop = _Unstopped() if stop is None else stop
        self._obs: Optional[torch.Tensor] = None  # the train env's next observation
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

    def _build(self) -> None:
        cfg = self.cfg
        if not cfg.eval_only:
            recorder = cfg.recorder if self.main else None  # rank 0 alone records
            video_dir = str(RunDir(self.run_dir).videos("train"))
            self.train_env = make_env_stack(
                cfg.env,
                cfg.sim,
                cfg.env.num_envs,
                self.env_seed,
                recorder,
                video_dir=video_dir,
                kind="train",
                on_clip=self._on_clip,
                device=self.device,
            ).env
        if (cfg.eval_env.enabled or cfg.eval_only) and self.main:  # rank 0 alone evaluates
            self.evaluator = Evaluator(
                cfg.env,
                cfg.sim,
                cfg.eval_env,
                self.run_dir,
                on_clip=self._on_clip,
                video_dir=str(RunDir(self.run_dir).videos("eval")),
                device=self.device,
            )
            self.eval_env = self.evaluator.env
        env = self.train_env or self.eval_env
        self.obs_shape = shape_of(env.single_observation_space)
        self.action_space = env.single_action_space
        if self.start is not None:
            self.start.check_compatible(self.obs_shape, self.action_space)
        self.ppo = PPO(cfg.algo, env.single_observation_space, self.action_space, self.device)
        # env steps per iteration over all ranks (env.num_envs is per rank)
        self.batch_size = self.world * cfg.env.num_envs * cfg.algo.num_steps
        self.num_iterations = resume.iterations(cfg, self.world)
        total, config = self.num_iterations * self.batch_size, to_container(cfg)
        wait = None if self.evaluator is None else self.evaluator.flush  # eval lines await clips
        # resume=auto continues the run from its checkpoint: its W&B run continues too
        resumed = self.start is not None and self.start.key == "resume" and not cfg.eval_only
        self.logger = RunLogger(cfg.logger, self.run_dir, total, config, wait, resumed)
        settle = self.logger.settle  # before each checkpoint: the eval lines of its steps
        protect = lambda: self.watch.protected  # noqa: E731  (the checkpoint before a blow-up)
        self.resume_point = resume.ResumePoint(
            self.state, self.run_dir, cfg, self.start, settle, protect
        )
        last = lambda: self.resume_point.last  # noqa: E731  (what a diverged run names)
        self.watch = Watch(cfg.algo.num_steps, cfg.env.num_envs, self.device, self.run_dir, last)
        distributed.announce(cfg.env.num_envs, cfg.algo.num_steps, self.num_iterations)

    def _on_clip(self, clip: ClipInfo) -> None:
        """A clip is on disk: log it at the step its caller tagged it with (an eval clip finishes
        encoding after its evaluation), or now."""
        if self.logger is not None:
            step = self.global_step if clip.tag is None else int(clip.tag)
            self.logger.log_clip(step, clip.kind, clip.path, clip.fps, clip.num_frames)

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
            "blowup": self.watch.under_way,  # resume=auto passes over a checkpoint that has one
        }

    def _restore(self) -> Optional[torch.Tensor]:
        """Loads the checkpoint found at start-up: the saved next observation, or None."""
        if self.start is None:
            return None
        self.global_step = int(self.start.data["global_step"])
        self.iteration = int(self.start.data["iteration"])
        envs = {"train_env": self.train_env, "eval_env": self.eval_env}
        return self.start.restore(self.rank, self.ppo, envs, self.ppo.rollout_mode())

    def evaluate(self) -> bool:
        """One evaluation of the current policy (its clip tagged with this step) and its eval line;
        False, with nothing logged, when a stop cut it short."""
        self.evaluator.poll()  # an eval clip finished encoding since the last evaluation
        if self.stop.now():
            return False
        t0, deterministic = time.perf_counter(), self.cfg.eval_env.deterministic
        policy = lambda obs: self.ppo.act_inference(obs, deterministic)  # noqa: E731
        if self.start is not None and "policy" in self.start.data:  # eval_only of an export
            policy = self.start.data["policy"]
        metrics = self.evaluator.run(
            policy, tag=self.global_step, stop=self.stop.now, iteration=self.iteration
        )
        if self.stop.now():  # figures of fewer episodes than asked: not an eval line
            return False
        if metrics:
            self.last_eval = {**metrics, "time/eval": time.perf_counter() - t0}
            # the eval line names its clip: it goes to metrics.jsonl once the clip is on disk
            clip = "eval" if self.evaluator.recorded else None
            self.logger.log(self.global_step, self.last_eval, clip=clip)
        return True

    def iterate(self) -> Optional[Dict[str, float]]:
        """A rollout of ``algo.num_steps`` steps into PPO's storage and PPO's update, both watched:
        the iteration's figures, or None when a stop cut the rollout short (it is dropped)."""
        env, ppo, watch, obs = self.train_env, self.ppo, self.watch, self._obs
        at = f"iteration {self.iteration + 1} (step {self.global_step + self.batch_size})"
        lr = ppo.set_schedule(1.0 - self.iteration / self.num_iterations)
        t0 = time.perf_counter()
        with ppo.rollout_mode(), watch.rollout(obs, at):
            for _ in range(self.cfg.algo.num_steps):
                obs, reward, terminated, truncated, info = env.step(ppo.act(obs))
                watch.step(obs, reward, info)  # batched device work, read after the update
                ppo.process_env_step(reward, terminated, truncated, info)
                self.logger.episodes.add(info)
                if self.stop:
                    break
            else:
                ppo.compute_returns(obs)
        self._obs = obs
        if self.stop.agreed():
            return None
        self.iteration += 1
        self.global_step += self.batch_size
        t1 = time.perf_counter()
        losses = ppo.update()
        # Diverged on a non-finite value: nothing is logged, evaluated or saved from it
        watch.check(losses, state_tensors(ppo), at)
        times = {"time/collect": t1 - t0, "time/learn": time.perf_counter() - t1}
        sps = self.batch_size / max(t1 - t0, 1e-9)
        return {**losses, "train/lr": lr, **times, "sps/collect": sps}

    def train(self) -> Dict[str, float]:
        cfg = self.cfg
        self.ppo.init_storage(self.train_env.num_envs)
        next_obs = self._restore()
        # record_final_episode: the episode in progress at the end gets its clip
        if (rec := recorder_of(self.train_env)) is not None:
            rec.expect_end((self.num_iterations - self.iteration) * cfg.algo.num_steps)
        if next_obs is None:
            with self.ppo.rollout_mode():
                next_obs, _ = self.train_env.reset(seed=self.env_seed)
        self._obs = next_obs
        # a stop cut the evaluation of the checkpoint's step short: it is redone first; a new run
        # evaluates the untrained policy first (eval_env.at_start)
        due = cfg.eval_env.at_start and self.iteration == 0
        try:
            self._train_loop(eval_due=due if self.start is None else self.start.eval_due)
        except RecorderError:
            # recorder.on_error=raise: the checkpoint of the last completed update, then the error
            self.resume_point.save(alone=True)
            raise
        # stopped: the state as of the start of the interrupted rollout or evaluation; else now
        step = self.resume_point.save()
        if self.stop:
            self.logger.event(step, "stop", signal=int(self.stop.signum))
        return self.last_eval

    def _train_loop(self, eval_due: bool) -> None:
        """Iterations until the total or a stop; each iteration and each evaluation a :meth:`_unit`
        (a stop or a recorder error checkpoints the state as of its start)."""
        cfg, evaluating = self.cfg, self.evaluator is not None
        if eval_due and evaluating and self.iteration < self.num_iterations:
            if not self._unit(self.evaluate, eval_due=True):
                return
            if self.iteration > 0:  # the evaluation at start (step 0) has no checkpoint of its own
                self.resume_point.periodic(self.iteration)
        start, start_step = time.perf_counter(), self.global_step
        while self.iteration < self.num_iterations and not self.stop.now():
            metrics = self._unit(self.iterate)
            if metrics is None:
                return  # the interrupted rollout is dropped: its start is checkpointed
            sps = (self.global_step - start_step) / max(time.perf_counter() - start, 1e-9)
            if self.iteration % cfg.logger.log_every == 0 or self.iteration == self.num_iterations:
                metrics.update(self.logger.episodes.summary())
                metrics.update(record_losses(self.train_env, self.eval_env))  # cumulative
                self.logger.log(self.global_step, {**metrics, "sps/total": sps})
            self.logger.progress(self.global_step, sps)
            if self.iteration >= self.num_iterations:
                return self._end()
            if evaluating:
                if self.iteration % cfg.eval_env.every:
                    self.evaluator.poll()  # an eval clip finished encoding since the evaluation
                elif not self._unit(self.evaluate, eval_due=True):
                    return
            self.resume_point.periodic(self.iteration)
        if self.iteration >= self.num_iterations:  # resumed with the final evaluation due
            self._end()

    def _end(self) -> None:
        """After the last update: the train recorder's last clip (the episode in progress, whose
        frames no checkpoint holds) goes to disk, then the final evaluation runs, then the last
        iteration's periodic checkpoint is written, as after every other iteration; a run killed
        before it resumes from the one before, and a stop leaves the evaluation due (resume=auto
        does it). :meth:`train` writes last.pt, the run's end, after it."""
        self.stop.agreed()  # a signal during the last update: every rank exits with it
        if (rec := recorder_of(self.train_env)) is not None:
            rec.finish()
        if self.evaluator is not None and not self._unit(self.evaluate, eval_due=True):
            return
        self.resume_point.periodic(self.iteration)

    def _unit(self, work: Callable[[], Any], eval_due: bool = False) -> Any:
        """``work()`` (an iteration, or an evaluation: ``eval_due``) with the state before it as the
        resume point: a stop cuts it short (None or False) and the resumed run does it again."""
        self.resume_point.keep(eval_due=eval_due)
        done = work()
        if done:
            self.resume_point.clear()
        return done

    def run(self) -> Dict[str, float]:
        """Trains (or, with eval_only, evaluates the checkpoint); always closes cleanly."""
        if self.start is not None and self.start.finished:
            steps = f"{self.global_step:,} env steps"
            print(
                f"rlrec: done already: {self.start.path} is at the end of the run ({steps}); "
                f"nothing to do | run dir {self.run_dir}",
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
        summary(
            time.perf_counter() - t0,
            self.global_step,
            self.last_eval,
            self.run_dir,
            self.stop.signum,
            not self.cfg.eval_only,
            self.losses,
        )
        return self.last_eval

    def close(self) -> None:
        """Closes the env stacks (a recorder saves the episode in progress) and the evaluator
        (``stack.close_all``), then the logger. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            close_all((self.train_env, self.eval_env), self.evaluator)
        finally:
            # what the recorders lost, the final evaluation included: metrics.jsonl and console
            self.losses = record_losses(self.train_env, self.eval_env)
            if self.logger is not None:
                self.logger.close(self.global_step, self.losses)


class _Unstopped:
    """The stop flag of a run built without one (a library call): never set."""

    signum: Optional[int] = None
    __bool__ = agreed = now = lambda self: False  # noqa: E731
    install = uninstall = lambda self: None  # noqa: E731
