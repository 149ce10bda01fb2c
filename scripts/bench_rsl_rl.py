#!/usr/bin/env python
"""Learning per env step and throughput on the built-in env: rlrec's main job against rsl_rl.

    pip install -c scripts/constraints.txt -e '.[bench]'   # rsl-rl-lib
    python scripts/bench_rsl_rl.py                         # 3 seeds, interleaved

Each run is a fresh process, timed from just before it starts (imports included), one at a time,
the two sides interleaved seed by seed, both with ``--threads`` torch threads (default 1):

- rlrec: ``python train.py seed=S logger=none`` (the main job as it is: its settings, its
  evaluations and clips); ``train/success`` of each iteration is read from ``metrics.jsonl`` as
  it is written (polled every 10 ms).
- rsl_rl: rsl-rl-lib's ``OnPolicyRunner`` on the same env (``PointReach``, 64 envs, 100-step
  episodes, seed S) with rlrec's default settings wherever its config has them: 32 steps per env,
  4 epochs of 4 minibatches, lr 3e-4 fixed (``schedule="fixed"``; rlrec: ``algo.anneal_lr=false``),
  gamma 0.99, lambda 0.95, clip 0.2, no entropy bonus, gradient norm 0.5, no clipped value loss,
  advantages normalised per minibatch, observations normalised, 64x64 tanh MLPs, initial std 1.
  rlrec's defaults have rsl_rl's choices where its config has none: each network's gradient
  clipped on its own (``algo.grad_clip=per_network``), ``nn.Linear``'s init
  (``algo.init=torch_default``), Adam's default eps 1e-8 (``algo.adam_eps``); and rsl_rl's value
  loss has no factor 1/2 (so ``value_loss_coef`` 0.25 = rlrec's ``vf_coef`` 0.5). What still
  differs: rlrec's KL early stop (``algo.target_kl`` 0.1; rsl_rl has none with a fixed
  schedule), the std (rlrec: ``exp(log_std)``; rsl_rl: the std itself as the parameter), the
  observation statistics (rlrec: updated at each step before acting; rsl_rl: once per
  iteration, after the update, with eps 1e-2 and no clip), time-outs bootstrapped from the value
  of the final observation (rsl_rl: of the observation the last action was taken in), and
  rsl_rl shuffles the batch once for all epochs (rlrec: once per epoch).
  ``--rsl-defaults`` runs rsl_rl's own defaults for the PPO settings instead (adaptive learning
  rate, 5 epochs, entropy 0.01, clipped value loss, max grad norm 1).
  ``--rlrec-override`` passes Hydra overrides to rlrec's runs (e.g. the defaults before they
  followed rsl_rl's: ``algo.init=orthogonal algo.adam_eps=1e-5 algo.anneal_lr=true``), and
  ``--stop-at-hit`` ends each run (both sides) once it reaches the threshold, to compare
  settings by env steps quickly.

Training success of an iteration: the fraction of the episodes that ended during its rollout
that ended in success (rlrec's ``train/success``); the same count on both sides. A run reaches
``--threshold`` (0.95) at the first iteration where the mean of the last ``--window`` (4)
iterations' success is at or above it: 4 iterations are 128 steps per env, more than the
100-step episode limit, so the window holds whole episodes and not only the early ones (the first
iterations see only the episodes that ended fast, which are successes). Reported per run: env
steps and seconds to it, the run's steps/s at that point (start-up included), and the loop's
steps/s (first to last iteration).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from metrics_tail import MetricsTail, RunDirs

ROOT = Path(__file__).resolve().parent.parent
RUNS = RunDirs()  # the runs' folders, removed at exit unless --keep-runs
NUM_ENVS, NUM_STEPS = 64, 32


# --------------------------------------------------------------------------- rsl_rl worker


def rsl_worker(
    seed: int, t0: float, total_steps: int, threads: int, rsl_defaults: bool
) -> None:  # pragma: no cover - runs in its own process
    """rsl_rl's OnPolicyRunner on the built-in env; one JSON line per iteration."""
    import torch

    torch.set_num_threads(threads)
    from rsl_rl.env import VecEnv
    from rsl_rl.runners import OnPolicyRunner
    from tensordict import TensorDict

    sys.path.insert(0, str(ROOT))
    from rlrec.envs.autoreset import AutoReset
    from rlrec.envs.builtin import PointReach

    torch.manual_seed(seed)

    class Env(VecEnv):
        """The built-in env as rsl_rl's VecEnv: time-outs in ``extras``, and the episodes and
        successes that ended counted on the device (read once per iteration)."""

        def __init__(self):
            self.env = AutoReset(PointReach(NUM_ENVS, max_episode_steps=100, seed=seed))
            self.num_envs, self.num_actions = NUM_ENVS, 2
            self.max_episode_length = 100
            self.episode_length_buf = torch.zeros(NUM_ENVS, dtype=torch.long)
            self.device, self.cfg = "cpu", {}
            self.obs, _ = self.env.reset(seed=seed)
            self.ended = torch.zeros(2, dtype=torch.float64)  # episodes, successes

        def get_observations(self):
            return TensorDict({"policy": self.obs}, batch_size=[NUM_ENVS])

        def step(self, actions):
            obs, reward, term, trunc, info = self.env.step(actions)
            self.obs = obs
            done = term | trunc
            self.ended[0] += done.sum()
            self.ended[1] += info["success"].sum()
            extras = {"time_outs": trunc & ~term}
            return self.get_observations(), reward, done, extras

    env = Env()
    alg = {
        "class_name": "PPO",
        "num_learning_epochs": 4,
        "num_mini_batches": 4,
        "clip_param": 0.2,
        "gamma": 0.99,
        "lam": 0.95,
        "value_loss_coef": 0.25,
        "entropy_coef": 0.0,
        "learning_rate": 3e-4,
        "max_grad_norm": 0.5,
        "use_clipped_value_loss": False,
        "schedule": "fixed",
        "desired_kl": None,
        "normalize_advantage_per_mini_batch": True,
    }
    if rsl_defaults:
        alg = {"class_name": "PPO"}
    model = {
        "class_name": "MLPModel",
        "hidden_dims": [64, 64],
        "activation": "tanh",
        "obs_normalization": True,
    }
    cfg = {
        "num_steps_per_env": NUM_STEPS,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": alg,
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution"}},
        "critic": dict(model),
        "check_for_nan": False,
    }
    runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    update = runner.alg.update
    iteration = 0

    def update_and_report():
        nonlocal iteration
        out = update()
        iteration += 1
        episodes, successes = env.ended.tolist()
        env.ended.zero_()
        rec = {"t": time.time() - t0, "step": iteration * NUM_ENVS * NUM_STEPS}
        if episodes:
            rec["success"] = successes / episodes
        print(json.dumps(rec), flush=True)
        return out

    runner.alg.update = update_and_report  # type: ignore[method-assign]
    runner.learn(total_steps // (NUM_ENVS * NUM_STEPS))


# --------------------------------------------------------------------------- runs


def _env(args) -> dict:
    n = str(args.threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, RLREC_PROGRESS="")


def run_rsl(seed: int, args) -> dict:
    t0 = time.time()
    cmd = [
        sys.executable,
        __file__,
        "--rsl-worker",
        "--seed",
        str(seed),
        "--t0",
        repr(t0),
        "--threads",
        str(args.threads),
        "--total-steps",
        str(args.total_steps),
        *(["--rsl-defaults"] if args.rsl_defaults else []),
    ]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=_env(args)
        )
        iters: List[dict] = []
        stopped = False
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith('{"t"'):
                iters.append(json.loads(line))
                if args.stop_at_hit and first_hit(iters, args.threshold, args.window):
                    proc.kill()  # this run's own child: the steps to the threshold are known
                    stopped = True
                    break
        proc.wait()
        wall = time.time() - t0
        if proc.returncode != 0 and not stopped:
            err.seek(0)
            raise RuntimeError(f"rsl_rl run failed (seed {seed}):\n{err.read()[-3000:]}")
    return {"iters": iters, "wall": wall}


