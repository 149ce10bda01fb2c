"""A diverging run stops at the first non-finite value with one line, its own exit status and
nothing written from that state (rlrec/train/divergence.py): non-finite losses, gradient norm or
parameters, and an env that returns a non-finite observation or reward, named as the source."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.train import checkpoint as ckpt
from rlrec.train.divergence import EXIT_STATUS, Diverged, Watch
from rlrec.train.resume import ResumePoint
from tests import nan_env
from tests.helpers import FAST, make_config, read_metrics, run_train
from tests.trainutil import drive, runner, snapshot, steps

QUIET = [*FAST, "recorder=none", "eval_env.enabled=false"]
# 8 iterations of 4 envs x 16 steps
NAN_ENV = ["env=gymnasium", f"env.id=tests.nan_env:{nan_env.ID}", "env.num_envs=4"]
NAN_ENV += ["total_steps=512", "checkpoint_every=2"]
BATCH = 4 * 16
LR_1000 = ["algo.learning_rate=1000", "algo.max_grad_norm=1e6"]  # far too high: diverges at once

# train.py's main, then the names of the threads of rlrec still alive as the interpreter exits
THREADS_AT_EXIT = """
import threading
from rlrec.run.cli import main
try:
    main()
finally:
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("rlrec"))
    print("threads at exit:", names, flush=True)
"""


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_line_its_own_exit_status_and_no_thread_left(tmp_path):
    """What a user meets with a learning rate far too high: before, torch's "normal expects all
    elements of std >= 0.0" from inside the next rollout, after a metrics line of nulls. Nothing
    of that state is written. Before, once in 24 runs the process aborted (SIGABRT) after the
    line: the one thread of rlrec still running as the interpreter exited was the report's
    warm-up import of matplotlib (seconds with a fresh matplotlib cache, MPLCONFIGDIR; the run
    diverges at its first update); the train recorder's encoder thread and TensorBoard's preview
    thread (a clip at step 0) are stopped too."""
    run_dir = tmp_path / "run"
    threads = ["report.enabled=true", "logger=tensorboard", "eval_env.enabled=false"]
    args = [*FAST, *threads, *LR_1000, f"hydra.run.dir={run_dir}"]
    proc = drive(tmp_path, THREADS_AT_EXIT, args, {"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == EXIT_STATUS == 3, proc.stdout + proc.stderr
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("rlrec:")]
    assert line.startswith("rlrec: diverged at iteration 1 (step 128): non-finite loss/"), line
    assert "nothing was written from that state" in line
    assert "no checkpoint was written before it" in line and "algo.learning_rate" in line
    assert "Traceback" not in proc.stderr
    assert proc.stdout.splitlines()[-1] == "threads at exit: []", proc.stdout
    assert not (run_dir / "checkpoints").exists() and steps(run_dir, "loss/policy") == []


@pytest.mark.parametrize(
    "what, value, discrete",
    [("obs", "nan", False), ("reward", "inf", False), ("obs", "nan", True)],
    ids=["nan-observation", "inf-reward", "nan-observation-discrete-actions"],
)
def test_an_env_that_returns_a_non_finite_value_is_named_as_the_source(
    tmp_path, what, value, discrete
):
    """Env 3 (its first reset's seed is 1 + 3) goes bad at its 40th step: step 8 of iteration
    3's rollout. A categorical policy fed its NaN observation fails inside the rollout (torch's
    sampling refuses NaN probabilities): the env is still named. The run stops before anything is
    written from that state; its last checkpoint (iteration 2) is named, and resuming from it
    once the env is fixed runs to the end."""
    run_dir = tmp_path / "run"
    bad = ["+env.kwargs.seed=4", f"+env.kwargs.what={what}", f"+env.kwargs.value={value}"]
    bad += [f"+env.kwargs.discrete={discrete}"]
    with pytest.raises(Diverged) as e:
        runner(run_dir, [*NAN_ENV, *bad, "+env.kwargs.step=40"], base=QUIET).run()
    msg = str(e.value)
    name = "observation" if what == "obs" else "reward"
    assert msg.startswith(
        f"rlrec: diverged at iteration 3 (step {3 * BATCH}): env 3 returned a non-finite "
        f"{name} at step 8 of the rollout (the env is the source)"
    ), msg
    last = run_dir / "checkpoints" / "last.pt"
    assert f"last finite checkpoint {last} (step {2 * BATCH})" in msg
    assert f"resume=auto hydra.run.dir={run_dir}" in msg
    # nothing from that state: the checkpoints and metrics lines of iterations 1 and 2 only
    assert sorted(p.name for p in last.parent.iterdir()) == ["iter_000002.pt", "last.pt"]
    assert ckpt.load(last)["global_step"] == 2 * BATCH
    assert steps(run_dir, "loss/policy") == [BATCH, 2 * BATCH]
    runner(run_dir, [*NAN_ENV, *bad, "resume=auto"], base=QUIET).run()  # the env fixed
    assert steps(run_dir, "loss/policy") == [k * BATCH for k in range(1, 9)]
    final = ckpt.load(last)
    assert final["global_step"] == 8 * BATCH
    assert all(torch.isfinite(v).all() for v in final["ppo"]["agent"].values())


# ---------------------------------------------------------------------- the check itself
FINITE = {"loss/policy": 0.1, "loss/value": 1.0, "loss/entropy": 1.4, "train/grad_norm": 1.0}
CALM = {**FINITE, "loss/approx_kl": 0.01}


def _params(**bad):
    names = ("actor.0.weight", "critic.0.weight", "log_std")
    return [(n, torch.full((2, 2), bad.get(n.replace(".", "_"), 1.0))) for n in names]


def _watch(tmp_path, last=lambda: None) -> Watch:
    return Watch(3, 4, torch.device("cpu"), tmp_path, last)


def _update(watch: Watch, losses=CALM, at="iteration 1", bad=None, params=None):
    """A rollout of 3 steps of 4 envs (``bad``: at step ``t`` env ``e`` returns a non-finite
    ``kind``, ``(t, kind, e)``) and the check of its update's ``losses``."""
    with watch.rollout(torch.zeros(4, 3), at):
        for t in range(3):
            obs, reward, info = torch.zeros(4, 3), torch.zeros(4), {}
            kind, env = bad[1:] if bad and bad[0] == t else (None, None)
            if kind == "obs":
                obs[env, 1] = math.nan
            elif kind == "reward":
                reward[env] = math.inf
            elif kind == "final":  # the final observation of an episode that ended at this step
                final = torch.zeros(4, 3)  # AutoReset's: the others' returned obs
                final[env, 0] = -math.inf
                info = {"_final": torch.arange(4) == env, "final_obs": final}
            watch.step(obs, reward, info)
    watch.check(losses, _params(**(params or {})), at)


