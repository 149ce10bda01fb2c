"""rlrec's env layer: the adapter interface, same-step autoreset, the backend registry and the
device they run on.

Importing this package imports nothing (each name below is imported on first use): composing a
config (``rlrec.envs.config``) loads no torch. The backend modules (``rlrec.envs.builtin``,
``rlrec.envs.gymnasium``, ``rlrec.envs.maniskill``, ``rlrec.envs.genesis``) import their
simulator only when they build an env.
"""

from rlrec import lazy

# each name, by the module of rlrec.envs that defines it
_LAZY = {
    "AutoReset": "autoreset",
    **dict.fromkeys(
        "EnvAdapter EnvIdx EnvWrapper EpisodeClock Info as_env_index owned_info".split(),
        "base",
    ),
    "use_device": "device",
    **dict.fromkeys("backend_module make_adapter resolve_device".split(), "factory"),
}
__all__ = list(_LAZY)
__getattr__ = lazy(__name__, _LAZY)
