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


def sb3_worker(a, seed: int, out: str) -> None:
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
    freq, episodes = max(a.sb3_eval_freq // 8, 1), a.sb3_eval_episodes
    model.learn(
        a.sb3_steps, callback=Report(evals, eval_freq=freq, n_eval_episodes=episodes, verbose=0)
    )


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
        cmd = [sys.executable, __file__, *a.bench.argv, "--worker", str(seed), str(metrics)]
    r = bl.follow(cmd, metrics, env=bl.env(a.threads))
    r["evals"] = [
        {"t": t, "step": x["step"], "return": x["eval/return"]}
        for t, x in r["lines"]
        if "eval/return" in x
    ]
    r.update(reach_and_hold(r, a.threshold) or {"t": None, "step": None})
    print(f"{side} seed {seed}: {r['t']} s, {r['step']} steps to {a.threshold:g}", flush=True)
    return r


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    b.parser.add_argument("--sb3-steps", type=int, default=100_000, help="rl-zoo n_timesteps")
    b.parser.add_argument("--sb3-eval-freq", type=int, default=25_000, help="steps between evals")
    b.parser.add_argument("--sb3-eval-episodes", type=int, default=5)
    a, results = bl.against(
        b, "sb3", ("stable_baselines3", "stable-baselines3"), 475.0, sb3_worker, run
    )
    last = lambda r: r["evals"] and r["evals"][-1]["step"] / r["evals"][-1]["t"]  # noqa: E731
    b.out(
        f"CartPole-v1, reach and hold eval return >= {a.threshold:g}, seeds {a.seeds}, torch "
        f"threads {a.threads}: medians over seeds ('-': never held)"
    )
    columns = [*bl.columns(f"{a.threshold:g}", "t", "step", "sps"), ("run steps/s", last, ",.0f")]
    bl.compare(b, results, columns, tuple(results) if len(results) == 2 else ())
    b.finish()


if __name__ == "__main__":
    main()