def test_a_finite_update_passes(tmp_path):
    _update(_watch(tmp_path), {**FINITE, "loss/explained_variance": math.nan})


@pytest.mark.parametrize(
    "losses, params, named",
    [
        ({"loss/value": math.inf}, {}, "non-finite loss/value;"),
        ({"train/grad_norm": math.nan}, {}, "non-finite train/grad_norm;"),
        ({}, {"critic_0_weight": math.inf}, "non-finite parameters (critic.0.weight);"),
    ],
)
def test_the_first_non_finite_loss_gradient_norm_or_parameter_is_named(
    tmp_path, losses, params, named
):
    with pytest.raises(Diverged) as e:
        _update(_watch(tmp_path), {**FINITE, **losses}, "iteration 5", params=params)
    assert str(e.value).startswith(f"rlrec: diverged at iteration 5: {named}"), str(e.value)
    assert "no checkpoint was written before it" in str(e.value)


@pytest.mark.parametrize(
    "bad, named",
    [
        ((1, "obs", 2), "env 2 returned a non-finite observation at step 2 of the rollout"),
        ((0, "reward", 3), "env 3 returned a non-finite reward at step 1 of the rollout"),
        ((2, "final", 1), "env 1 returned a non-finite observation at step 3 of the rollout"),
    ],
)
def test_the_env_is_named_with_its_index_and_what_it_returned(tmp_path, bad, named):
    last = (str(tmp_path / "checkpoints" / "last.pt"), 96, True, "iter_000008.pt")
    losses = {**FINITE, "loss/value": math.nan}
    # the parameters went non-finite too (a NaN observation poisons the normaliser): the env is
    # the source, and it is what the line names
    with pytest.raises(Diverged) as e:
        _update(_watch(tmp_path, lambda: last), losses, "iteration 9", bad, {"log_std": math.nan})
    msg = str(e.value)
    assert msg.startswith(f"rlrec: diverged at iteration 9: {named} (the env is the source)"), msg
    assert f"last finite checkpoint {tmp_path / 'checkpoints' / 'last.pt'} (step 96)" in msg
    assert "once the env gives finite values" in msg


