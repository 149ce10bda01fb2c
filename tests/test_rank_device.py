"""Several GPUs: each rank resolves its device once, with its index, makes it torch's current CUDA
device, and hands that one device to its adapters, its policy and its normaliser; ManiSkill's sim
and renderer get the same index (rlrec/envs/factory.py resolve_device, rlrec/train/runner.py).

CUDA is faked (two GPUs, torch.cuda.* monkeypatched) and each rank is one torchrun launch's
environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE); no process group is made. The
rendezvous store is a HashStore in which rank 0 has published the UUID of its GPU, cuda:0.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

import pytest
import torch

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.envs.config import SimConfig
from tests.helpers import FAST, make_config

GPU_SIM = SimConfig(name="gpu", device="cuda")


@pytest.fixture
def two_gpus(monkeypatch) -> List[int]:
    """torch sees two GPUs; returns the indices torch.cuda.set_device was called with."""
    current = {"index": 0}
    calls: List[int] = []

    def index(device) -> int:
        index = device if isinstance(device, int) else torch.device(device).index
        assert index is not None, f"{device!r} without an index"
        return index

    def set_device(device):
        current["index"] = index(device)
        calls.append(current["index"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    uuid = lambda device: SimpleNamespace(uuid=f"GPU-{index(device)}")  # noqa: E731
    monkeypatch.setattr(torch.cuda, "get_device_properties", uuid)
    store = torch.distributed.HashStore()
    store.set("rlrec/gpu/0", "GPU-0")  # as rank 0 publishes it (distributed.shared_gpus)
    monkeypatch.setattr(distributed, "_store", store)
    for name in ("SLURM_GPUS_PER_TASK", "SUBMITIT_EXECUTOR", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return calls


def as_rank(monkeypatch, rank: int, world: int = 2) -> None:
    """This process's environment as torchrun gives it to rank ``rank`` of one node."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")


class Stop(Exception):
    """Ends a build that a faked GPU cannot finish."""


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_resolves_its_gpu_with_the_index(two_gpus, monkeypatch, rank):
    from rlrec.envs.factory import resolve_device

    as_rank(monkeypatch, rank)
    assert resolve_device(GPU_SIM) == torch.device("cuda", rank)
    assert resolve_device(SimConfig(name="cpu", device="cuda")) == torch.device("cuda", rank)


def test_one_process_gets_the_current_gpu_with_its_index(two_gpus, monkeypatch):
    from rlrec.envs.factory import resolve_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_device(GPU_SIM) == torch.device("cuda", 0)
    torch.cuda.set_device(1)
    assert resolve_device(GPU_SIM) == torch.device("cuda", 1)
    assert resolve_device(SimConfig(name="gpu", device="cuda:1")) == torch.device("cuda", 1)
    assert resolve_device(SimConfig()) == torch.device("cpu")


@pytest.mark.parametrize("rank", [0, 1])
def test_every_part_of_a_rank_uses_its_gpu(two_gpus, monkeypatch, tmp_path, rank):
    """A Runner on rank ``rank`` (gloo, two GPUs) makes cuda:<rank> current and builds its train
    and eval adapters, its policy and its normaliser for cuda:<rank>. The adapters are built on
    the CPU and PPO on the ``meta`` device in their place (no real GPU here): what is checked is
    the device each was asked for, and that PPO puts the policy and normaliser on the device it
    is given."""
    from rlrec.envs import builtin
    from rlrec.ppo.ppo import PPO
    from rlrec.train import runner as runner_mod

    as_rank(monkeypatch, rank)
    asked = {"adapter": [], "ppo": [], "watch": []}
    real_make = builtin.make

    def make(env_cfg, sim, num_envs, device, seed=None):
        asked["adapter"].append(torch.device(device))
        return real_make(env_cfg, sim, num_envs, torch.device("cpu"), seed)

    built = []

    def ppo(cfg, obs_space, action_space, device):
        asked["ppo"].append(torch.device(device))
        built.append(PPO(cfg, obs_space, action_space, torch.device("meta")))
        return built[-1]

    real_watch = runner_mod.Watch

    def watch(num_steps, num_envs, device, *args):  # the finite check's sums, on the meta device
        asked["watch"].append(torch.device(device))
        return real_watch(num_steps, num_envs, torch.device("meta"), *args)

    monkeypatch.setattr(builtin, "make", make)
    monkeypatch.setattr(runner_mod, "PPO", ppo)
    monkeypatch.setattr(runner_mod, "Watch", watch)
    cfg = make_config([*FAST, "sim.device=cuda", "algo.norm_obs=true", "distributed.backend=gloo"])
    run = runner_mod.Runner(cfg, tmp_path / "run")
    try:
        mine = torch.device("cuda", rank)
        assert run.device == mine
        assert two_gpus and two_gpus[-1] == rank  # the rank's GPU is torch's current device
        assert asked["adapter"] == [mine, mine]  # train and eval env
        assert asked["ppo"] == [mine]
        assert asked["watch"] == [mine]
        agent = built[0].agent
        tensors = [*agent.parameters(), *agent.buffers(), *built[0].obs_norm.buffers()]
        assert {t.device.type for t in tensors} == {"meta"}
    finally:
        run.close()


