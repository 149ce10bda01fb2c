"""PPO from pixels on the built-in env: env steps and wall time to an eval success of 0.9, and the
steps/s of the pixel path against the state path on the same env, side by side.

    python scripts/bench_pixels.py [--seeds 1 2 3]

Each run a fresh ``train.py +experiment=builtin_pixels`` process (state: the same preset with
``env.obs_mode=state algo.encoder=mlp``), one after the other, stopped (SIGTERM: it checkpoints and
exits) at its first evaluation with success >= ``--target``: seconds (from its start) and env steps
to it, training steps/s (collect + update) and collection steps/s; medians over seeds.
"""

from __future__ import annotations

import benchlib as bl

PATHS = {"pixels": [], "state": ["env.obs_mode=state", "algo.encoder=mlp"]}


def main() -> None:
    b = bl.Bench(__file__, __doc__, runs=True)
    b.parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    b.parser.add_argument("--target", type=float, default=0.9, help="eval success to reach")
    b.parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    b.parser.add_argument("--override", nargs="*", default=[], help="more train.py overrides")
    a = b.args()
    over = lambda path, s: ["+experiment=builtin_pixels", f"seed={s}", *PATHS[path], *a.override]  # noqa: E731
    runs = {
        p: [bl.job(b.runs, over(p, s), a.target, True, a.threads) for s in a.seeds] for p in PATHS
    }
    b.out(f"built-in env, +experiment=builtin_pixels, seeds {a.seeds}, target {a.target}")
    columns = bl.columns(f"success {a.target:g}", "step", "t", "train", "collect")
    bl.compare(b, runs, columns, ("pixels", "state"))
    b.finish()


if __name__ == "__main__":
    main()
