"""A frame's layout (grid, even size) and the overlay, on plain arrays."""

import numpy as np
import pytest
import torch

from rlrec.record.frames import FrameMeta, draw_overlay, grid_shape, pad_even, tile


@pytest.mark.parametrize(
    "k, shape",
    [(1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (5, (2, 3)), (7, (3, 3)), (10, (3, 4))],
)
def test_tiles_fill_the_most_square_grid_row_by_row_and_unused_tiles_stay_black(k, shape):
    h, w = 4, 6
    tiles = np.stack([np.full((h, w, 3), i + 1, np.uint8) for i in range(k)])  # 0: black
    image = tile(tiles)
    assert grid_shape(k) == shape and image.shape == (shape[0] * h, shape[1] * w, 3)
    for cell in range(shape[0] * shape[1]):
        r, c = divmod(cell, shape[1])
        expected = cell + 1 if cell < k else 0
        assert (image[r * h : (r + 1) * h, c * w : (c + 1) * w] == expected).all(), cell


def test_pad_even_pads_bottom_and_right_never_scales():
    even = np.ones((4, 6, 3), np.uint8)
    assert pad_even(even) is even
    for h, w in [(5, 6), (4, 7), (5, 7)]:
        out = pad_even(np.ones((h, w, 3), np.uint8))
        assert out.shape == (h + h % 2, w + w % 2, 3)
        assert (out[:h, :w] == 1).all() and (out[h:] == 0).all() and (out[:, w:] == 0).all()


def test_overlay_writes_only_in_each_tiles_corner():
    frames = np.full((2, 96, 128, 3), 128, np.uint8)
    assert draw_overlay(frames, None) is frames  # no meta: untouched
    reward, ret = torch.tensor([0.5, -1.0]), torch.tensor([1.0, 2.0])
    out = draw_overlay(frames, FrameMeta(3, 7, reward, ret, torch.tensor([True, False])))
    assert out.shape == frames.shape and (frames == 128).all()  # a new array; the input is kept
    for i in range(2):
        assert not (out[i, :20, :60] == 128).all()  # the text (the second tile: reward and return)
        assert (out[i, 60:] == 128).all() and (out[i, :, 100:] == 128).all()  # the rest untouched
    out = draw_overlay(frames, FrameMeta(episode=0, episode_step=0))  # a clip's first frame
    assert not (out[0] == 128).all()  # episode and step, on the first tile only
    assert (out[1] == 128).all()
