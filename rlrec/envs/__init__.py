"""rlrec's env layer: the adapter interface, same-step autoreset, and the backend registry.

Importing this package imports no simulator: the backends (``rlrec.envs.builtin``,
``rlrec.envs.gymnasium``, ``rlrec.envs.maniskill``, ``rlrec.envs.genesis``) are imported by
:func:`make_adapter` when a config names them, or directly by whoever needs one.
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
from rlrec.envs.factory import backend_module, make_adapter, resolve_device, use_device

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
