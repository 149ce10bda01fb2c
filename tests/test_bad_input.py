"""The bad-input matrix, through the real entry point (``train.py``'s main): each row must fail
before any work with an error that names the offending key, and write nothing at all.

Rows also covered at the config level: tests/test_config.py (composition and validation),
tests/test_runner.py (bad checkpoint paths); here they run end to end.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List

import pytest
import torch
from hydra.errors import ConfigCompositionException

import rlrec.run.cli
from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.envs.config import SimConfig
from rlrec.envs.factory import resolve_device
from rlrec.run import budget
from rlrec.train.runner import Runner
from tests.helpers import FAST, REPO, make_config

RUN = [*FAST, "total_steps=256"]


def _files(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _main(args: List[str], tmp_path: Path, monkeypatch, capsys):
    """Runs train.py's main in this process from an empty cwd; returns (exit code, output)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as exc:
        rlrec.run.cli.main()
    out = capsys.readouterr()
    return exc.value.code, out.out + out.err, work


@pytest.fixture
def refused(tmp_path, monkeypatch, capsys):
    """``refused(args, *says)``: train.py ``args`` fails naming each of ``says`` (the key first)
    and writes nothing; returns its output."""

    def check(args, *says):
        before = [f for f in _files(tmp_path) if f != "work"]
        code, out, work = _main(args, tmp_path, monkeypatch, capsys)
        assert code not in (0, None) and all(s in out for s in says), out
        assert _files(work) == [], f"{args} wrote {_files(work)}"
        assert [f for f in _files(tmp_path) if f != "work"] == before
        return out

    return check


