"""``recorder.view``: what a recorder layer's frames show, as the ``render`` of a layer below it.

:class:`ObsView` keeps the observation of every reset and step its env returns and renders the
policy's own image (``"rgb"``, rlrec/obs.py) of the named envs (``view=obs``), or the env's render
with that image beside it (``view=both``). A recorder above it takes its frames where it takes
them from any env, right after the reset or step that gave that observation, so the observation
tile of a frame is the observation the policy acts on at that step (the reset frame the reset
observation, the terminal frame the final observation that AutoReset keeps as ``final_obs``).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch.nn.functional import pad

from rlrec.checks import check_choices
from rlrec.envs.base import EnvAdapter, EnvWrapper
from rlrec.obs import RGB
from rlrec.record.settings import RecorderConfig, View, check_view


def obs_frames(image: torch.Tensor, size: Tuple[int, int], channels: int = 3) -> torch.Tensor:
    """Observation images ``uint8 [k, h, w, C]`` as frames ``[k, f*h, f*w, 3]``, upscaled to fit
    ``size`` (H, W) by nearest neighbour: each pixel repeated ``f = min(H // h, W // w)`` times
    (at least 1) on each axis, an integer, so every observed pixel stays exact (a size that does
    not divide is not reached: the tile is the largest multiple within it). Shown: the newest
    frame (the last ``channels`` of C: a stack is joined oldest first), its first 3 channels (RGB;
    of several cameras, the first) or, with fewer, its first as grey."""
    start, c = image.shape[-1] - channels, 3 if channels >= 3 else 1
    image = image[..., start : start + c].expand(*image.shape[:-1], 3)
    f = max(1, min(size[0] // image.shape[1], size[1] // image.shape[2]))
    return image.repeat_interleave(f, 1).repeat_interleave(f, 2)


class ObsView(EnvWrapper):
    """``env`` whose ``render(env_idx)`` shows ``view`` (obs or both; see the module docstring).
    The image is upscaled to the size of the env's own render (:func:`obs_frames`), learnt from
    one render of one env at the first frame with ``view=obs``."""

    def __init__(self, env: EnvAdapter, view: View):
        super().__init__(env)
        self.view = view
        # channels of one observed frame: C over the stack's depth (env.frame_stack, where kept)
        stack = getattr(env.unwrapped, "frame_stack", 1)
        self.channels = env.single_observation_space[RGB].shape[-1] // stack
        self._obs = None
        self._size = None

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        self._obs = out[0]
        return out

    def step(self, action):
        out = self.env.step(action)
        self._obs = out[0]
        return out

    def render(self, env_idx):
        # the recorded envs' images only, in one copy to the host
        image = self._obs[RGB][list(env_idx)].cpu()
        if self.view == View.obs:
            if self._size is None:  # the adapter's: a view above another shows its image once
                self._size = tuple(self.unwrapped.render(env_idx[:1]).shape[1:3])
            return obs_frames(image, self._size, self.channels)
        frames = torch.as_tensor(self.unwrapped.render(env_idx)).cpu()
        tiles = (frames, obs_frames(image, frames.shape[1:3], self.channels))
        # side by side, each padded with black rows at the bottom to the tallest (never scaled)
        h = max(t.shape[1] for t in tiles)
        return torch.cat([pad(t, (0, 0, 0, 0, 0, h - t.shape[1])) for t in tiles], 2)


def viewed(env: EnvAdapter, cfg: RecorderConfig, key: str) -> EnvAdapter:
    """``env`` as a recorder with settings ``cfg`` (``key`` in messages) shows it: itself for
    ``view=render``, else under an :class:`ObsView`; ConfigError naming ``{key}.view`` where the
    env's observation has no image."""
    check_choices(cfg, f"{key}.")  # the view's choice among them
    if cfg.view is View.render:
        return env
    check_view(cfg, RGB in getattr(env.single_observation_space, "spaces", {}), key)
    return ObsView(env, cfg.view)
