"""The PPO algorithm: it acts, stores the transitions of its rollout, computes returns, and
updates with the clipped objective over minibatches and epochs (target-KL early stop per epoch,
or per minibatch with ``algo.kl_check=minibatch``)."""

from __future__ import annotations

from functools import partial
from typing import Dict, Optional

import gymnasium as gym
import torch
from torch import nn

from rlrec import distributed
from rlrec.obs import STATE, as_float, batch_size, map_obs, shape_of
from rlrec.ppo.adam import FusedAdam, fused_available
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.ppo.config import BootstrapAt, GradClip, KLCheck, PPOConfig
from rlrec.ppo.storage import RolloutStorage

# torch.compile's mode for ``algo.compile``, by device type. CUDA: CUDA graphs (LeanRL and
# ManiSkill's ppo_fast.py replay the policy step and the update step as CUDA graphs; rlrec uses
# torch.compile's own). Elsewhere torch.compile's default: CUDA graphs do not apply, and
# max-autotune's kernel search costs minutes of compile time for the small MLPs of PPO.
COMPILE_MODES: Dict[str, Optional[str]] = {"cuda": "reduce-overhead"}

# what PPO.update returns the mean of over its minibatches, in the order a minibatch's stats hold
# them: the losses, the approximate KL, the clipped fraction and the gradient norm before the clip
UPDATE_STATS = (
    "loss/policy",
    "loss/value",
    "loss/entropy",
    "loss/approx_kl",
    "loss/clipfrac",
    "train/grad_norm",
)