NON_FINITE = "is invalid: must be a finite number"
REFUSED = [
    # composition
    (["env=nope"], "env='nope'", "builtin", "gymnasium"),
    (["env.foo=1"], "env.foo"),
    (["env.num_envs=abc"], "env.num_envs"),
    (["-m", "hydra/launcher=nope", "seed=1,2"], "hydra/launcher", "nope", "basic"),
    # values
    *(
        ([o], o, "rlrec: config error")
        for o in (
            "env.num_envs=0",
            "eval_env.num_envs=0",
            "eval_env.episodes=0",
            "total_steps=0",
            "algo.num_steps=0",
            "algo.update_epochs=-1",
            "algo.num_minibatches=0",
            "env.max_episode_steps=0",
            "env.render_width=0",
            "recorder.length_frames=0",
            "recorder.length_sec=-1.5",
            "eval_env.recorder.length_frames=-3",
            "checkpoint_every=0",
            "checkpoint_keep=1",  # a single periodic copy
            "checkpoint_keep=-2",
            "eval_env.every=0",
            "recorder.fps=0",
        )
    ),
    (["env.num_envs=8", "recorder.env_idx=[8]"], "recorder.env_idx", "num_envs"),
    (["env.num_envs=8", "recorder.env_idx=[0,12]"], "recorder.env_idx", "num_envs"),
    (["eval_env.num_envs=2", "eval_env.recorder.env_idx=[2]"], "eval_env.recorder.env_idx", "num"),
    (["recorder.env_idx=[-1]"], "recorder.env_idx", "num_envs"),
    # an episode trigger and a step count: a recorder has exactly one trigger
    (["recorder.trigger=cubic", "recorder.every=5"], "recorder.every"),
    (["eval_env.recorder.every=3"], "eval_env.recorder.every"),
    (["recorder.length_frames=10", "recorder.length_sec=2"], "recorder.length_frames"),  # two
    (["recorder.trigger=step"], "recorder.every"),  # step trigger without its count
    # a protocol ffmpeg would write to (pipe:1 is its stdout): refused, not a dir of that name
    (["recorder.dir=pipe:1"], "recorder.dir", "protocol"),
    (["eval_env.recorder.dir=file:videos"], "eval_env.recorder.dir", "protocol"),
    # names that are not one plain file: every clip would fail
    (["recorder.filename=.."], "recorder.filename", "plain file name"),
    (["recorder.filename=."], "recorder.filename", "plain file name"),
    (["eval_env.recorder.filename=-latest.mp4"], "eval_env.recorder.filename", "plain file"),
    (["recorder.filename=" + "x" * 200], "recorder.filename", "plain file name"),  # no room
    (["recorder.stall_timeout_sec=0"], "recorder.stall_timeout_sec", "in (0, 86400]"),
    (["sim.name=gpu"], "sim.name", "sim=cpu"),  # the GPU simulator with sim.device=cpu
    (["eval_env.recorder.stall_timeout_sec=-1"], "eval_env.recorder.stall_t", "in (0, 86400]"),
    # every float field where NaN or infinity has no meaning (one check, math.isfinite: NaN or
    # infinity for each), and ranges a type cannot express
    *(
        ([*RUN, o], o.split("=")[0], NON_FINITE)
        for o in (
            "algo.learning_rate=nan",
            "algo.clip_coef=nan",
            "algo.target_kl=nan",
            "algo.ent_coef=nan",
            "algo.ent_coef=-0.01",
            "algo.vf_coef=-1",
            "algo.vf_coef=inf",
            "algo.max_grad_norm=inf",
            "algo.reward_scale=nan",
            "algo.init_log_std=nan",
            "algo.gamma=nan",
            "recorder.fps=nan",
            "recorder.length_sec=inf",
            "recorder.length_sec=1e308",  # finite, but its clip length would overflow
            "recorder.stall_timeout_sec=nan",
            "recorder.stall_timeout_sec=1e308",  # beyond what a wait can take
            "distributed.timeout_sec=1e308",
            "eval_env.recorder.fps=nan",
            "env.goal_radius=nan",
            "env.dt=inf",
        )
    ),
    *(
        ([*RUN, f"{k}={v}"], f"{k}=", "must be an integer in [0, ")
        for k in ("seed", "eval_env.seed")
        for v in (-1, 2**32)
    ),
    *(
        ([*RUN, f"sim.device={d}"], f"sim.device='{d}'", "cpu, cuda, cuda:N")
        for d in ("nonsense", "meta", "cpu:1")
    ),
    # Hydra's + adds a key even to a struct config: a key no schema declares is refused
    (
        [*RUN, "+evn=gymnasium"],
        "evn is not a config key",
        "did you mean env?",
        "env, sim, eval_env",
        "+experiment=NAME",
    ),
    ([*RUN, "+env.nmu_envs=4"], "env.nmu_envs is not a config key"),
    ([*RUN, "++algo.lr=0.1"], "algo.lr is not a config key"),
    ([*RUN, "+eval_env.recorder.fsp=5"], "eval_env.recorder.fsp is not a config key"),
    # it used to evaluate an untrained policy and exit 0
    ([*FAST, "eval_only=true", "resume=auto"], "resume=auto", "no checkpoint", "checkpoint=PATH"),
    (
        [*RUN, "env=gymnasium", "env.id=CartPole-v1", "+env.kwargs.gravity=3"],
        "env.kwargs.gravity",
        "CartPole-v1",
        "sutton_barto_reward, render_mode",
    ),
    # sizes that cannot fit a machine of less than hundreds of GB
    *(
        (args, key, "of host memory", "GB")
        for args, key in (
            (["env.num_envs=100000000"], "env.num_envs=100000000"),
            (["env.render_width=30000", "env.render_height=30000"], "env.render_width=30000"),
            (["algo.hidden_sizes=[100000,100000]"], "algo.hidden_sizes=[100000, 100000]"),
            (["algo.num_steps=100000000"], "algo.num_steps=100000000"),
        )
    ),
]


@pytest.mark.parametrize("row", REFUSED, ids=[row[1] for row in REFUSED])
def test_bad_input_is_refused_before_any_work(refused, row):
    args, *says = row
    if "of host memory" in says:
        need = sum(n.bytes for n in budget.estimate(make_config(args)))
        have, _ = budget.host_memory()
        if have is not None and have >= need:
            pytest.skip(f"this machine has {budget.gb(have)}: {args} ({budget.gb(need)}) fits")
    refused(args, *says)


