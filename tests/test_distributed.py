"""Data-parallel training on two gloo ranks on the CPU (rlrec/distributed.py, docs/distributed.md).

The ranks are started as torchrun starts them (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``
in the environment of each process), by torch.multiprocessing or as ``train.py`` subprocesses, so
a test can signal or kill one rank; one test goes through torchrun itself, one through Hydra's
submitit_local launcher with two tasks.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

from rlrec import distributed
from rlrec.checks import ConfigError
from tests.helpers import FAST, REPO, make_config, read_metrics, run_train, wait_for

TWO = ["distributed.timeout_sec=60", *FAST]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> Dict[str, str]:
    ranks = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        **{k: str(v) for k, v in ranks.items()},
    }


def start_ranks(args: List[str], cwd: Path, logs: Path, world: int = 2) -> List[subprocess.Popen]:
    """``train.py args`` as ``world`` ranks of one run, each logging to ``logs/rank<r>.log``."""
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **_rank_env(r, world, port)},
            stdout=open(logs / f"rank{r}.log", "w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]


def wait_ranks(procs: List[subprocess.Popen], timeout: float) -> List[int]:
    """Every rank's exit status, killing all of them after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _log(logs: Path, *ranks: int) -> str:
    return "".join((logs / f"rank{r}.log").read_text() for r in ranks or (0, 1))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


# ------------------------------------------------------------------ in-process ranks (spawn)
def _rank_worker(rank: int, world: int, port: int, run_dirs: List[str], out: List[str]) -> None:
    os.environ.update(_rank_env(rank, world, port))
    from rlrec.train.runner import Runner
    from rlrec.train.stack import recorder_of

    cfg = make_config([*TWO, "total_steps=1536", "recorder.trigger=always"])
    distributed.init(cfg.distributed, torch.device("cpu"))
    runner = Runner(cfg, Path(run_dirs[rank]))
    ppo = runner.ppo
    after: List[torch.Tensor] = []
    rollouts: List[torch.Tensor] = []
    update = ppo.update

    def recording_update(*args, **kwargs):
        rollouts.append(ppo.storage.obs.clone())
        losses = update(*args, **kwargs)
        norm = ppo.obs_norm
        after.append(
            torch.cat(
                [p.detach().reshape(-1).double() for p in ppo.agent.parameters()]
                + [norm.mean.double(), norm.var.double(), norm.count.reshape(1)]
            )
        )
        return losses

    ppo.update = recording_update
    built = {
        "train_recorder": recorder_of(runner.train_env) is not None,
        "eval_env": runner.eval_env is not None,
        "logs": runner.logger.writes,  # every rank has a logger: rank 0's alone writes
    }
    runner.run()
    distributed.shutdown()
    torch.save({"after": after, "rollouts": rollouts, "built": built}, out[rank])


def test_ranks_hold_one_policy_and_rank_1_writes_nothing(tmp_path):
    """After every update both ranks hold the same parameters and normaliser statistics, from
    different episodes; rank 1 builds no recorder and no eval env, and writes no file (its logger
    does nothing)."""
    import torch.multiprocessing as mp

    run_dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    for d in run_dirs:
        d.mkdir()
    out = [str(tmp_path / f"out{r}.pt") for r in range(2)]
    ctx = mp.start_processes(
        _rank_worker,
        args=(2, _free_port(), [str(d) for d in run_dirs], out),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=1):
        assert time.monotonic() < deadline, "the two ranks did not finish"
    r0, r1 = (torch.load(p, weights_only=True) for p in out)
    assert len(r0["after"]) == len(r1["after"]) == 1536 // (2 * 8 * 16)
    for a, b in zip(r0["after"], r1["after"]):
        assert torch.equal(a, b)
    assert not torch.equal(r0["after"][0], r0["after"][-1])  # it trained
    for a, b in zip(r0["rollouts"], r1["rollouts"]):
        assert not torch.equal(a, b)  # each rank collects its own episodes
    assert r0["built"] == {"train_recorder": True, "eval_env": True, "logs": True}
    assert r1["built"] == {"train_recorder": False, "eval_env": False, "logs": False}
    assert (run_dirs[0] / "metrics.jsonl").is_file()
    assert (run_dirs[0] / "checkpoints" / "last.pt").is_file()
    assert list((run_dirs[0] / "videos" / "train").glob("*.mp4"))
    assert list(run_dirs[1].rglob("*")) == []


