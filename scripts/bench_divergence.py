#!/usr/bin/env python
"""What the divergence check costs (rlrec/train/divergence.py): rollouts and updates of one Runner,
with the check on and with it replaced by no-ops, alternated in one process (on, off, off, on, ...)
so that both see the same machine load and neither always goes first.

    python scripts/bench_divergence.py                 # builtin env, +experiment=smoke sizes, CPU
    python scripts/bench_divergence.py --rounds 10 sim=gpu env=maniskill   # any overrides

Prints the median time of a rollout and of an update plus its check (``Runner.iterate``'s
``time/collect`` and ``time/learn``), for each, and their ratio (check on / off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlrec.train.divergence import Watch  # noqa: E402
from rlrec.train.runner import Runner  # noqa: E402
from tests.helpers import make_config  # noqa: E402


class _Off(Watch):
    def begin(self, obs):
        pass

    def step(self, obs, reward, info):
        pass

    def check(self, losses, tensors, at):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    base = ["+experiment=smoke", "recorder=none", "eval_env.enabled=false", "logger=none"]
    cfg = make_config([*base, "logger.progress=false", *args.overrides])
    with tempfile.TemporaryDirectory() as tmp:
        runner = Runner(cfg, Path(tmp))
        try:
            on = runner.watch
            off = _Off(cfg.algo.num_steps, cfg.env.num_envs, runner.device, Path(tmp))
            runner.ppo.init_storage(runner.train_env.num_envs)
            runner._obs, _ = runner.train_env.reset(seed=cfg.seed)
            runner.num_iterations = 2 * args.rounds + 2  # the schedule stays within [0, 1]
            times = {"on": ([], []), "off": ([], [])}
            for r in range(2 * args.rounds + 2):
                name = ("on", "off")[(r + r // 2) % 2]  # on off off on ...: no order bias
                runner.watch = on if name == "on" else off
                figures = runner.iterate()
                if r >= 2:  # the first round of each warms up
                    times[name][0].append(figures["time/collect"])
                    times[name][1].append(figures["time/learn"])
        finally:
            runner.close()
    for i, what in enumerate(("rollout", "update + check")):
        a, b = (statistics.median(times[k][i]) * 1e3 for k in ("on", "off"))
        print(f"{what:15s} check on {a:8.2f} ms   off {b:8.2f} ms   on/off {a / b:.3f}")


if __name__ == "__main__":
    main()