@pytest.mark.slow
def test_every_rank_stops_at_the_same_iteration_and_rank_0_names_the_env(tmp_path):
    """Two gloo ranks; rank 1's env 2 (the run's env 6) returns a NaN observation at step 8 of
    iteration 3: both ranks stop there with the divergence exit status, and rank 0's line names
    that env of rank 1; the last checkpoint (iteration 2, both ranks' states) is intact."""
    from tests.test_distributed import TWO, _log, start_ranks, wait_ranks

    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = [*TWO, "recorder=none", "eval_env.enabled=false", *NAN_ENV]
    args += ["+env.kwargs.seed=7", "+env.kwargs.step=40", f"hydra.run.dir={run_dir}"]
    codes = wait_ranks(start_ranks(args, tmp_path, logs), timeout=240)
    assert codes == [EXIT_STATUS, EXIT_STATUS], (_log(logs, 0), _log(logs, 1))
    batch = 2 * BATCH
    line = [s for s in _log(logs, 0).splitlines() if s.startswith("rlrec: diverged")]
    assert line == [
        f"rlrec: diverged at iteration 3 (step {3 * batch}): env 6 (rank 1's env 2) returned a "
        "non-finite observation at step 8 of the rollout (the env is the source); nothing was "
        f"written from that state | last finite checkpoint {run_dir / 'checkpoints' / 'last.pt'} "
        f"(step {2 * batch}); to continue from it once the env gives finite values (or with other "
        f"settings): the same command + resume=auto hydra.run.dir={run_dir}"
    ], _log(logs, 0)
    assert "Traceback" not in _log(logs, 0) + _log(logs, 1)
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == 2 * batch and saved["world_size"] == 2
    assert steps(run_dir, "loss/policy") == [batch, 2 * batch]


@pytest.mark.slow
def test_a_diverging_sweep_job_fails_alone_with_its_line(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "algo.learning_rate=1000,3e-4", "algo.max_grad_norm=1e6", *QUIET]
    args += ["total_steps=256", f"hydra.sweep.dir={sweep_dir}"]
    proc = run_train(args, cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a job failed
    with open(sweep_dir / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "FAILED"), ("1", "COMPLETED")]
    assert rows[0]["error"].startswith("rlrec: diverged at iteration 1 (step 128): non-finite")
    assert "Traceback" not in proc.stderr
    assert ckpt.load(sweep_dir / "1" / "checkpoints" / "last.pt")["global_step"] == 256


def test_after_a_sticky_cuda_error_the_original_error_stands(monkeypatch, tmp_path):
    """A rollout raised a sticky CUDA error (a device-side assert, an illegal address): every
    later CUDA call raises again, which a fake torch.isfinite stands for here. The watch's look
    at the rollout's values must not replace the original error with that second one."""
    watch = Watch(num_steps=2, num_envs=2, device=torch.device("cpu"), run_dir=tmp_path)

    def sticky(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    original = RuntimeError("CUDA error: device-side assert triggered")
    with pytest.raises(RuntimeError) as raised:
        with watch.rollout(torch.zeros(2, 3), "iteration 1 (step 16)"):  # as the runner's
            monkeypatch.setattr(torch, "isfinite", sticky)
            raise original
    assert raised.value is original


# ---------------------------------------------------------------------- a blow-up under way
BLOWUP = [*QUIET, "checkpoint_every=1", "checkpoint_keep=2", "algo.max_grad_norm=1e6"]


def _line(proc) -> str:
    assert proc.returncode == EXIT_STATUS, proc.stdout + proc.stderr
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("rlrec: diverged")]
    return line


