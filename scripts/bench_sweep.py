"""Wall time of a sweep with ``hydra/launcher=joblib`` (parallel processes) against the same jobs
one after another by Hydra's basic launcher, and the ratio.

    python scripts/bench_sweep.py [--jobs 4 --n-jobs 2 --steps 16384] [--separate] [OVERRIDES]

Real ``python train.py -m`` commands (start-up, recorders, checkpoints) of ``+experiment=smoke``
seeds, ``torch_threads=1``; ``--separate`` also the jobs as separate processes in a row. Cores busy:
CPU seconds of all processes over wall seconds.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import benchlib as bl


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    p = b.parser
    p.add_argument("--jobs", type=int, default=4, help="jobs in the sweep (seeds 1..N)")
    p.add_argument("--n-jobs", type=int, default=2, help="joblib worker processes")
    p.add_argument("--steps", type=int, default=16384, help="total_steps of each job")
    p.add_argument("--threads", type=int, default=1, help="torch_threads (0: torch's default)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--separate", action="store_true", help="also separate processes in a row")
    p.add_argument("overrides", nargs="*", help="extra overrides for every job")
    a = b.args()
    seeds = ",".join(str(s) for s in range(1, a.jobs + 1))
    common = ["+experiment=smoke", f"total_steps={a.steps}", "logger=none", "logger.progress=false"]
    common += [f"torch_threads={a.threads}"] * bool(a.threads) + a.overrides
    train = [sys.executable, str(bl.ROOT / "train.py")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlrec-bench-sweep-") as work:
        for r in range(a.repeat):
            load = os.getloadavg()[0]
            cmd = [*train, "-m", f"seed={seeds}", *common]
            seq = bl.timed([*cmd, f"hydra.sweep.dir={work}/seq{r}"], Path(work))
            joblib = ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={a.n_jobs}"]
            par = bl.timed([*cmd, *joblib, f"hydra.sweep.dir={work}/par{r}"], Path(work))
            row = [f"{seq[0]:.1f} ({seq[1] / seq[0]:.2f})", f"{par[0]:.1f} ({par[1] / par[0]:.2f})"]
            row.append(f"{seq[0] / par[0]:.2f}")
            if a.separate:
                one = [*train, *common, f"hydra.run.dir={work}/sep{r}_"]
                sep = sum(
                    bl.timed(one[:-1] + [one[-1] + str(s), f"seed={s}"], Path(work))[0]
                    for s in range(1, a.jobs + 1)
                )
                row.append(f"{sep:.1f} ({sep / par[0]:.2f})")
            rows.append(row + [f"{load:.1f} -> {os.getloadavg()[0]:.1f}"])
    b.out(f"{a.jobs} jobs x {a.steps} steps, {os.cpu_count()} cores; wall s (cores busy)")
    head = ["basic launcher", f"joblib n_jobs={a.n_jobs}", "ratio"]
    head += ["separate processes (over joblib)"] * a.separate + ["load average"]
    b.table(head, rows)
    b.finish()


if __name__ == "__main__":
    main()
