"""Data-parallel runs: the process group and every collective rlrec uses, in one place.

One run trains one policy on ``WORLD_SIZE`` processes (``torchrun``, or SLURM/submitit tasks):

- **Start-up.** The rendezvous is ``env://`` (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``), as torchrun exports it; in a submitit job with several tasks,
  the first read of one (:func:`env_rank`, ...) exports it from submitit's job environment. The
  rendezvous store is made once (:func:`store`) and serves three times: with the policy on CUDA,
  the ranks tell each other their GPU's UUID (:func:`shared_gpus`); before Hydra creates the run
  dir, rank 0 publishes the run dir it resolved and every other rank takes it (:func:`publish`,
  :func:`wait_for`), so a ``${now:...}`` in ``hydra.run.dir`` names one dir for the whole run;
  then the process group (:func:`init`) is built on the same store, gloo on CPU and NCCL on
  CUDA (gloo where two ranks share a GPU), with ``distributed.timeout_sec`` as the timeout of
  every collective: no rank waits longer than that for a rank that died or hangs.
- **Training.** Gradients are averaged every minibatch (:func:`mean_grads_`, one all-reduce of the
  flat gradient), the normaliser's statistics are merged once per update and the KL early stop is
  decided on the mean KL (:func:`all_reduce_`), the stop flag once per rollout
  (:func:`agree_signal`); rank 0 alone evaluates, records, logs and writes files
  (:func:`is_main`), and gathers each rank's RNG and env state into its checkpoints
  (:func:`gather`).

With one process (no ``WORLD_SIZE`` above 1 in the environment) every helper is a no-op and
nothing of ``torch.distributed`` is touched.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    import torch

from rlrec.checks import SECONDS, SEED_MAX, Choice, ConfigError

_KEY_PREFIX = "rlrec/"
_ERROR = "!error:"  # a published value that says the publishing rank failed, and why

_store: Any = None  # the rendezvous store (made once per process)
_group = False  # whether this module initialised the default process group
_comm_device: Any = "cpu"  # where collectives run (CUDA for NCCL)


class Backend(Choice):
    """torch.distributed backend: ``auto`` is NCCL when the policy is on CUDA and no two ranks
    share a GPU, else gloo."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class DistributedConfig:
    """Data-parallel training on several processes (``torchrun``, or SLURM through submitit;
    docs/distributed.md). With one process these keys change nothing."""

    # the range of each float field, applied by rlrec.checks.check_fields (not a field)
    FLOAT_RANGES = {"timeout_sec": SECONDS}

    backend: Backend = Backend.auto  # auto: nccl on CUDA (a GPU per rank), else gloo
    # seconds a collective (or the start-up rendezvous) waits for the other ranks before the run
    # fails: longer than the slowest evaluation + checkpoint, which only rank 0 runs
    timeout_sec: float = 600.0
    share_gpus: bool = False  # let several ranks share a GPU (else refused)


# ---------------------------------------------------------------------- the environment
def _int(name: str, default: int) -> int:
    with contextlib.suppress(ValueError):
        return int(os.environ.get(name) or default)
    return default


def _env_int(name: str, default: int) -> int:
    """A variable of the ``env://`` rendezvous. In a submitit job of several tasks
    (``tasks_per_node``, ``nodes``), exported first from submitit's job environment
    (``TorchDistributedEnvironment``: the first host, a port derived from the job id, RANK,
    WORLD_SIZE, LOCAL_RANK), unless they are set already; CUDA_VISIBLE_DEVICES is left as SLURM
    set it."""
    tasks = _int("SUBMITIT_LOCAL_NTASKS", _int("SLURM_NTASKS", 1))
    if os.environ.get("SUBMITIT_EXECUTOR") and tasks > 1 and "RANK" not in os.environ:
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return _int(name, default)


def env_world_size() -> int:
    return max(1, _env_int("WORLD_SIZE", 1))


def env_rank() -> int:
    return _env_int("RANK", 0)


def launched() -> bool:
    """True when this process is one rank of several (before or after :func:`init`)."""
    return env_world_size() > 1


# ---------------------------------------------------------------------- rank helpers
def _ask(name: str, alone: Any) -> Any:
    """``torch.distributed.<name>()`` in the process group; ``alone`` with one process."""
    if not _group:
        return alone
    import torch

    return getattr(torch.distributed, name)()


