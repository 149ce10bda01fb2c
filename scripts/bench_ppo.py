"""Where PPO's time goes on the built-in env, at several num_envs, measured side by side in one run.

    python scripts/bench_ppo.py [--num-envs 16 256 4096] [--device cpu] [--iters 5] [--compile]

Per num_envs: env-only steps/s (random actions), rollout steps/s (policy, env and storage, as in
training), the update's seconds per iteration (4 epochs of 4 minibatches, no KL stop) and its share
of an iteration; ``floor``: the networks' own forward and backward passes in those epochs alone
(the least any formulation of them can take) and its share. ``--compile``: the same update with
``algo.compile=true`` on the same rollout (its first update, the compile, apart), over the eager.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import benchlib as bl
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO

FIELDS = ("obs", "actions", "logprobs", "values", "advantages", "returns")


def seconds(fn, iters: int) -> tuple:
    """(the first call's seconds, the median of the next ``iters``)."""
    times = [bl.per_call(fn, 1)[0] for _ in range(iters + 1)]
    return times[0], statistics.median(times[1:])


def update(ppo: PPO, storage) -> None:
    """An update on the same rollout (it changes none of the storage's tensors, but clears it)."""
    storage.step = storage.num_steps
    ppo.update(storage)


def floor(ppo: PPO, obs: torch.Tensor) -> None:
    """For every minibatch of every epoch (the counts and sizes of ``PPO.update``) a forward pass
    of the actor and the critic over its observations and one backward pass: nothing else."""
    size = obs.shape[0] // ppo.cfg.num_minibatches
    for _ in range(ppo.cfg.update_epochs):
        for mb in obs.split(size)[: ppo.cfg.num_minibatches]:
            (ppo.agent.actor(mb).sum() + ppo.agent.critic(mb).sum()).backward()


def bench(num_envs: int, device: str, iters: int, compile: bool, num_steps: int = 32) -> dict:
    env, dev = AutoReset(PointReach(num_envs, device=device)), torch.device(device)
    algo = PPOConfig(num_steps=num_steps, target_kl=None)
    ppo = PPO(algo, env.single_observation_space, env.single_action_space, dev)
    batch, storage = iters * num_steps * num_envs, ppo.init_storage(num_envs)
    with torch.inference_mode():
        obs, _ = env.reset(seed=0)
        actions = torch.rand(num_steps, num_envs, 2, device=device) * 2 - 1
        for a in actions[:4]:  # warm-up
            env.step(a)
        out = {"env": batch / bl.per_call(lambda: [env.step(a) for a in actions], iters)[0] / iters}

        def rollout():  # training's own calls: PPO.act, the env's step, process_env_step, GAE
            nonlocal obs
            storage.clear()
            for _ in range(num_steps):
                obs, reward, term, trunc, info = env.step(ppo.act(obs))
                ppo.process_env_step(reward, term, trunc, info)
            ppo.compute_returns(obs)

        out["rollout"] = batch / bl.per_call(rollout, iters)[0] / iters
    flat = storage.obs.reshape(-1, *storage.obs.shape[2:]).clone()
    out["floor"] = seconds(lambda: floor(ppo, flat), iters)[1]
    ppo.optimizer.zero_grad(set_to_none=True)
    out["update"] = seconds(lambda: update(ppo, storage), iters)[1]
    if compile:
        spaces = env.single_observation_space, env.single_action_space
        compiled = PPO(replace(algo, compile=True), *spaces, dev)
        compiled.load_state_dict(ppo.state_dict())
        copy = compiled.init_storage(num_envs)  # ordinary tensors: no inference ones in graphs
        for name in FIELDS:
            getattr(copy, name).copy_(getattr(storage, name))
        out["compile"], out["compiled"] = seconds(lambda: update(compiled, copy), iters)
    return out


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    b.parser.add_argument("--num-envs", type=int, nargs="+", default=[16, 256, 4096])
    b.parser.add_argument("--device", default="cpu")
    b.parser.add_argument("--iters", type=int, default=5)
    b.parser.add_argument("--threads", type=int, default=1, help="torch threads (rlrec's: 1)")
    b.parser.add_argument("--compile", action="store_true", help="also time algo.compile=true")
    a = b.args()
    torch.set_num_threads(a.threads)
    rows = []
    for n in a.num_envs:
        r = bench(n, a.device, a.iters, a.compile)
        collect = 32 * n / r["rollout"]
        row = [n, f"{r['env']:,.0f}", f"{r['rollout']:,.0f}", f"{r['rollout'] / r['env']:.3f}"]
        row += [f"{r['update']:.3f}", f"{r['update'] / (r['update'] + collect):.1%}"]
        row += [f"{r['floor']:.3f}", f"{r['floor'] / (r['floor'] + collect):.1%}"]
        if a.compile:
            row += [f"{r['compiled']:.3f}", f"{r['compiled'] / r['update']:.2f}"]
            row.append(f"{r['compile']:.1f}")
        rows.append(row)
        print(row, flush=True)
    b.out(f"built-in env, device={a.device}, num_steps=32, torch threads={a.threads}")
    head = ["num_envs", "env-only steps/s", "rollout steps/s", "rollout/env", "update s/iter"]
    head += ["update share", "floor s", "floor share"]
    head += ["compiled s/iter", "compiled/eager", "compile s"] * a.compile
    b.table(head, rows)
    b.finish()


if __name__ == "__main__":
    main()