def test_no_adapter_is_built_on_a_bare_cuda(two_gpus, monkeypatch):
    from rlrec.envs import builtin
    from rlrec.envs.builtin import BuiltinEnvConfig
    from rlrec.envs.factory import make_adapter

    asked = []
    monkeypatch.setattr(builtin, "make", lambda cfg, sim, **kw: asked.append(kw["device"]))
    as_rank(monkeypatch, 1)
    make_adapter(BuiltinEnvConfig(), GPU_SIM, 2, seed=0)  # resolved: the rank's GPU
    torch.cuda.set_device(1)
    make_adapter(BuiltinEnvConfig(), GPU_SIM, 2, seed=0, device=torch.device("cuda"))
    assert asked == [torch.device("cuda", 1)] * 2


def test_maniskill_gets_the_rank_gpu_for_its_sim_and_renderer(two_gpus, monkeypatch):
    """ManiSkill's kwargs carry the index (a bare ``physx_cuda`` is SAPIEN's first CUDA device)."""
    from rlrec.envs.maniskill import gpu_env_kwargs

    kw = gpu_env_kwargs({"obs_mode": "state"}, 4, torch.device("cuda", 1))
    assert kw == {
        "obs_mode": "state",
        "num_envs": 4,
        "sim_backend": "physx_cuda:1",
        "render_backend": "sapien_cuda:1",
    }
    # env.kwargs may choose the renderer; the sim backend and num_envs are rlrec's
    kw = gpu_env_kwargs({"render_backend": "none", "sim_backend": "x", "num_envs": 9}, 4, "cuda:1")
    assert (kw["render_backend"], kw["sim_backend"], kw["num_envs"]) == ("none", "physx_cuda:1", 4)
    torch.cuda.set_device(1)  # a bare "cuda" means torch's current device, made explicit
    kw = gpu_env_kwargs({}, 4, torch.device("cuda"))
    assert (kw["sim_backend"], kw["render_backend"]) == ("physx_cuda:1", "sapien_cuda:1")


def test_maniskill_adapter_of_rank_1_asks_for_gpu_1(two_gpus, monkeypatch, tmp_path):
    """Through the factory, as the runner builds it: rank 1's ManiSkill GPU env is built with
    ``physx_cuda:1``/``sapien_cuda:1`` (the build itself is stopped: there is no GPU here)."""
    pytest.importorskip("mani_skill")
    from rlrec.envs import maniskill
    from rlrec.envs.factory import make_adapter
    from rlrec.envs.maniskill import ManiSkillEnvConfig

    as_rank(monkeypatch, 1)
    monkeypatch.setattr(maniskill, "require_gpu_library", lambda: None, raising=False)
    seen = {}

    def build(env_id, kwargs, imports=()):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(maniskill, "build_maniskill_env", build)
    monkeypatch.setattr(maniskill, "EpisodeClock", lambda num_envs, device: None)  # CUDA tensors
    with pytest.raises(Stop):
        make_adapter(ManiSkillEnvConfig(), GPU_SIM, 2, seed=0)
    assert seen["sim_backend"] == "physx_cuda:1" and seen["render_backend"] == "sapien_cuda:1"


@pytest.fixture
def backends(monkeypatch) -> List[str]:
    """The backends init_process_group is asked for (none is made)."""
    asked: List[str] = []
    monkeypatch.setattr(distributed, "_group", False)
    monkeypatch.setattr(distributed, "_comm_device", "cpu")
    fake = lambda backend, **kwargs: asked.append(backend)  # noqa: E731
    monkeypatch.setattr(torch.distributed, "init_process_group", fake)
    return asked


