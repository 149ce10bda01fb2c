"""A frame's layout (grid, even size) and the overlay, on plain arrays."""

import numpy as np
import pytest
import torch

from rlrec.record.frames import FrameMeta, draw_overlay, grid_shape, pad_even, tile


def tiles(k, h=4, w=6):
    """``k`` tiles, each filled with its own index + 1 (0 stays the black of unused tiles)."""
    return np.stack([np.full((h, w, 3), i + 1, np.uint8) for i in range(k)])


@pytest.mark.parametrize(
    "k, shape",
    [(1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (5, (2, 3)), (7, (3, 3)), (10, (3, 4))],
)
def test_grid_shape_is_the_most_square_grid(k, shape):
    assert grid_shape(k) == shape


def test_one_tile_is_the_frame_itself():
    frames = tiles(1)
    assert np.array_equal(tile(frames), frames[0])


@pytest.mark.parametrize("k", [2, 3, 5, 7])
def test_tiles_fill_rows_first_and_unused_tiles_stay_black(k):
    h, w = 4, 6
    image = tile(tiles(k, h, w))
    rows, cols = grid_shape(k)
    assert image.shape == (rows * h, cols * w, 3)
    for cell in range(rows * cols):
        r, c = divmod(cell, cols)
        expected = cell + 1 if cell < k else 0
        assert (image[r * h : (r + 1) * h, c * w : (c + 1) * w] == expected).all(), cell


def test_pad_even_pads_bottom_and_right_never_scales():
    even = np.ones((4, 6, 3), np.uint8)
    assert pad_even(even) is even
    for h, w in [(5, 6), (4, 7), (5, 7)]:
        image = np.ones((h, w, 3), np.uint8)
        out = pad_even(image)
        assert out.shape == (h + h % 2, w + w % 2, 3)
        assert (out[:h, :w] == 1).all() and (out[h:] == 0).all() and (out[:, w:] == 0).all()


def test_overlay_writes_only_in_each_tiles_corner():
    frames = np.full((2, 96, 128, 3), 128, np.uint8)
    assert draw_overlay(frames, None) is frames  # no meta: untouched
    meta = FrameMeta(episode=3, episode_step=7, reward=torch.tensor([0.5, -1.0]),
                     ret=torch.tensor([1.0, 2.0]), success=torch.tensor([True, False]))  # fmt: skip
    out = draw_overlay(frames, meta)
    assert out.shape == frames.shape and (frames == 128).all()  # a new array; the input is kept
    for i in range(2):
        assert not (out[i, :20, :60] == 128).all()  # the text (the second tile: reward and return)
        assert (out[i, 60:] == 128).all() and (out[i, :, 100:] == 128).all()  # the rest untouched


def test_overlay_without_reward_draws_nothing_on_the_other_tiles():
    frames = np.full((2, 32, 32, 3), 50, np.uint8)
    out = draw_overlay(frames, FrameMeta(episode=0, episode_step=0))  # a clip's first frame
    assert not (out[0] == 50).all()  # episode and step, on the first tile only
    assert (out[1] == 50).all()
