"""The backend registry (each env backend by its name), :func:`make_adapter`, which builds the
bare adapter of a config's env group option, and :func:`resolve_device`, the one place where
this process's device is resolved.

A backend is the module ``rlrec.envs.<name>`` of its schema's ``name`` (the schemas:
``rlrec.envs.config.BACKENDS``), holding ``make(env_cfg, sim, num_envs, device, seed)``; optionally
``check_ready(env_cfg, sim)`` (what it refuses for ``sim`` before anything is built) and
``check_renderable(env_cfg)`` (where frames need a capability the env may lack). Each module
reports a missing simulator extra itself, naming the extra to install, and imports its simulator
only when it builds an env. The modules are imported when a backend is asked for (a check before
work, :func:`make_adapter`), not with this package. Adding a backend: its module, its schema and
its line in ``BACKENDS`` (``rlrec/envs/config.py``) and its YAML (``conf/env/<name>.yaml``,
extending ``/schema/env/<name>``).

The layers above the adapter (recorder, AutoReset) are composed by ``rlrec.train.stack``.
"""

from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.envs.base import EnvAdapter
from rlrec.envs.config import EnvConfig, SimConfig
from rlrec.envs.device import explicit


def resolve_device(sim: SimConfig) -> torch.device:
    """This process's torch device for ``sim``, resolved once by the runner and handed to every
    adapter, the policy and the normaliser; fails early with what to do when CUDA is missing.

    A CUDA device always carries its index: with several ranks, the rank's GPU
    (:func:`rlrec.distributed.rank_device`: ``cuda`` becomes ``cuda:<local rank>``); otherwise the
    index ``sim.device`` names, or torch's current device. A bare ``cuda`` would mean whichever
    device is current where a tensor is made, and a simulator's own ``cuda`` alias need not be
    torch's current device at all (SAPIEN's is the first CUDA device it enumerated). ``sim=gpu``
    on a device other than CUDA is refused here, for every backend."""
    if sim.name == "gpu" and torch.device(sim.device).type != "cuda":
        raise ConfigError(
            f"sim.name=gpu with sim.device={sim.device}: a GPU simulator keeps its tensors on "
            "CUDA; use sim=gpu (sim.device=cuda or cuda:N), or sim=cpu"
        )
    if torch.device(sim.device).type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"sim={sim.name} (device={sim.device}) needs CUDA, but "
                "torch.cuda.is_available() is False on this machine: use sim=cpu, or install a "
                "CUDA build of torch on a GPU machine"
            )
        index = torch.device(sim.device).index
        if index is not None and index >= torch.cuda.device_count():
            # ids count the GPUs this job was given (CUDA_VISIBLE_DEVICES), not the machine's
            raise ConfigError(
                f"sim.device={sim.device} is invalid: this job sees "
                f"{torch.cuda.device_count()} GPU(s) "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
                "device ids are relative to those, so use "
                f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return explicit(distributed.rank_device(torch.device(sim.device)))


def backend_module(name: str):
    """The module of backend ``name``, one of ``BACKENDS`` (``rlrec.config.validate`` refuses any
    other ``env.name``; imported here: no simulator)."""
    return importlib.import_module(f"rlrec.envs.{name}")


def check_ready(env_cfg: EnvConfig, sim: SimConfig) -> None:
    """What the backend of ``env_cfg`` refuses for ``sim`` before anything is built (its optional
    ``check_ready(env_cfg, sim)``; e.g. ManiSkill's GPU sim without SAPIEN's PhysX GPU library).
    The entry point asks it once, before the process group and the runner; ``make`` again."""
    getattr(backend_module(env_cfg.name), "check_ready", lambda *_: None)(env_cfg, sim)


def make_adapter(
    env_cfg: EnvConfig,
    sim: SimConfig,
    num_envs: int,
    seed: Optional[int],
    device: Optional[torch.device] = None,
) -> EnvAdapter:
    """The bare backend adapter for ``env_cfg`` with ``num_envs`` envs on ``device`` (the runner
    passes the one it resolved; None: :func:`resolve_device` of ``sim``). A CUDA device without
    an index is made explicit (torch's current device): no backend gets a bare ``cuda``."""
    device = resolve_device(sim) if device is None else explicit(device)
    return backend_module(env_cfg.name).make(
        env_cfg, sim, num_envs=num_envs, device=device, seed=seed
    )
