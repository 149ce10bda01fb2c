"""rlrec: PPO on vectorized simulators, configured with Hydra, with videos you can trust."""

import importlib
import sys
from typing import Any, Callable, Dict

__version__ = "0.1.0"


def lazy(package: str, table: Dict[str, str]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that imports each name of ``table`` (name -> the package's module
    that defines it) on first use: importing the package itself loads nothing (no torch)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__getattr__ = lazy(__name__, {"load_policy": "train.policy"})  # rlrec.load_policy
