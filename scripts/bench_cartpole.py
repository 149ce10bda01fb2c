#!/usr/bin/env python
"""CartPole-v1: wall time to reach, and then hold, an eval return of 475, rlrec vs
Stable-Baselines3.

    pip install -c scripts/constraints.txt -e '.[bench]'  # stable-baselines3
    python scripts/bench_cartpole.py                      # 3 seeds, both sides, one after the other

Each run is a fresh process, timed from just before it is started (imports included):

- rlrec: ``python train.py env=gymnasium env.id=CartPole-v1 +experiment=cartpole seed=S``
  (plus ``logger=none``: no TensorBoard files, and ``torch_threads``; the evaluations and eval
  videos of the preset stay as they are). Its evals are read from ``metrics.jsonl`` as they are
  written (polled every 10 ms).
- SB3: PPO with rl-baselines3-zoo's tuned CartPole-v1 hyper-parameters (hyperparams/ppo.yml:
  n_envs 8, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0,
  learning_rate lin_0.001, clip_range lin_0.2, MlpPolicy, 1e5 steps) and the zoo's default
  evaluation (every 25,000 env steps, 5 deterministic episodes on one env).

"Reaches and holds" = the first evaluation with mean return >= threshold after which every later
evaluation of that run is >= threshold as well. Reported per run: time to it (s from process
start), env steps at it, and steps/s = those steps / that time (so start-up and evals count; a run
that holds 475 sooner shows fewer steps/s, start-up being a larger share). Beside it, the
whole-run steps/s: env steps at the run's last evaluation over the time to it (start-up and
evaluations included; rlrec's report, written after it, not), a throughput that does not depend
on when 475 is first held.
The two sides run one after the other, never at once, with the same torch thread count
(``--threads``, default 1) and ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from metrics_tail import MetricsTail, RunDirs

ROOT = Path(__file__).resolve().parent.parent
RUNS = RunDirs()  # the runs' folders, removed at exit unless --keep-runs


# --------------------------------------------------------------------------- SB3 worker


def sb3_worker(
    seed: int, t0: float, steps: int, eval_freq: int, eval_episodes: int, threads: int
) -> None:
    """Runs SB3 PPO (rl-zoo CartPole-v1 settings); prints one JSON line per evaluation."""
    import torch

    torch.set_num_threads(threads)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env

    n_envs = 8

    def lin(value: float):
        return lambda progress_remaining: progress_remaining * value

    class Report(EvalCallback):
        def _on_step(self) -> bool:
            ok = super()._on_step()
            if self.n_calls % self.eval_freq == 0:  # an evaluation just ran
                print(
                    json.dumps(
                        {
                            "t": time.time() - t0,
                            "step": self.num_timesteps,
                            "return": float(self.last_mean_reward),
                        }
                    ),
                    flush=True,
                )
            return ok

    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 10_000)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=lin(1e-3),
        clip_range=lin(0.2),
        seed=seed,
        verbose=0,
    )
    callback = Report(
        eval_env,
        eval_freq=max(eval_freq // n_envs, 1),
        n_eval_episodes=eval_episodes,
        deterministic=True,
        verbose=0,
    )
    model.learn(total_timesteps=steps, callback=callback)
    print(json.dumps({"end": time.time() - t0, "step": model.num_timesteps}), flush=True)


# --------------------------------------------------------------------------- runs


def _env(args) -> dict:
    """The same thread settings for both sides."""
    n = str(args.threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, RLREC_PROGRESS="")


def run_sb3(seed: int, args) -> dict:
    t0 = time.time()
    cmd = [
        sys.executable,
        __file__,
        "--sb3-worker",
        "--seed",
        str(seed),
        "--t0",
        repr(t0),
        "--sb3-steps",
        str(args.sb3_steps),
        "--sb3-eval-freq",
        str(args.sb3_eval_freq),
        "--sb3-eval-episodes",
        str(args.sb3_eval_episodes),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(args))
    if out.returncode != 0:
        raise RuntimeError(f"SB3 run failed (seed {seed}):\n{out.stderr[-3000:]}")
    evals, end = [], None
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if "end" in rec:
                end = rec
            else:
                evals.append(rec)
    return {
        "evals": evals,
        "wall": end["end"] if end else time.time() - t0,
        "steps": end["step"] if end else None,
    }


def run_rlrec(seed: int, args) -> dict:
    run_dir = RUNS.new(f"bench_rlrec_s{seed}_")
    metrics = run_dir / "metrics.jsonl"
    cmd = [
        sys.executable,
        "train.py",
        "env=gymnasium",
        "env.id=CartPole-v1",
        "+experiment=cartpole",
        f"seed={seed}",
        "logger=none",
        f"torch_threads={args.threads}",
        f"hydra.run.dir={run_dir}",
        *args.rlrec_override,
    ]
    env = _env(args)
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    evals: List[dict] = []
    tail, last_step = MetricsTail(metrics, t0), 0

    def read_new() -> None:
        nonlocal last_step
        for now, rec in tail.read():
            last_step = max(last_step, rec.get("step", 0))
            if "eval/return" in rec:
                evals.append({"t": now, "step": rec["step"], "return": rec["eval/return"]})

    while proc.poll() is None:
        read_new()
        time.sleep(0.01)
    wall = time.time() - t0
    read_new()
    log = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"rlrec run failed (seed {seed}):\n{log[-3000:]}")
    return {"evals": evals, "wall": wall, "steps": last_step, "run_dir": str(run_dir)}


def reach_and_hold(evals: List[dict], threshold: float) -> Optional[dict]:
    """The first evaluation >= threshold after which all later ones are >= threshold too."""
    hit = None
    for rec in evals:
        if rec["return"] >= threshold:
            hit = hit or rec
        else:
            hit = None
    return hit


# --------------------------------------------------------------------------- report


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--only", choices=["rlrec", "sb3"], default=None, help="run one side only")
    p.add_argument("--sb3-steps", type=int, default=100_000, help="rl-zoo n_timesteps")
    p.add_argument(
        "--sb3-eval-freq", type=int, default=25_000, help="env steps between evals (rl-zoo default)"
    )
    p.add_argument("--sb3-eval-episodes", type=int, default=5, help="rl-zoo default")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of both sides (1: fastest for these tiny MLPs; with more threads "
        "than free cores, OpenMP spinning slowed SB3 down 20x on a busy 2-core machine)",
    )
    p.add_argument(
        "--rlrec-override", nargs="*", default=[], help="extra Hydra overrides for train.py"
    )
    p.add_argument("--json", type=str, default=None, help="also write all results to this file")
    p.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    RUNS.add_argument(p)
    args = p.parse_args()
    RUNS.start(args.keep_runs)
    if args.sb3_worker:
        sb3_worker(
            args.seed,
            args.t0 or time.time(),
            args.sb3_steps,
            args.sb3_eval_freq,
            args.sb3_eval_episodes,
            args.threads,
        )
        return

    sides = [s for s in ("rlrec", "sb3") if args.only in (None, s)]
    if "sb3" in sides:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            sys.exit(
                "bench_cartpole: SB3 is missing: "
                "pip install -c scripts/constraints.txt -e '.[bench]'"
            )
    results = {s: [] for s in sides}
    runners = {"rlrec": run_rlrec, "sb3": run_sb3}
    for seed in args.seeds:
        for side in sides:
            res = runners[side](seed, args)
            hit = reach_and_hold(res["evals"], args.threshold)
            res.update(seed=seed, hit=hit)
            results[side].append(res)
            t = None if hit is None else hit["t"]
            steps = None if hit is None else hit["step"]
            print(
                f"{side:6s} seed {seed}: time-to-{args.threshold:g} {_fmt(t, '.1f')} s, "
                f"env steps {_fmt(steps, ',')}, steps/s {_fmt(steps / t if hit else None, ',.0f')} "
                f"| run {res['wall']:.1f} s, {res['steps']:,} steps, "
                f"evals {[round(e['return']) for e in res['evals']]}",
                flush=True,
            )

    print(
        f"\nCartPole-v1, reach and hold eval return >= {args.threshold:g}, seeds {args.seeds} "
        f"(median over seeds; '-' = never held)"
    )
    summary = {}
    for side in sides:
        hits = [r["hit"] for r in results[side]]
        held = [h for h in hits if h is not None]
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        summary[side] = {
            "held": f"{len(held)}/{len(hits)}",
            "time": med([h["t"] for h in held]),
            "steps": med([h["step"] for h in held]),
            "sps": med([h["step"] / h["t"] for h in held]),
            # the whole run, start-up included, to its last evaluation (rlrec's report after it
            # left out): throughput not tied to when 475 is first held
            "run_sps": med([r["evals"][-1]["step"] / r["evals"][-1]["t"] for r in results[side]]),
            "all_times": [None if h is None else round(h["t"], 2) for h in hits],
        }
        s = summary[side]
        print(
            f"  {side:6s} held {s['held']}  time-to-{args.threshold:g} {_fmt(s['time'], '.1f')} s  "
            f"env steps {_fmt(s['steps'], ',.0f')}  steps/s {_fmt(s['sps'], ',.0f')}  "
            f"whole-run steps/s {s['run_sps']:,.0f}  per seed {s['all_times']}"
        )
    if len(sides) == 2 and all(summary[s]["time"] for s in sides):
        a, b = summary["rlrec"], summary["sb3"]
        print(
            f"  ratio rlrec/sb3: time {a['time'] / b['time']:.2f}  "
            f"env steps {a['steps'] / b['steps']:.2f}  "
            f"steps/s {a['sps'] / b['sps']:.2f}  "
            f"whole-run steps/s {a['run_sps'] / b['run_sps']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