@pytest.mark.slow
def test_a_blow_up_names_the_checkpoint_before_it_and_the_printed_advice_reaches_the_end(
    tmp_path,
):
    """Four sane iterations, then resume=auto with a learning rate far too high: the first update
    moves the policy by thousands of nats and the run goes non-finite iterations later. Every
    checkpoint written in between is finite but ruined; the line names the one before the blow-up
    (which checkpoint_keep=2 would otherwise have removed), and its command, run as printed with a
    sane learning rate, reaches the end with a sane policy."""
    run_dir = tmp_path / "run"
    run_train([*BLOWUP, "total_steps=512", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    command = [*BLOWUP, "total_steps=4096", "algo.learning_rate=30", "resume=auto"]
    command += [f"hydra.run.dir={run_dir}"]
    line = _line(run_train(command, cwd=tmp_path, check=False))
    before = run_dir / "checkpoints" / "iter_000004.pt"
    assert "the blow-up began at iteration 5 (step 640) with loss/approx_kl" in line, line
    assert f"the checkpoint before it is {before} (step 512)" in line, line
    assert "last finite checkpoint" not in line
    assert before.is_file()  # kept, though two newer periodic ones were written after it
    assert len(list(before.parent.glob("iter_*.pt"))) == 3

    advice = line.split("the same command + ")[1].split()
    new_dir = Path(f"{run_dir}-from-step512")
    assert advice == ["resume=null", f"checkpoint={before}", f"hydra.run.dir={new_dir}"]
    run_train([*command, *advice, "algo.learning_rate=0.0003"], cwd=tmp_path)
    final = ckpt.load(new_dir / "checkpoints" / "last.pt")
    assert final["global_step"] == 4096
    assert all(torch.isfinite(v).all() for v in final["ppo"]["agent"].values())
    assert float(final["ppo"]["agent"]["log_std"].abs().max()) < 0.5  # a sane policy: std ~1
    kls = [m["loss/approx_kl"] for m in read_metrics(new_dir) if "loss/approx_kl" in m]
    assert len(kls) == 28 and max(kls) < 0.1, kls

    # resume=auto in the run dir passes over the checkpoints written during the blow-up (each says
    # so) to the one before it, saying so, and reaches the end with a sane policy too
    ruined = [p for p in before.parent.glob("*.pt") if ckpt.load(p).get("blowup")]
    assert sorted(p.name for p in ruined) == ["iter_000005.pt", "iter_000006.pt", "last.pt"]
    proc = run_train([*command, "algo.learning_rate=0.0003"], cwd=tmp_path)
    assert (
        "rlrec: warning: resume=auto: last.pt, iter_000006.pt, iter_000005.pt written after the "
        "blow-up that began at iteration 5 (step 640)"
    ) in proc.stderr, proc.stderr
    assert f"skipped, resuming from {before} (step 512)" in proc.stderr
    final = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert final["global_step"] == 4096 and final["blowup"] is None
    assert float(final["ppo"]["agent"]["log_std"].abs().max()) < 0.5


@pytest.mark.slow
def test_a_blow_up_from_the_first_update_names_no_checkpoint(tmp_path):
    """The first update already blows up: no checkpoint is named as finite and good, though the
    ruined ones of the iterations before the non-finite one were written."""
    run_dir = tmp_path / "run"
    args = [*BLOWUP, "total_steps=4096", "algo.learning_rate=30", f"hydra.run.dir={run_dir}"]
    line = _line(run_train(args, cwd=tmp_path, check=False))
    assert "the blow-up began at iteration 1 (step 128) with loss/approx_kl" in line, line
    assert "no checkpoint was written before it; to start again with other settings" in line
    assert "checkpoint=" not in line and "resume=auto" not in line

    # the checkpoint written during the blow-up says so itself; resume=auto of it with a sane
    # learning rate is refused, saying why and how to start again, and changes nothing
    last = run_dir / "checkpoints" / "last.pt"
    assert ckpt.load(last)["global_step"] == 128
    assert ckpt.load(last)["blowup"].startswith("iteration 1 (step 128) with loss/approx_kl")
    before = snapshot(run_dir)
    sane = [*BLOWUP, "total_steps=4096", "algo.learning_rate=0.0003"]
    proc = run_train([*sane, "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        f"resume=auto: every checkpoint in {last.parent} that can be read (last.pt, "
        "iter_000001.pt) was written after the blow-up that began at iteration 1 (step 128)"
    ) in proc.stderr, proc.stderr
    assert "the same command in a new run dir" in proc.stderr
    assert "diverged" not in proc.stderr and "last finite checkpoint" not in proc.stderr
    assert snapshot(run_dir) == before
    # and so is training from it by name (evaluating it is not)
    new_dir = tmp_path / "new"
    proc = run_train(
        [*sane, f"checkpoint={last}", f"hydra.run.dir={new_dir}"], cwd=tmp_path, check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"checkpoint={last} was written after the blow-up that began at" in proc.stderr
    assert "none from before it is beside it" in proc.stderr
    assert not (new_dir / "checkpoints").exists()


@pytest.mark.slow
def test_a_spike_the_run_survives_does_not_stop_it(tmp_path):
    """Env 3 returns a reward of 1e6 once (iteration 6): the value loss and gradient norm jump
    ten orders of magnitude, the clipped update survives it, and the run goes on to its end."""
    run_dir = tmp_path / "run"
    spike = ["+env.kwargs.seed=4", "+env.kwargs.step=88", "+env.kwargs.what=reward"]
    spike += ["+env.kwargs.value=1e6", "total_steps=1024", f"hydra.run.dir={run_dir}"]
    proc = run_train([*QUIET, *NAN_ENV, *spike], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert "rlrec: iteration 6 (step 384): loss/value" in out, out
    assert "came back into range after the spike at iteration 6 (step 384)" in out
    assert steps(run_dir, "loss/policy") == [k * BATCH for k in range(1, 17)]
    assert "diverged" not in out


def test_a_spike_protects_the_checkpoint_before_it_until_the_run_settles(tmp_path):
    """A finite update far out of range (a value loss 5000 times the largest before) begins a
    blow-up: the checkpoint before it is protected until three updates are back in range; the
    KL limit holds from the first update on, while the window of recent values is still too
    short for the relative limits."""
    saved = []  # what the resume point would say: the last checkpoint written
    watch = _watch(tmp_path, lambda: saved[-1] if saved else None)
    for i in range(1, 9):
        _update(watch, {**CALM, "loss/value": 5e3} if i == 5 else CALM, f"iteration {i}")
        assert watch.protected == ("iter_000004.pt" if 5 <= i < 8 else None), i
        saved.append((str(tmp_path / "last.pt"), i * 12, True, str(tmp_path / f"iter_00000{i}.pt")))
    fresh = _watch(tmp_path)
    _update(fresh)
    assert fresh.blowup is None
    _update(fresh, {**CALM, "loss/approx_kl": 5.0}, "iteration 2")
    assert fresh.blowup is not None and fresh.blowup[0] == "iteration 2"


@pytest.mark.parametrize("periodic", [True, False], ids=["periodic", "last.pt-only"])
def test_a_checkpoint_written_during_a_blow_up_is_never_the_one_to_continue_from(
    tmp_path, periodic
):
    """Checkpoints after iterations 4 (calm), 5 (a spike begins a blow-up) and 8 (the run came back
    into range after 3 calm updates), then a non-finite update: the one of iteration 5 says it
    was written during the blow-up, resume=auto passes over it, and the line names the newest one
    from before it, never it. With last.pt alone, iteration 5's wrote over iteration 4's."""
    state = {"global_step": 0, "iteration": 0, "blowup": None}
    point = ResumePoint(lambda: dict(state), tmp_path, make_config(["checkpoint_every=1"]))
    watch = _watch(tmp_path, lambda: point.last)
    for i in range(1, 10):
        _update(watch, {**CALM, "loss/value": 5e3} if i == 5 else CALM, f"iteration {i}")
        state.update(global_step=12 * i, iteration=i, blowup=watch.under_way)
        if i in (4, 5):
            point.save(i if periodic else None)
    checkpoints = tmp_path / "checkpoints"
    assert ckpt.load(checkpoints / "last.pt")["blowup"] == (
        "iteration 5 with loss/value 5e+03 (up to 1 before)"
    )
    assert watch.blowup is None  # iterations 6, 7 and 8 were back in range
    with pytest.raises(Diverged) as e:
        _update(watch, {**CALM, "loss/value": math.nan}, "iteration 10")
    msg = str(e.value)
    assert str(checkpoints / "last.pt") not in msg, msg
    if periodic:
        assert ckpt.find_resume(checkpoints)[0].name == "iter_000004.pt"
        assert f"last finite checkpoint {checkpoints / 'iter_000004.pt'} (step 48)" in msg, msg
    else:
        with pytest.raises(ConfigError, match="was written after the blow-up that began at"):
            ckpt.find_resume(checkpoints)
        assert "no checkpoint was written before it; to start again" in msg, msg


def test_retention_keeps_the_protected_checkpoint(tmp_path):
    """checkpoint_keep=2 keeps the checkpoint a blow-up protects beside the newest two, and
    removes it once it is no longer protected."""
    cfg, state = make_config(["checkpoint_keep=2"]), {"global_step": 0, "iteration": 0}
    protected = ["iter_000002.pt"]
    for run_dir, last, kept in ((tmp_path / "a", 5, (4, 5)), (tmp_path / "b", 4, (2, 3, 4))):
        point = ResumePoint(lambda: state, run_dir, cfg, protect=lambda: protected[0])
        for i in range(1, last + 1):
            protected[0] = None if run_dir.name == "a" and i == 5 else "iter_000002.pt"
            point.save(i)
        names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        assert names == [*(f"iter_{k:06d}.pt" for k in kept), "last.pt"]
