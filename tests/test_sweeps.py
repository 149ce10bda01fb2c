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


def _rows(sweep_dir: Path):
    with open(sweep_dir / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def _last_eval(run_dir: Path) -> dict:
    return [m for m in read_metrics(run_dir) if "eval/return" in m][-1]


def _check_job_dir(run_dir: Path, seed: int, steps: int = 256) -> None:
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").seed == seed
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"] == steps
    clips = list((run_dir / "videos" / "eval").glob("*.mp4"))
    assert clips, f"no eval video in {run_dir}"
    for clip in clips:
        assert imageio_ffmpeg.count_frames_and_secs(str(clip))[0] > 0
    assert _last_eval(run_dir)["step"] == steps


def _check_summary(sweep_dir: Path, seeds) -> None:
    rows = _rows(sweep_dir)
    assert [int(r["job"]) for r in rows] == list(range(len(seeds)))
    for row, seed in zip(rows, seeds):
        run_dir = sweep_dir / row["job"]
        assert row["status"] == "COMPLETED"
        assert row["seed"] == str(seed) and row["swept"] == f"seed={seed}"
        assert Path(row["run_dir"]) == run_dir
        ev = _last_eval(run_dir)
        assert float(row["eval/return"]) == pytest.approx(ev["eval/return"], rel=1e-9)
        assert float(row["eval/success"]) == pytest.approx(ev["eval/success"])
        assert int(row["step"]) == 256


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_two_job_sweep_on_a_parallel_launcher(tmp_path, launcher):
    pytest.importorskip(
        "hydra_plugins.hydra_joblib_launcher"
        if launcher == "joblib"
        else "hydra_plugins.hydra_submitit_launcher"
    )
    sweep_dir = tmp_path / "sweep"
    proc = run_train(
        ["-m", f"hydra/launcher={launcher}", "seed=1,2", *TINY, f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
    )
    for job, seed in ((0, 1), (1, 2)):
        _check_job_dir(sweep_dir / str(job), seed)
    _check_summary(sweep_dir, [1, 2])
    assert "rlrec sweep summary" in proc.stdout  # the printed table
    # different seeds, different runs
    assert _last_eval(sweep_dir / "0")["eval/return"] != _last_eval(sweep_dir / "1")["eval/return"]


def _is_clip(metrics: dict) -> bool:
    return any(k.startswith("video/") for k in metrics)


def _final_state(run_dir: Path) -> dict:
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    return {
        **{f"agent.{k}": v for k, v in data["ppo"]["agent"].items()},
        **{f"obs_norm.{k}": v for k, v in data["ppo"]["obs_norm"].items()},
    }


@pytest.mark.slow
def test_basic_launcher_sweep_in_one_process_equals_separate_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*TINY, "logger=tensorboard", "recorder.trigger=episode", "recorder.every=1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    separate = [
        subprocess.Popen(
            [
                sys.executable,
                str(REPO / "train.py"),
                *args,
                f"seed={s}",
                f"hydra.run.dir={tmp_path / f'alone{s}'}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for s in (1, 2)
    ]
    proc = run_train(["-m", "seed=1,2", *args, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    for p in separate:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    assert proc.stdout.count("rlrec: done") == 2
    for job, seed in enumerate((1, 2)):
        in_sweep, alone = sweep_dir / str(job), tmp_path / f"alone{seed}"
        _check_job_dir(in_sweep, seed)
        a, b = _final_state(in_sweep), _final_state(alone)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"job {job}: {k} differs from the separate run"
        strip = ("time/", "sps/")  # wall-clock figures differ, nothing else may
        ma = [
            {k: v for k, v in m.items() if not k.startswith(strip)} for m in read_metrics(in_sweep)
        ]
        mb = [{k: v for k, v in m.items() if not k.startswith(strip)} for m in read_metrics(alone)]

        # a clip's line, and an eval line that names its clip, are written once the encoder is
        # done, while training goes on, so where they fall among the other lines depends on
        # timing; their steps and contents may not
        def timed(m):
            return _is_clip(m) or "eval/return" in m

        def clips(ms):
            return sorted((m["step"], json.dumps(m, sort_keys=True)) for m in ms if timed(m))

        assert [m for m in ma if not timed(m)] == [m for m in mb if not timed(m)]
        assert clips(ma) == clips(mb) and clips(ma)
        for kind in ("train", "eval"):
            names_a = sorted(p.name for p in (in_sweep / "videos" / kind).glob("*.mp4"))
            names_b = sorted(p.name for p in (alone / "videos" / kind).glob("*.mp4"))
            assert names_a == names_b and names_a
        assert list((in_sweep / "tensorboard").glob("events.*"))
    _check_summary(sweep_dir, [1, 2])


@pytest.mark.slow
def test_optuna_tunes_the_learning_rate(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep_dir = tmp_path / "sweep"
    run_train(
        [
            "-m",
            "hydra/sweeper=lr_search",
            "hydra.sweeper.n_trials=2",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
    )
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
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        "seed=5",
        *FAST,
        "total_steps=128",
        "eval_env.enabled=false",
        "recorder=none",
    ]
    procs = [
        subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stdout.read()
    sweeps = sorted((tmp_path / "multirun").glob("*/*"))
    assert len(sweeps) == 2
    for s in sweeps:
        assert (s / "0" / "checkpoints" / "last.pt").exists() and len(_rows(s)) == 1


def _task_pid(tag: str):
    """The pid of the submitit task process (not its controller) whose environment holds tag."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RLREC_TEST_TAG={tag}".encode() in environ and any(
            e.startswith(b"SUBMITIT_LOCAL_GLOBALID=") for e in environ
        ):
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_submitit_preemption_checkpoints_requeues_and_resumes(tmp_path):
    """submitit's preemption signal (USR2): the job checkpoints, submitit requeues it, and the
    requeued job continues from that checkpoint (resume=auto by default under submitit)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    total = 40 * 128
    sweep_dir = tmp_path / "sweep"
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLREC_TEST_TAG": tag}
    launcher = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "train.py"),
            "-m",
            "hydra/launcher=submitit_local",
            "seed=7",
            *FAST,
            "torch_threads=1",
            f"total_steps={total}",
            "checkpoint_every=1000",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = sweep_dir / "0"
    deadline = time.monotonic() + 180
    pid = None
    while time.monotonic() < deadline and launcher.poll() is None:
        lines = (
            (run_dir / "metrics.jsonl").read_text().count("loss/policy")
            if (run_dir / "metrics.jsonl").exists()
            else 0
        )
        if lines >= 3:
            pid = _task_pid(tag)
            break
        time.sleep(0.05)
    assert pid is not None, "the job never got going"
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
    assert 3 * 128 <= int(stopped[0].replace(",", "")) < total
    # ...from its checkpoint: every iteration logged once, none lost, none replayed
    steps = [m["step"] for m in read_metrics(run_dir) if "loss/policy" in m]
    assert steps == list(range(128, total + 1, 128))
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"] == total
    (row,) = _rows(sweep_dir)
    assert row["status"] == "COMPLETED" and int(row["step"]) == total


def _ray_python():
    """The Python that has the ray extra: scripts/setup_launchers.sh keeps it in .venv-ray (its
    cloudpickle pin conflicts with joblib's), or this one if Ray was installed here."""
    for python in (REPO / ".venv-ray" / "bin" / "python", Path(sys.executable)):
        if (
            python.exists()
            and subprocess.run(
                [str(python), "-c", "import hydra_plugins.hydra_ray_launcher, ray"],
                capture_output=True,
            ).returncode
            == 0
        ):
            return str(python)
    pytest.skip(
        "the ray extra is not installed (bash scripts/setup_launchers.sh puts it in .venv-ray)"
    )


@pytest.mark.slow
def test_ray_launcher_two_job_sweep(tmp_path):
    python = _ray_python()
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            python,
            str(REPO / "train.py"),
            "-m",
            "hydra/launcher=ray",
            "+hydra.launcher.ray.init.num_cpus=2",
            "seed=1,2",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for job, seed in ((0, 1), (1, 2)):
        _check_job_dir(sweep_dir / str(job), seed)
    _check_summary(sweep_dir, [1, 2])


# ------------------------------------------------------------------------- failed and stopped jobs


def _statuses(sweep_dir: Path):
    return [(int(r["job"]), r["status"]) for r in _rows(sweep_dir)]


@pytest.mark.slow
def test_an_invalid_job_fails_alone_on_the_basic_launcher(tmp_path):
    """The invalid job first: it gets a FAILED row with its error, the next one runs to the end,
    and the sweep exits 1 once it is over (before: SystemExit(2) at job 0, nothing ran)."""
    sweep_dir = tmp_path / "sweep"
    proc = run_train(
        ["-m", "algo.learning_rate=-1,3e-4", *TINY, f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(sweep_dir) == [(0, "FAILED"), (1, "COMPLETED")]
    failed = _rows(sweep_dir)[0]
    assert failed["error"].startswith("ConfigError: algo.learning_rate=-1"), failed["error"]
    _check_job_dir(sweep_dir / "1", seed=1)
    assert "rlrec sweep summary" in proc.stdout  # the table, at the end
    assert "1 of 2 jobs failed (job 0)" in proc.stderr


@pytest.mark.slow
def test_an_invalid_job_fails_alone_on_joblib(tmp_path):
    """Two workers, the invalid job between two valid ones: both valid jobs run to the end with
    their checkpoints (before: the sweep died with the valid job running beside it)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "algo.learning_rate=3e-4,-1,5e-4",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(sweep_dir) == [(0, "COMPLETED"), (1, "FAILED"), (2, "COMPLETED")]
    assert "algo.learning_rate=-1" in _rows(sweep_dir)[1]["error"]
    for job in (0, 2):
        _check_job_dir(sweep_dir / str(job), seed=1)


@pytest.mark.slow
def test_a_sweep_whose_jobs_are_all_refused_writes_nothing_and_exits_2(tmp_path):
    """As a refused run: exit 2, the refusals as the last lines, nothing left of the sweep: the
    dirs it made are gone, a sweep dir that was there holds what it held (before: exit 1, "2 of 2
    jobs failed", summary.csv, .rlrec_summary/ and the job dirs)."""
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


STOP_TOTAL = 48 * 128  # 48 iterations of FAST: job 0 is still running when job 1 got going


def _iterations(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().count("loss/policy") if metrics.exists() else 0


def _interrupt(args, sweep_dir: Path, cwd: Path, also_running=()):
    """Starts the sweep in a process group of its own and, once job 0 has made 3 iterations (and
    each job of ``also_running`` one), sends SIGINT to the group, as Ctrl-C in a terminal does;
    returns (exit status, output)."""
    proc = start_train(args, cwd, new_session=True)
    deadline = time.monotonic() + 180

    def going() -> bool:
        return _iterations(sweep_dir / "0") >= 3 and all(
            _iterations(sweep_dir / str(j)) >= 1 for j in also_running
        )

    while not going():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the sweep never got going:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def _check_resumed(sweep_dir: Path, jobs: int) -> None:
    """resume=auto completed every job; the stopped ones continued from their checkpoints (each
    iteration logged once, none lost, none replayed)."""
    assert _statuses(sweep_dir) == [(j, "COMPLETED") for j in range(jobs)]
    for job in range(jobs):
        run_dir = sweep_dir / str(job)
        steps = [m["step"] for m in read_metrics(run_dir) if "loss/policy" in m]
        assert steps == list(range(128, STOP_TOTAL + 1, 128)), f"job {job}: {steps}"
        assert ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"] == STOP_TOTAL


def _stop_args(sweep_dir: Path):
    return [
        *FAST,
        "torch_threads=1",
        f"total_steps={STOP_TOTAL}",
        "checkpoint_every=1000",
        f"hydra.sweep.dir={sweep_dir}",
    ]


@pytest.mark.slow
def test_ctrl_c_stops_a_basic_launcher_sweep_and_resume_completes_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, out = _interrupt(["-m", "seed=1,2", *_stop_args(sweep_dir)], sweep_dir, tmp_path)
    assert code == 128 + signal.SIGINT, out
    (row,) = _rows(sweep_dir)  # job 1 never started
    assert row["status"] == "STOPPED" and "stopped by SIGINT" in row["error"], row
    assert 3 * 128 <= int(row["step"]) < STOP_TOTAL
    assert not (sweep_dir / "1").exists()
    assert ckpt.load(sweep_dir / "0" / "checkpoints" / "last.pt")["global_step"] >= 3 * 128
    assert "resume=auto" in out
    run_train(["-m", "seed=1,2", *_stop_args(sweep_dir), "resume=auto"], cwd=tmp_path)
    _check_resumed(sweep_dir, 2)


@pytest.mark.slow
def test_ctrl_c_stops_a_joblib_sweep_and_resume_completes_it(tmp_path):
    """Two workers, three jobs: Ctrl-C stops both running jobs after their checkpoints and the
    third never starts (before: the running jobs returned normally as COMPLETED, the launcher
    started the third, or the launcher died at once and took the workers' checkpoints with it).
    The sweep is resumed on the basic launcher (the jobs, their dirs and numbers are the same)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2,3"]
    # both workers' jobs are running when Ctrl-C comes (a worker still starting up is not what
    # this test is about: loky may start the second worker seconds after the first)
    code, out = _interrupt([*args, *_stop_args(sweep_dir)], sweep_dir, tmp_path, also_running=[1])
    assert code == 128 + signal.SIGINT, out
    rows = _rows(sweep_dir)
    assert [int(r["job"]) for r in rows][:2] == [0, 1], out
    assert all(r["status"] == "STOPPED" for r in rows), rows
    assert 3 * 128 <= int(rows[0]["step"]) < STOP_TOTAL
    assert ckpt.load(sweep_dir / "0" / "checkpoints" / "last.pt")["global_step"] >= 3 * 128
    if len(rows) == 2:  # the third job was not even handed to a worker
        assert not (sweep_dir / "2").exists()
    else:
        assert rows[2]["error"].startswith("not started"), rows[2]
    run_train(["-m", "seed=1,2,3", *_stop_args(sweep_dir), "resume=auto"], cwd=tmp_path)
    _check_resumed(sweep_dir, 3)


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
    seconds (before: both went on training to the end). resume=auto of the sweep continues
    both jobs from their checkpoints."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2"]
    launcher = start_train([*args, *_stop_args(sweep_dir)], tmp_path, new_session=True)
    deadline = time.monotonic() + 180
    while not (_iterations(sweep_dir / "0") >= 3 and _iterations(sweep_dir / "1") >= 1):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise AssertionError(f"the sweep never got going:\n{launcher.communicate()[0]}")
        time.sleep(0.05)
    entries = SweepDir(sweep_dir).running.glob("*.json")
    workers = {json.loads(p.read_text())["pid"] for p in entries}
    assert len(workers) == 2 and launcher.pid not in workers
    launcher.kill()  # SIGKILL of the launcher alone, not of its process group
    launcher.wait(timeout=10)
    t0 = time.monotonic()
    while not all(_exited(pid) for pid in workers) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    assert all(_exited(pid) for pid in workers), "workers still running 30 s after the kill"
    assert elapsed < 10, f"the workers took {elapsed:.1f} s to stop"
    for job in (0, 1):
        saved = ckpt.load(sweep_dir / str(job) / "checkpoints" / "last.pt")["global_step"]
        assert 128 <= saved < STOP_TOTAL, (job, saved)
        stop = [m for m in read_metrics(sweep_dir / str(job)) if m.get("event") == "stop"]
        assert stop == [{"step": saved, "event": "stop", "signal": int(signal.SIGHUP)}]
    assert _statuses(sweep_dir) == [(0, "STOPPED"), (1, "STOPPED")]
    run_train(["-m", "seed=1,2", *_stop_args(sweep_dir), "resume=auto"], cwd=tmp_path)
    _check_resumed(sweep_dir, 2)


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


def test_failed_job_gets_a_row_with_its_error(tmp_path):
    """A job that raised is summarised too (Hydra swallows a callback's exception, so a row
    that could not be built would silently be missing)."""
    from hydra.core.utils import JobReturn, JobStatus

    ret = JobReturn(status=JobStatus.FAILED, _return_value=ValueError("boom"))
    config = OmegaConf.create(
        {
            "hydra": {
                "runtime": {"output_dir": str(tmp_path / "3")},
                "job": {"num": 3},
                "sweep": {"dir": str(tmp_path)},
                "overrides": {"task": ["seed=2"]},
            }
        }
    )
    row = sweep.job_row(config, ret)
    assert row["status"] == "FAILED" and row["error"] == "ValueError: boom" and row["seed"] == "2"


def test_final_figures_take_the_last_eval_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 128, "eval/return": 1.0, "eval/success": 0.5}\n'
        '{"step": 256, "loss/policy": 0.1}\n'
        '{"step": 256, "eval/return": 2.0, "eval/length": 9.0}\n'
        '{"step": 384, "loss/po'  # a line cut by a kill
    )
    assert sweep.final_figures(tmp_path) == {"step": 256, "eval/return": 2.0, "eval/length": 9.0}
    table = sweep.format_table(
        [{"job": 0, "status": "COMPLETED", "eval/return": 2.0, "swept": "seed=1"}]
    )
    assert "seed=1" in table and "return" in table


def test_a_job_dir_left_without_a_row_by_a_stop_reads_not_started(tmp_path):
    """The race of a process-per-job launcher's stop: a worker is handed job 2 as the sweep
    stops, Hydra makes its dir, and the worker ends with the launching process before the job
    writes its row. The launching process's summary says it was not started, as the job itself
    would have (the resumed sweep then runs it)."""
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
