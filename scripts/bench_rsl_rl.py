"""Learning per env step and throughput on the built-in env: rlrec's main job against rsl_rl's
OnPolicyRunner (``pip install -c scripts/constraints.txt -e '.[bench]'``).

    python scripts/bench_rsl_rl.py            # seeds 1 2 3, the sides interleaved seed by seed

Each run is a fresh process timed from just before its start, one at a time, with ``--threads``
torch threads: ``train.py seed=S`` as it is, and rsl_rl on the same env with rlrec's PPO settings
where its config has them (``--rsl-defaults``: rsl_rl's own; docs/architecture.md says what still
differs). A run reaches ``--threshold`` at the first iteration where the mean ``train/success`` of
the last ``--window`` iterations is at or above it. Per side, medians over seeds: env steps, seconds
and steps/s to it, and the loop's steps/s (first to last iteration). ``--stop-at-hit`` ends runs
there.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import List, Optional

import benchlib as bl

NUM_ENVS, NUM_STEPS = 64, 32


def rsl_worker(a, seed: int, out: str) -> None:
    """rsl_rl's OnPolicyRunner on the built-in env; a line per iteration appended to ``out``."""
    import torch
    from rsl_rl.env import VecEnv
    from rsl_rl.runners import OnPolicyRunner
    from tensordict import TensorDict

    from rlrec.envs.autoreset import AutoReset
    from rlrec.envs.builtin import PointReach

    torch.manual_seed(seed)

    class Env(VecEnv):
        """The built-in env as rsl_rl's VecEnv: time-outs in ``extras``; the episodes and the
        successes that ended counted on the device (read once per iteration)."""

        def __init__(self):
            self.env = AutoReset(PointReach(NUM_ENVS, max_episode_steps=100, seed=seed))
            self.num_envs, self.num_actions, self.max_episode_length = NUM_ENVS, 2, 100
            self.episode_length_buf = torch.zeros(NUM_ENVS, dtype=torch.long)
            self.device, self.cfg = "cpu", {}
            self.obs, _ = self.env.reset(seed=seed)
            self.ended = torch.zeros(2, dtype=torch.float64)  # episodes, successes

        def get_observations(self):
            return TensorDict({"policy": self.obs}, batch_size=[NUM_ENVS])

        def step(self, actions):
            self.obs, reward, term, trunc, info = self.env.step(actions)
            self.ended += torch.stack([(term | trunc).sum(), info["success"].sum()])
            return self.get_observations(), reward, term | trunc, {"time_outs": trunc & ~term}

    env = Env()
    alg = dict(num_learning_epochs=4, num_mini_batches=4, clip_param=0.2, gamma=0.99, lam=0.95)
    alg.update(value_loss_coef=0.25, entropy_coef=0.0, learning_rate=3e-4, max_grad_norm=0.5)
    alg.update(use_clipped_value_loss=False, schedule="fixed", desired_kl=None)
    alg.update(normalize_advantage_per_mini_batch=True)
    model = dict(class_name="MLPModel", hidden_dims=[64, 64], activation="tanh")
    model.update(obs_normalization=True)
    cfg = {
        "num_steps_per_env": NUM_STEPS,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {"class_name": "PPO", **({} if a.rsl_defaults else alg)},
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution"}},
        "critic": model,
        "check_for_nan": False,
    }
    runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    update, log, iteration = runner.alg.update, open(out, "a", buffering=1), [0]

    def update_and_report():
        losses = update()
        iteration[0] += 1
        (episodes, successes), line = env.ended.tolist(), {"loss/policy": 0.0}
        env.ended.zero_()
        line["step"] = iteration[0] * NUM_ENVS * NUM_STEPS
        if episodes:
            line["train/success"] = successes / episodes
        log.write(json.dumps(line) + "\n")
        return losses

    runner.alg.update = update_and_report
    runner.learn(a.total_steps // (NUM_ENVS * NUM_STEPS))


def first_hit(iters: List[dict], threshold: float, window: int) -> Optional[dict]:
    """The first iteration at which the mean success of the last ``window`` iterations (one where
    no episode ended counting as 0) is at or above ``threshold``."""
    for i in range(window - 1, len(iters)):
        if sum(it["success"] for it in iters[i - window + 1 : i + 1]) >= threshold * window:
            return iters[i]
    return None


def run(side: str, seed: int, a) -> dict:
    run_dir = a.bench.runs.new(f"bench_rsl_rl_{side}_s{seed}_")
    metrics = run_dir / "metrics.jsonl"
    if side == "rlrec":
        over = [f"seed={seed}", f"total_steps={a.total_steps}", *a.rlrec_override]
        cmd = bl.train_cmd(over, run_dir, a.threads)
    else:
        cmd = [sys.executable, __file__, *a.bench.argv, "--worker", str(seed), str(metrics)]
    iters: List[dict] = []

    def stop(t: float, line: dict) -> bool:
        if "loss/policy" in line:  # an iteration's line
            iters.append({"t": t, "step": line["step"], "success": line.get("train/success", 0.0)})
        return a.stop_at_hit and first_hit(iters, a.threshold, a.window) is not None

    r = bl.follow(cmd, metrics, stop, signal.SIGKILL, env=bl.env(a.threads))
    r.update(first_hit(iters, a.threshold, a.window) or {"t": None, "step": None})
    r["loop_sps"] = None  # steps/s from the first iteration's line to the last
    if len(iters) > 1 and iters[-1]["t"] > iters[0]["t"]:
        r["loop_sps"] = (iters[-1]["step"] - iters[0]["step"]) / (iters[-1]["t"] - iters[0]["t"])
    print(f"{side} seed {seed}: {r['step']} steps, {r['t']} s to {a.threshold:g}", flush=True)
    return r


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    b.parser.add_argument("--window", type=int, default=4, help="iterations averaged over")
    b.parser.add_argument("--total-steps", type=int, default=200_000, help="per run, both sides")
    b.parser.add_argument("--rsl-defaults", action="store_true", help="rsl_rl's own PPO settings")
    b.parser.add_argument("--stop-at-hit", action="store_true", help="end runs at the threshold")
    a, results = bl.against(b, "rsl_rl", ("rsl_rl", "rsl-rl-lib"), 0.95, rsl_worker, run)
    b.out(
        f"built-in env, {NUM_ENVS} envs, training success >= {a.threshold:g}, seeds {a.seeds}, "
        f"torch threads {a.threads}: medians over seeds ('-': never reached)"
    )
    loop = ("loop steps/s", lambda r: r["loop_sps"], ",.0f")
    columns = [*bl.columns(f"{a.threshold:g} success", "step", "t", "sps"), loop]
    bl.compare(b, results, columns, tuple(results) if len(results) == 2 else ())
    b.finish()


if __name__ == "__main__":
    main()
