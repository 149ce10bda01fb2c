"""Streaming clip encoder: a background thread feeding one ffmpeg process per clip.

The training thread only copies frames into reusable CPU buffers and queues them; this thread
tiles, overlays and pads them (:mod:`rlrec.record.frames`) and pipes them into an
:class:`~rlrec.record.ffmpeg.FFmpegProcess`, so no whole clip is ever held in memory. A clip is
written to a hidden temporary name in its directory and ``os.replace``'d to its final name once
ffmpeg exited cleanly, so whoever scans the directory never sees a partial file.
"""

from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional

import numpy as np

from rlrec.record.ffmpeg import FFmpegProcess
from rlrec.record.frames import pad_even, tile

__all__ = ["BATCH", "ClipInfo", "ClipJob", "Encoder"]


@dataclass
class ClipInfo:
    """A clip that is complete on disk."""

    path: str
    kind: str  # "train" | "eval"
    episode: int  # episode index of the recorded env (the first one of a grid)
    step: int  # env step count (calls of step) of the recorder at the clip's first frame
    num_frames: int
    fps: float
    tag: Any = None  # the recorder's ``tag`` when the clip started (set by the caller)


@dataclass
class ClipJob:
    """What the encoder needs to know about one clip."""

    path: str  # final path
    fixed_name: bool  # True: replace an existing file; False: never overwrite, pick a free name
    kind: str
    episode: int
    step: int
    fps: float
    quality: int
    lossless: bool
    preset: str
    overlay: Optional[Callable[[np.ndarray, Any], np.ndarray]] = None
    tag: Any = None  # copied into ClipInfo.tag


def _temporary_name(final: str, serial: int) -> str:
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.{os.getpid()}-{serial}.part")


def _free_name(path: str) -> str:
    """``path`` or, if taken (a resumed run writing into the same directory), ``stem-1.ext``..."""
    if not os.path.exists(path):
        return path
    stem, ext = os.path.splitext(path)
    n = 1
    while os.path.exists(f"{stem}-{n}{ext}"):
        n += 1
    return f"{stem}-{n}{ext}"


BATCH = 8  # frames handed to the encoder thread per wake-up


