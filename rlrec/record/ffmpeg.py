"""One ffmpeg process encoding raw rgb24 frames from its stdin into an mp4 file.

We drive ffmpeg with our own ``subprocess.Popen`` (the binary that imageio-ffmpeg ships) instead of
``imageio_ffmpeg.write_frames`` because the recorder must notice a failed encode: write_frames
neither checks ffmpeg's exit status on close (a killed ffmpeg would leave a truncated file that
looks finished) nor keeps ffmpeg's error output for the message.

Every wait on ffmpeg is bounded by ``stall_timeout`` seconds *without progress*: writes go through
a non-blocking pipe, and ffmpeg progresses while it takes frame data or uses CPU time (Linux's
``/proc/PID/stat``; elsewhere only taking data counts). A stopped or hung ffmpeg (SIGSTOP, a
deadlock) is killed after that long with an :class:`EncoderError`; a slow but working one is not.

The output path reaches ffmpeg as ``file:`` and an absolute path, so no directory or file name
can be read by ffmpeg as an option (``-vids``) or as another protocol (``pipe:1``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import tempfile
import time
from fractions import Fraction
from typing import List, Optional

import numpy as np


class EncoderError(RuntimeError):
    """Encoding a clip failed (ffmpeg could not start, died, or the file could not be written)."""


# the longest ffmpeg may take to finish a clip's tail once its input ended, even while it progresses
FINISH_TIMEOUT_S = 120.0
STALL_TIMEOUT_S = 10.0  # RecorderConfig.stall_timeout_sec's default, for the Encoder on its own
_PIPE_SIZE = 1 << 20  # Linux's default limit for unprivileged users (/proc/sys/fs/pipe-max-size)
_IOV_MAX = 1024  # buffers per writev


def ffmpeg_output_path(path: str) -> str:
    """``path`` as ffmpeg can only read it: a local file (``file:`` and the absolute path)."""
    return "file:" + os.path.abspath(path)


def _cpu_ticks(pid):
    """User + system CPU time of process ``pid`` (all its threads) in clock ticks; None where
    ``/proc`` cannot tell (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None


def encoder_settings(quality: int, lossless: bool, preset: str) -> dict:
    """A clip's encoding, as :class:`FFmpegProcess` takes it and the clip's sidecar names it: the
    codec, its rate control, pixel format and preset, and the settings they come from."""
    # str: an X264Preset prints as its value
    settings = {"preset": str(preset), "quality": quality, "lossless": lossless}
    if lossless:  # exact RGB: for tests and pixel-exact analysis; fewer players support it
        return {"codec": "libx264rgb", "qp": 0, "pix_fmt": "rgb24", **settings}
    # imageio's 1..10 quality scale mapped to x264's CRF as imageio-ffmpeg maps it (7 -> 15)
    crf = int((1 - quality / 10.0) * 51)
    return {"codec": "libx264", "crf": crf, "pix_fmt": "yuv420p", **settings}


def _command(path, width, height, fps, e, threads):
    """ffmpeg's command line: raw rgb24 frames of ``width`` x ``height`` from stdin, at ``fps``,
    into an mp4 at ``path``, encoded as ``e`` (:func:`encoder_settings`) says; ``threads``:
    x264's (None: its own)."""
    import imageio_ffmpeg

    q = "qp" if e["lossless"] else "crf"
    rate = Fraction(fps).limit_denominator(1_000_000)  # the real fps, as an exact rational
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), *"-y -nostdin -loglevel error -f rawvideo".split()]
    cmd += ["-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(rate), "-i", "-", "-an"]
    cmd += ["-c:v", e["codec"], f"-{q}", str(e[q]), "-pix_fmt", e["pix_fmt"]]
    cmd += ["-preset", e["preset"]] + ([] if threads is None else ["-threads", str(threads)])
    cmd += ["-g", str(e["gop"])] if "gop" in e else []  # keyframe interval (frames)
    if e["lossless"]:  # primaries and transfer tagged: without them Chromium ignores the stream's
        # GBR matrix and shows the G/B/R planes as Y/U/V (false colours)
        cmd += ["-x264-params", "colorprim=bt709:transfer=bt709"]
    return cmd + ["-f", "mp4", ffmpeg_output_path(path)]


class FFmpegProcess:
    """One ffmpeg process encoding raw rgb24 frames from its stdin into an mp4 file.

    ``encoding``: :func:`encoder_settings`; ``stall_timeout``: seconds without progress after
    which a write or :meth:`finish` gives up (ffmpeg is killed, EncoderError); ``threads``:
    x264's threads (None: x264 chooses)."""

    def __init__(
        self,
        path: str,
        width: int,
        height: int,
        fps: float,
        encoding: dict,
        stall_timeout: float = STALL_TIMEOUT_S,
        threads: Optional[int] = None,
    ):
        self.size = (width, height)  # of the file's frames
        self.stall_timeout = float(stall_timeout)
        # the slice of a bounded wait: short enough to notice a stall soon after stall_timeout
        self._slice = max(0.005, min(0.25, self.stall_timeout / 5))
        cmd = _command(path, width, height, fps, encoding, threads)
        self._stderr = tempfile.TemporaryFile()
        # A session of its own: Ctrl-C in a terminal reaches the whole foreground process group;
        # ffmpeg must survive it so that close() can still finish the clip.
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                bufsize=0,  # frames go straight to the pipe (writev), no Python-side buffer
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                start_new_session=True,
            )
        except BaseException:
            self._stderr.close()
            raise
        # when ffmpeg last progressed: took frame data (write) or used CPU time (_idle)
        self.progress_at = time.monotonic()
        self._ticks = _cpu_ticks(self.proc.pid)
        fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
        # a frame or more per pipe fill: fewer wake-ups of ffmpeg and of the encoder thread (Linux
        # only; a size above the user's pipe size limit is refused)
        with contextlib.suppress(AttributeError, OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        # where cores are scarce, the training thread goes first; the bounded queue keeps ffmpeg
        # from falling behind
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, 10)
        os.set_blocking(fd, False)  # a write into a full pipe waits in poll(), bounded
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    def _idle(self):
        """Seconds since ffmpeg last progressed (CPU time used since the last call counts as
        now)."""
        ticks = _cpu_ticks(self.proc.pid)
        if ticks is not None and ticks != self._ticks:
            self._ticks, self.progress_at = ticks, time.monotonic()
        return time.monotonic() - self.progress_at

    def _error(self, what):
        self.proc.poll()
        self._stderr.seek(0)
        lines = self._stderr.read()[-4000:].decode(errors="replace").strip().splitlines()
        tail = "; ".join(line.strip() for line in lines[-3:] if line.strip())
        code = self.proc.returncode
        status = f"ffmpeg exit status {code}" if code is not None else "ffmpeg still running"
        return EncoderError(f"{what} ({status}){': ' + tail if tail else ''}")

    def _stalled(self, what):
        self.kill_and_wait()
        err = self._error(
            f"ffmpeg made no progress for {self.stall_timeout:g} s {what} (stopped or hung; "
            f"stall_timeout_sec={self.stall_timeout:g}): killed"
        )
        err.stalled = True  # counted as a stall of the encoder (Encoder.losses)
        return err

    def write(self, images: List[np.ndarray]):
        """Writes contiguous frames, as few ``writev`` calls as the pipe allows. Waits while the
        pipe is full, at most ``stall_timeout`` seconds without progress of ffmpeg."""
        views = [memoryview(image).cast("B") for image in images]
        try:
            fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
            while views:
                try:
                    n = os.writev(fd, views[:_IOV_MAX])
                except BlockingIOError:  # the pipe is full: wait until ffmpeg takes some of it
                    idle = not self._poll.poll(self._slice * 1000)
                    if idle and self._idle() > self.stall_timeout:
                        raise self._stalled("taking frames") from None
                    continue
                self.progress_at = time.monotonic()
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if n:
                    views[0] = views[0][n:]
        except (OSError, ValueError) as err:  # a stall's EncoderError is neither
            raise self._error(f"writing a frame to ffmpeg failed: {err}") from None

    def finish(self):
        """Ends the stream and waits for ffmpeg; raises EncoderError unless it exited with 0."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            # a clip's tail takes ffmpeg well under a second; a slow preset on big frames longer,
            # and it is waited for as long as ffmpeg works on it (up to FINISH_TIMEOUT_S)
            start = self.progress_at = time.monotonic()
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=self._slice)
                    break
                if self._idle() > self.stall_timeout:
                    raise self._stalled("finishing the clip")
                if time.monotonic() - start > FINISH_TIMEOUT_S:
                    self.kill_and_wait()
                    raise self._error(
                        f"ffmpeg did not finish the clip within {FINISH_TIMEOUT_S:g} s: killed"
                    )
            if self.proc.returncode != 0:
                raise self._error("ffmpeg did not finish the clip")
        finally:
            self._stderr.close()

    def kill_and_wait(self):
        """SIGKILL (which also ends a stopped process) and a bounded wait for its exit."""
        # gone already, or stuck in the kernel
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=max(1.0, self.stall_timeout))

    def kill(self):
        self.kill_and_wait()
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        self._stderr.close()