def world_size() -> int:
    return _ask("get_world_size", 1)


def rank() -> int:
    return _ask("get_rank", 0)


def is_main() -> bool:
    """Rank 0: the one rank that evaluates, records, logs and writes files."""
    return rank() == 0


# ---------------------------------------------------------------------- rendezvous
def store(timeout_sec: float) -> Any:
    """The ``env://`` rendezvous store of this run (made on first use; rank 0 hosts it, or
    torchrun's agent does). The other ranks wait at most ``timeout_sec`` for it."""
    global _store
    import torch

    if _store is None:  # torch reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself
        found = torch.distributed.rendezvous("env://", timeout=timedelta(seconds=timeout_sec))
        _store = next(found)[0]
    return _store


def publish(key: str, value: str, timeout_sec: float, error: bool = False) -> None:
    """Rank 0 publishes ``value`` under ``key`` for the other ranks (:func:`wait_for`); ``error``:
    rank 0 failed before ``key``, and the ranks waiting for it fail with the message ``value``
    (or, where rank 0 could not even host the store, time out)."""
    with contextlib.suppress(Exception) if error else contextlib.nullcontext():
        store(timeout_sec).set(_KEY_PREFIX + key, (_ERROR if error else "") + value)


def wait_for(key: str, timeout_sec: float) -> str:
    """What rank 0 published under ``key``, waiting at most ``timeout_sec``; ConfigError when rank
    0 failed before it (its message) or did not publish it in time."""
    s = store(timeout_sec)
    try:
        s.wait([_KEY_PREFIX + key], timedelta(seconds=timeout_sec))
        value = s.get(_KEY_PREFIX + key).decode()
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise ConfigError(
            f"rank {env_rank()}: rank 0 did not publish {key} within distributed.timeout_sec="
            f"{timeout_sec:g}s ({type(exc).__name__}: {first})"
        ) from None
    if value.startswith(_ERROR):
        raise ConfigError(f"rank 0 refused the run: {value[len(_ERROR) :]}")
    return value


# ---------------------------------------------------------------------- checks
def check(cfg: Any, device: torch.device) -> None:
    """What a run of ``WORLD_SIZE`` ranks refuses before any work (ConfigError naming the keys):
    evaluation alone on several ranks, a total below one global batch, env seeds past 32 bits,
    NCCL without CUDA, and the policy on CUDA (this rank's ``device``) with two ranks on one GPU
    (:func:`shared_gpus`)."""
    world = env_world_size()
    if world <= 1:
        return
    if cfg.eval_only:
        raise ConfigError(
            f"eval_only=true runs on one process, this is rank {env_rank()} of WORLD_SIZE={world}:"
            " start it with python train.py, not torchrun"
        )
    n, steps = cfg.env.num_envs, cfg.algo.num_steps
    if cfg.total_steps < world * n * steps:
        raise ConfigError(
            f"total_steps={cfg.total_steps} is less than one global batch: WORLD_SIZE={world} x "
            f"env.num_envs={n} (per rank) x algo.num_steps={steps} = {world * n * steps} env "
            "steps; raise total_steps or lower env.num_envs"
        )
    if cfg.seed > SEED_MAX - (world * n - 1):
        raise ConfigError(
            f"seed={cfg.seed} is invalid with WORLD_SIZE={world}: rank r seeds its env i with "
            f"seed + r * env.num_envs + i, so seed must be in [0, {SEED_MAX - (world * n - 1)}]"
        )
    nccl = Backend(cfg.distributed.backend) is Backend.nccl
    if nccl and device.type != "cuda":
        raise ConfigError(
            f"distributed.backend=nccl needs the policy on CUDA (sim.device={cfg.sim.device}): "
            "use distributed.backend=auto or gloo on CPU"
        )
    if device.type != "cuda":
        return
    if ":" in str(cfg.sim.device):
        raise ConfigError(
            f"sim.device={cfg.sim.device} names one GPU for every rank: use sim.device=cuda "
            "(rank with local rank k uses cuda:k)"
        )
    shared = _shared(device, cfg.distributed.timeout_sec)
    where = "; ".join(f"ranks {', '.join(map(str, r))} on GPU {u}" for u, r in shared.items())
    if nccl and shared:
        raise ConfigError(
            f"distributed.backend=nccl, but {where}: NCCL cannot put two ranks on one GPU; "
            "use distributed.backend=auto (gloo when GPUs are shared) or one rank per GPU"
        )
    if shared and not cfg.distributed.share_gpus:
        raise ConfigError(
            f"sim={cfg.sim.name} with {where} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): start at most one rank per "
            "GPU (torchrun --nproc-per-node), or set distributed.share_gpus=true"
        )


