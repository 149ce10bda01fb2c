"""Where PPO's time goes on the built-in env, at several num_envs, measured side by side in one run.

    python scripts/bench_ppo.py [--num-envs 16 256 4096] [--device cpu] [--iters 5] [--compile]

Prints, per num_envs: env-only steps/s (random actions, no policy), rollout steps/s (policy + env +
storage, as in training) and the PPO update time per iteration (the default PPOConfig: 4 epochs of
4 minibatches, no KL stop here so every iteration does the same work), plus ratios against
env-only and the update's share of an iteration. ``floor``: the networks' own arithmetic in those
epochs alone (a forward and a backward pass of the actor and the critic per minibatch: no loss
terms, no clip, no optimizer), and the share of an iteration that floor alone would take: the
least share any formulation of the same epochs can reach, whatever its overhead.
``--compile``: the same update with ``algo.compile=true`` too, on the same rollout in the same
run (its compilation, the first update, timed apart), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO, action_dtype
from rlrec.ppo.storage import RolloutStorage


def _update_s(ppo: PPO, storage: RolloutStorage, iters: int) -> tuple:
    """(the first update's seconds, the median of the next ``iters``), each on the same rollout
    (the storage's tensors restored before each: an update changes none of them, but clears it)."""
    times = []
    for _ in range(iters + 1):
        storage.step = storage.num_steps
        t0 = time.perf_counter()
        ppo.update(storage)
        times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[1:])


def _floor_s(ppo: PPO, storage: RolloutStorage, iters: int) -> float:
    """The networks' own arithmetic in an update, and nothing else: for every minibatch of every
    epoch (the same count and sizes as :meth:`PPO.update`), one forward pass of the actor and the
    critic over its observations and one backward pass, without the loss terms, the gradient clip
    or the optimizer step. No formulation of these epochs can do less; the median of ``iters``."""
    cfg = ppo.cfg
    obs = storage.obs.reshape(-1, *storage.obs.shape[2:]).clone()
    size = obs.shape[0] // cfg.num_minibatches
    times = []
    for _ in range(iters + 1):
        t0 = time.perf_counter()
        for _epoch in range(cfg.update_epochs):
            for i in range(cfg.num_minibatches):
                mb = obs[i * size : (i + 1) * size]
                out = ppo.agent.actor(mb).sum() + ppo.agent.critic(mb).sum()
                out.backward()
        times.append(time.perf_counter() - t0)
    ppo.optimizer.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def bench(
    num_envs: int, device: str, iters: int, num_steps: int = 32, compile: bool = False
) -> dict:
    env = AutoReset(PointReach(num_envs, device=device))
    algo = PPOConfig(num_steps=num_steps, target_kl=None)
    ppo = PPO(algo, env.single_observation_space, env.single_action_space, torch.device(device))
    storage = RolloutStorage(
        num_steps, num_envs, (6,), (2,), action_dtype(env.single_action_space), torch.device(device)
    )
    with torch.inference_mode():
        obs, _ = env.reset(seed=0)
        actions = torch.rand(num_steps, num_envs, 2, device=device) * 2 - 1
        # env only
        for a in actions[:4]:
            env.step(a)  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            for a in actions:
                env.step(a)
        env_sps = iters * num_steps * num_envs / (time.perf_counter() - t0)
        # rollout: training's own calls (PPO.act, env step, PPO.process_env_step, GAE)
        ppo.storage = storage
        t0 = time.perf_counter()
        for _ in range(iters):
            storage.clear()
            for _t in range(num_steps):
                action = ppo.act(obs)
                obs, reward, term, trunc, info = env.step(action)
                ppo.process_env_step(reward, term, trunc, info)
            ppo.compute_returns(obs)
        rollout_sps = iters * num_steps * num_envs / (time.perf_counter() - t0)
    out = {"env_sps": env_sps, "rollout_sps": rollout_sps}
    out["floor_s"] = _floor_s(ppo, storage, iters)
    _, out["update_s"] = _update_s(ppo, storage, iters)
    if compile:
        compiled = PPO(
            replace(algo, compile=True),
            env.single_observation_space,
            env.single_action_space,
            torch.device(device),
        )
        compiled.load_state_dict(ppo.state_dict())
        # the same rollout in ordinary tensors (the compiled graphs take no inference tensors)
        copy = RolloutStorage(
            num_steps, num_envs, (6,), (2,), storage.actions.dtype, storage.obs.device
        )
        for name in ("obs", "actions", "logprobs", "values", "advantages", "returns"):
            getattr(copy, name).copy_(getattr(storage, name))
        out["compile_s"], out["compiled_update_s"] = _update_s(compiled, copy, iters)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[16, 256, 4096])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (rlrec's default 1)")
    parser.add_argument("--compile", action="store_true", help="also time algo.compile=true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"built-in env, device={args.device}, num_steps=32, torch threads={torch.get_num_threads()}"
    )
    print(
        f"{'num_envs':>9} {'env-only SPS':>14} {'rollout SPS':>13} {'rollout/env':>12} "
        f"{'update s/iter':>14} {'update share':>13} {'floor s':>8} {'floor share':>12}"
        + (
            f" {'compiled s/iter':>16} {'compiled/eager':>15} {'compile s':>10}"
            if args.compile
            else ""
        )
    )
    for n in args.num_envs:
        r = bench(n, args.device, args.iters, compile=args.compile)
        collect_s = 32 * n / r["rollout_sps"]
        share = r["update_s"] / (r["update_s"] + collect_s)
        line = (
            f"{n:>9} {r['env_sps']:>14,.0f} {r['rollout_sps']:>13,.0f} "
            f"{r['rollout_sps'] / r['env_sps']:>12.3f} "
            f"{r['update_s']:>14.3f} {share:>13.1%} {r['floor_s']:>8.3f} "
            f"{r['floor_s'] / (r['floor_s'] + collect_s):>12.1%}"
        )
        if args.compile:
            line += (
                f" {r['compiled_update_s']:>16.3f} "
                f"{r['compiled_update_s'] / r['update_s']:>15.2f} {r['compile_s']:>10.1f}"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
