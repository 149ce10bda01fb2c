"""Shared helpers of the real-Genesis tests: small FrankaReach adapters on the CPU backend.

Scenes are small (64x64 camera, a few envs, short episodes). The first scene built on a machine
compiles Genesis's kernels (about 100 s here); later builds reuse the cache under ~/.cache.
"""

from __future__ import annotations

import numpy as np
import torch

from rlrec.envs.config import SimConfig
from rlrec.envs.genesis import GenesisEnvConfig

SIZE = 64
# Largest mean absolute pixel difference (0..255) accepted between two renders of the same state.
# Renders of one state by Mesa's llvmpipe are identical here (difference 0.0, also across two
# scenes); one step of random actions changes a 64x64 frame by about 0.2 and a partial reset by
# about 3, so 0.05 separates "same state" from "moved" while absorbing rare rasterizer noise.
RENDER_ATOL = 0.05


def genesis_cfg(num_envs: int, limit: int, **kwargs) -> GenesisEnvConfig:
    return GenesisEnvConfig(
        num_envs=num_envs,
        max_episode_steps=limit,
        render_width=SIZE,
        render_height=SIZE,
        kwargs=dict(kwargs),
    )


def make_genesis(num_envs: int = 3, limit: int = 6, seed: int = 0, **kwargs):
    from rlrec.envs import genesis

    return genesis.make(
        genesis_cfg(num_envs, limit, **kwargs), SimConfig(), num_envs, torch.device("cpu"), seed
    )


def diff(a, b) -> float:
    """Mean absolute pixel difference of two uint8 frames."""
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean())