# ------------------------------------------------------------------ torchrun end to end
def test_torchrun_two_ranks_share_one_run_dir(tmp_path):
    """``torchrun --nproc-per-node 2 train.py``: one run dir (its default name has ${now:...} and
    a per-process id in it), one set of Hydra files, a checkpoint with both ranks' state."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(REPO / "train.py"),
            *TWO,
            "total_steps=1024",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [p.parent for p in tmp_path.glob("outputs/*/*/.hydra")]
    assert len(runs) == 1 and len(list(tmp_path.glob("outputs/*/*"))) == 1
    run = runs[0]
    assert "a global batch of 256 env steps per iteration" in proc.stdout
    assert len(list(run.glob("*.log"))) == 1
    data = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert data["world_size"] == 2 and len(data["ranks"]) == 1
    assert data["global_step"] == 1024
    assert not torch.equal(data["rng"]["torch"], data["ranks"][0]["rng"]["torch"])


# ------------------------------------------------------------------ learning
def _first_success(run_dir: Path, threshold: float = 0.95) -> Optional[int]:
    for rec in read_metrics(run_dir):
        if rec.get("eval/success", 0.0) >= threshold:
            return int(rec["step"])
    return None


LEARN = [
    "env.render_width=32",
    "env.render_height=32",
    "eval_env.num_envs=16",
    "eval_env.every=2",
    "algo.num_steps=32",
    "algo.learning_rate=3e-3",
    "algo.anneal_lr=false",
    "logger.progress=false",
    "logger=none",
    "recorder=none",
    "eval_env.recorder.enabled=false",
    "total_steps=10240",
    "distributed.timeout_sec=60",
]


def test_two_ranks_learn_as_fast_as_one_with_twice_the_envs(tmp_path):
    """Two ranks of 8 envs reach eval success >= 0.95 within the same number of global env steps
    (within noise) as one rank of 16 envs."""
    run_train([*LEARN, "env.num_envs=16", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path)
    procs = start_ranks(
        [*LEARN, "env.num_envs=8", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path, tmp_path
    )
    assert wait_ranks(procs, 240) == [0, 0], _log(tmp_path)
    one, two = _first_success(tmp_path / "one"), _first_success(tmp_path / "two")
    assert one is not None and two is not None, (one, two)
    assert 0.5 <= two / one <= 2.0, (one, two)


# ------------------------------------------------------------------ stop, kill, resume
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_killed_rank_ends_the_other_within_the_timeout(tmp_path, sig):
    """A rank that dies (its connections close) or hangs (stopped: the collective times out)
    ends the other rank within distributed.timeout_sec, with a message."""
    timeout = 10
    procs = start_ranks(
        [
            *FAST,
            f"distributed.timeout_sec={timeout}",
            "total_steps=10000000",
            "recorder=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        tmp_path / "logs",
    )
    wait_for(lambda: _lines(tmp_path / "run" / "metrics.jsonl") >= 2, procs[0])
    procs[1].send_signal(sig)
    t0 = time.monotonic()
    try:
        rc = procs[0].wait(timeout=timeout + 20)
    finally:
        procs[1].kill()  # a stopped process too
        wait_ranks(procs, 10)
    assert time.monotonic() - t0 < timeout + 20
    assert rc == 1
    assert "another rank of this run failed" in _log(tmp_path / "logs", 0)


def test_sigterm_to_one_rank_stops_both_and_resume_continues_bit_exactly(tmp_path):
    """SIGTERM to rank 1 alone stops both ranks (exit 143, one checkpoint); resume=auto with two
    ranks ends with the parameters of an uninterrupted two-rank run."""
    args = [*TWO, "total_steps=3072", "recorder=none", "checkpoint_every=1000"]
    full = start_ranks([*args, f"hydra.run.dir={tmp_path / 'full'}"], tmp_path, tmp_path / "l1")
    assert wait_ranks(full, 240) == [0, 0], _log(tmp_path / "l1", 0)
    cut = start_ranks([*args, f"hydra.run.dir={tmp_path / 'cut'}"], tmp_path, tmp_path / "l2")
    wait_for(lambda: _lines(tmp_path / "cut" / "metrics.jsonl") >= 3, cut[0])
    cut[1].send_signal(signal.SIGTERM)
    assert wait_ranks(cut, 120) == [143, 143], _log(tmp_path / "l2")
    saved = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert 0 < saved["global_step"] < 3072
    again = start_ranks(
        [*args, f"hydra.run.dir={tmp_path / 'cut'}", "resume=auto"], tmp_path, tmp_path / "l3"
    )
    assert wait_ranks(again, 240) == [0, 0], _log(tmp_path / "l3")
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 3072
    for key, value in a["ppo"]["agent"].items():
        assert torch.equal(value, b["ppo"]["agent"][key]), key
    for key, value in a["ppo"]["obs_norm"].items():
        assert torch.equal(value, b["ppo"]["obs_norm"][key]), key
    assert torch.equal(a["ranks"][0]["next_obs"], b["ranks"][0]["next_obs"])


def test_resume_with_another_world_size_is_refused(tmp_path):
    run = tmp_path / "run"
    run_train([*FAST, "total_steps=256", "recorder=none", f"hydra.run.dir={run}"], tmp_path)
    procs = start_ranks(
        [*TWO, "total_steps=1024", "recorder=none", f"hydra.run.dir={run}", "resume=auto"],
        tmp_path,
        tmp_path / "logs",
    )
    assert wait_ranks(procs, 120) == [2, 2]
    text = _log(tmp_path / "logs", 0)
    assert "saved by a run of 1 rank(s) and this run has 2 (WORLD_SIZE)" in text, text


# ------------------------------------------------------------------ SLURM (submitit_local)
def test_submitit_local_two_tasks_train_one_run(tmp_path):
    """Hydra's submitit_local launcher with tasks_per_node=2: the rendezvous comes from
    submitit's job environment; one job dir, rank 0's files, one summary row."""
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.tasks_per_node=2",
            f"hydra.sweep.dir={sweep}",
            *TWO,
            "total_steps=512",
            "recorder=none",
        ],
        tmp_path,
        timeout=300,
    )
    assert "2 ranks (gloo)" in (sweep / ".submitit").glob("*/*_0_log.out").__next__().read_text()
    data = torch.load(sweep / "0" / "checkpoints" / "last.pt", weights_only=True)
    assert data["world_size"] == 2 and data["global_step"] == 512
    rows = [json.loads(p.read_text()) for p in (sweep / ".rlrec_summary").glob("0*.json")]
    assert [r["status"] for r in rows] == ["COMPLETED"], proc.stdout


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["eval_only=true", "checkpoint=x.pt"], "eval_only=true runs on one process"),
        (["total_steps=200"], "total_steps=200 is less than one global batch: WORLD_SIZE=2"),
        ([f"seed={2**32 - 12}"], "is invalid with WORLD_SIZE=2"),
        (["distributed.backend=nccl"], "distributed.backend=nccl needs the policy on CUDA"),
    ],
)
def test_bad_input_for_two_ranks(monkeypatch, overrides, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = make_config([*FAST, *overrides])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        distributed.check(cfg, torch.device("cpu"))


# ------------------------------------------------------------------ GPUs (CUDA faked)
def _exchange(uuids: List[str], timeout: float = 10) -> List[object]:
    """Each rank r of len(uuids) publishes uuids[r] in one store, each from its own thread:
    what shared_gpus answers each (or the ConfigError it raised)."""
    store, out = torch.distributed.HashStore(), [None] * len(uuids)

    def rank(r: int) -> None:
        try:
            out[r] = distributed.shared_gpus(store, uuids[r], r, len(uuids), timeout)
        except ConfigError as exc:
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(uuids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def test_ranks_tell_each_other_their_gpu():
    """Every rank gets the same answer: the GPUs two ranks use, by UUID, with their ranks."""
    assert _exchange(["GPU-a", "GPU-b"]) == [{}, {}]
    assert _exchange(["GPU-a", "GPU-b", "GPU-a"]) == [{"GPU-a": [0, 2]}] * 3


def test_a_rank_that_never_publishes_its_gpu_ends_the_wait_within_the_timeout():
    store = torch.distributed.HashStore()
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"rank 0: rank\(s\) \[1\] did not publish their GPU"):
        distributed.shared_gpus(store, "GPU-a", 0, 2, 0.5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_finite_and_positive(value):
    with pytest.raises(ConfigError, match="distributed.timeout_sec"):
        make_config([*FAST, f"distributed.timeout_sec={value}"])


def test_a_refusal_on_rank_0_ends_every_rank(tmp_path):
    """Rank 0 finds the run dir held by another run: it refuses, and rank 1 (which waits for rank
    0's run dir before Hydra makes one) says so and exits too, both with 2."""
    from rlrec.run import rundir

    run = tmp_path / "run"
    claim = rundir.claim(run, "hydra.run.dir")
    try:
        procs = start_ranks([*TWO, f"hydra.run.dir={run}"], tmp_path, tmp_path / "logs")
        assert wait_ranks(procs, 120) == [2, 2]
    finally:
        claim.release()
    assert "is in use by another rlrec run" in _log(tmp_path / "logs", 0)
    assert "rank 0 refused the run" in _log(tmp_path / "logs", 1)
    assert sorted(p.name for p in run.iterdir()) == []


def test_sweep_under_torchrun_is_refused_before_any_work(tmp_path):
    env = {**os.environ, **_rank_env(0, 2, _free_port()), "TORCHELASTIC_RUN_ID": "x"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "seed=1,2", *FAST],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "-m (a sweep) under torchrun is refused" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_one_process_touches_no_process_group():
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    assert not torch.distributed.is_initialized()
    assert distributed.agree_signal(None) is None
    t = torch.ones(3)
    assert distributed.all_reduce_(t) is t and torch.equal(t, torch.ones(3))


def test_normaliser_merge_equals_one_normaliser_of_all_observations():
    """Two ranks' pending moments merged (the all-reduce faked by a sum of both) give the
    statistics of one normaliser that saw every observation."""
    from rlrec.ppo.agent import ObsNormalizer

    g = torch.Generator().manual_seed(0)
    batches = [[torch.randn(8, 3, generator=g) * 3 + 1 for _ in range(4)] for _ in range(2)]
    ranks = [ObsNormalizer((3,), pending=True) for _ in range(2)]
    one = ObsNormalizer((3,))
    for step in range(4):
        for r in range(2):
            ranks[r].update(batches[r][step])
        one.update(torch.cat([batches[0][step], batches[1][step]]))
    total = ranks[0]._pending + ranks[1]._pending
    for r in ranks:
        r.merge_pending(lambda t: t.copy_(total))
    assert torch.equal(ranks[0].mean, ranks[1].mean) and torch.equal(ranks[0].var, ranks[1].var)
    torch.testing.assert_close(ranks[0].mean, one.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ranks[0].var, one.var, rtol=1e-5, atol=1e-6)
    assert float(ranks[0].count) == pytest.approx(float(one.count))
    assert float(ranks[0]._pending.abs().sum()) == 0.0  # the next rollout starts afresh


def test_another_ranks_cuda_tensors_arrive_on_the_cpu(monkeypatch):
    """What rank k sends (gather into rank 0's checkpoint) is serialized with its storages' device
    tags, cuda:k (torch/serialization.py: ``location = location_tag(storage)``). Rank 0 loads it
    on the CPU: torch.load without map_location restores each storage on its saved device
    (``default_restore_location``), which fails where cuda:k is not visible (here: no CUDA)."""
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:3")
    buf = io.BytesIO()  # as _all_gather serializes what a rank sends
    torch.save({"next_obs": torch.arange(6.0).reshape(2, 3), "n": 7}, buf)
    monkeypatch.undo()
    data = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
    out = distributed._from_bytes(data)
    assert out["n"] == 7 and out["next_obs"].device == torch.device("cpu")
    assert torch.equal(out["next_obs"], torch.arange(6.0).reshape(2, 3))