class PPO:
    """Owns the model, the optional observation and return normalisers, the optimizer and the
    rollout storage; knows nothing of envs. The runner's collection loop is ``act`` -> env step
    -> ``process_env_step``, then ``compute_returns`` and ``update``.

    Several ranks: one policy (rank 0's initial weights), gradients averaged every minibatch,
    normaliser statistics merged every update, the KL stop on the mean KL."""

    def __init__(
        self, cfg: PPOConfig, obs_space: gym.Space, action_space: gym.Space, device: torch.device
    ):
        self.cfg, self.device, self.action_space = cfg, device, action_space
        self.obs_shape = shape = shape_of(obs_space)
        self.agent = ActorCritic(
            obs_space,
            action_space,
            list(cfg.hidden_sizes),
            cfg.activation,
            cfg.init_log_std,
            cfg.init,
            cfg.encoder,
        ).to(device)
        self.world = distributed.world_size()
        distributed.broadcast_module_(self.agent)
        # the state part: an image is never normalised
        state = shape.get(STATE) if isinstance(shape, dict) else shape
        norm = lambda shape: ObsNormalizer(shape, pending=self.world > 1).to(device)  # noqa: E731
        self.obs_norm = norm(state) if cfg.norm_obs and state is not None else None
        # algo.norm_reward: the running statistics of each env's discounted return so far
        self.return_norm = norm(()) if cfg.norm_reward else None
        self._returns = torch.zeros(0, device=device)  # made by init_storage
        # the clip range (and, compiled, the learning rate) is a tensor, changed in place by
        # set_schedule, so annealing it never recompiles
        self.clip_coef = torch.tensor(cfg.clip_coef, device=device)
        self.compiled = bool(cfg.compile)
        self.optimizer = self._optimizer()
        self._params = list(self.agent.parameters())
        # the parameter sets max_grad_norm clips, each on its own (algo.grad_clip)
        critic = list(self.agent.critic.parameters())
        actor = [p for p in self._params if all(p is not q for q in critic)]
        per_network = cfg.grad_clip == GradClip.per_network
        self._clip_sets = [actor, critic] if per_network else [self._params]
        # the RolloutStorage (init_storage); (obs, action, logprob, value) of the last act()
        self.storage = self._transition = None
        # algo.compile: the rollout's policy step, the minibatch loss (with its backward pass)
        # and the optimizer step are each one compiled graph (fullgraph: a graph break is an
        # error; torch's optimizers break the graph around their step on purpose); on CUDA they
        # run as CUDA graphs (COMPILE_MODES), one launch each
        mode = COMPILE_MODES.get(device.type)
        self._cudagraphs = self.compiled and mode == "reduce-overhead"
        compiled = partial(torch.compile, mode=mode) if self.compiled else lambda f, **_: f
        self._policy_step = compiled(self._policy_step_eager, fullgraph=True)
        self._loss = compiled(self._loss_eager, fullgraph=True)
        self._optimizer_step = compiled(self._optimizer_step_eager)

    def _optimizer(self):
        """Adam: torch's fused kernel (one kernel for all parameters; FusedAdam is that kernel
        without torch.optim's import of torch._dynamo), or with ``algo.compile`` torch.optim's
        Adam with a tensor learning rate (read by the compiled step). ``_opt_flags``: what this
        run's Adam is, kept over a loaded state."""
        cfg, compiled = self.cfg, self.compiled
        fused = not compiled and fused_available(self.device)
        capturable = compiled and self.device.type == "cuda"
        self._opt_flags = {"foreach": False if compiled else None, "fused": fused or None}
        self._opt_flags["capturable"] = capturable
        params, eps = self.agent.parameters(), cfg.adam_eps
        if fused:
            return FusedAdam(params, lr=cfg.learning_rate, eps=eps)
        lr = torch.tensor(cfg.learning_rate, device=self.device) if compiled else cfg.learning_rate
        return torch.optim.Adam(params, lr=lr, eps=eps, **self._opt_flags)

    def init_storage(self, num_envs: int) -> RolloutStorage:
        """Preallocates the ``[num_steps, num_envs]`` rollout tensors on the device."""
        self._returns = torch.zeros(num_envs, device=self.device)
        action = self.agent.action_shape, action_dtype(self.action_space)
        self.storage = RolloutStorage(
            self.cfg.num_steps, num_envs, self.obs_shape, *action, self.device
        )
        return self.storage

    def rollout_mode(self):
        """The grad mode of rollouts (and of the env resets and restores whose tensors they update
        in place): ``torch.inference_mode()``, or with ``algo.compile`` ``torch.no_grad()``: on
        torch before 2.11 a first CUDA graph capture (the policy step's) inside inference mode
        makes every later capture outside it (the update's) fail with "Inplace update to
        inference tensor outside InferenceMode"."""
        return torch.no_grad() if self.compiled else torch.inference_mode()

    # ------------------------------------------------------------------ acting
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Collection: normalises ``obs`` (updating the statistics), samples an action and keeps
        what the transition needs until :meth:`process_env_step`. The noise is drawn here by the
        default generator and the policy step (:meth:`ActorCritic.act_with_noise`) turns it into
        the action: a Gaussian action is the number ``Normal.sample`` draws, a categorical one a
        Gumbel-max sample (cheaper than ``torch.multinomial`` for a CPU rollout's batches)."""
        obs = as_float(obs)
        if self.obs_norm is not None:  # in place, outside the graph: it reads the buffers
            self.obs_norm.update(obs)
        noise_fn = torch.rand if self.agent.discrete else torch.randn
        noise = noise_fn(self.agent.noise_shape(batch_size(obs)), device=self.device)
        if self._cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        out = self._policy_step(obs, noise)
        # a CUDA graph's outputs are overwritten by its next replay: the caller owns copies
        self._transition = tuple(map_obs(torch.clone, t) for t in out) if self._cudagraphs else out
        return self._transition[1]

    def _policy_step_eager(self, obs, noise):
        """The rollout's policy step as one function of tensors (compiled by ``algo.compile``):
        normalised observation, action, its log-probability and the value."""
        nobs = obs if self.obs_norm is None else self.obs_norm(obs)
        return nobs, *self.agent.act_with_noise(nobs, noise)

    def process_env_step(
        self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, info: dict
    ) -> None:
        """Stores the transition of the last :meth:`act`: the reward scaled, divided by the
        running std of the discounted return (``algo.norm_reward``: Gymnasium's NormalizeReward,
        whose return restarts at every episode end here), clipped (``algo.clip_reward``), and each
        episode end that ``algo.bootstrap_at`` names bootstrapped from its real final observation
        (``info["final_obs"]``)."""
        cfg = self.cfg
        done = terminated | truncated  # every episode end
        reward = reward.float() * cfg.reward_scale
        if self.return_norm is not None:
            self._returns.mul_(cfg.gamma).add_(reward)
            self.return_norm.update(self._returns)
            self._returns.masked_fill_(done, 0.0)
            reward = reward / torch.sqrt(self.return_norm.var + self.return_norm.eps)
        if cfg.clip_reward is not None:
            reward = reward.clamp(-cfg.clip_reward, cfg.clip_reward)
        if "_final" in info:
            # reward + gamma * V(final_obs) where an episode ended in a way algo.bootstrap_at
            # bootstraps (GAE then treats every episode end as terminal): truncated only where
            # the time limit cut it, done at every end (ManiSkill's PPO baselines). The value is
            # taken of the ended rows alone, named by AutoReset's host index (copied without
            # waiting for the device): no host sync, no pass over the envs that did not end
            ends = done if cfg.bootstrap_at == BootstrapAt.done else truncated & ~terminated
            idx = info.get("_final_idx")  # absent: an info not from AutoReset (one sync here)
            if idx is None:
                rows = info["_final"].nonzero().flatten()
            else:
                rows = idx.to(self.device, non_blocking=True)
            final_obs = map_obs(lambda t: t[rows], info["final_obs"])
            bootstrap = cfg.gamma * self.agent.value(self.normalize(final_obs)) * ends[rows]
            reward = reward.index_add(0, rows, bootstrap)
        self.storage.add(*self._transition, reward, done.float())  # type: ignore[union-attr,misc]

    def compute_returns(self, last_obs: torch.Tensor) -> None:
        """GAE over the filled storage, bootstrapped from the value of the observation after it."""
        last_value = self.agent.value(self.normalize(last_obs))
        self.storage.compute_gae(last_value, self.cfg.gamma, self.cfg.gae_lambda)  # type: ignore[union-attr]

    def act_inference(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Evaluation: the action for raw observations (statistics untouched, no critic pass)."""
        return self.agent.action(self.normalize(obs), deterministic=deterministic)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` as the policy sees it (the statistics untouched)."""
        obs = as_float(obs)
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def set_schedule(self, frac_remaining: float) -> float:
        """Anneals the learning rate (and, with ``anneal_clip``, the clip range) linearly to 0
        over training; returns the learning rate."""
        cfg = self.cfg
        lr = cfg.learning_rate * (frac_remaining if cfg.anneal_lr else 1.0)
        for group in self.optimizer.param_groups:
            if self.compiled:
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self.clip_coef.fill_(cfg.clip_coef * (frac_remaining if cfg.anneal_clip else 1.0))
        return lr

    # ------------------------------------------------------------------ learning
    def update(self, storage: Optional[RolloutStorage] = None) -> Dict[str, float]:
        """Runs the PPO epochs on a filled storage (its own by default); returns mean losses and
        diagnostics (:data:`UPDATE_STATS`), summed on the device and read back once at the end.
        Each epoch gathers its shuffled batch once; a minibatch is one loss, one backward pass and
        one optimizer step, with no host sync. With ``target_kl`` the epochs stop once the
        approximate KL exceeds it: ``algo.kl_check=epoch`` checks the last minibatch's KL after
        each epoch (CleanRL: a sync per epoch), ``minibatch`` each minibatch's before its step,
        which it then skips (ManiSkill's ppo.py: a sync per minibatch)."""
        storage = self.storage if storage is None else storage
        cfg = self.cfg
        totals = torch.zeros(len(UPDATE_STATS), device=self.device)  # summed on the device
        n_updates = 0
        for norm in (self.obs_norm, self.return_norm):  # every rank's of this rollout, merged
            if norm is not None:
                norm.merge_pending(distributed.all_reduce_)
        kl_limit = cfg.target_kl if cfg.kl_check == KLCheck.minibatch else None
        per_epoch = cfg.target_kl is not None and kl_limit is None
        stats: Optional[torch.Tensor] = None
        for _epoch in range(cfg.update_epochs):
            for mb in storage.minibatches(cfg.num_minibatches):  # type: ignore[union-attr]
                if self._cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                stats = self._train_step(mb, kl_limit)
                if stats is None:  # kl_check=minibatch: over target_kl, this one took no step
                    break
                totals += stats  # read before the next step (a CUDA graph's output is reused)
                n_updates += 1
            if stats is None or (per_epoch and self._kl_above(stats[3], cfg.target_kl)):
                break
        y, pred = storage.returns.flatten(), storage.values.flatten()  # type: ignore[union-attr]
        var_y = y.var()
        explained = torch.where(var_y == 0, float("nan"), 1 - (y - pred).var() / var_y)
        keys, extra = [*UPDATE_STATS, "loss/explained_variance"], [explained.reshape(1)]
        if not self.agent.discrete:
            keys.append("policy/std")
            extra.append(self.agent.log_std.detach().exp().mean().reshape(1))
        # the update's one read back (besides the KL checks): every statistic at once
        out = dict(zip(keys, torch.cat([totals / max(1, n_updates), *extra]).tolist()))
        out["loss/updates"] = float(n_updates)
        storage.clear()  # type: ignore[union-attr]
        return out

    def _train_step(self, mb, kl_limit):
        """One minibatch (a :meth:`RolloutStorage.minibatches` item): the clipped PPO loss, its
        backward pass, the gradient clip and the Adam step; the :data:`UPDATE_STATS` of this
        minibatch as one tensor (nothing read back). ``kl_limit`` (``algo.kl_check=minibatch``):
        above it, None before any gradient is taken."""
        # the gradients are dropped, never zeroed: under CUDA graphs the last minibatch's are the
        # outputs of its backward graph's replay, in the CUDA-graph pool, which the replays since
        # have overwritten (torch's cudagraph_trees: "set .grad to None before each backward").
        # The new ones are outputs recorded by the backward graph, which the optimizer graph
        # reads in place
        self.optimizer.zero_grad(set_to_none=True)
        loss, stats = self._loss(*mb.values(), self.clip_coef)  # in the order the loss takes them
        if kl_limit is not None and self._kl_above(stats[3], kl_limit):
            return None
        loss.backward()
        # several ranks: one all-reduce of the flat gradient (in place: CUDA graphs keep it)
        distributed.mean_grads_(self._params)
        return torch.cat((stats, self._optimizer_step().reshape(1)))

    def _kl_above(self, approx_kl, limit):
        """Whether this minibatch's approximate KL (the mean over ranks: every rank decides the
        same) is above ``limit``; one host sync."""
        kl = approx_kl.detach().clone()
        if self.world > 1:
            distributed.all_reduce_(kl, "mean")
        return float(kl) > limit

    def _loss_eager(self, obs, actions, old_logprobs, old_values, advantages, returns, clip):
        """``(loss, [policy, value, entropy, approx_kl, clipfrac])`` of one minibatch (tensors;
        ``clip``: the clip range)."""
        cfg = self.cfg
        logprob, entropy, value = self.agent.evaluate(obs, actions)
        logratio = logprob - old_logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
        adv = advantages
        if cfg.norm_adv and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
        if cfg.clip_vloss:
            v_clipped = old_values + (value - old_values).clamp(-clip, clip)
            v_loss = 0.5 * torch.max((value - returns) ** 2, (v_clipped - returns) ** 2).mean()
        else:
            v_loss = 0.5 * ((value - returns) ** 2).mean()
        ent = entropy.mean()
        loss = pg_loss
        if cfg.ent_coef:  # no entropy bonus: its terms stay out of the backward pass
            loss = loss - cfg.ent_coef * ent
        loss = loss + cfg.vf_coef * v_loss
        return loss, torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac]).detach()

    def _optimizer_step_eager(self):
        """The gradient clip (``clip_grad_norm_`` of each parameter set of ``algo.grad_clip``: it
        multiplies by the clamped factor on the device, no host sync) and the Adam step; returns
        the norm of the whole gradient before the clip."""
        max_norm = self.cfg.max_grad_norm
        norms = [nn.utils.clip_grad_norm_(ps, max_norm, foreach=True) for ps in self._clip_sets]
        self.optimizer.step()
        grad_norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
        return grad_norm.detach()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The same in both modes (``algo.compile`` or not): a float learning rate, so a
        checkpoint resumes compiled or eager."""
        optimizer = self.optimizer.state_dict()
        for group in optimizer["param_groups"]:
            group["lr"] = float(group["lr"])  # a tensor under algo.compile
        return {
            "agent": self.agent.state_dict(),
            "optimizer": optimizer,
            "obs_norm": None if self.obs_norm is None else self.obs_norm.state_dict(),
            "return_norm": None
            if self.return_norm is None
            else (self.return_norm.state_dict(), self._returns.clone()),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        optimizer = dict(state["optimizer"])
        # this run's Adam implementation (fused, or the compiled one) and eps, not the saver's
        optimizer["param_groups"] = [
            {**g, **self._opt_flags, "lr": float(g["lr"]), "eps": self.cfg.adam_eps}
            for g in optimizer["param_groups"]
        ]
        self.optimizer.load_state_dict(optimizer)
        if self.compiled:
            for group in self.optimizer.param_groups:
                group["lr"] = torch.tensor(group["lr"], device=self.device)
        if self.obs_norm is not None and state.get("obs_norm") is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        if self.return_norm is not None and state.get("return_norm") is not None:
            stats, returns = state["return_norm"]
            self.return_norm.load_state_dict(stats)
            self._returns = returns.to(self.device)


def action_dtype(space: gym.Space) -> torch.dtype:
    """Storage dtype of actions from ``space``."""
    return torch.long if isinstance(space, gym.spaces.Discrete) else torch.float32