def shared_gpus(
    s: Any, uuid: str, rank: int, world: int, timeout_sec: float
) -> Dict[str, List[int]]:
    """The GPUs that several ranks of a run use, by UUID, each with its ranks: rank ``rank`` of
    ``world`` publishes ``uuid``, its GPU's, in the rendezvous store ``s`` and reads every rank's,
    waiting at most ``timeout_sec``; every rank gets the same answer. NCCL refuses two ranks on
    one GPU only (nccl src/init.cc: "Duplicate GPU detected", one bus id on one host), so one GPU
    per rank is not shared, whatever its index (CUDA_VISIBLE_DEVICES=$LOCAL_RANK: each cuda:0)."""
    keys = [f"{_KEY_PREFIX}gpu/{r}" for r in range(world)]
    s.set(keys[rank], uuid)
    try:
        s.wait(keys, timedelta(seconds=timeout_sec))
    except Exception as exc:
        missing = [r for r, key in enumerate(keys) if not s.check([key])]
        raise ConfigError(
            f"rank {rank}: rank(s) {missing} did not publish their GPU within "
            f"distributed.timeout_sec={timeout_sec:g}s ({type(exc).__name__})"
        ) from None
    ranks: Dict[str, List[int]] = {}
    for r, key in enumerate(keys):
        ranks.setdefault(s.get(key).decode(), []).append(r)
    return {gpu: group for gpu, group in ranks.items() if len(group) > 1}


def _shared(device: torch.device, timeout_sec: float) -> Dict[str, List[int]]:
    """:func:`shared_gpus` for this rank, whose GPU is ``device`` (its UUID:
    ``torch.cuda.get_device_properties(device).uuid``)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return shared_gpus(store(timeout_sec), uuid, env_rank(), env_world_size(), timeout_sec)


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda`` becomes ``cuda:<local rank>`` (modulo the visible GPUs when
    they are shared); one GPU per SLURM task is that task's ``cuda:0``."""
    import torch

    if device.type != "cuda" or not launched() or device.index is not None:
        return device
    if os.environ.get("SLURM_GPUS_PER_TASK"):
        return torch.device("cuda", 0)
    return torch.device("cuda", _env_int("LOCAL_RANK", 0) % max(1, torch.cuda.device_count()))


def ranks_sharing(device: torch.device) -> int:
    """How many ranks of this node use ``device`` (this rank's, :func:`rank_device`): more than
    one where the ranks share the GPUs (``distributed.share_gpus``: rank k on ``cuda:(k mod
    GPUs)``)."""
    import torch

    if device.type != "cuda" or not launched() or os.environ.get("SLURM_GPUS_PER_TASK"):
        return 1
    gpus, local = max(1, torch.cuda.device_count()), _env_int("LOCAL_WORLD_SIZE", env_world_size())
    return max(1, len(range(device.index or 0, local, gpus)))


# ---------------------------------------------------------------------- the process group
def init(cfg: DistributedConfig, device: torch.device) -> None:
    """Joins the process group of this run when ``WORLD_SIZE`` > 1 (a no-op otherwise):
    ``distributed.backend`` (auto: NCCL on CUDA with a GPU per rank, else gloo),
    ``distributed.timeout_sec`` for every collective. Idempotent."""
    global _group, _comm_device
    import torch

    if _group or not launched():
        return
    backend = Backend(cfg.backend)
    if backend is Backend.auto:  # NCCL on CUDA, unless two ranks share a GPU (NCCL refuses that)
        own_gpu = device.type == "cuda" and not _shared(device, cfg.timeout_sec)
        backend = Backend.nccl if own_gpu else Backend.gloo
    base, timeout = store(cfg.timeout_sec), timedelta(seconds=cfg.timeout_sec)
    base.set_timeout(timeout)
    nccl = backend is Backend.nccl
    if nccl:
        torch.cuda.set_device(device)
        _comm_device = device
    torch.distributed.init_process_group(
        backend.value,
        store=torch.distributed.PrefixStore("default_pg", base),
        rank=env_rank(),
        world_size=env_world_size(),
        timeout=timeout,
        **({"device_id": device} if nccl else {}),
    )
    _group = True


