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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from rlrec.files import remove_quietly, temporary_name
from rlrec.layout import RunDir
from rlrec.record.ffmpeg import FFmpegProcess, ffmpeg_output_path
from rlrec.record.frames import grid_shape
from rlrec.record.sidecar import write_sidecar
from rlrec.report.rundata import Evaluation, RunData

__all__ = ["BAND", "Layout", "Progress", "even_subset", "write_progress"]

BAND = 24  # pixels of label above each tile (two lines of PIL's default font)


def even_subset(items: Sequence[Any], k: int) -> List[Any]:
    """At most ``k`` of ``items``, evenly spread, the first and the last always among them."""
    n = len(items)
    if n <= k:
        return list(items)
    if k == 1:
        return [items[-1]]
    picks = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    return [items[i] for i in picks]


@dataclass
class Layout:
    """Where each tile sits in the progress video's frame: a grid of ``rows`` x ``cols`` cells,
    each a label band of :data:`BAND` pixels above a ``tile_h`` x ``tile_w`` tile."""

    count: int
    tile_h: int
    tile_w: int

    def __post_init__(self) -> None:
        self.rows, self.cols = grid_shape(self.count)

    @property
    def cell_h(self) -> int:
        return BAND + self.tile_h

    @property
    def size(self) -> tuple:
        """(height, width) of the frame, padded to even sizes (H.264 in yuv420p)."""
        h, w = self.rows * self.cell_h, self.cols * self.tile_w
        return h + h % 2, w + w % 2

    def origin(self, i: int) -> tuple:
        """(y, x) of tile ``i``'s top-left pixel (below its band)."""
        r, c = divmod(i, self.cols)
        return r * self.cell_h + BAND, c * self.tile_w


@dataclass
class Progress:
    """What :func:`write_progress` wrote."""

    path: Path
    frames: int
    fps: float
    layout: Layout
    tiles: List[Dict[str, Any]] = field(default_factory=list)  # step, clip, y, x of each tile


def _frames(path: Path) -> Iterator[np.ndarray]:
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


def _label(image: np.ndarray, layout: Layout, i: int, lines: List[str]) -> None:
    from PIL import Image, ImageDraw

    y, x = layout.origin(i)
    band = Image.new("RGB", (layout.tile_w, BAND), (24, 24, 24))
    ImageDraw.Draw(band).multiline_text((2, 1), "\n".join(lines), fill=(255, 255, 255), spacing=1)
    image[y - BAND : y, x : x + layout.tile_w] = np.asarray(band)


def write_progress(run: RunData, max_tiles: int = 16) -> Optional[Progress]:
    """Writes ``videos/progress.mp4`` (and its sidecar) of ``run``; None when the run has no eval
    clip on disk. The file appears complete or not at all (a temporary, then a rename)."""
    evaluations: List[Evaluation] = [e for e in run.evaluations if e.clip_ok and e.clip]
    if not evaluations:
        return None
    chosen = even_subset(evaluations, max_tiles)
    sidecars = [e.sidecar or {} for e in chosen]
    layout = Layout(
        len(chosen),
        max(int(s.get("height", 0)) for s in sidecars),
        max(int(s.get("width", 0)) for s in sidecars),
    )
    fps = float(sidecars[0].get("fps") or 30.0)
    encoders = [s.get("encoder") or {} for s in sidecars]
    lossless = all(bool(e.get("lossless")) for e in encoders)
    quality = int(encoders[0].get("quality") or 7)
    height, width = layout.size
    base = np.zeros((height, width, 3), dtype=np.uint8)
    tiles = []
    for i, ev in enumerate(chosen):
        _label(base, layout, i, ev.tile_label())
        y, x = layout.origin(i)
        tiles.append({"step": ev.step, "clip": ev.clip, "y": y, "x": x})
    out = RunDir(run.path).progress_video
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(out)
    readers = [_frames(run.path / str(ev.clip)) for ev in chosen]
    last: List[Optional[np.ndarray]] = [None] * len(chosen)
    proc = FFmpegProcess(tmp, width, height, fps, quality, lossless, "ultrafast")
    frames = 0
    try:
        while True:
            image = base.copy()
            live = False
            for i, reader in enumerate(readers):
                if reader is not None:
                    frame = next(reader, None)
                    if frame is None:
                        readers[i] = None  # finished: the tile holds its last frame
                    else:
                        last[i], live = frame, True
                if last[i] is not None:
                    y, x = layout.origin(i)
                    h, w = last[i].shape[:2]
                    image[y : y + h, x : x + w] = last[i]
            if not live:
                break
            proc.write([image])
            frames += 1
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
            if reader is not None:
                reader.close()
    codec = "libx264rgb" if lossless else "libx264"
    write_sidecar(
        str(out),
        {
            "frames": frames,
            "fps": fps,
            "width": width,
            "height": height,
            "encoder": {"codec": codec, "lossless": lossless, "quality": quality},
            "kind": "progress",
            "tiles": [{**t, "h": layout.tile_h, "w": layout.tile_w} for t in tiles],
        },
    )
    return Progress(out, frames, fps, layout, tiles)
