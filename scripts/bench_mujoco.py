"""MuJoCo returns of rlrec's PPO presets beside the references' PPO, run side by side in one
sitting on this machine (the same tasks, seeds, env steps and software):

    pip install -c scripts/constraints.txt -e '.[bench]'   # gymnasium[mujoco], SB3, tyro
    python scripts/bench_mujoco.py --cleanrl PATH          # +experiment=mujoco beside CleanRL
    python scripts/bench_mujoco.py --preset mujoco_tuned --sb3 --tasks HalfCheetah-v4
    python scripts/bench_mujoco.py --tasks Hopper-v4 --seeds 1 --steps 300000 --cleanrl PATH
    python scripts/bench_mujoco.py --table-of SWEEP_DIR [SWEEP_DIR ...]  # sittings' runs together

Each side is one stream of runs (task by task, seed by seed, one torch thread), the streams
started together so that each side's run of a task and seed runs beside the other's:

- rlrec: one multirun ``python train.py -m +experiment=PRESET`` over the tasks and seeds (recorder
  and evaluations on); overrides after ``--`` go to its runs.
- ``--cleanrl PATH``: CleanRL's ``ppo_continuous_action.py`` (vwxyzjn/cleanrl at 016ca33; needs
  tyro), which ``+experiment=mujoco`` reproduces, run from a copy with the one line Gymnasium >=
  1.0 needs; its ``episodic_return`` lines are its training returns (it has no deterministic eval).
- ``--sb3``: SB3's PPO with the preset's settings (``scripts/bench_sb3_ppo.py``).

Per task and side: mean +- std over seeds of the final training return (the last 10 training
episodes), of the last deterministic eval return, wall s per run and env steps/s, and rlrec against
each reference; CleanRL's published figure as context only. The runs land in ``--sweep-dir``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List

import benchlib as bl

from rlrec.layout import RunDir
from rlrec.report.html import write_report
from rlrec.report.rundata import read_jsonl, read_rows

ROOT = bl.ROOT

# CleanRL's published ppo_continuous_action.py table (MuJoCo v4 on older MuJoCo and Gym, 1M steps,
# 3 seeds): context only, never the reference (the side-by-side runs are)
PUBLISHED = {
    "HalfCheetah-v4": (1442.64, 46.03),
    "Walker2d-v4": (2287.95, 571.78),
    "Hopper-v4": (2382.86, 271.74),
    "InvertedPendulum-v4": (963.09, 22.20),
}
LAST_EPISODES = 10
PRESETS = ("mujoco", "mujoco_tuned")
# the line of CleanRL's script that Gymnasium >= 1.0 refuses, and what it becomes
CLEANRL_LINE = "lambda obs: np.clip(obs, -10, 10))"
CLEANRL_FIX = "lambda obs: np.clip(obs, -10, 10), env.observation_space)"
CLEANRL_RETURN = re.compile(r"global_step=(\d+), episodic_return=(\S+)")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def final_train_return(lines: List[dict], episodes: int = LAST_EPISODES) -> float:
    """The mean return of the last ``episodes`` training episodes: the last ``train/return``
    lines, each weighted by how many episodes it is the mean of (the oldest one in part)."""
    total = weight = 0.0
    for line in reversed([x for x in lines if "train/return" in x]):
        take = min(float(line.get("train/episodes", 1.0)), episodes - weight)
        total, weight = total + line["train/return"] * take, weight + take
        if weight >= episodes:
            break
    return total / weight if weight else float("nan")


def run_figures(run_dir: Path) -> Dict[str, Any]:
    """What one rlrec job's run dir says: final training return, last eval return, steps, wall s."""
    paths = RunDir(run_dir)
    lines = read_jsonl(paths.metrics)
    evals = [x["eval/return"] for x in lines if "eval/return" in x]
    return {
        "train": final_train_return(lines),
        "eval": evals[-1] if evals else float("nan"),
        "steps": float(max((int(x.get("step", 0)) for x in lines), default=0)),
        "wall": paths.metrics.stat().st_mtime - paths.hydra_config.stat().st_mtime,
        "run_dir": str(run_dir),
    }


def reference_figures(path: Path) -> Dict[str, Any]:
    """The figures of a reference side's ``result.json`` (:func:`run_cleanrl`, bench_sb3_ppo.py)."""
    r = json.loads(path.read_text())
    returns = r["train"]["returns"][-LAST_EPISODES:]
    evals = r.get("eval") or []
    return {
        "task": r["task"],
        "train": statistics.fmean(returns) if returns else float("nan"),
        "eval": statistics.fmean(evals) if evals else float("nan"),
        "steps": float(r["steps"]),
        "wall": float(r["wall"]),
        "run_dir": str(path.parent),
    }