@pytest.mark.parametrize(
    "override,says",
    [
        # an unknown key or group: the closest names, as the override would be written
        ("evn=gymnasium", "evn is not a config key: did you mean env=gymnasium?"),
        ("recoder.trigger=cubic", "recoder is not a config key: did you mean recorder.trigger=cub"),
        ("env.num_envz=4", "env.num_envz is not a config key: did you mean env.num_envs=4?"),
        ("env=gymnasum", "env='gymnasum' is invalid: allowed values are builtin, genesis, gym"),
        ("+experiment=cartpol", "did you mean cartpole?"),
        ("recorder.trigger=Cubic", "allowed values are cubic, episode, step"),
        # a wrong type: the key, its type and an example (the key's value so far)
        ("total_steps=1e5", "must be an integer, e.g. total_steps=100000 (1e5 is a float: write"),
        (
            "env.num_envs=8.5",
            "env.num_envs=8.5 is invalid: must be an integer, e.g. env.num_envs=64",
        ),
        ("recorder.quality=7.5", "recorder.quality=7.5 is invalid: must be an integer, e.g. recor"),
        ("algo.learning_rate=abc", "must be a number, e.g. algo.learning_rate=0.0003"),
        ("recorder.env_idx=[x]", "must be a list of integers, e.g. recorder.env_idx=[0]"),
        ("algo.hidden_sizes=8", "must be a list of integers, e.g. algo.hidden_sizes=[64,64]"),
        ("env.max_episode_steps=x", "must be an integer or null, e.g. env.max_episode_steps=100"),
        ("hydra.mode=SWEEP", "hydra.mode='SWEEP' is invalid: allowed values are RUN, MULTIRUN"),
    ],
)
def test_an_override_hydra_cannot_apply_gets_one_line(
    override, says, tmp_path, monkeypatch, capsys
):
    """Hydra's own errors (``Could not override 'evn'``, ``Error merging override ...``, exit 1)
    become rlrec's one line, exit 2."""
    code, out, work = _main([override], tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert out.startswith("rlrec: config error: ") and out.count("\n") == 1, out
    assert says in out, out
    assert _files(work) == [] and "HYDRA_FULL_ERROR" not in os.environ


def test_hydra_reports_a_crash_of_the_run_as_without_rlrec(tmp_path, monkeypatch, capsys):
    """What the run raises is Hydra's to report, without Hydra's own frames (exit 1); a user's
    HYDRA_FULL_ERROR=1 gets Hydra's own error of an override."""

    def crash(*args, **kwargs):
        raise RuntimeError("the run crashed")

    monkeypatch.setattr(rlrec.run.cli, "_single", crash)
    code, out, _ = _main([f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, monkeypatch, capsys)
    assert code == 1 and "RuntimeError: the run crashed" in out, out
    assert "rlrec: config error" not in out and "hydra/_internal" not in out, out
    assert "HYDRA_FULL_ERROR" not in os.environ
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", ["train.py", "evn=gymnasium"])
    with pytest.raises(ConfigCompositionException, match="Could not override 'evn'"):
        rlrec.run.cli.main()
    assert os.environ["HYDRA_FULL_ERROR"] == "1"


# --------------------------------------------------------------------------- GPU memory


def _one_gpu(monkeypatch, free: int, total: int) -> None:
    """torch sees one GPU with ``free`` of ``total`` bytes free (cudaMemGetInfo's answer)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    for name in ("SLURM_GPUS_PER_TASK", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


GPU_RUN = ["sim.device=cuda", "env.obs_mode=rgb_state", "algo.encoder=cnn", "algo.compile=true"]


def _gpu_need(args: List[str]) -> int:
    return sum(n.bytes for n in budget.estimate(make_config(args), True) if n.where == "device")


def test_a_run_larger_than_the_free_gpu_memory_is_refused(refused, monkeypatch):
    """The device's free memory is what a run can have, not its total; the refusal says what it
    does not count. Half of the need free: refused; twice: accepted."""
    need = _gpu_need(GPU_RUN)
    _one_gpu(monkeypatch, need // 2, 10 * need)
    also = ["of GPU memory (cuda:0)", "free of", "torch.cuda.mem_get_info", "CUDA-graph copies"]
    refused(GPU_RUN, "env.num_envs", *also, "Not counted: the simulator's and the renderer's")
    _one_gpu(monkeypatch, 2 * need, 10 * need)
    budget.check(make_config(GPU_RUN), torch.device("cuda", 0))


def test_ranks_sharing_a_gpu_share_its_free_memory(refused, monkeypatch):
    """distributed.share_gpus: two ranks on one GPU each have half its free memory."""
    args = [*GPU_RUN, "distributed.share_gpus=true"]
    need = _gpu_need(args)
    _one_gpu(monkeypatch, 3 * need // 2, 10 * need)
    budget.check(make_config(args), torch.device("cuda", 0))  # one process: it fits
    for key, value in (("RANK", 1), ("LOCAL_RANK", 1), ("WORLD_SIZE", 2), ("LOCAL_WORLD_SIZE", 2)):
        monkeypatch.setenv(key, str(value))
    # the ranks' GPUs, as rank 0 published its own (rlrec.distributed.shared_gpus): the same one
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(uuid="G"))
    store = torch.distributed.HashStore()
    store.set("rlrec/gpu/0", "G")
    monkeypatch.setattr(distributed, "_store", store)
    refused(args, "env.num_envs", "shared by the 2 ranks on it (distributed.share_gpus)")


def test_gpu_ids_are_relative_to_the_gpus_the_job_was_given(monkeypatch):
    """A job given one GPU (CUDA_VISIBLE_DEVICES=5, as SLURM/submitit set it) sees it as cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert resolve_device(SimConfig(name="gpu", device="cuda:0")) == torch.device("cuda:0")
    with pytest.raises(ConfigError, match=r"sim.device=cuda:5 .*CUDA_VISIBLE_DEVICES=5"):
        resolve_device(SimConfig(name="gpu", device="cuda:5"))


# --------------------------------------------------------------------------- files


def test_unwritable_run_and_sweep_dirs(refused, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused([f"hydra.run.dir={blocker}/run"], "hydra.run.dir", "not a directory")
    refused(["-m", "seed=1,2", f"hydra.sweep.dir={blocker}/s"], "hydra.sweep.dir", "not a dir")
    if os.geteuid() != 0:  # root writes into read-only dirs
        (tmp_path / "ro").mkdir(mode=0o555)
        refused([f"hydra.run.dir={tmp_path}/ro/run"], "hydra.run.dir", "not writable")


def test_checkpoints_missing_or_of_another_env(refused, tmp_path):
    """A missing file is refused before work (refuse_before_work); one of another env (one
    iteration of CartPole: obs (4,), Discrete(2)) once the envs are built, which it says."""
    out = refused([*FAST, f"checkpoint={tmp_path}/nope.pt"], "checkpoint=", "does not exist")
    assert "found after the run dir was claimed" not in out
    src = tmp_path / "cartpole"
    src.mkdir()
    one = ["env.num_envs=2", "algo.num_steps=8", "algo.num_minibatches=1", "total_steps=16"]
    quiet = ["recorder=none", "eval_env.enabled=false", "logger=none", "logger.progress=false"]
    Runner(make_config(["env=gymnasium", "env.id=CartPole-v1", *one, *quiet]), src).run()
    also = ["'gymnasium'", "(4,)", "Discrete(2)", "rlrec: config error"]
    refused(
        [*FAST, f"checkpoint={src}/checkpoints/last.pt"],
        "checkpoint",
        *also,
        "(found after the run dir was claimed: when the run read its checkpoint",
    )


# --------------------------------------------------------------------------- missing extras

_BLOCKER = """
import importlib.abc, os, sys
_BLOCKED = tuple(os.environ["RLREC_TEST_BLOCK"].split(","))
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in _BLOCKED or name.startswith(tuple(b + "." for b in _BLOCKED)):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "modules,args,key,extra",
    [
        (["mani_skill", "sapien"], ["env=maniskill"], "env=maniskill", "maniskill"),
        *(
            ([f"hydra_plugins.hydra_{plugin}"], ["-m", f"hydra/{group}", "seed=1,2"], group, e)
            for plugin, group, e in (
                ("joblib_launcher", "launcher=joblib", "launchers"),
                ("submitit_launcher", "launcher=submitit_slurm", "launchers"),
                ("optuna_sweeper", "sweeper=optuna", "launchers"),
                ("ray_launcher", "launcher=ray", "ray"),
            )
        ),
        (["wandb"], ["logger=wandb"], "logger=wandb", "wandb"),
    ],
)
def test_missing_optional_extra_names_it(modules, args, key, extra, tmp_path):
    """train.py in a subprocess in which ``modules`` cannot be imported (as if not installed)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_BLOCKER)
    (tmp_path / "work").mkdir()
    path = os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *FAST, *args],
        cwd=tmp_path / "work",
        env={**os.environ, "PYTHONPATH": path, "RLREC_TEST_BLOCK": ",".join(modules)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rlrec: config error" in proc.stderr and key in proc.stderr
    installs = (f"rlrec[{extra}]", f".[{extra}]", f"the {extra} extra")
    assert any(f in proc.stderr for f in installs), proc.stderr
    assert _files(tmp_path / "work") == []


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None, reason="box2d is installed here")
def test_gymnasium_env_whose_extra_is_missing(refused):
    """LunarLander-v3 without box2d: gymnasium's DependencyNotInstalled, as one config error line
    naming the key and what to install, for the recording and the non-recording path."""
    base = [*RUN, "env=gymnasium", "env.id=LunarLander-v3"]
    for extra in ([], ["recorder=none", "eval_env.recorder.enabled=false"]):
        out = refused([*base, *extra], "env.id='LunarLander-v3'", "gymnasium[box2d]")
        errors = [line for line in out.splitlines() if line.strip()]
        assert errors == [errors[0]] and errors[0].startswith("rlrec: config error"), out
