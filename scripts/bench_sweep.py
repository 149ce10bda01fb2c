"""Wall time of a 4-job sweep: ``hydra/launcher=joblib`` (parallel processes) vs the same 4 jobs
run one after another by Hydra's basic launcher, and the ratio.

    python scripts/bench_sweep.py                 # 4 seeds of +experiment=smoke
    python scripts/bench_sweep.py --jobs 4 --n-jobs 2 --steps 16384 --separate

Both sweeps are real ``python train.py -m`` commands (start-up, recorders and checkpoints
included) with the same overrides, ``torch_threads=1`` by default (``--threads``): the built-in
env's small MLP is fastest on one thread, and the parallel jobs then fill one core each.
``--separate`` also times the jobs as separate ``python train.py`` processes one after another.
Wall times on a shared machine vary with what else runs: repeat with ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # every finished descendant we waited for
    return ru.ru_utime + ru.ru_stime


def _run(args, cwd: Path) -> Tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, all processes) of one train.py command."""
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True
    )
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    if proc.returncode != 0:
        sys.exit(f"train.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, cpu


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=4, help="jobs in the sweep (seeds 1..N)")
    ap.add_argument("--n-jobs", type=int, default=2, help="joblib worker processes")
    ap.add_argument("--steps", type=int, default=16384, help="total_steps of each job")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch_threads of every job (0: torch's default)"
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--separate", action="store_true", help="also time separate processes in a row")
    ap.add_argument("overrides", nargs="*", help="extra overrides for every job")
    a = ap.parse_args()

    seeds = ",".join(str(s) for s in range(1, a.jobs + 1))
    common = [
        "+experiment=smoke",
        f"total_steps={a.steps}",
        "logger=none",
        "logger.progress=false",
        *([f"torch_threads={a.threads}"] if a.threads else []),
        *a.overrides,
    ]
    work = Path(tempfile.mkdtemp(prefix="rlrec-bench-sweep-"))
    try:
        for r in range(a.repeat):
            load = _load()
            seq, seq_cpu = _run(
                ["-m", f"seed={seeds}", *common, f"hydra.sweep.dir={work}/seq{r}"], work
            )
            par, par_cpu = _run(
                [
                    "-m",
                    "hydra/launcher=joblib",
                    f"hydra.launcher.n_jobs={a.n_jobs}",
                    f"seed={seeds}",
                    *common,
                    f"hydra.sweep.dir={work}/par{r}",
                ],
                work,
            )
            line = (
                f"{a.jobs} jobs x {a.steps} steps: basic launcher (sequential) {seq:.1f} s wall "
                f"({seq_cpu / seq:.2f} cores busy), joblib n_jobs={a.n_jobs} {par:.1f} s wall "
                f"({par_cpu / par:.2f} cores busy); ratio sequential/joblib {seq / par:.2f}"
            )
            if a.separate:
                sep = sum(
                    _run([f"seed={s}", *common, f"hydra.run.dir={work}/sep{r}_{s}"], work)[0]
                    for s in range(1, a.jobs + 1)
                )
                line += f"; separate processes in a row {sep:.1f} s (ratio {sep / par:.2f})"
            # the machine's load average before and after (other users' processes included)
            print(f"{line}  [load average {load} -> {_load()}, {os.cpu_count()} cores]", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