def cleanrl_copy(script: Path, folder: Path) -> Path:
    """CleanRL's script copied into ``folder`` with the one line Gymnasium >= 1.0 needs."""
    text = script.read_text()
    if CLEANRL_LINE in text:
        text = text.replace(CLEANRL_LINE, CLEANRL_FIX)
    elif CLEANRL_FIX not in text:
        raise SystemExit(
            f"--cleanrl {script}: not CleanRL's ppo_continuous_action.py (no TransformObservation "
            f"line {CLEANRL_LINE!r}); take it from vwxyzjn/cleanrl at commit 016ca33"
        )
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "ppo_continuous_action.py"
    copy.write_text(text)
    return copy.resolve()  # absolute: never read as an option


def logged(side: str, command: List[str], task: str, seed: int, out: Path) -> float:
    """``command`` run in ``out`` (what it writes into its working directory lands there), its
    output in ``out/log.txt``, one torch thread; its seconds (a failure is said)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        env = {**os.environ, **ONE_THREAD}
        code = subprocess.run(command, cwd=out, stdout=log, stderr=subprocess.STDOUT, env=env)
    if code.returncode != 0:
        print(
            f"{side} {task} seed {seed}: exit {code.returncode} (see {out / 'log.txt'})", flush=True
        )
    return time.perf_counter() - t0 if code.returncode == 0 else -1.0


def run_cleanrl(script: Path, task: str, seed: int, steps: int, out: Path) -> None:
    """One CleanRL run; the training returns it printed in ``out/result.json``."""
    command = [sys.executable, str(script), "--env-id", task, "--seed", str(seed)]
    command += ["--total-timesteps", str(steps), "--no-cuda"]
    wall = logged("cleanrl", command, task, seed, out)
    if wall < 0:
        return
    found = CLEANRL_RETURN.findall((out / "log.txt").read_text())
    result = dict(side="cleanrl", task=task, seed=seed, eval=[], wall=wall)
    result["steps"] = steps - steps % 2048  # whole iterations of 2,048 steps
    result["train"] = {"returns": [float(r) for _, r in found]}
    (out / "result.json").write_text(json.dumps(result))
    print(f"cleanrl {task} seed {seed}: {len(found)} episodes in {wall:.0f} s", flush=True)


def run_sb3(preset: str, task: str, seed: int, steps: int, out: Path, extra: List[str]) -> None:
    """One SB3 run of ``preset``'s settings (scripts/bench_sb3_ppo.py)."""
    command = [sys.executable, str(ROOT / "scripts" / "bench_sb3_ppo.py"), str(out.resolve())]
    command += [str(seed), str(steps), f"+experiment={preset}", task_override(preset, [task])]
    logged("sb3", command + extra, task, seed, out)


def task_override(preset: str, tasks: List[str]) -> str:
    """The override that picks the tasks: the Zoo group of mujoco_tuned (it sets env.id and the
    task's settings), env.id otherwise."""
    return f"{'zoo' if preset == 'mujoco_tuned' else 'env.id'}={','.join(tasks)}"