def run_rlrec(seed: int, args) -> dict:
    run_dir = RUNS.new(f"bench_rsl_rl_rlrec_s{seed}_")
    metrics = run_dir / "metrics.jsonl"
    cmd = [
        sys.executable,
        "train.py",
        f"seed={seed}",
        "logger=none",
        f"torch_threads={args.threads}",
        f"total_steps={args.total_steps}",
        f"hydra.run.dir={run_dir}",
        *args.rlrec_override,
    ]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(args)
    )
    iters: List[dict] = []
    tail = MetricsTail(metrics, t0)

    def read_new() -> None:
        for now, rec in tail.read():
            if "loss/policy" in rec:  # an iteration's line
                it = {"t": now, "step": rec["step"]}
                if "train/success" in rec:
                    it["success"] = rec["train/success"]
                iters.append(it)

    stopped = False
    while proc.poll() is None:
        read_new()
        if args.stop_at_hit and first_hit(iters, args.threshold, args.window) is not None:
            proc.kill()  # this run's own child: the steps to the threshold are known
            proc.wait()
            stopped = True
            break
        time.sleep(0.01)
    wall = time.time() - t0
    read_new()
    log = proc.stdout.read()  # type: ignore[union-attr]
    if proc.returncode != 0 and not stopped:
        raise RuntimeError(f"rlrec run failed (seed {seed}):\n{log[-3000:]}")
    return {"iters": iters, "wall": wall}