def test_one_gpu_per_rank_each_seen_as_cuda_0_runs_on_nccl(two_gpus, monkeypatch, backends):
    """The recipe of docs/distributed.md for Genesis: torchrun, each rank with
    CUDA_VISIBLE_DEVICES=$LOCAL_RANK. Each rank sees one GPU, its own: not shared (NCCL refuses
    only two ranks on one GPU), so the run needs no distributed.share_gpus and runs on NCCL."""
    as_rank(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(uuid="b"))
    cfg = make_config([*FAST, "sim=gpu"])
    distributed.check(cfg, torch.device("cuda", 0))
    distributed.init(cfg.distributed, torch.device("cuda", 0))
    assert backends == ["nccl"]


def test_two_ranks_on_one_gpu(two_gpus, monkeypatch, backends):
    """Both ranks on GPU-0: refused unless distributed.share_gpus=true, which runs the
    collectives on gloo; distributed.backend=nccl is refused."""
    as_rank(monkeypatch, 1)
    gpu = torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"sim=gpu with ranks 0, 1 on GPU GPU-0 .*share_gpus"):
        distributed.check(make_config([*FAST, "sim=gpu"]), gpu)
    with pytest.raises(ConfigError, match="NCCL cannot put two ranks on one GPU"):
        distributed.check(make_config([*FAST, "sim=gpu", "distributed.backend=nccl"]), gpu)
    cfg = make_config([*FAST, "sim=gpu", "distributed.share_gpus=true"])
    distributed.check(cfg, gpu)
    distributed.init(cfg.distributed, gpu)
    assert backends == ["gloo"]


@pytest.fixture
def genesis_started(monkeypatch):
    """Genesis faked: what ``init_genesis`` was asked for, with torch's current CUDA device then
    (it stops the build there)."""
    from rlrec.envs import genesis

    started = []

    def init_genesis(sim_name):
        started.append((sim_name, torch.cuda.current_device()))
        raise Stop

    monkeypatch.setattr(genesis, "import_genesis", lambda: None)
    monkeypatch.setattr(genesis, "import_object", lambda target, key: object)
    monkeypatch.setattr(genesis, "init_genesis", init_genesis)
    return started


def test_genesis_is_initialised_on_the_first_visible_gpu(two_gpus, genesis_started):
    """Genesis's gs.init takes torch's current CUDA device (genesis/utils/misc.py get_device):
    the adapter makes the rank's GPU (cuda:0 here) current before gs.init."""
    from rlrec.envs import genesis

    with pytest.raises(Stop):
        genesis.make(genesis.GenesisEnvConfig(), GPU_SIM, 2, torch.device("cuda", 0), seed=0)
    assert genesis_started == [("gpu", 0)]


@pytest.mark.parametrize("sim", ["gpu", "cpu"])
@pytest.mark.parametrize(
    "rank, overrides",
    [(1, ["sim.device=cuda"]), (None, ["sim.device=cuda:1"])],
    ids=["rank-1", "cuda-1"],
)
def test_genesis_on_another_gpu_than_the_first(
    two_gpus, monkeypatch, genesis_started, sim, rank, overrides
):
    """sim=gpu: Quadrants (Genesis's kernels) makes its CUDA context on device 0 whatever torch's
    current device is (its binary logs "Using CUDA device [id=0]"), so rank 1 of a shared node,
    or sim.device=cuda:1, would keep rlrec's tensors on cuda:1 and Genesis's on cuda:0: refused
    by the entry point's checks, naming CUDA_VISIBLE_DEVICES, and by make for callers that skip
    them; nothing of Genesis is initialised. sim=cpu: Genesis's CPU backend makes no CUDA context
    (docs/distributed.md), so the policy may be on any GPU: the checks pass with the rank's GPU,
    and make starts Genesis's CPU backend."""
    from omegaconf import OmegaConf

    from rlrec.envs import genesis
    from rlrec.run.preflight import refuse_before_work
    from tests.helpers import compose_cfg

    if rank is not None:
        as_rank(monkeypatch, rank)
    cfg = compose_cfg([*FAST, "env=genesis", f"sim={sim}", *overrides])
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    if sim == "gpu":
        with pytest.raises(ConfigError, match=r"cuda:1.*CUDA_VISIBLE_DEVICES"):
            refuse_before_work(cfg)
        with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES"):
            genesis.make(genesis.GenesisEnvConfig(), GPU_SIM, 2, torch.device("cuda", 1), seed=0)
        assert genesis_started == []
        return
    checked = refuse_before_work(cfg)
    assert checked.device == torch.device("cuda", 1)
    with pytest.raises(Stop):
        genesis.make(genesis.GenesisEnvConfig(), checked.config.sim, 2, checked.device, seed=0)
    assert genesis_started == [("cpu", 1)]
