"""The progress video ``videos/progress.mp4``: the eval clips of a run across its evaluations as a
grid played in sync, so one sees the policy improve on the same start states (every evaluation
resets the eval env with the same seed).

Each tile is one evaluation's clip, in step order, row by row, under a label band with the
training step and the return (and success, when the env reports it); a tile whose clip ended holds
its last frame until the longest one ends. The tiles' pixels are the clips' decoded frames,
unscaled (the labels sit in their own band above each tile), and the video is encoded as the clips
were: lossless clips give a lossless progress video whose tiles equal the clips' frames. With more
evaluations than ``max_tiles``, an even subset is shown, the first and the last always in it.

Clips are decoded and the video encoded as streams (one frame of each clip in memory at a time),
with the ffmpeg binary imageio-ffmpeg ships, through :class:`rlrec.record.ffmpeg.FFmpegProcess`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np

from rlrec.files import remove_quietly, temporary_name
from rlrec.layout import RunDir
from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings, ffmpeg_output_path
from rlrec.record.frames import grid_shape, pad_even, tile
from rlrec.record.sidecar import write_sidecar
from rlrec.report.rundata import Evaluation, RunData

BAND = 24  # pixels of label above each tile (two lines of PIL's default font)


def even_subset(items: Sequence[Any], k: int) -> List[Any]:
    """At most ``k`` of ``items``, evenly spread, the first and the last always among them."""
    n = len(items)
    if n <= k or k == 1:
        return list(items[-k:])
    return [items[i] for i in sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})]


def read_frames(path: Path) -> Iterator[np.ndarray]:
    """The frames of an mp4 as ``uint8 [H, W, 3]`` arrays (rgb24), decoded by ffmpeg."""
    import imageio_ffmpeg

    # a path that ffmpeg cannot read as an option or another protocol (file: and absolute)
    reader = imageio_ffmpeg.read_frames(ffmpeg_output_path(str(path)))
    try:
        meta = next(reader)
        w, h = meta["size"]
        for data in reader:
            yield np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3)
    finally:
        reader.close()  # ends ffmpeg


def _layout(chosen, tile_h, tile_w):
    """The cells of the tiles (each its label band above an empty frame) and the place of each
    tile in the tiled frame (its step, clip, y, x, h, w)."""
    from PIL import Image, ImageDraw

    cells = np.zeros((len(chosen), BAND + tile_h, tile_w, 3), dtype=np.uint8)
    cols = grid_shape(len(chosen))[1]
    tiles = []
    for i, ev in enumerate(chosen):
        band = Image.new("RGB", (tile_w, BAND), (24, 24, 24))  # the label above the tile
        label = "\n".join(ev.tile_label())
        ImageDraw.Draw(band).multiline_text((2, 1), label, fill=(255, 255, 255), spacing=1)
        cells[i, :BAND] = np.asarray(band)
        y, x = (i // cols) * (BAND + tile_h) + BAND, (i % cols) * tile_w
        tiles.append({"step": ev.step, "clip": ev.clip, "y": y, "x": x, "h": tile_h, "w": tile_w})
    return cells, tiles


def _encode(proc, readers, cells):
    """Writes the tiled frames until every clip has ended and returns how many."""
    frames = 0
    while True:
        live = False
        for i, frame in enumerate(next(reader, None) for reader in readers):
            if frame is not None:  # a finished clip's cell holds its last frame
                cells[i, BAND : BAND + frame.shape[0], : frame.shape[1]] = frame
                live = True
        if not live:
            return frames
        proc.write([pad_even(tile(cells))])
        frames += 1


def write_progress(run: RunData, max_tiles: int = 16) -> Optional[Path]:
    """Writes ``videos/progress.mp4`` and its sidecar (with the place of each tile: its step,
    clip, y, x, h, w) of ``run`` and returns its path; None when the run has no eval clip on
    disk. The file appears complete or not at all (a temporary, then a rename). Each tile's cell
    (its label band above its clip's frame) holds the frame last written into it, and the cells
    are tiled as the recorder tiles its envs (``rlrec.record.frames``)."""
    evaluations: List[Evaluation] = [e for e in run.evaluations if e.clip_ok and e.clip]
    if not evaluations:
        return None
    chosen = even_subset(evaluations, max_tiles)
    sidecars = [e.sidecar or {} for e in chosen]
    encoders = [s.get("encoder") or {} for s in sidecars]
    lossless = all(bool(e.get("lossless")) for e in encoders)
    fps, quality = float(sidecars[0].get("fps") or 30.0), int(encoders[0].get("quality") or 7)
    size = [max(int(s.get(k, 0)) for s in sidecars) for k in ("height", "width")]
    cells, tiles = _layout(chosen, *size)
    height, width = pad_even(tile(cells)).shape[:2]
    out = RunDir(run.path).progress_video
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(out)
    readers = [read_frames(run.path / str(ev.clip)) for ev in chosen]
    proc = FFmpegProcess(tmp, width, height, fps, encoder_settings(quality, lossless, "ultrafast"))
    try:
        frames = _encode(proc, readers, cells)
        proc.finish()
        if frames == 0:
            remove_quietly(tmp)
            return None
        os.replace(tmp, out)
    except BaseException:
        proc.kill()
        remove_quietly(tmp)
        raise
    finally:
        for reader in readers:
            reader.close()
    encoder = {"codec": "libx264rgb" if lossless else "libx264", "lossless": lossless}
    sidecar = dict(frames=frames, fps=fps, width=width, height=height, kind="progress", tiles=tiles)
    write_sidecar(str(out), {**sidecar, "encoder": {**encoder, "quality": quality}})
    return out
