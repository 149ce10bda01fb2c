"""The training loop: collect, update, evaluate, checkpoint, log.

The runner owns two env stacks built by one factory, with their own num_envs and seeds:
``AutoReset(Recorder(adapter))`` for collection and for evaluation.
"""

from __future__ import annotations

import bisect
import math
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from rlrec import checkpoint as ckpt
from rlrec import preempt
from rlrec.config import Config, ConfigError, to_container, to_dataclass
from rlrec.envs.base import AutoReset, env_state, load_env_state
from rlrec.envs.factory import make_env_stack, resolve_device
from rlrec.logging import RunLogger
from rlrec.ppo.ppo import PPO, action_dtype
from rlrec.ppo.storage import RolloutStorage


class _StopRequested:
    """SIGTERM/SIGINT (and submitit's preemption signal in a submitit job) set a flag the loop
    checks every env step; a second SIGINT interrupts."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: Dict[int, object] = {}

    def __bool__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def install(self) -> None:
        for sig in preempt.stop_signals():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (some launchers): the default handlers stay
                pass

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _recorder(env):
    """The Recorder layer of an env stack, or None."""
    from rlrec.record.recorder import Recorder

    return None if env is None else env.find(Recorder)


def action_space_desc(space) -> str:
    return repr(space)


class Runner:
    """Builds everything from a validated :class:`Config` and runs training or evaluation."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = resolve_device(cfg.sim)
        self.resume_data = self._find_checkpoint()  # fails before any work on a bad path
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.global_step = 0
        self.iteration = 0
        self.train_env: Optional[AutoReset] = None
        self.eval_env: Optional[AutoReset] = None
        self.logger: Optional[RunLogger] = None
        self.last_eval: Dict[str, float] = {}
        self._eval_starts: List[Tuple[int, int]] = []  # (eval recorder's steps, global step) per eval
        self.stop = _StopRequested()
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up
    def _find_checkpoint(self) -> Optional[dict]:
        cfg = self.cfg
        if cfg.checkpoint is not None:
            return ckpt.load(cfg.checkpoint)
        if cfg.resume == "auto":
            preempt.remove_stale_temporaries(self.run_dir)  # what a killed run left half-written
            path = ckpt.newest(self.run_dir / "checkpoints")
            return ckpt.load(path, key="resume") if path is not None else None
        if cfg.eval_only:
            raise ConfigError("eval_only=true needs checkpoint=PATH (the checkpoint to evaluate)")
        return None

    def _build(self) -> None:
        cfg = self.cfg
        videos = self.run_dir / "videos"
        if not cfg.eval_only:
            self.train_env = make_env_stack(
                cfg.env, cfg.sim, cfg.env.num_envs, cfg.seed, cfg.recorder,
                video_dir=str(videos / "train"), kind="train", on_clip=self._on_clip,
            )
        if cfg.eval_env.enabled or cfg.eval_only:
            self.eval_env = make_env_stack(
                cfg.env, cfg.sim, cfg.eval_env.num_envs, cfg.eval_env.seed, cfg.eval_env.recorder,
                video_dir=str(videos / "eval"), kind="eval", on_clip=self._on_clip,
            )
        env = self.train_env or self.eval_env
        self.obs_shape = tuple(env.single_observation_space.shape)
        self.action_space = env.single_action_space
        if self.resume_data is not None:
            ckpt.check_compatible(self.resume_data, self.obs_shape, action_space_desc(self.action_space),
                                  key="checkpoint" if cfg.checkpoint else "resume")
        self.ppo = PPO(cfg.algo, env.single_observation_space, self.action_space, self.device)
        self.batch_size = cfg.env.num_envs * cfg.algo.num_steps
        self.num_iterations = max(1, cfg.total_steps // self.batch_size)
        self.logger = RunLogger(cfg.logger, self.run_dir, self.num_iterations * self.batch_size,
                                to_container(cfg))

    def _on_clip(self, clip) -> None:
        if self.logger is None:
            return
        step = self.global_step
        if clip.kind == "eval" and self._eval_starts:
            # the clip finishes encoding after its evaluation (training does not wait for it):
            # log it at the step of the evaluation that recorded it
            i = bisect.bisect_right(self._eval_starts, (clip.step, float("inf"))) - 1
            step = self._eval_starts[max(i, 0)][1]
        self.logger.log_clip(step, clip.kind, clip.path, clip.fps, clip.num_frames)

    # ------------------------------------------------------------------ checkpoints
    def state(self, next_obs: Optional[torch.Tensor]) -> dict:
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "ppo": self.ppo.state_dict(),
            "rng": ckpt.rng_state(),
            "train_env": None if self.train_env is None else env_state(self.train_env),
            "eval_env": None if self.eval_env is None else env_state(self.eval_env),
            "next_obs": next_obs,
            "obs_shape": self.obs_shape,
            "action_space": action_space_desc(self.action_space),
            "env_name": self.cfg.env.name,
            "config": to_container(self.cfg),
        }

    def save_checkpoint(self, next_obs: Optional[torch.Tensor], periodic: bool = False) -> Path:
        state = self.state(next_obs)
        directory = self.run_dir / "checkpoints"
        ckpt.save(directory / "last.pt", state)
        if periodic:
            ckpt.save(directory / f"iter_{self.iteration:06d}.pt", state)
        return directory / "last.pt"

    def _restore(self) -> Optional[torch.Tensor]:
        """Loads the checkpoint found at start-up; returns the saved next observation, if any."""
        data = self.resume_data
        if data is None:
            return None
        self.ppo.load_state_dict(data["ppo"])
        self.global_step = int(data["global_step"])
        self.iteration = int(data["iteration"])
        ckpt.set_rng_state(data["rng"])
        with torch.inference_mode():
            if self.train_env is not None and data.get("train_env"):
                load_env_state(self.train_env, data["train_env"])
            if self.eval_env is not None and data.get("eval_env"):
                load_env_state(self.eval_env, data["eval_env"])
        obs = data.get("next_obs")
        saved_layers = {key.split(":", 1)[1] for key in data.get("train_env") or {}}
        sim_saved = bool(saved_layers - {"AutoReset", "Recorder"})  # the adapter saved its state
        if self.train_env is not None and sim_saved and obs is not None \
                and obs.shape[0] == self.cfg.env.num_envs:
            return obs.to(self.device)
        return None  # the backend could not save its state: collection starts new episodes

    # ------------------------------------------------------------------ evaluation
    @torch.inference_mode()
    def evaluate(self) -> Dict[str, float]:
        """Full reset of the eval env with its seed, then run until every eval env finished an
        episode (or ``eval_env.episodes`` episodes in all). Deterministic actions by default."""
        cfg = self.cfg.eval_env
        env = self.eval_env
        n = env.num_envs
        target = cfg.episodes or n
        rec = _recorder(env)
        if rec is not None:  # eval clips start at rec.steps: remember which evaluation that was
            self._eval_starts.append((rec.steps, self.global_step))
        obs, _ = env.reset(seed=cfg.seed)
        first_done = torch.zeros(n, dtype=torch.bool, device=env.device)
        success_once = torch.zeros(n, dtype=torch.bool, device=env.device)
        returns: List[torch.Tensor] = []
        lengths: List[torch.Tensor] = []
        successes: List[torch.Tensor] = []
        has_success = False
        count = 0
        limit = (env.max_episode_steps or 10_000) * (math.ceil(target / n) + 1)
        for _ in range(limit):
            action = self.ppo.agent.action(self.ppo.normalize(obs), deterministic=cfg.deterministic)
            obs, _, _, _, info = env.step(action)
            if "success" in info:
                has_success = True
                success_once |= info["success"].to(torch.bool)
            if "_final" in info:
                done = info["_final"]
                take = done & ~first_done if cfg.episodes is None else done
                idx = take.nonzero().flatten()[: target - count]
                returns.append(info["episode"]["return"][idx])
                lengths.append(info["episode"]["length"][idx].float())
                successes.append(success_once[idx].float())
                count += idx.numel()
                first_done |= done
                success_once &= ~done
            if count >= target or self.stop:
                break
        if rec is not None:
            # an evaluation cut short still gets its clip; it is encoded while training goes on
            # and logged (at this evaluation's step) once it is on disk, see _on_clip
            rec.end_clip()
        if count == 0:
            return {}
        out = {
            "eval/return": float(torch.cat(returns).mean()),
            "eval/length": float(torch.cat(lengths).mean()),
            "eval/episodes": count,
        }
        if has_success:
            out["eval/success"] = float(torch.cat(successes).mean())
        return out

    def _evaluate_and_log(self) -> None:
        t0 = time.perf_counter()
        metrics = self.evaluate()
        if metrics:
            metrics["time/eval"] = time.perf_counter() - t0
            self.last_eval = metrics
            self.logger.log(self.global_step, metrics)

    # ------------------------------------------------------------------ training
    def train(self) -> Dict[str, float]:
        cfg, algo = self.cfg, self.cfg.algo
        env = self.train_env
        n = env.num_envs
        storage = RolloutStorage(algo.num_steps, n, self.obs_shape, tuple(self.ppo.agent.action_shape),
                                 action_dtype(self.action_space), self.device)
        next_obs = self._restore()
        with torch.inference_mode():
            if next_obs is None:
                next_obs, _ = env.reset(seed=cfg.seed)
        start = time.perf_counter()
        start_step = self.global_step
        finished = {"return": [], "length": [], "success": []}
        rec = _recorder(env)
        eval_rec = _recorder(self.eval_env)
        # record_final_episode: once the remaining steps fit in one episode, every episode of the
        # recorded env that starts is recorded, so the last one has a clip that close() saves
        # (an idle recorder renders nothing, so it cannot save an episode it did not record)
        final_window = (env.max_episode_steps or algo.num_steps) // algo.num_steps + 1
        while self.iteration < self.num_iterations and not self.stop:
            self.iteration += 1
            if rec is not None and rec.cfg.record_final_episode \
                    and self.num_iterations - self.iteration < final_window:
                rec.record_next_episode()
            lr = self.ppo.set_schedule(1.0 - (self.iteration - 1) / self.num_iterations)
            t_collect = time.perf_counter()
            with torch.inference_mode():
                for t in range(algo.num_steps):
                    nobs = self.ppo.normalize(next_obs, update=True)
                    action, logprob, value = self.ppo.agent.act(nobs)
                    next_obs, reward, term, trunc, info = env.step(action)
                    reward = reward.float() * algo.reward_scale
                    if "_final" in info:
                        reward = self.ppo.bootstrap_truncated(reward, term, trunc, info["final_obs"])
                        ep = info["episode"]
                        mask = ep["_mask"]
                        finished["return"].append(ep["return"][mask])
                        finished["length"].append(ep["length"][mask].float())
                        if "success" in info:
                            finished["success"].append(info["success"][mask].float())
                    storage.obs[t] = nobs
                    storage.actions[t] = action
                    storage.logprobs[t] = logprob
                    storage.values[t] = value
                    storage.rewards[t] = reward
                    storage.dones[t] = (term | trunc).float()
                    if self.stop:
                        break
                if self.stop:  # the interrupted rollout is dropped; the checkpoint keeps the last update
                    self.iteration -= 1
                    break
                next_value = self.ppo.agent.value(self.ppo.normalize(next_obs))
                storage.compute_gae(next_value, algo.gamma, algo.gae_lambda)
            self.global_step += self.batch_size
            collect_time = time.perf_counter() - t_collect
            t_learn = time.perf_counter()
            losses = self.ppo.update(storage)
            learn_time = time.perf_counter() - t_learn
            metrics: Dict[str, float] = {**losses, "train/lr": lr, "time/collect": collect_time,
                                         "time/learn": learn_time,
                                         "sps/collect": self.batch_size / max(collect_time, 1e-9),
                                         "sps/total": (self.global_step - start_step)
                                         / max(time.perf_counter() - start, 1e-9)}
            if finished["return"]:
                metrics["train/return"] = float(torch.cat(finished["return"]).mean())
                metrics["train/length"] = float(torch.cat(finished["length"]).mean())
                if finished["success"]:
                    metrics["train/success"] = float(torch.cat(finished["success"]).mean())
                finished = {"return": [], "length": [], "success": []}
            if self.iteration % cfg.logger.log_every == 0 or self.iteration == self.num_iterations:
                self.logger.log(self.global_step, metrics)
            self.logger.progress(self.global_step, metrics["sps/total"])
            if eval_rec is not None and eval_rec.pending:
                eval_rec.poll()  # an eval clip finished encoding since the evaluation: log it
            if self.eval_env is not None and self.iteration % cfg.eval_env.every == 0 \
                    and self.iteration < self.num_iterations:
                self._evaluate_and_log()
            if self.iteration % cfg.checkpoint_every == 0:
                self.save_checkpoint(next_obs, periodic=True)
        if self.eval_env is not None and not self.stop:
            self._evaluate_and_log()
        self.save_checkpoint(next_obs)
        return self.last_eval

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
        ev = self.last_eval
        parts = [f"rlrec: {'stopped by signal' if self.stop else 'done'} in {seconds:.1f}s",
                 f"{self.global_step:,} env steps"]
        if ev:
            figures = f"eval return {ev['eval/return']:.3f}, length {ev['eval/length']:.1f}"
            if "eval/success" in ev:
                figures += f", success {ev['eval/success']:.3f}"
            parts.append(figures)
        parts.append(f"run dir {self.run_dir}")
        print(" | ".join(parts), flush=True)

    def close(self) -> None:
        """Closes recorders (saving the episode in progress), envs and loggers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for env in (self.train_env, self.eval_env):
            if env is None:
                continue
            try:
                rec = _recorder(env)
                if rec is not None:
                    rec.close()  # record_final_episode: the clip in progress is saved here
            finally:
                env.close()
        if self.logger is not None:
            self.logger.close()


def _remove_if_empty(run_dir: Path) -> None:
    """After a config error: drop the run dir Hydra made if it holds nothing but its own files
    (and empty dirs, e.g. video dirs a recorder made), then its parents left empty (outputs/DATE)."""
    if not run_dir.is_dir():
        return
    leftovers = [p for p in run_dir.rglob("*") if p.is_file()
                 and p.relative_to(run_dir).parts[0] != ".hydra" and not p.name.endswith(".log")]
    if not leftovers:
        shutil.rmtree(run_dir, ignore_errors=True)
        parent = run_dir.absolute().parent
        for _ in range(2):  # outputs/DATE/TIME_UID: DATE and outputs; never above the cwd
            if parent == Path.cwd() or Path.cwd() not in parent.parents:
                break
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
            parent = parent.parent


def run_from_hydra(cfg) -> Optional[float]:
    """Hydra task function body: validate, build, run; returns the final eval return."""
    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    threads = torch.get_num_threads()  # jobs of a basic-launcher sweep share this process
    try:
        config = to_dataclass(cfg)
        preempt.default_resume(config)  # a requeued submitit job continues its checkpoint
        runner = Runner(config, run_dir)
    except ConfigError as exc:
        _remove_if_empty(run_dir)
        print(f"rlrec: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        result = runner.run()
    finally:
        torch.set_num_threads(threads)  # the next job starts with the process's default again
    preempt.requeue_if_preempted(runner.stop.signum)  # submitit requeues the job and exits
    return result.get("eval/return")