def first_hit(iters: List[dict], threshold: float, window: int) -> Optional[dict]:
    """The first iteration at which the mean success of the last ``window`` iterations (an
    iteration where no episode ended counting as 0) is at or above ``threshold``."""
    for i in range(window - 1, len(iters)):
        last = iters[i - window + 1 : i + 1]
        if sum(it.get("success", 0.0) for it in last) / window >= threshold:
            return iters[i]
    return None


def loop_sps(iters: List[dict]) -> Optional[float]:
    """Steps/s from the first iteration's line to the last (start-up excluded)."""
    if len(iters) < 2 or iters[-1]["t"] <= iters[0]["t"]:
        return None
    return (iters[-1]["step"] - iters[0]["step"]) / (iters[-1]["t"] - iters[0]["t"])


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--window", type=int, default=4, help="iterations the success is averaged over")
    p.add_argument("--total-steps", type=int, default=200_000, help="per run, both sides")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    p.add_argument("--only", choices=["rlrec", "rsl_rl"], default=None, help="one side only")
    p.add_argument("--rsl-defaults", action="store_true", help="rsl_rl's own PPO settings")
    p.add_argument("--rlrec-override", nargs="*", default=[], help="extra overrides for train.py")
    p.add_argument(
        "--stop-at-hit",
        action="store_true",
        help="end each run once it reaches the threshold (to compare settings by steps; "
        "its steps/s then cover that part only)",
    )
    p.add_argument("--json", type=str, default=None, help="also write all results to this file")
    p.add_argument("--rsl-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    RUNS.add_argument(p)
    args = p.parse_args()
    RUNS.start(args.keep_runs)
    if args.rsl_worker:
        rsl_worker(
            args.seed, args.t0 or time.time(), args.total_steps, args.threads, args.rsl_defaults
        )
        return
    sides = [s for s in ("rlrec", "rsl_rl") if args.only in (None, s)]
    if "rsl_rl" in sides:
        try:
            import rsl_rl  # noqa: F401
        except ImportError:
            sys.exit(
                "bench_rsl_rl: rsl-rl-lib is missing: "
                "pip install -c scripts/constraints.txt -e '.[bench]'"
            )
    runners = {"rlrec": run_rlrec, "rsl_rl": run_rsl}
    results: dict = {s: [] for s in sides}
    for seed in args.seeds:
        for side in sides:
            res = runners[side](seed, args)
            hit = first_hit(res["iters"], args.threshold, args.window)
            res.update(seed=seed, hit=hit, loop_sps=loop_sps(res["iters"]))
            results[side].append(res)
            print(
                f"{side:6s} seed {seed}: to {args.threshold:g} success "
                f"{_fmt(hit and hit['step'], ',')} steps, {_fmt(hit and hit['t'], '.1f')} s "
                f"| loop {_fmt(res['loop_sps'], ',.0f')} steps/s, run {res['wall']:.1f} s",
                flush=True,
            )
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    print(
        f"\nbuilt-in env, {NUM_ENVS} envs, training success >= {args.threshold:g}, seeds "
        f"{args.seeds}, torch threads {args.threads} (median over seeds; '-' = never reached)"
    )
    summary = {}
    for side in sides:
        hits = [r["hit"] for r in results[side] if r["hit"] is not None]
        summary[side] = s = {
            "reached": f"{len(hits)}/{len(results[side])}",
            "steps": med([h["step"] for h in hits]),
            "time": med([h["t"] for h in hits]),
            "sps": med([h["step"] / h["t"] for h in hits]),
            "loop_sps": med([r["loop_sps"] for r in results[side] if r["loop_sps"]]),
            "all_steps": [r["hit"] and r["hit"]["step"] for r in results[side]],
        }
        print(
            f"  {side:6s} reached {s['reached']}  steps {_fmt(s['steps'], ',.0f')}  "
            f"time {_fmt(s['time'], '.1f')} s  steps/s {_fmt(s['sps'], ',.0f')}  "
            f"loop steps/s {_fmt(s['loop_sps'], ',.0f')}  per seed {s['all_steps']}"
        )
    if len(sides) == 2 and all(summary[s]["steps"] for s in sides):
        a, b = summary["rlrec"], summary["rsl_rl"]
        print(
            f"  ratio rlrec/rsl_rl: steps {a['steps'] / b['steps']:.2f}  "
            f"time {a['time'] / b['time']:.2f}  steps/s {a['sps'] / b['sps']:.2f}  "
            f"loop steps/s {a['loop_sps'] / b['loop_sps']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
