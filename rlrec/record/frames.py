"""What one video frame looks like: the recorded envs' views (:mod:`rlrec.record.wrappers.view`)
tiled into a grid, padded to even sizes, and the optional text overlay (episode, step, reward,
success) on each tile.

It runs on the encoder thread: the training thread only hands over the frames and small tensors
(rewards, success flags of the recorded envs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

# ----------------------------------------------------------------------------- layout


def grid_shape(k: int) -> Tuple[int, int]:
    """(rows, cols) of the most square grid holding ``k`` tiles, filled row by row."""
    cols = math.ceil(math.sqrt(k))
    return math.ceil(k / cols), cols


def tile(frames: np.ndarray) -> np.ndarray:
    """``[k, H, W, 3]`` -> one ``[rows*H, cols*W, 3]`` image; unused tiles stay black."""
    k, h, w, c = frames.shape
    if k == 1:
        return frames[0]
    rows, cols = grid_shape(k)
    canvas = np.zeros((rows * cols, h, w, c), dtype=frames.dtype)
    canvas[:k] = frames
    return (
        canvas.reshape(rows, cols, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, cols * w, c)
    )


def pad_even(image: np.ndarray) -> np.ndarray:
    """H.264 in yuv420p needs even sizes: odd ones get one black row/column bottom/right
    (padding, never scaling, so pixels stay where they were)."""
    h, w = image.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return image
    return np.pad(image, ((0, h % 2), (0, w % 2), (0, 0)))


# ----------------------------------------------------------------------------- overlay


@dataclass
class FrameMeta:
    """What the overlay shows for one frame; tensors are over the recorded envs."""

    episode: int  # episode of the first recorded env
    episode_step: int  # steps since that env's reset
    # [k] reward of the step that led to this frame (None on a clip's first frame)
    reward: Any = None
    ret: Any = None  # [k] return since the clip started
    success: Any = None  # [k] bool, or None when the env has no success signal


def draw_overlay(frames: np.ndarray, meta: Optional[FrameMeta]) -> np.ndarray:
    """Returns ``frames`` ``[k, H, W, 3]`` with the text of ``meta`` in each tile's top-left
    corner."""
    if meta is None:
        return frames
    from PIL import Image, ImageDraw

    k = frames.shape[0]
    rewards, returns, successes = (  # lists, arrays or tensors over the recorded envs
        [None] * k if v is None else v.tolist() if hasattr(v, "tolist") else list(v)
        for v in (meta.reward, meta.ret, meta.success)
    )
    out = frames.copy()
    for i in range(k):
        # episodes and steps are counted on the first recorded env only
        lines = [f"ep {meta.episode}", f"t {meta.episode_step}"] if i == 0 else []
        if rewards[i] is not None:
            lines.append(f"r {rewards[i]:+.2f}  R {returns[i]:+.2f}")
        if successes[i]:
            lines.append("success")
        if not lines:
            continue
        image = Image.fromarray(frames[i])
        draw = ImageDraw.Draw(image)
        text = "\n".join(lines)
        box = draw.multiline_textbbox((2, 1), text, spacing=1)
        draw.rectangle(box, fill=(0, 0, 0))
        draw.multiline_text((2, 1), text, fill=(255, 255, 255), spacing=1)
        out[i] = np.asarray(image)
    return out
