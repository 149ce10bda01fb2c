"""CartPole-v1: wall time to reach and hold an eval return of 475, rlrec against Stable-Baselines3
(``pip install -c scripts/constraints.txt -e '.[bench]'``).

    python scripts/bench_cartpole.py          # seeds 1 2 3, the sides one after the other

Each run is a fresh process timed from just before its start, one at a time, with ``--threads``
torch threads: ``train.py env=gymnasium env.id=CartPole-v1 +experiment=cartpole``, and SB3's PPO
with rl-baselines3-zoo's CartPole-v1 settings and evaluation (every 25,000 steps, 5 episodes). Reach
and hold: the first evaluation >= 475 after which every later one is too. Per side, medians over
seeds: seconds, env steps and steps/s to it, and the whole run's steps/s (to its last evaluation).
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import benchlib as bl


def sb3_worker(seed: int, steps: int, eval_freq: int, episodes: int, out: str) -> None:
    """SB3 PPO with rl-zoo's CartPole-v1 settings; a line per evaluation appended to ``out``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env

    log = open(out, "a", buffering=1)

    class Report(EvalCallback):
        def _on_step(self) -> bool:
            ok = super()._on_step()
            if self.n_calls % self.eval_freq == 0:  # an evaluation just ran
                line = {"step": self.num_timesteps, "eval/return": float(self.last_mean_reward)}
                log.write(json.dumps(line) + "\n")
            return ok

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    evals = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 10_000)
    lin = lambda v: lambda remaining: remaining * v  # noqa: E731  (the zoo's lin_ schedules)
    zoo = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
    model = PPO("MlpPolicy", env, learning_rate=lin(1e-3), clip_range=lin(0.2), **zoo, seed=seed)
    cb = Report(evals, eval_freq=max(eval_freq // 8, 1), n_eval_episodes=episodes, verbose=0)
    model.learn(total_timesteps=steps, callback=cb)


def reach_and_hold(run: dict, threshold: float) -> Optional[dict]:
    """The first evaluation >= threshold after which all later ones are >= threshold too."""
    hit = None
    for e in run["evals"]:
        hit = (hit or e) if e["return"] >= threshold else None
    return hit


def run(side: str, seed: int, a) -> dict:
    run_dir = a.bench.runs.new(f"bench_cartpole_{side}_s{seed}_")
    metrics = run_dir / "metrics.jsonl"
    if side == "rlrec":
        over = ["env=gymnasium", "env.id=CartPole-v1", "+experiment=cartpole", f"seed={seed}"]
        cmd = bl.train_cmd([*over, *a.rlrec_override], run_dir, a.threads)
    else:
        cmd = [sys.executable, __file__, *a.bench.argv, "--sb3-worker", str(seed), str(metrics)]
    r = bl.follow(cmd, metrics, env=bl.env(a.threads))
    r["evals"] = [
        {"t": t, "step": x["step"], "return": x["eval/return"]}
        for t, x in r["lines"]
        if "eval/return" in x
    ]
    r["hit"] = reach_and_hold(r, a.threshold)
    hit = r["hit"] or {}
    print(
        f"{side} seed {seed}: time-to-{a.threshold:g} {bl.fmt(hit.get('t'), '.1f')} s, env steps "
        f"{bl.fmt(hit.get('step'))}; evals {[round(e['return']) for e in r['evals']]}",
        flush=True,
    )
    return r


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    p = b.parser
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--only", choices=["rlrec", "sb3"], help="run one side only")
    p.add_argument("--sb3-steps", type=int, default=100_000, help="rl-zoo n_timesteps")
    p.add_argument("--sb3-eval-freq", type=int, default=25_000, help="env steps between evals")
    p.add_argument("--sb3-eval-episodes", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    p.add_argument("--rlrec-override", nargs="*", default=[], help="Hydra overrides for train.py")
    p.add_argument("--sb3-worker", nargs=2, metavar=("SEED", "OUT"), help="(internal)")
    a = b.args()
    if a.sb3_worker:
        import torch

        torch.set_num_threads(a.threads)
        seed, out = a.sb3_worker
        return sb3_worker(int(seed), a.sb3_steps, a.sb3_eval_freq, a.sb3_eval_episodes, out)
    a.bench = b
    sides = [s for s in ("rlrec", "sb3") if a.only in (None, s)]
    if "sb3" in sides:
        bl.require("stable_baselines3", "stable-baselines3")
    results = {s: [] for s in sides}
    for seed in a.seeds:
        for side in sides:
            results[side].append(run(side, seed, a))
    hit = lambda key: lambda r: r["hit"] and r["hit"][key]  # noqa: E731
    last = lambda r: r["evals"] and r["evals"][-1]["step"] / r["evals"][-1]["t"]  # noqa: E731
    b.out(
        f"CartPole-v1, reach and hold eval return >= {a.threshold:g}, seeds {a.seeds}, torch "
        f"threads {a.threads}: medians over seeds ('-': never held)"
    )
    columns = [
        (f"s to {a.threshold:g}", hit("t"), ".1f"),
        ("env steps", hit("step"), ",.0f"),
        ("steps/s", lambda r: r["hit"] and r["hit"]["step"] / r["hit"]["t"], ",.0f"),
        ("whole-run steps/s", last, ",.0f"),
    ]
    bl.compare(b, results, columns, ("rlrec", "sb3") if len(sides) == 2 else ())
    b.finish()


if __name__ == "__main__":
    main()
