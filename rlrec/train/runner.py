"""The training loop: collect, update, evaluate, checkpoint, log, each a call to its owner (the env
stacks, PPO, the evaluator, the logger, the divergence watch, the resume point every checkpoint
holds), which decides for itself what this rank does: rank 0 alone writes files."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Dict, Optional

import torch

from rlrec import distributed
from rlrec.config import Config, to_container
from rlrec.envs.device import use_device
from rlrec.envs.factory import resolve_device
from rlrec.layout import RunDir
from rlrec.obs import shape_of
from rlrec.ppo.ppo import PPO
from rlrec.record import RecorderError
from rlrec.train import checkpoint as ckpt
from rlrec.train import resume
from rlrec.train.divergence import Watch, state_tensors
from rlrec.train.evaluation import Evaluator
from rlrec.train.logger import RunLogger
from rlrec.train.stack import close_all, make_env_stack, record_losses, recorder_of, stack_state


class Runner:
    """Builds everything from a validated :class:`Config` and runs training or evaluation.
    ``device``: what ``rlrec.envs.factory.resolve_device(cfg.sim)`` gave (None: resolved here);
    ``stop``: the entry point's stop flag (None: never set). Rank r (docs/distributed.md) seeds its
    RNGs seed + r, its envs r * num_envs + i; rank 0 alone records and evaluates."""

    def __init__(self, cfg: Config, run_dir: Path, device=None, stop=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.rank, self.world = distributed.rank(), distributed.world_size()
        # one device for all of this rank (cuda:<local rank>), made torch's current device
        self.device = resolve_device(cfg.sim) if device is None else torch.device(device)
        use_device(self.device)
        self.env_seed = cfg.seed + self.rank * cfg.env.num_envs
        self.start = resume.find(cfg, self.run_dir, self.rank, self.world)  # a bad path fails here
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        ckpt.seed_rng(cfg.seed + self.rank)
        self.global_step = self.iteration = 0
        # the env stacks (AutoReset), the Evaluator, the RunLogger; the train env's next observation
        self.train_env = self.eval_env = self.evaluator = self.logger = self._obs = None
        self.last_eval = {}
        self.losses = {}  # the recorders' losses as they closed
        self.stop = _Unstopped() if stop is None else stop
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

    def _build(self):
        cfg, on_clip, device, main = self.cfg, self._on_clip, self.device, self.rank == 0
        if not cfg.eval_only:
            rec = cfg.recorder if main else None
            args = cfg.env.num_envs, self.env_seed, rec, str(RunDir(self.run_dir).videos("train"))
            self.train_env = make_env_stack(cfg.env, cfg.sim, *args, "train", on_clip, device).env
        if main and (cfg.eval_env.enabled or cfg.eval_only):
            ev = Evaluator(
                cfg.env, cfg.sim, cfg.eval_env, self.run_dir, on_clip=on_clip, device=device
            )
            self.evaluator, self.eval_env = ev, ev.env
        env = self.train_env or self.eval_env
        space, self.action_space = env.single_observation_space, env.single_action_space
        self.obs_shape = shape_of(space)
        if self.start is not None:
            self.start.check_compatible(self.obs_shape, self.action_space)
        self.ppo = PPO(cfg.algo, space, self.action_space, device)
        self.batch_size = self.world * cfg.env.num_envs * cfg.algo.num_steps  # over all ranks
        self.num_iterations = resume.iterations(cfg, self.world)
        wait = None if self.evaluator is None else self.evaluator.flush  # eval lines await clips
        # resume=auto continues the run from its checkpoint: its W&B run continues too
        resumed = self.start is not None and self.start.key == "resume" and not cfg.eval_only
        total = self.num_iterations * self.batch_size
        self.logger = RunLogger(cfg.logger, self.run_dir, total, to_container(cfg), wait, resumed)
        protect = lambda: self.watch.protected  # noqa: E731  (the checkpoint before a blow-up)
        last = lambda: self.resume_point.last  # noqa: E731  (what a diverged run names)
        args = self.state, self.run_dir, cfg, self.start, self.logger.settle, protect
        self.resume_point = resume.ResumePoint(*args)
        self.watch = Watch(cfg.algo.num_steps, cfg.env.num_envs, device, self.run_dir, last)
        distributed.announce(cfg.env.num_envs, cfg.algo.num_steps, self.num_iterations)

    def _on_clip(self, clip):
        if self.logger is not None:
            self.logger.log_clip(clip, self.global_step)

    def state(self) -> dict:
        """The checkpoint of this moment (``rlrec.train.resume`` reads it back)."""
        stacks = {k: None if e is None else stack_state(e) for k, e in self._stacks().items()}
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "ppo": self.ppo.state_dict(),
            "rng": ckpt.rng_state(),
            **stacks,
            "next_obs": self._obs,
            "obs_shape": self.obs_shape,
            "action_space": repr(self.action_space),
            "env_name": self.cfg.env.name,
            "config": to_container(self.cfg),
            "blowup": self.watch.under_way,  # resume=auto passes over a checkpoint that has one
        }

    def _restore(self):
        """Loads the checkpoint found at start-up: the saved next observation, or None."""
        if self.start is None:
            return None
        self.global_step = int(self.start.data["global_step"])
        self.iteration = int(self.start.data["iteration"])
        return self.start.restore(self.rank, self.ppo, self._stacks(), self.ppo.rollout_mode())

    def _stacks(self):
        return {"train_env": self.train_env, "eval_env": self.eval_env}

    def evaluate(self) -> bool:
        """One evaluation of the current policy (its clip tagged with this step) and its eval line
        (written once its clip is on disk); False, with nothing logged, when a stop cut it short."""
        self.evaluator.poll()  # an eval clip finished encoding since the last evaluation
        if self.stop.now():
            return False
        policy = partial(self.ppo.act_inference, deterministic=self.cfg.eval_env.deterministic)
        if self.start is not None and "policy" in self.start.data:  # eval_only of an export
            policy = self.start.data["policy"]
        metrics = self.evaluator.run(policy, self.global_step, self.stop.now, self.iteration)
        if self.stop.now():  # figures of fewer episodes than asked: not an eval line
            return False
        if metrics:
            self.last_eval = metrics
            self.logger.log(self.global_step, metrics, clip=self.evaluator.recorded)
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

    def train(self) -> None:
        """Iterations until the total or a stop, each iteration and each evaluation a :meth:`_unit`
        (a stop or a recorder error checkpoints the state as of its start), then last.pt."""
        cfg = self.cfg
        self.ppo.init_storage(self.train_env.num_envs)
        self._obs = self._restore()
        # record_final_episode: the episode in progress at the end gets its clip
        if (rec := recorder_of(self.train_env)) is not None:
            rec.expect_end((self.num_iterations - self.iteration) * cfg.algo.num_steps)
        if self._obs is None:
            with self.ppo.rollout_mode():
                self._obs, _ = self.train_env.reset(seed=self.env_seed)
        # a new run evaluates the untrained policy first (eval_env.at_start); a stop cut the
        # evaluation of the checkpoint's step short: it is redone first
        due = self.start.eval_due if self.start is not None else cfg.eval_env.at_start
        try:
            self._loop(due and self.evaluator is not None)
        except RecorderError:
            # recorder.on_error=raise: the checkpoint of the last completed update, then the error
            self.resume_point.save(alone=True)
            raise
        # stopped: the state as of the start of the interrupted rollout or evaluation; else now
        step = self.resume_point.save()
        if self.stop:
            self.logger.event(step, "stop", signal=int(self.stop.signum))

    def _loop(self, eval_due):
        if (eval_due or self.iteration >= self.num_iterations) and not self._after(True):
            return
        start, start_step = time.perf_counter(), self.global_step
        while self.iteration < self.num_iterations and not self.stop.now():
            metrics = self._unit(self.iterate)
            if metrics is None:
                return  # the interrupted rollout is dropped: its start is checkpointed
            sps = (self.global_step - start_step) / max(time.perf_counter() - start, 1e-9)
            last = self.iteration >= self.num_iterations
            if self.iteration % self.cfg.logger.log_every == 0 or last:
                metrics.update(self.logger.episodes.summary())
                metrics.update(record_losses(self.train_env, self.eval_env))  # cumulative
                self.logger.log(self.global_step, {**metrics, "sps/total": sps})
            self.logger.progress(self.global_step, sps)
            if not self._after(last or self.iteration % self.cfg.eval_env.every == 0):
                return

    def _after(self, evaluate):
        """After an iteration (or at the start, with an evaluation due): the evaluation, if due
        (the final one always, after the train recorder's last clip), then the iteration's
        periodic checkpoint; False when a stop cut the evaluation short (it stays due)."""
        if self.iteration >= self.num_iterations:
            self.stop.agreed()  # a signal during the last update: every rank exits with it
            if (rec := recorder_of(self.train_env)) is not None:
                rec.finish()
        if self.evaluator is not None:
            if not evaluate:
                self.evaluator.poll()  # an eval clip finished encoding since the evaluation
            elif not self._unit(self.evaluate, eval_due=True):
                return False
        if self.iteration > 0:
            self.resume_point.periodic(self.iteration)
        return True

    def _unit(self, work, eval_due=False):
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
            print(
                f"rlrec: done already: {self.start.path} is at the end of the run "
                f"({self.global_step:,} env steps); nothing to do | run dir {self.run_dir}",
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
        resumable = not self.cfg.eval_only
        self.logger.summary(time.perf_counter() - t0, self.last_eval, self.stop.signum, resumable)
        return self.last_eval

    def close(self) -> None:
        """Closes the env stacks (a recorder saves the episode in progress) and the evaluator,
        then, with what the recorders lost (the final evaluation included), the logger.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            close_all((self.train_env, self.eval_env), self.evaluator)
        finally:
            self.losses = record_losses(self.train_env, self.eval_env)
            if self.logger is not None:
                self.logger.close(self.global_step, self.losses)


class _Unstopped:
    """The stop flag of a run built without one (a library call): never set."""

    signum: Optional[int] = None
    __bool__ = agreed = now = lambda self: False  # noqa: E731
    install = uninstall = lambda self: None  # noqa: E731
