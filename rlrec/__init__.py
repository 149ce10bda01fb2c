"""rlrec: PPO on vectorized simulators, configured with Hydra, with videos you can trust."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``rlrec.load_policy``, imported on first use (``import rlrec.record`` loads no torch)."""
    if name == "load_policy":
        from rlrec.export import load_policy

        return load_policy
    raise AttributeError(f"module 'rlrec' has no attribute {name!r}")
