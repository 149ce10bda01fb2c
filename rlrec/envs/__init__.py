"""rlrec's env layer: the adapter interface, same-step autoreset, the backend registry and the
device they run on.

Importing this package imports no simulator: the backend modules (``rlrec.envs.builtin``,
``rlrec.envs.gymnasium``, ``rlrec.envs.maniskill``, ``rlrec.envs.genesis``) hold their schemas
and import their simulator only when they build an env.
"""

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.base import (
    EnvAdapter,
    EnvIdx,
    EnvWrapper,
    EpisodeClock,
    Info,
    as_env_index,
    layers,
    owned_info,
)
from rlrec.envs.device import use_device
from rlrec.envs.factory import backend_module, make_adapter, resolve_device

__all__ = [
    "AutoReset",
    "EnvAdapter",
    "EnvIdx",
    "EnvWrapper",
    "EpisodeClock",
    "Info",
    "as_env_index",
    "backend_module",
    "layers",
    "make_adapter",
    "owned_info",
    "resolve_device",
    "use_device",
]