def shutdown() -> None:
    """Leaves the process group (idempotent)."""
    global _group, _store
    if _group:
        import torch

        try:
            torch.distributed.destroy_process_group()
        finally:
            _group = False
    _store = None


# ---------------------------------------------------------------------- collectives
def all_reduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In place: the sum (``op="sum"``), mean or max of ``tensor`` over the ranks."""
    if not _group:
        return tensor
    import torch

    reduce = torch.distributed.ReduceOp
    buf = tensor if tensor.device == _comm_device else tensor.to(_comm_device)
    torch.distributed.all_reduce(buf, op=reduce.MAX if op == "max" else reduce.SUM)
    if op == "mean":
        buf /= world_size()
    if buf is not tensor:
        tensor.copy_(buf)
    return tensor


def mean_grads_(params: List[torch.nn.Parameter]) -> None:
    """Averages the gradients of ``params`` over the ranks: one all-reduce of the flat gradient
    (as rsl_rl does), copied back in place (the gradients keep their storage)."""
    if not _group:
        return
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = all_reduce_(torch.cat([g.reshape(-1) for g in grads]), "mean")
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def broadcast_module_(module: torch.nn.Module) -> None:
    """Every parameter and buffer of ``module`` as rank 0 has them (the same initial policy)."""
    if _group:
        module.load_state_dict(broadcast(module.state_dict()))


def announce(num_envs: int, num_steps: int, iterations: int) -> None:
    """Several ranks: rank 0 says once how the global batch is made (one process: nothing)."""
    world = world_size()
    if world > 1 and rank() == 0:
        print(
            f"rlrec: {world} ranks ({_ask('get_backend', 'none')}) x env.num_envs={num_envs} x "
            f"algo.num_steps={num_steps}: a global batch of {world * num_envs * num_steps} env "
            f"steps per iteration, {iterations} iterations",
            flush=True,
        )


def agree_signal(signum: Optional[int]) -> Optional[int]:
    """The stop flag agreed by every rank: one all-reduce (max) of this rank's stop signal; any
    rank's signal stops every rank. None when no rank was signalled."""
    if not _group:
        return signum
    import torch

    flag = torch.tensor([int(signum or 0)], dtype=torch.int64)
    return int(all_reduce_(flag, "max").item()) or None


def _from_bytes(data: torch.Tensor) -> Any:
    # plain data only (tensors, containers, numbers, strings): never the full unpickler; on the
    # CPU: without map_location torch.load restores each storage on the device it was saved from
    # (torch/serialization.py default_restore_location), another rank's cuda:k
    import torch

    buf = io.BytesIO(data.cpu().numpy().tobytes())
    return torch.load(buf, map_location="cpu", weights_only=True)


def _all_gather(obj: Any) -> List[torch.Tensor]:
    """Every rank's ``obj`` as bytes (``torch.save``), in rank order, on every rank."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    data = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8).to(_comm_device)
    size = torch.tensor([data.numel()], device=_comm_device)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    torch.distributed.all_gather(sizes, size)
    padded = torch.zeros(int(max(sizes)), dtype=torch.uint8, device=_comm_device)
    padded[: data.numel()] = data
    parts = [torch.zeros_like(padded) for _ in sizes]
    torch.distributed.all_gather(parts, padded)
    return [p[: int(n)] for p, n in zip(parts, sizes)]


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` (plain data: tensors, containers, numbers, strings) on every rank."""
    if not _group:
        return obj
    return _from_bytes(_all_gather(obj if is_main() else None)[0])  # (the others send None)


def gather(obj: Any) -> Optional[List[Any]]:
    """Every rank's ``obj`` (plain data), in rank order, on rank 0; None on the other ranks."""
    if not _group:
        return [obj]
    parts = _all_gather(obj)
    return [_from_bytes(p) for p in parts] if is_main() else None


_LOST = ("gloo", "nccl", "connection closed", "timed out", "timeout", "processgroup", "c10d")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank died or did not answer
    within the timeout (gloo raises a plain RuntimeError naming itself)."""
    if not _group or isinstance(exc, ConfigError):
        return False
    import torch

    if isinstance(exc, getattr(torch.distributed, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _LOST)