class Encoder:
    """Background encoding of a sequence of clips, one at a time, from a bounded set of buffers.

    Training-thread API: ``open(job)``, ``frame(frames, meta)``, ``end(keep)``, ``flush()``,
    ``close()``, ``results()``. ``frame`` copies the frames into one of at most ``queue_size``
    reusable CPU buffers (the one copy the training thread pays) and queues it; when all buffers
    are in flight it waits for one (back-pressure): frames are never dropped. Results (ClipInfo or
    error message) are collected here and handed to the training thread by ``results()``, so
    callbacks and warnings never run on this thread.

    Two things keep the training thread's cost at its one copy. The buffers are reused, because
    a fresh frame-sized allocation per frame is a fresh mmap whose page faults (and the unmap
    when the encoder frees it) cost the training thread more than the copy. And the encoder thread
    is woken once per ``BATCH`` frames (or by a control message), not per frame, and writes the
    batch with one system call: every wake-up of a second Python thread is a GIL hand-over that
    the training thread pays for in its next few torch calls.
    """

    def __init__(self, queue_size: int, name: str = "rlrec-encoder"):
        self._capacity = queue_size
        self._batch = max(1, min(BATCH, queue_size // 2))
        self._name = name
        self._thread: Optional[threading.Thread] = None
        self._cv = threading.Condition()
        # shared with the encoder thread, under _cv
        self._items: Deque[Optional[tuple]] = collections.deque()
        self._queued_frames = 0  # frame items in _items
        self._urgent = False  # wake the encoder thread now, whatever the number of frames
        self._unfinished = 0  # items put and not yet processed (flush waits for 0)
        self._free: List[Any] = []  # buffers ready for reuse
        self._buffers = 0  # buffers that exist (free + in flight)
        self._layout: Optional[tuple] = None  # (shape, pinned) of the buffers
        self._results: Deque[Any] = collections.deque()
        self._serial = 0
        # encoder-thread state of the clip being written
        self._job: Optional[ClipJob] = None
        self._proc: Optional[FFmpegProcess] = None
        self._tmp: Optional[str] = None
        self._frames = 0
        self._failed = False
        self.current_pid: Optional[int] = None  # pid of the running ffmpeg (tests kill it)

    # -------------------------------------------------------------- training thread
    def _put(self, item: Optional[tuple], wake: bool) -> None:
        if self._thread is None:  # started on the first clip: an idle recorder has no thread
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        with self._cv:
            self._items.append(item)
            self._unfinished += 1
            if item is not None and item[0] == "frame":
                self._queued_frames += 1
                wake = wake or self._queued_frames >= self._batch
            if wake:
                self._urgent = True
                self._cv.notify_all()

    def _buffer(self, frames: Any) -> Any:
        """A free CPU buffer shaped like ``frames``; waits for one while all are in flight."""
        import torch

        pinned = frames.device.type == "cuda"  # device -> pinned host memory is the fast copy
        layout = (tuple(frames.shape), pinned)
        with self._cv:
            if layout != self._layout:  # a new frame size: buffers of the old one are dropped
                self._layout, self._free, self._buffers = layout, [], 0
            while not self._free and self._buffers >= self._capacity:
                self._urgent = True
                self._cv.notify_all()
                self._cv.wait()
                if layout != self._layout:  # pragma: no cover - only one training thread
                    raise RuntimeError("frame size changed while waiting for a buffer")
            if self._free:
                return self._free.pop()
            self._buffers += 1
        return torch.empty(layout[0], dtype=torch.uint8, pin_memory=pinned)

    def open(self, job: ClipJob) -> None:
        self._put(("open", job), wake=False)

    def frame(self, frames: Any, meta: Any = None) -> None:
        """Queues a copy of ``frames`` (uint8 ``[k, H, W, 3]`` tensor on any device)."""
        buffer = self._buffer(frames)
        buffer.copy_(frames)
        self._put(("frame", buffer, meta), wake=False)

    def end(self, keep: bool) -> None:
        """Ends the current clip: ``keep`` finishes and renames it, else it is discarded."""
        self._put(("end", keep), wake=True)
        with self._cv:  # between clips, keep only the buffers a clip's start needs
            if len(self._free) > 2 * self._batch:
                self._buffers -= len(self._free) - 2 * self._batch
                del self._free[2 * self._batch :]

    def flush(self) -> None:
        """Returns once everything queued so far is processed (finished clips are on disk)."""
        if self._thread is None:
            return
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._unfinished == 0)

    def close(self) -> None:
        if self._thread is not None:
            self._put(None, wake=True)
            self._thread.join()
            self._thread = None
        self._free, self._buffers = [], 0

    @property
    def pending(self) -> bool:
        """Whether results wait for ``results()`` (cheap: checked on every step)."""
        return bool(self._results)

    def results(self) -> List[Any]:
        out = []
        while self._results:
            out.append(self._results.popleft())
        return out

    # -------------------------------------------------------------- encoder thread
    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._urgent or self._queued_frames >= self._batch)
                items = list(self._items)
                self._items.clear()
                self._queued_frames = 0
                self._urgent = False
            stop = False
            buffers: List[Any] = []
            try:
                stop = self._process(items, buffers)
            finally:
                # never let this thread die or keep buffers: the training thread would wait forever
                with self._cv:
                    if self._layout is not None and buffers and buffers[0].shape == self._layout[0]:
                        self._free.extend(buffers)
                    self._unfinished -= len(items)
                    self._cv.notify_all()
            if stop:
                return

    def _process(self, items: List[Optional[tuple]], buffers: List[Any]) -> bool:
        """Runs the queued items in order, consecutive frames as one write; True on close."""
        images: List[np.ndarray] = []
        for item in items:
            if item is not None and item[0] == "frame":
                buffers.append(item[1])
                image = self._prepare(item[1], item[2])
                if image is not None:
                    images.append(image)
                continue
            self._write(images)
            images = []
            if item is None:
                self._discard()
                return True
            try:
                getattr(self, "_on_" + item[0])(*item[1:])
            except Exception as err:  # any failure ends this clip only; the next one tries again
                self._fail(err)
        self._write(images)
        return False

    def _prepare(self, frames: Any, meta: Any) -> Optional[np.ndarray]:
        """The image ffmpeg gets for one frame item (and its ffmpeg started), None if skipped."""
        job = self._job
        if job is None or self._failed:
            return None
        try:
            array = frames.numpy()
            if job.overlay is not None:
                array = job.overlay(array, meta)
            image = pad_even(tile(array))
            if self._proc is None:  # the size is known with the first frame
                self._serial += 1
                self._tmp = _temporary_name(job.path, self._serial)
                h, w = image.shape[:2]
                self._proc = FFmpegProcess(
                    self._tmp, w, h, job.fps, job.quality, job.lossless, job.preset
                )
                self.current_pid = self._proc.pid
            return np.ascontiguousarray(image)
        except Exception as err:
            self._fail(err)
            return None

    def _write(self, images: List[np.ndarray]) -> None:
        if not images or self._proc is None or self._failed:
            return
        try:
            self._proc.write(images)
            self._frames += len(images)
        except Exception as err:
            self._fail(err)

    def _on_open(self, job: ClipJob) -> None:
        self._discard()  # a clip never ended (should not happen): drop it rather than mix clips
        self._job, self._frames, self._failed = job, 0, False

    def _on_end(self, keep: bool) -> None:
        if not keep:
            self._discard()
            return
        job, proc, tmp, frames = self._job, self._proc, self._tmp, self._frames
        self._job, self._proc, self._tmp, self.current_pid = None, None, None, None
        if job is None or proc is None or self._failed:
            return
        try:
            proc.finish()
            path = job.path if job.fixed_name else _free_name(job.path)
            os.replace(tmp, path)  # type: ignore[arg-type]
        except Exception as err:
            _remove(tmp)
            self._results.append(_failure(job, err))
            return
        self._results.append(
            ClipInfo(path, job.kind, job.episode, job.step, frames, job.fps, job.tag)
        )

    def _discard(self) -> None:
        proc, tmp = self._proc, self._tmp
        self._job, self._proc, self._tmp, self.current_pid = None, None, None, None
        if proc is not None:
            try:
                proc.kill()
            except Exception:  # best effort: the clip is lost anyway
                pass
            _remove(tmp)

    def _fail(self, err: Exception) -> None:
        job = self._job
        self._discard()
        self._failed = True  # the rest of this clip's frames are skipped until the next open
        self._results.append(_failure(job, err))


def _failure(job: Optional[ClipJob], err: Exception) -> str:
    what = f"clip {job.path!r}" if job is not None else "a clip"
    return f"encoding {what} failed: {type(err).__name__}: {err}"


def _remove(path: Optional[str]) -> None:
    if path:
        try:
            os.remove(path)
        except OSError:  # already gone, or its directory is
            pass
