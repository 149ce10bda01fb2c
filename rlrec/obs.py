"""What an observation is, for every backend and the policy (docs/architecture.md, "Observations").

A state-only env observes one float tensor ``[N, D]``. A pixel env observes a dict
``{"rgb": uint8 [N, H, W, C], "state": float32 [N, D]}`` ("state" only where the env adds it), as
ManiSkill's ``FlattenRGBDObservationWrapper`` (its ``observation``:
the cameras' images joined on the channel axis under "rgb", the rest flattened under "state") hands
it to ``ppo_rgb.py``; its observation space is a ``gym.spaces.Dict`` of those two ``Box``es.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple, Union

import torch

RGB, STATE = "rgb", "state"
Obs = Union[torch.Tensor, Dict[str, torch.Tensor]]
# a space's shape: one tuple, or one per key of a pixel observation (what checkpoints hold)
Shape = Union[Tuple[int, ...], Dict[str, Tuple[int, ...]]]


def map_obs(fn: Callable[..., torch.Tensor], obs: Obs, *more: Obs) -> Obs:
    """``fn`` applied to the tensor, or to each tensor of a pixel observation (with the same key
    of each of ``more``)."""
    if isinstance(obs, dict):
        return {k: fn(v, *(m[k] for m in more)) for k, v in obs.items()}  # type: ignore[index]
    return fn(obs, *more)


def shape_of(space_or_shape) -> Shape:
    """The shape of an observation space (a ``Box`` or a ``Dict`` of them), or a saved shape made
    comparable (tuples where a checkpoint may hold lists)."""
    x = getattr(space_or_shape, "spaces", space_or_shape)  # a Dict space: its dict of Boxes
    if isinstance(x, dict):
        return {k: tuple(getattr(v, "shape", v)) for k, v in x.items()}
    return tuple(getattr(x, "shape", x))


def first(obs: Obs) -> torch.Tensor:
    """The tensor of ``obs``, or the first of a pixel observation (its batch size, its device)."""
    return next(iter(obs.values())) if isinstance(obs, dict) else obs


def batch_size(obs: Obs) -> int:
    """How many envs ``obs`` holds."""
    return first(obs).shape[0]


def as_float(obs: Obs) -> Obs:
    """The state as float32; the image stays uint8 (the encoder scales it, on the device)."""
    if isinstance(obs, dict):
        return {k: v if k == RGB else v.float() for k, v in obs.items()}
    return obs.float()
