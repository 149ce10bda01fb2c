"""Multirun sweeps of the built-in env on real Hydra launchers, and the sweep summary."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import imageio_ffmpeg
import pytest
import torch
from omegaconf import OmegaConf

from rlrec.layout import SweepDir
from rlrec.run import sweep
from rlrec.train import checkpoint as ckpt
from tests.helpers import FAST, REPO, read_metrics, run_train, start_train

TINY = [*FAST, "total_steps=256", "torch_threads=1"]
PLUGIN = {"joblib": "joblib_launcher", "submitit_local": "submitit_launcher", "ray": "ray_launcher"}


def _rows(sweep_dir: Path):
    with open(sweep_dir / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def _statuses(sweep_dir: Path):
    return [(int(r["job"]), r["status"]) for r in _rows(sweep_dir)]


def _last_eval(run_dir: Path) -> dict:
    return [m for m in read_metrics(run_dir) if "eval/return" in m][-1]


def _step(run_dir: Path) -> int:
    return ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"]


def _check_job_dir(run_dir: Path, seed: int, steps: int = 256) -> None:
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").seed == seed
    assert _step(run_dir) == steps == _last_eval(run_dir)["step"]
    clips = list((run_dir / "videos" / "eval").glob("*.mp4"))
    assert clips and all(imageio_ffmpeg.count_frames_and_secs(str(c))[0] > 0 for c in clips)


def _check_summary(sweep_dir: Path, seeds) -> None:
    rows = _rows(sweep_dir)
    assert [int(r["job"]) for r in rows] == list(range(len(seeds)))
    for row, seed in zip(rows, seeds):
        run_dir = sweep_dir / row["job"]
        _check_job_dir(run_dir, seed)
        assert row["status"] == "COMPLETED" and int(row["step"]) == 256
        assert row["seed"] == str(seed) and row["swept"] == f"seed={seed}"
        assert Path(row["run_dir"]) == run_dir
        ev = _last_eval(run_dir)
        assert float(row["eval/return"]) == pytest.approx(ev["eval/return"], rel=1e-9)
        assert float(row["eval/success"]) == pytest.approx(ev["eval/success"])


def _python(launcher: str) -> str:
    """The Python with the launcher's plugin: scripts/setup_launchers.sh keeps the ray extra in
    .venv-ray (its cloudpickle pin conflicts with joblib's), or this one where it is here."""
    venv = [REPO / ".venv-ray" / "bin" / "python"] if launcher == "ray" else []
    for python in [*venv, Path(sys.executable)]:
        code = f"import hydra_plugins.hydra_{PLUGIN[launcher]}"
        if (
            python.exists()
            and not subprocess.run([python, "-c", code], capture_output=True).returncode
        ):
            return str(python)
    pytest.skip(f"the {launcher} launcher is not installed (bash scripts/setup_launchers.sh)")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local", "ray"])
def test_two_job_sweep_on_a_parallel_launcher(tmp_path, launcher):
    sweep_dir = tmp_path / "sweep"
    ray = ["+hydra.launcher.ray.init.num_cpus=2"] if launcher == "ray" else []
    args = ["-m", f"hydra/launcher={launcher}", *ray, "seed=1,2", *TINY]
    proc = subprocess.run(
        [_python(launcher), str(REPO / "train.py"), *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_summary(sweep_dir, [1, 2])
    assert "rlrec sweep summary" in proc.stdout  # the printed table
    # different seeds, different runs
    assert _last_eval(sweep_dir / "0")["eval/return"] != _last_eval(sweep_dir / "1")["eval/return"]


@pytest.mark.slow
def test_basic_launcher_sweep_in_one_process_equals_separate_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*TINY, "logger=tensorboard", "recorder.trigger=episode", "recorder.every=1"]
    separate = [
        start_train([*args, f"seed={s}", f"hydra.run.dir=alone{s}"], tmp_path) for s in (1, 2)
    ]
    proc = run_train(["-m", "seed=1,2", *args, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    for p in separate:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    assert proc.stdout.count("rlrec: done") == 2
    _check_summary(sweep_dir, [1, 2])

    # a clip's line, and an eval line that names its clip, are written once the encoder is done,
    # while training goes on, so where they fall among the other lines depends on timing; their
    # steps and contents may not; wall-clock figures differ, nothing else may
    def lines(run_dir: Path):
        ms = [
            {k: v for k, v in m.items() if not k.startswith(("time/", "sps/"))}
            for m in read_metrics(run_dir)
        ]
        timed = [m for m in ms if "eval/return" in m or any(k.startswith("video/") for k in m)]
        clips = sorted((m["step"], json.dumps(m, sort_keys=True)) for m in timed)
        return [m for m in ms if m not in timed], clips

    for job, seed in enumerate((1, 2)):
        in_sweep, alone = sweep_dir / str(job), tmp_path / f"alone{seed}"
        a, b = (ckpt.load(d / "checkpoints" / "last.pt")["ppo"] for d in (in_sweep, alone))
        for part in ("agent", "obs_norm"):
            assert a[part].keys() == b[part].keys()
            assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), f"job {job}: {part}"
        assert lines(in_sweep) == lines(alone) and lines(in_sweep)[1]
        for kind in ("train", "eval"):
            names = [
                sorted(p.name for p in (d / "videos" / kind).glob("*.mp4"))
                for d in (in_sweep, alone)
            ]
            assert names[0] == names[1] and names[0]
        assert list((in_sweep / "tensorboard").glob("events.*"))


@pytest.mark.slow
def test_optuna_tunes_the_learning_rate(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=2", *TINY]
    run_train([*args, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    rows = _rows(sweep_dir)
    assert len(rows) == 2 and all(r["status"] == "COMPLETED" for r in rows)
    lrs = [float(r["algo.learning_rate"]) for r in rows]
    assert len(set(lrs)) == 2 and all(1e-4 <= lr <= 3e-3 for lr in lrs)
    assert all(r["swept"] == f"algo.learning_rate={r['algo.learning_rate']}" for r in rows)
    # the value Optuna maximised is the final eval return train.py returned
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert best.best_value == pytest.approx(max(float(r["eval/return"]) for r in rows))


@pytest.mark.slow
def test_sweeps_started_in_the_same_second_do_not_collide(tmp_path):
    args = ["-m", "seed=5", *FAST, "total_steps=128", "eval_env.enabled=false", "recorder=none"]
    for p in [start_train(args, tmp_path) for _ in range(2)]:
        assert p.wait(timeout=180) == 0, p.stdout.read()
    sweeps = sorted((tmp_path / "multirun").glob("*/*"))
    assert len(sweeps) == 2
    for s in sweeps:
        assert (s / "0" / "checkpoints" / "last.pt").exists() and len(_rows(s)) == 1


def _task_pid(tag: str):
    """The pid of the submitit task process (not its controller) whose environment holds tag."""
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RLREC_TEST_TAG={tag}".encode() in environ and any(
            e.startswith(b"SUBMITIT_LOCAL_GLOBALID=") for e in environ
        ):
            return int(entry.name)
    return None


# ------------------------------------------------------------------------- failed and stopped jobs

STOP_TOTAL = 48 * 128  # 48 iterations of FAST: job 0 is still running when job 1 got going
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def _stop_args(sweep_dir: Path):
    args = [*FAST, "torch_threads=1", f"total_steps={STOP_TOTAL}", "checkpoint_every=1000"]
    return [*args, f"hydra.sweep.dir={sweep_dir}"]


def _iterations(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().count("loss/policy") if metrics.exists() else 0


def _going(proc, sweep_dir: Path, jobs=(0,)):
    """Waits until job 0 of the sweep ``proc`` runs has made 3 iterations and each other of
    ``jobs`` one."""
    deadline = time.monotonic() + 180
    while not all(_iterations(sweep_dir / str(j)) >= (1 if j else 3) for j in jobs):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the sweep never got going:\n{proc.communicate()[0]}")
        time.sleep(0.05)


def _check_resumed(args, sweep_dir: Path, jobs: int, cwd: Path) -> None:
    """resume=auto completes every job; the stopped ones continue from their checkpoints (each
    iteration logged once, none lost, none replayed)."""
    run_train([*args, *_stop_args(sweep_dir), "resume=auto"], cwd=cwd)
    assert _statuses(sweep_dir) == [(j, "COMPLETED") for j in range(jobs)]
    for job in range(jobs):
        steps = [m["step"] for m in read_metrics(sweep_dir / str(job)) if "loss/policy" in m]
        assert steps == list(range(128, STOP_TOTAL + 1, 128)), f"job {job}: {steps}"
        assert _step(sweep_dir / str(job)) == STOP_TOTAL


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_submitit_preemption_checkpoints_requeues_and_resumes(tmp_path, monkeypatch):
    """submitit's preemption signal (USR2): the job checkpoints, submitit requeues it, and the
    requeued job continues from that checkpoint (resume=auto by default under submitit)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep_dir, tag = tmp_path / "sweep", uuid.uuid4().hex
    monkeypatch.setenv("RLREC_TEST_TAG", tag)
    args = ["-m", "hydra/launcher=submitit_local", "seed=7", *_stop_args(sweep_dir)]
    launcher = start_train(args, tmp_path)
    _going(launcher, sweep_dir)
    pid = _task_pid(tag)
    os.kill(pid, signal.SIGUSR2)
    # the preempted job exits after its checkpoint; the requeued one resumes from it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _task_pid(tag) in (pid, None):
        time.sleep(0.1)
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out
    # the first attempt stopped on the signal, the requeued one finished the job
    log = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out"))
    stopped = re.findall(r"rlrec: stopped by signal in [\d.]+s \| ([\d,]+) env steps", log)
    assert len(stopped) == 1 and log.count("rlrec: done") == 1, log
    assert 3 * 128 <= int(stopped[0].replace(",", "")) < STOP_TOTAL
    # ...from its checkpoint: every iteration logged once, none lost, none replayed
    steps = [m["step"] for m in read_metrics(sweep_dir / "0") if "loss/policy" in m]
    assert steps == list(range(128, STOP_TOTAL + 1, 128))
    assert _step(sweep_dir / "0") == STOP_TOTAL
    (row,) = _rows(sweep_dir)
    assert row["status"] == "COMPLETED" and int(row["step"]) == STOP_TOTAL


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, rates, statuses",
    [
        ([], "-1,3e-4", ["FAILED", "COMPLETED"]),
        # two workers, the invalid job between two valid ones
        (JOBLIB, "3e-4,-1,5e-4", ["COMPLETED", "FAILED", "COMPLETED"]),
    ],
    ids=["basic", "joblib"],
)
def test_an_invalid_job_fails_alone(tmp_path, launcher, rates, statuses):
    """The invalid job gets a FAILED row with its error, the others run to the end with their
    checkpoints, and the sweep exits 1 once it is over."""
    if launcher:
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *launcher, f"algo.learning_rate={rates}", *TINY, f"hydra.sweep.dir={sweep_dir}"]
    proc = run_train(args, cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(sweep_dir) == list(enumerate(statuses))
    bad = statuses.index("FAILED")
    assert _rows(sweep_dir)[bad]["error"].startswith("ConfigError: algo.learning_rate=-1")
    for job in (j for j, s in enumerate(statuses) if s == "COMPLETED"):
        _check_job_dir(sweep_dir / str(job), seed=1)
    assert "rlrec sweep summary" in proc.stdout  # the table, at the end
    assert f"1 of {len(statuses)} jobs failed (job {bad})" in proc.stderr


@pytest.mark.slow
def test_a_sweep_whose_jobs_are_all_refused_writes_nothing_and_exits_2(tmp_path):
    """As a refused run: exit 2, the refusals as the last lines, nothing left of the sweep: the
    dirs it made are gone, a sweep dir that was there holds what it held."""
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's own")
    for sweep_dir in (tmp_path / "made" / "sweep", kept):
        args = ["-m", "algo.learning_rate=-1,-2", *TINY, f"hydra.sweep.dir={sweep_dir}"]
        proc = run_train(args, cwd=tmp_path, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        invalid = "is invalid: must be a finite number > 0"
        assert proc.stderr.splitlines()[-2:] == [
            f"rlrec: config error: algo.learning_rate=-1.0 {invalid} (job 0)",
            f"rlrec: config error: algo.learning_rate=-2.0 {invalid} (job 1)",
        ], proc.stderr
        assert "rlrec sweep summary" not in proc.stdout and "failed" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["kept"]
    assert sorted(os.listdir(kept)) == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [[], JOBLIB], ids=["basic", "joblib"])
def test_ctrl_c_stops_a_sweep_and_resume_completes_it(tmp_path, launcher):
    """Ctrl-C (SIGINT to the sweep's process group) stops the running jobs after their
    checkpoints and starts no other: with the basic launcher job 1 never starts; with two joblib
    workers and three jobs both running jobs stop (the launcher waits for their rows) and the
    third does not start. resume=auto (on the basic launcher: the jobs, their dirs and numbers
    are the same) completes them."""
    if launcher:
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir, seeds = tmp_path / "sweep", "1,2,3" if launcher else "1,2"
    proc = start_train(["-m", *launcher, f"seed={seeds}", *_stop_args(sweep_dir)], tmp_path, True)
    # both workers' jobs are running when Ctrl-C comes (loky may start the second worker
    # seconds after the first)
    _going(proc, sweep_dir, jobs=(0, 1) if launcher else (0,))
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT and "resume=auto" in out, out
    rows, running = _rows(sweep_dir), 2 if launcher else 1  # jobs running when it came
    assert [int(r["job"]) for r in rows][:running] == list(range(running)), out
    assert all(r["status"] == "STOPPED" for r in rows), rows
    assert "stopped by SIGINT" in rows[0]["error"] and 3 * 128 <= int(rows[0]["step"]) < STOP_TOTAL
    assert _step(sweep_dir / "0") >= 3 * 128
    if len(rows) == running or not launcher:  # the next job was not even handed to a worker
        assert len(rows) == running and not (sweep_dir / str(running)).exists()
    else:
        assert rows[-1]["error"].startswith("not started"), rows
    _check_resumed(["-m", f"seed={seeds}"], sweep_dir, len(seeds.split(",")), tmp_path)


def _exited(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no one reaped yet has ended too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_kill_9_of_a_joblib_launcher_stops_its_jobs_and_resume_completes_them(tmp_path):
    """SIGKILL of the launching process sends its workers nothing: each running job notices that
    its parent is gone at the end of its iteration, writes its checkpoint and stops within a few
    seconds. resume=auto of the sweep continues both jobs from their checkpoints."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    launcher = start_train(["-m", *JOBLIB, "seed=1,2", *_stop_args(sweep_dir)], tmp_path, True)
    _going(launcher, sweep_dir, jobs=(0, 1))
    entries = SweepDir(sweep_dir).running.glob("*.json")
    workers = {json.loads(p.read_text())["pid"] for p in entries}
    assert len(workers) == 2 and launcher.pid not in workers
    launcher.kill()  # SIGKILL of the launcher alone, not of its process group
    launcher.wait(timeout=10)
    t0 = time.monotonic()
    while not all(_exited(pid) for pid in workers) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert all(_exited(pid) for pid in workers), "workers still running 10 s after the kill"
    for job in (0, 1):
        saved = _step(sweep_dir / str(job))
        assert 128 <= saved < STOP_TOTAL, (job, saved)
        stop = [m for m in read_metrics(sweep_dir / str(job)) if m.get("event") == "stop"]
        assert stop == [{"step": saved, "event": "stop", "signal": int(signal.SIGHUP)}]
    assert _statuses(sweep_dir) == [(0, "STOPPED"), (1, "STOPPED")]
    _check_resumed(["-m", "seed=1,2"], sweep_dir, 2, tmp_path)


# --------------------------------------------------------------------------- the summary itself


def _write_rows(args):
    sweep_dir, first, count = args
    for job in range(first, first + count):
        sweep.write_summary(
            Path(sweep_dir), {"job": job, "status": "COMPLETED", f"k{job % 3}": job}
        )


def test_summary_survives_concurrent_writers(tmp_path):
    """Jobs of a parallel launcher finishing together: every row lands, the CSV is never torn."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:  # each spawned worker imports this module (torch): seconds each
        pool.map(_write_rows, [(str(tmp_path), i * 20, 20) for i in range(2)])
    rows = _rows(tmp_path)
    assert [int(r["job"]) for r in rows] == list(range(40))
    assert {"k0", "k1", "k2"} <= set(rows[0])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_a_job_row_its_figures_and_the_table(tmp_path):
    """A job that raised is summarised too (Hydra swallows a callback's exception, so a row that
    could not be built would silently be missing); the figures are the last eval line's."""
    from hydra.core.utils import JobReturn, JobStatus

    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "metrics.jsonl").write_text(
        '{"step": 128, "eval/return": 1.0, "eval/success": 0.5}\n'
        '{"step": 256, "loss/policy": 0.1}\n'
        '{"step": 256, "eval/return": 2.0, "eval/length": 9.0}\n'
        '{"step": 384, "loss/po'  # a line cut by a kill
    )
    hydra = {"runtime": {"output_dir": str(tmp_path / "3")}, "job": {"num": 3}}
    hydra.update(sweep={"dir": str(tmp_path)}, overrides={"task": ["seed=2"]})
    ret = JobReturn(status=JobStatus.FAILED, _return_value=ValueError("boom"))
    row = sweep.job_row(OmegaConf.create({"hydra": hydra}), ret)
    assert row["status"] == "FAILED" and row["error"] == "ValueError: boom" and row["seed"] == "2"
    assert {k: row[k] for k in ("step", "eval/return", "eval/length")} == {
        "step": 256,
        "eval/return": 2.0,
        "eval/length": 9.0,
    }
    assert "eval/success" not in row
    table = sweep.format_table([row]).splitlines()
    assert table[0].split() == ["job", "status", "step", "return", "length", "swept"]
    assert table[2].split() == ["3", "FAILED", "256", "2", "9", "seed=2"]


def test_a_job_dir_left_without_a_row_by_a_stop_reads_not_started(tmp_path):
    """The race of a process-per-job launcher's stop: a worker is handed job 2 as the sweep
    stops, Hydra makes its dir, and the worker ends with the launching process before the job
    writes its row. The launching process's summary says it was not started, as the job itself
    would have (the resumed sweep then runs it); the sweep exits with 128 + the signal."""
    sweep_dir = tmp_path / "sweep"
    for job in (0, 1):
        (sweep_dir / str(job)).mkdir(parents=True)
        sweep.write_summary(sweep_dir, {"job": job, "status": sweep.STOPPED, "error": "stopped"})
    (sweep_dir / "2" / ".hydra").mkdir(parents=True)
    (sweep_dir / "2" / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    (sweep_dir / "multirun.yaml").write_text("{}\n")  # not a job dir
    with pytest.raises(SystemExit) as exc, sweep.ending():
        sweep._state().sweep_dir = sweep_dir
        raise sweep.SweepStopped(signal.SIGINT)
    assert exc.value.code == 128 + signal.SIGINT
    rows = _rows(sweep_dir)
    assert [int(r["job"]) for r in rows] == [0, 1, 2]
    assert rows[2]["status"] == "STOPPED" and rows[2]["error"].startswith("not started"), rows
    assert rows[2]["overrides"] == "seed=3"
