"""One factory for both env stacks (collection and evaluation).

``make_adapter`` builds the bare backend adapter; ``make_env_stack`` adds the recorder and
AutoReset on top: ``AutoReset(Recorder(adapter))``.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable, Dict, Optional

import torch

from rlrec.config import ConfigError, EnvConfig, RecorderConfig, SimConfig
from rlrec.envs.base import AutoReset, EnvAdapter

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
                f"sim={sim.name} (device={sim.device}) needs CUDA, but torch.cuda.is_available() is "
                "False on this machine: use sim=cpu, or install a CUDA build of torch on a GPU machine"
            )
        index = torch.device(sim.device).index
        if index is not None and index >= torch.cuda.device_count():
            # ids count the GPUs this job was given (CUDA_VISIBLE_DEVICES), not the machine's
            raise ConfigError(
                f"sim.device={sim.device} is invalid: this job sees {torch.cuda.device_count()} GPU(s) "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); device ids "
                f"are relative to those, so use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(sim.device)


def backend_module(name: str):
    """The module of backend ``name`` (imported lazily: simulators are optional extras)."""
    if name not in _BACKENDS:
        raise ConfigError(f"env={name!r} is unknown: allowed values are {', '.join(_BACKENDS)}")
    return importlib.import_module(_BACKENDS[name])


def make_adapter(env_cfg: EnvConfig, sim: SimConfig, num_envs: int, seed: Optional[int]) -> EnvAdapter:
    """The bare backend adapter for ``env_cfg`` with ``num_envs`` envs."""
    device = resolve_device(sim)
    return backend_module(env_cfg.name).make(env_cfg, sim, num_envs=num_envs, device=device, seed=seed)


def make_env_stack(
    env_cfg: EnvConfig,
    sim: SimConfig,
    num_envs: int,
    seed: Optional[int],
    recorder_cfg: Optional[RecorderConfig] = None,
    video_dir: Optional[str] = None,
    kind: str = "train",
    on_clip: Optional[Callable] = None,
) -> AutoReset:
    """``AutoReset(Recorder(adapter))``; the recorder is left out when disabled or ``none``.
    When recording, an env that cannot render is refused before it is built."""
    recording = recorder_cfg is not None and recorder_cfg.enabled and recorder_cfg.trigger.value != "none"
    if recording:
        check = getattr(backend_module(env_cfg.name), "check_renderable", None)
        if check is not None:
            check(env_cfg)
    env = make_adapter(env_cfg, sim, num_envs, seed)
    if recording:
        from rlrec.record.recorder import Recorder

        env = Recorder(env, recorder_cfg, video_dir=video_dir, kind=kind, on_clip=on_clip)
    return AutoReset(env)