def versions() -> str:
    found = []
    for name in ("torch", "gymnasium", "mujoco", "stable-baselines3", "tyro"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return f"Python {platform.python_version()}, " + ", ".join(found)


def main() -> None:
    b = bl.Bench(__file__, __doc__, fenced=True)  # its table is plain text
    ap = b.parser
    ap.add_argument("--preset", choices=PRESETS, default="mujoco", help="rlrec's +experiment")
    ap.add_argument("--tasks", nargs="+", default=["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=1_000_000, help="env steps of each run")
    ap.add_argument("--cleanrl", type=Path, metavar="PATH", help="CleanRL's script: run beside")
    ap.add_argument("--sb3", action="store_true", help="SB3's PPO with the preset's settings")
    ap.add_argument("--no-rlrec", action="store_true", help="the reference sides only")
    ap.add_argument("--sweep-dir", type=Path, help="default: outputs/bench_mujoco/<time>")
    ap.add_argument("--table-of", nargs="+", type=Path, metavar="SWEEP_DIR", help="run nothing: "
                    "the table of these sittings' completed runs together")  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="extra overrides for rlrec's runs (after --)")
    a = b.args()
    if a.table_of:
        print_table(a.table_of, b.out)
        return b.finish()
    if a.cleanrl and a.preset != "mujoco":
        ap.error("--cleanrl runs CleanRL's own settings: --preset mujoco reproduces them")
    if a.cleanrl and not a.cleanrl.is_file():
        ap.error(f"--cleanrl {a.cleanrl}: no such file")
    sweep = a.sweep_dir or ROOT / "outputs" / "bench_mujoco" / time.strftime("%Y%m%d-%H%M%S")
    sweep = sweep.resolve()
    jobs = [(task, seed) for task in a.tasks for seed in a.seeds]  # Hydra's order: seed fastest
    streams: Dict[str, Callable[[], Any]] = {}
    if not a.no_rlrec:
        command = [sys.executable, str(ROOT / "train.py"), "-m", f"+experiment={a.preset}"]
        command += [task_override(a.preset, a.tasks), f"seed={','.join(map(str, a.seeds))}"]
        command += [f"total_steps={a.steps}", "logger=none", f"hydra.sweep.dir={sweep}"]
        command += a.overrides
        print(" ".join(command[1:]), flush=True)
        streams["rlrec"] = lambda: subprocess.run(command, cwd=ROOT)
    if a.cleanrl:
        script = cleanrl_copy(a.cleanrl, sweep / "cleanrl")
        streams["cleanrl"] = lambda: [
            run_cleanrl(script, t, s, a.steps, sweep / "cleanrl" / t / f"seed{s}") for t, s in jobs
        ]
    if a.sb3:
        streams["sb3"] = lambda: [
            run_sb3(a.preset, t, s, a.steps, sweep / "sb3" / t / f"seed{s}", a.overrides)
            for t, s in jobs
        ]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=fn, name=side) for side, fn in streams.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # each stream's subprocesses end on their own (their runs' lengths)
    elapsed = time.perf_counter() - t0
    report = write_report(sweep) if "rlrec" in streams else None
    print_table([sweep], b.out)
    print(f"\nsitting {sweep} in {elapsed:.0f} s; {versions()}; report {report}", flush=True)
    b.finish()


def _pm(values: List[float]) -> str:
    values = [v for v in values if v == v]  # NaN: no such figure
    if not values:
        return "-"
    return f"{statistics.fmean(values):.2f} +- {statistics.pstdev(values):.2f}"


def collect(sweeps: List[Path]) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """``{task: {side: [run figures]}}`` of the completed runs of ``sweeps``."""
    out: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    for sweep in sweeps:
        for row in read_rows(sweep):
            if row.get("status") == "COMPLETED":
                task = str(row.get("env.id") or row.get("zoo"))
                figures = run_figures(Path(row["run_dir"]))
                out.setdefault(task, {}).setdefault("rlrec", []).append(figures)
        for side in ("cleanrl", "sb3"):
            for path in sorted((sweep / side).glob("*/seed*/result.json")):
                figures = reference_figures(path)
                out.setdefault(figures["task"], {}).setdefault(side, []).append(figures)
    return out


def print_table(sweeps: List[Path], out: Callable[[str], None] = print) -> None:
    """Per task and side, the completed runs of ``sweeps``: mean +- std over seeds."""
    by_task = collect(sweeps)
    head = ("task", "side", "runs", f"train return (last {LAST_EPISODES} ep)", "eval return")
    out(f"\n{' | '.join(head)} | wall s per run | steps/s")
    for task, sides in sorted(by_task.items()):
        means = {}
        for side, runs in sides.items():
            wall = statistics.fmean(r["wall"] for r in runs)
            sps = statistics.fmean(r["steps"] / r["wall"] for r in runs)
            train, evals = _pm([r["train"] for r in runs]), _pm([r["eval"] for r in runs])
            means[side] = (statistics.fmean(r["train"] for r in runs), wall)
            out(f"{task} | {side} | {len(runs)} | {train} | {evals} | {wall:.0f} | {sps:.0f}")
            for r in runs:
                out(
                    f"    {r['run_dir']}: train {r['train']:.2f}, eval {r['eval']:.2f}, "
                    f"{r['wall']:.0f} s"
                )
        for side in ("cleanrl", "sb3"):
            if "rlrec" in means and side in means:
                (mine, my_wall), (theirs, their_wall) = means["rlrec"], means[side]
                ratio = f" ({mine / theirs:.3f}x)" if min(mine, theirs) > 0 else ""
                out(
                    f"{task} | rlrec - {side}: train return {mine - theirs:+.2f}{ratio}, "
                    f"wall {my_wall / their_wall:.3f}x"
                )
        if task in PUBLISHED:
            out(
                f"{task} | CleanRL's published table (older MuJoCo; context only): "
                "%.2f +- %.2f" % PUBLISHED[task]
            )


if __name__ == "__main__":
    main()
