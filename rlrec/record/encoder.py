"""Streaming clip encoder: a background thread feeding one ffmpeg process per clip.

The training thread only copies frames into reusable CPU buffers and queues them; this thread
tiles, overlays and pads them (:mod:`rlrec.record.frames`) and pipes them into an
:class:`~rlrec.record.ffmpeg.FFmpegProcess`, so no whole clip is ever held in memory. A clip is
written to a hidden temporary name in its directory; once ffmpeg exited cleanly it waits there
until the training thread takes it (:meth:`Encoder.results` yields it) and is moved to its final
name then, so whoever scans the directory never sees a partial file, and whoever is handed a clip
finds that clip under its name:

- a clip of its own name (``fixed_name=False``) claims the name atomically with ``os.link``, which
  fails if the name exists, and tries ``stem-1.ext``, ``stem-2.ext``, ... until one is free, so two
  encoders (two runs sharing a directory) never overwrite each other's clips;
- a fixed name (``fixed_name=True``) is replaced (``os.replace``).

An encoder told to ``hold`` its clips keeps them in their temporary files until
:meth:`Encoder.release` says which are placed (the others' files are removed, never placed).

No wait of the training thread on this thread is unbounded: see :class:`Encoder`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np

from rlrec.files import remove_quietly, temporary_name
from rlrec.record.ffmpeg import STALL_TIMEOUT_S, EncoderError, FFmpegProcess
from rlrec.record.frames import pad_even, tile
from rlrec.record.sidecar import sha256_file, write_sidecar

log = logging.getLogger(__name__)


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
    sidecar: Optional[str] = None  # NAME.json beside the mp4 (rlrec.record.sidecar)
    # a clip not yet moved to ``path``: (its temporary file, whether the name is fixed, its
    # sidecar's data); Encoder.results and Encoder.release move it
    _pending: Optional[tuple] = field(default=None, repr=False, compare=False)


@dataclass
class ClipJob:
    """What the encoder needs to know about one clip."""

    # the clip as it is handed on once on disk (its final path; num_frames: counted here)
    info: ClipInfo
    fixed_name: bool  # True: replace an existing file; False: never overwrite, pick a free name
    encoding: dict  # rlrec.record.ffmpeg.encoder_settings
    overlay: Optional[Callable[[np.ndarray, Any], np.ndarray]] = None


# a filesystem without hard links (FAT, some network and FUSE mounts) answers os.link with these
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}


def _claim(tmp, path):
    """Moves the finished file ``tmp`` to ``path`` or, if taken (a resumed run, or another run,
    writing into the same directory), to the first free ``stem-1.ext``, ``stem-2.ext``, ...

    Each name is claimed atomically: ``os.link`` fails if the name exists, so of two processes
    racing for one name exactly one gets it and the other tries the next. Where the filesystem
    has no hard links, the name is claimed by creating it with ``O_CREAT | O_EXCL`` and then
    replaced by the clip (a reader may see it empty for that moment)."""
    stem, ext = os.path.splitext(path)
    links, n = True, 0
    while True:
        candidate = f"{stem}-{n}{ext}" if n else path
        try:
            if links:
                os.link(tmp, candidate)
            else:
                os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            n += 1
            continue
        except OSError as err:
            if not links or err.errno not in _NO_LINKS:
                raise
            links = False  # this name again, claimed without a link
            continue
        if links:
            remove_quietly(tmp)
        else:
            os.replace(tmp, candidate)
        return candidate


BATCH = 8  # frames handed to the encoder thread per wake-up
# the longest an encoder dropped without close() (collected, or at interpreter exit) waits for its
# thread to kill ffmpeg and end; ffmpeg is then killed from the calling thread
ABANDON_TIMEOUT_S = 5.0


class _Worker:
    """The state an :class:`Encoder` shares with its thread, and that thread's code.

    The thread runs :meth:`run` of this object, never a method of the :class:`Encoder` that owns
    it, so the thread keeps no reference to its owner: an owner dropped without ``close()`` is
    collected, and its finalizer calls :meth:`abandon`. (One object for both would be kept alive
    by its own thread.) The training thread's side is the :class:`Encoder`'s methods.
    """

    def __init__(self, queue_size, name, stall_timeout, threads):
        self.batch = max(1, min(BATCH, queue_size // 2))
        self.name, self.stall_timeout = name, float(stall_timeout)
        self.threads = threads  # x264's threads of each clip (None: its own)
        self.thread = None
        self.cv = threading.Condition()
        # shared by the two threads, under cv: the items handed over, and those put and not yet
        # processed (flush waits for 0)
        self.items = collections.deque()
        self.unfinished = 0
        # buffers ready for reuse; the training thread takes one with a bare pop (a deque's
        # pops and appends are atomic), everything else on it happens under cv
        self.free = collections.deque()
        self.buffers = 0  # buffers that exist (free + in flight)
        self.layout = None  # (shape, pinned) of the buffers
        self.results = collections.deque()
        self.held_clips = []  # finished clips Encoder.hold keeps (training thread)
        # serials of clips whose failure was reported (by this thread, or by the training
        # thread, which gave up on them): their frames go nowhere
        self.reported = set()
        self.sent = {}  # frames handed over, by serial of a clip not yet done
        self.frames_dropped = 0  # frames handed over for clips that failed
        self.stalled = set()  # serials of clips dropped because the encoder stalled
        self.alive_at = time.monotonic()  # when the encoder thread last made progress
        # encoder-thread state of the clip being written: its job and serial, its ffmpeg, its
        # temporary file and the frames written
        self.job = None
        self.job_serial = self.frames = 0
        self.proc = None
        self.tmp = None
        self.abandoned = False  # the owner is gone without close(): drop everything, stop

    def abandon(self):
        """The owner was collected, or the interpreter exits, without :meth:`close`: the clip in
        progress and every clip not yet on disk are dropped (ffmpeg killed and reaped, temporary
        files removed) and the thread ends. Clips already under their final name stay. Bounded,
        and safe from any thread (a garbage collection runs finalizers wherever it happens)."""
        thread, proc = self.thread, self.proc
        with self.cv:
            first, self.abandoned = not self.abandoned, True
            self.cv.notify_all()
        if not first or thread is None:
            return
        if self.job is not None or self.items:
            log.warning(
                "%s: the recorder was not closed (garbage-collected, or the interpreter exits): "
                "the clip in progress is dropped; close() saves it",
                self.name,
            )
        if proc is not None:  # unblocks a write or a finish the thread may be waiting in; reaped
            proc.kill_and_wait()
        if thread is not threading.current_thread():  # collected on this thread: it ends itself
            thread.join(ABANDON_TIMEOUT_S)
            if thread.is_alive():  # stuck outside ffmpeg (an overlay, say): clean up from here
                remove_quietly(self.tmp)
                self.drop_pending()

    def drop_pending(self):
        """Removes the temporary files of finished clips nobody will place now."""
        for result in [*self.results, *self.held_clips]:
            if isinstance(result, ClipInfo) and result._pending is not None:
                remove_quietly(result._pending[0])
                result._pending = None

    # -------------------------------------------------------------- encoder thread
    def run(self):
        stop = False
        while not (stop or self.abandoned):
            with self.cv:
                self.cv.wait_for(lambda: self.items or self.abandoned)
                items = list(self.items)
                self.items.clear()
            self.alive_at = time.monotonic()
            buffers = []
            try:
                stop = self._process(items, buffers)
            finally:
                # never let this thread die or keep buffers: the training thread would wait forever
                with self.cv:
                    # a batch may hold buffers of an old frame size and of the new one
                    shape = self.layout and self.layout[0]
                    self.free.extend(b for b in buffers if tuple(b.shape) == shape)
                    self.unfinished -= len(items)
                    self.alive_at = time.monotonic()
                    self.cv.notify_all()
        if self.abandoned:  # the encoder thread's part of abandon()
            self._discard()
            self.drop_pending()
            with self.cv:
                self.items.clear()
                self.unfinished = 0
                self.cv.notify_all()

    def _process(self, items, buffers):
        """Runs the queued items in order, consecutive frames as one write; True on close."""
        images = []
        for item in items:
            self.alive_at = time.monotonic()
            if self.abandoned:  # the rest goes nowhere (see abandon)
                return True
            if item is not None and item[0] == "frame":
                buffers.append(item[1])
                image = self._prepare(*item[1:])
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

    def _skipping(self):
        """Whether the frames of the current clip go nowhere (none, failed, or given up on): a
        failed clip is discarded (``job`` None) until the next open."""
        if self.job_serial in self.reported:
            self._discard()  # given up on by the training thread (once discarded: a no-op)
        return self.job is None

    def _prepare(self, frames, meta):
        """The image ffmpeg gets for one frame item (and its ffmpeg started), None if skipped."""
        if self._skipping():
            return None
        job = self.job
        try:
            array = frames.numpy()
            if job.overlay is not None:
                array = job.overlay(array, meta)
            image = np.ascontiguousarray(pad_even(tile(array)))
            if self.proc is None:  # the size is known with the first frame
                self.tmp = temporary_name(job.info.path)
                h, w = image.shape[:2]
                args = (job.info.fps, job.encoding, self.stall_timeout, self.threads)
                self.proc = FFmpegProcess(self.tmp, w, h, *args)
            return image
        except Exception as err:
            self._fail(err)

    def _write(self, images):
        if images and self.proc is not None and not self._skipping():
            try:
                self.proc.write(images)
                self.frames += len(images)
            except Exception as err:
                self._fail(err)

    def _on_open(self, job, serial):
        self._discard()  # a clip never ended (should not happen): drop it rather than mix clips
        self.job, self.job_serial, self.frames = job, serial, 0

    def _on_end(self, keep, summary=None):
        """Finishes the clip into its temporary file (a failure here is the caller's _fail)."""
        job, proc, tmp, serial = self.job, self.proc, self.tmp, self.job_serial
        if not keep or self._skipping() or proc is None:  # no frame: no file
            if not keep:
                self.sent.pop(serial, None)  # dropped on purpose: not a loss
            self._discard()
            return
        proc.finish()  # bounded: stall_timeout without progress (the training thread can kill
        # ffmpeg meanwhile: self.proc stays set until it is done)
        if serial in self.reported:  # given up on meanwhile
            raise EncoderError("given up on by the training thread")
        info = dataclasses.replace(job.info, num_frames=self.frames)
        data = summary and {  # the clip's summary and the file's figures
            "sha256": sha256_file(tmp),
            "frames": self.frames,
            "fps": info.fps,
            "width": proc.size[0],
            "height": proc.size[1],
            "encoder": job.encoding,
            "tag": info.tag,
            **summary,
        }
        info._pending = (tmp, job.fixed_name, data)  # moved to its name when handed over
        self.job = self.proc = self.tmp = None
        with self.cv:
            self.sent.pop(serial, None)
            self.results.append(info)

    def _discard(self):
        proc, tmp = self.proc, self.tmp
        self.job = self.proc = self.tmp = None
        if proc is not None:
            with contextlib.suppress(Exception):  # best effort: the clip is lost anyway
                proc.kill()
            remove_quietly(tmp)

    def _fail(self, err):
        job, serial = self.job, self.job_serial
        if getattr(err, "stalled", False):
            self.stalled.add(serial)
        self._discard()  # the rest of this clip's frames are skipped until the next open
        with self.cv:
            self.report(serial, _failure(job, err))

    def report(self, serial, message):
        """Appends a clip's failure to the results, once per clip (call under ``cv``)."""
        if serial not in self.reported:
            self.reported.add(serial)
            self.frames_dropped += self.sent.pop(serial, 0)
            self.results.append(message)


class Encoder:
    """Background encoding of a sequence of clips, one at a time, from a bounded set of buffers.

    Training-thread API: ``open(job)``, ``frame(frames, meta)``, ``end(keep)``, ``flush()``,
    ``close()``, ``results()``; ``hold``: see :meth:`release`; ``threads``: x264's threads of
    each clip (None: x264 chooses). ``frame`` copies the frames into one of at most ``queue_size``
    reusable CPU buffers (the one copy the training thread pays) and queues it; when all buffers
    are in flight it waits for one (back-pressure): frames are never dropped while the encoder
    makes progress. Results (ClipInfo or error message) are collected here and handed to the
    training thread by ``results()``, so callbacks and warnings never run on this thread.

    Three things keep the training thread's cost at its one copy. The buffers are reused, because
    a fresh frame-sized allocation per frame is a fresh mmap whose page faults (and the unmap
    when the encoder frees it) cost the training thread more than the copy; a free one is taken
    without the lock. The frames are held back in the training thread and handed over ``BATCH``
    at a time (or with a control message, :meth:`flush` and :meth:`close`) under one lock, and the
    encoder thread is woken then, not per frame, and writes the batch with one system call: every
    wake-up of a second Python thread is a GIL hand-over that the training thread pays for in its
    next few torch calls.

    ``stall_timeout`` (seconds) bounds every wait. This thread gives ffmpeg that long without
    progress (taking frame data or using CPU time) for each write and for finishing a clip; then
    ffmpeg is killed, its temporary file removed, and the clip reported failed, once. The
    training thread's waits (a free buffer, :meth:`flush`, :meth:`close`) give up after twice
    that without progress of this thread, whatever it is stuck in: the clip it was on is then
    dropped (the rest of its frames are not queued), its ffmpeg killed, and it is reported
    failed, once. A hung ffmpeg therefore costs training about ``stall_timeout`` seconds, once.

    An encoder dropped without :meth:`close` (garbage-collected, or still open when the
    interpreter exits) drops the clip in progress and every clip not yet on disk: a
    ``weakref.finalize`` kills ffmpeg, removes the temporary files and ends the thread (daemon),
    within :data:`ABANDON_TIMEOUT_S`. Clips already under their final name stay; no partial file
    is ever left under a final name.

    The methods here run in the training thread; what the encoder thread runs, and the state the
    two threads share, is a :class:`_Worker` (see there why it is a second object).
    """

    def __init__(
        self,
        queue_size: int,
        name: str = "rlrec-encoder",
        stall_timeout: float = STALL_TIMEOUT_S,
        hold: bool = False,
        threads: Optional[int] = None,
    ):
        self._w = w = _Worker(queue_size, name, stall_timeout, threads)
        # the results deque itself: true while results wait (``pending`` without a call, for a
        # caller that checks on every step)
        self.waiting = w.results
        self._capacity = queue_size
        self._patience = 2 * w.stall_timeout  # the training thread's waits (see above)
        self._slice = max(0.005, min(0.25, w.stall_timeout / 5))
        self._opened = 0  # serial of the clip last opened (1, 2, ...)
        self._open_job = None
        # items (frames, controls) not yet handed to the encoder thread, and how many are frames
        self._held = []
        self._held_frames = 0
        # runs once: when this object is collected, or at interpreter exit (atexit) if it is
        # still alive then; a no-op after close(). It holds the worker, never this object.
        weakref.finalize(self, w.abandon)
        self.hold = hold  # finished clips wait in their temporary files for release()

    @property
    def current_pid(self) -> Optional[int]:
        """pid of the running ffmpeg, None between clips."""
        proc = self._w.proc
        return None if proc is None else proc.proc.pid

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The encoder thread: started with the first clip, None again after :meth:`close`."""
        return self._w.thread

    @property
    def buffers(self) -> int:
        """Frame buffers that exist (free and in flight): never more than ``queue_size``."""
        return self._w.buffers

    def losses(self) -> Dict[str, int]:
        """``frames_dropped``: frames handed over for clips that failed (never on disk), so far
        (frames held back in the training thread, fewer than a batch, count once handed over);
        ``encoder_stalls``: clips dropped because the encoder stalled (ffmpeg made no progress
        for ``stall_timeout`` s, or the training thread gave up waiting for this thread)."""
        return {"frames_dropped": self._w.frames_dropped, "encoder_stalls": len(self._w.stalled)}

    # -------------------------------------------------------------- the clips
    def open(self, job: ClipJob):
        self._hand_over()  # what is held back belongs to the clip before
        self._opened += 1
        self._open_job = job
        self._put(("open", job, self._opened))

    def frame(self, frames, meta=None):
        """Queues a copy of ``frames`` (uint8 ``[k, H, W, 3]`` tensor on any device)."""
        w = self._w
        buffer = None
        if self._opened not in w.reported:  # else a failed clip: the rest of it is not sent
            # a free buffer of this layout, taken without the lock (see _Worker.free); else the
            # bounded wait for one
            layout = w.layout
            if layout is not None and frames.shape == layout[0] and frames.is_cuda is layout[1]:
                with contextlib.suppress(IndexError):
                    buffer = w.free.pop()
            if buffer is None:
                buffer = self._buffer(frames)
            if buffer is None:
                self._give_up(self._opened, "the training thread's wait for a free frame buffer")
        if buffer is None:  # this frame is lost
            with w.cv:
                w.frames_dropped += 1
            return
        buffer.copy_(frames)
        # held back here and handed over BATCH at a time: one lock, one wake-up
        self._put(("frame", buffer, meta))
        self._held_frames += 1
        if self._held_frames >= w.batch:
            self._hand_over()

    def end(self, keep: bool, summary: Optional[dict] = None):
        """Ends the current clip: ``keep`` finishes it (:meth:`results` places it), else it is
        discarded. ``summary``: what the clip shows (plain data), written into its sidecar with
        the file's own figures; None: no sidecar."""
        w = self._w
        self._put(("end", keep, summary))
        self._hand_over()
        with w.cv:  # between clips, keep only the buffers a clip's start needs
            while len(w.free) > 2 * w.batch:
                w.free.pop()
                w.buffers -= 1

    def flush(self):
        """Returns once everything queued so far is processed (finished clips wait for
        :meth:`results`), or after ``2 * stall_timeout`` seconds without progress of the encoder
        (its clip in progress is then dropped)."""
        w = self._w
        self._hand_over()
        if not self._wait(lambda: w.unfinished):
            self._give_up(w.job_serial or self._opened, "flush()")

    def close(self):
        """Finishes what is queued and stops the encoder thread; bounded like :meth:`flush`. A
        thread still stuck after its clip was given up on is left behind (a daemon thread) and
        its temporary file removed."""
        w = self._w
        thread = w.thread
        if thread is not None:
            self._put(None)
            self._hand_over()
            while not self._wait(lambda: w.unfinished):
                serial = w.job_serial or self._opened
                if serial in w.reported:  # given up on (or failed) already: leave the thread behind
                    remove_quietly(w.tmp)
                    break
                self._give_up(serial, "close()")
            else:
                thread.join(self._patience)  # it ends right after its last item
            w.thread = None
        w.free, w.buffers = collections.deque(), 0

    # -------------------------------------------------------------- the results
    def results(self) -> Iterator[Any]:
        """The finished clips (ClipInfo) and failure messages (str) since the last call, in
        order (clips held while :attr:`hold`: none). Each clip is moved to its name right before
        it is yielded, so the file under its name is that clip while the caller handles it; what
        a caller that stops early (an exception) leaves comes with the next call."""
        w = self._w
        while w.results:
            result = w.results.popleft()
            if self.hold and getattr(result, "_pending", None):
                w.held_clips.append(result)
            else:
                yield self._place(result)

    def release(self, keep: Callable[[ClipInfo], bool]):
        """Hands on the clips held (:attr:`hold`): those ``keep`` selects are placed under their
        names here, in order, and come with the next :meth:`results`; the others' temporary
        files are removed, and no name of theirs is ever taken."""
        w = self._w
        held, w.held_clips = w.held_clips, []
        for clip in held:
            if keep(clip):
                w.results.append(self._place(clip))
            else:
                remove_quietly(clip._pending[0])

    def _place(self, result):
        """Moves a finished clip to its name (a fixed name replaced, else the first free one of
        ``stem.ext``, ``stem-1.ext``, ...), then writes its sidecar; returns the ClipInfo, or a
        failure message if it could not be moved. Anything else is returned as it is."""
        if not getattr(result, "_pending", None):
            return result
        (tmp, fixed, data), result._pending = result._pending, None
        try:
            if fixed:
                os.replace(tmp, result.path)
            else:
                result.path = _claim(tmp, result.path)
        except OSError as err:
            remove_quietly(tmp)
            return f"encoding clip {result.path!r} failed: {type(err).__name__}: {err}"
        try:
            if data is not None:  # after the mp4 is complete under its name
                result.sidecar = write_sidecar(result.path, data)
        except OSError as err:
            return f"writing the sidecar of clip {result.path!r} failed: {err}"
        return result

    # -------------------------------------------------------------- internals
    def _put(self, item):
        """Holds back an item (a frame, a control; ``None``: stop) until the next hand-over."""
        w = self._w
        if w.thread is None:  # started on the first clip: an idle recorder has no thread
            w.thread = threading.Thread(target=w.run, name=w.name, daemon=True)
            w.thread.start()
        self._held.append(item)

    def _hand_over(self):
        """Hands the items held back to the encoder thread, in order, under one lock, and wakes
        it."""
        held, n = self._held, self._held_frames
        if held:
            self._held, self._held_frames = [], 0
            w = self._w
            with w.cv:
                w.items.extend(held)
                w.unfinished += len(held)
                # the frames held back are all of the clip last opened (open() hands over what
                # came before): counted as dropped now if it failed already, else when it fails
                if self._opened in w.reported:
                    w.frames_dropped += n
                else:
                    w.sent[self._opened] = w.sent.get(self._opened, 0) + n
                w.cv.notify_all()

    def _buffer(self, frames):
        """A free CPU buffer shaped like ``frames``; waits for one while all are in flight, and
        returns None after ``2 * stall_timeout`` seconds without progress of the encoder."""
        import torch

        w = self._w
        pinned = frames.device.type == "cuda"  # device -> pinned host memory is the fast copy
        layout = (tuple(frames.shape), pinned)
        if not w.free and w.buffers >= self._capacity:
            self._hand_over()  # the frames held back hold buffers: the encoder's now
        with w.cv:
            if layout != w.layout:  # a new frame size: buffers of the old one are dropped
                w.layout, w.free, w.buffers = layout, collections.deque(), 0
            if not self._wait(lambda: not w.free and w.buffers >= self._capacity):
                return None
            if w.free:
                return w.free.pop()
            w.buffers += 1
        return torch.empty(layout[0], dtype=torch.uint8, pin_memory=pinned)

    def _wait(self, busy):
        """Waits while ``busy()`` (asked under the lock; the condition's lock is reentrant):
        False after ``2 * stall_timeout`` seconds without progress of the encoder thread."""
        w = self._w
        start = time.monotonic()
        with w.cv:
            while busy():
                w.cv.wait(self._slice)
                # the last progress of the encoder thread, or of its ffmpeg
                last = max(w.alive_at, start, getattr(w.proc, "progress_at", start))
                if busy() and time.monotonic() - last > self._patience:
                    return False
        return True

    def _give_up(self, serial, waited):
        """The training thread gives up on clip ``serial``: its remaining frames are dropped,
        its ffmpeg killed, and it is reported failed (once); the encoder thread discards it."""
        if serial <= 0:
            return
        w = self._w
        w.stalled.add(serial)
        err = EncoderError(
            f"{waited} waited {self._patience:g} s without progress of the encoder (stuck; "
            f"stall_timeout_sec={w.stall_timeout:g}): clip dropped"
        )
        with w.cv:
            w.report(serial, _failure(self._open_job if serial == self._opened else w.job, err))
        proc = w.proc
        if proc is not None and w.job_serial == serial:
            with contextlib.suppress(OSError):
                proc.proc.kill()  # unblocks the encoder thread; it reaps the process


def _failure(job, err):
    what = f"clip {job.info.path!r}" if job is not None else "a clip"
    return f"encoding {what} failed: {type(err).__name__}: {err}"
