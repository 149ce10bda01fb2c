"""rlrec: PPO on vectorized simulators, configured with Hydra, with videos you can trust."""

__version__ = "0.1.0"
