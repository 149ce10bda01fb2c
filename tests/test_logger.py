"""RunLogger's TensorBoard clip previews."""

import io

import imageio_ffmpeg
import numpy as np
from PIL import Image

from rlrec.logger import _tb_add_clip


class _Writer:
    """Captures what _tb_add_clip hands to TensorBoard's file writer."""

    def __init__(self):
        self.summaries = []

    def _get_file_writer(self):
        return self

    def add_summary(self, summary, step):
        self.summaries.append((summary, step))


def _clip(path, n, size=16):
    writer = imageio_ffmpeg.write_frames(str(path), (size, size), fps=30, macro_block_size=1)
    writer.send(None)
    for i in range(n):
        writer.send(np.full((size, size, 3), (i * 12) % 256, np.uint8))  # distinct frames
    writer.close()


def test_long_clip_preview_is_subsampled_to_at_most_150_frames(tmp_path):
    path = tmp_path / "c.mp4"
    _clip(path, 400)
    writer = _Writer()
    _tb_add_clip(writer, "video/eval", str(path), fps=30.0, step=7, num_frames=400)
    ((summary, step),) = writer.summaries
    image = summary.value[0].image
    gif = Image.open(io.BytesIO(image.encoded_image_string))
    assert step == 7 and summary.value[0].tag == "video/eval"
    assert (image.width, image.height) == (16, 16)
    assert gif.n_frames == 134  # every 3rd of 400 frames: ceil(400 / 3)


def test_short_clip_preview_keeps_every_frame(tmp_path):
    path = tmp_path / "c.mp4"
    _clip(path, 20)
    writer = _Writer()
    _tb_add_clip(writer, "video/train", str(path), fps=30.0, step=0, num_frames=20)
    gif = Image.open(io.BytesIO(writer.summaries[0][0].value[0].image.encoded_image_string))
    assert gif.n_frames == 20
