"""The backend registry: ``make_adapter`` builds the bare adapter of a config's env group option.

The layers above the adapter (recorder, AutoReset) are composed by ``rlrec.stack``.
"""

from __future__ import annotations

import importlib
import os
from typing import Dict, Optional

import torch

from rlrec.config import ConfigError, EnvConfig, SimConfig
from rlrec.envs.base import EnvAdapter

# env group option -> module with ``make(env_cfg, sim, num_envs, device, seed)`` and, where frames
# need a capability the env may lack, ``check_renderable(env_cfg)``. Each module reports a missing
# simulator extra itself, naming the extra to install.
_BACKENDS: Dict[str, str] = {
    "builtin": "rlrec.envs.builtin",
    "gymnasium": "rlrec.envs.gymnasium",
    "maniskill": "rlrec.envs.maniskill",
    "genesis": "rlrec.envs.genesis",
}


def resolve_device(sim: SimConfig) -> torch.device:
    """The torch device for ``sim``; fails early with what to do when CUDA is missing."""
    if sim.name == "gpu" or str(sim.device).startswith("cuda"):
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
    return torch.device(sim.device)


def backend_module(name: str):
    """The module of backend ``name`` (imported lazily: simulators are optional extras)."""
    if name not in _BACKENDS:
        raise ConfigError(f"env={name!r} is unknown: allowed values are {', '.join(_BACKENDS)}")
    return importlib.import_module(_BACKENDS[name])


def make_adapter(
    env_cfg: EnvConfig, sim: SimConfig, num_envs: int, seed: Optional[int]
) -> EnvAdapter:
    """The bare backend adapter for ``env_cfg`` with ``num_envs`` envs."""
    device = resolve_device(sim)
    return backend_module(env_cfg.name).make(
        env_cfg, sim, num_envs=num_envs, device=device, seed=seed
    )
