"""Optional text overlay (episode, step, reward, success) drawn on each tile by the encoder thread.

The training thread only hands over small tensors (rewards, success flags of the recorded envs);
converting them and drawing happen off the training thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np


@dataclass
class FrameMeta:
    """What the overlay shows for one frame; tensors are over the recorded envs."""

    episode: int  # episode of the first recorded env
    episode_step: int  # steps since that env's reset
    reward: Any = None  # [k] reward of the step that led to this frame (None on a clip's first frame)
    ret: Any = None  # [k] return since the clip started
    success: Any = None  # [k] bool, or None when the env has no success signal


def _values(x: Any, k: int) -> list:
    if x is None:
        return [None] * k
    return x.tolist() if hasattr(x, "tolist") else list(x)


def draw_overlay(frames: np.ndarray, meta: Optional[FrameMeta]) -> np.ndarray:
    """Returns ``frames`` ``[k, H, W, 3]`` with the text of ``meta`` in each tile's top-left corner."""
    if meta is None:
        return frames
    from PIL import Image, ImageDraw

    k = frames.shape[0]
    rewards, returns, successes = (_values(v, k) for v in (meta.reward, meta.ret, meta.success))
    out = np.empty_like(frames)
    for i in range(k):
        # episodes and steps are counted on the first recorded env only
        lines = [f"ep {meta.episode}", f"t {meta.episode_step}"] if i == 0 else []
        if rewards[i] is not None:
            lines.append(f"r {rewards[i]:+.2f}  R {returns[i]:+.2f}")
        if successes[i]:
            lines.append("success")
        if not lines:
            out[i] = frames[i]
            continue
        image = Image.fromarray(frames[i])
        draw = ImageDraw.Draw(image)
        text = "\n".join(lines)
        box = draw.multiline_textbbox((2, 1), text, spacing=1)
        draw.rectangle(box, fill=(0, 0, 0))
        draw.multiline_text((2, 1), text, fill=(255, 255, 255), spacing=1)
        out[i] = np.asarray(image)
    return out
