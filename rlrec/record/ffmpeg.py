"""One ffmpeg process encoding raw rgb24 frames from its stdin into an mp4 file.

We drive ffmpeg with our own ``subprocess.Popen`` (the binary that imageio-ffmpeg ships) instead of
``imageio_ffmpeg.write_frames`` because the recorder must notice a failed encode: write_frames
neither checks ffmpeg's exit status on close (a killed ffmpeg would leave a truncated file that
looks finished) nor keeps ffmpeg's error output for the message.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from fractions import Fraction
from typing import List

import numpy as np

__all__ = ["EncoderError", "FFmpegProcess", "FINISH_TIMEOUT_S", "quality_to_crf"]


class EncoderError(RuntimeError):
    """Encoding a clip failed (ffmpeg could not start, died, or the file could not be written)."""


def quality_to_crf(quality: int) -> int:
    """imageio's 1..10 quality scale mapped to x264's CRF like imageio-ffmpeg does (7 -> 15)."""
    return int((1 - quality / 10.0) * 51)


FINISH_TIMEOUT_S = 120.0  # a hung ffmpeg must not block flush()/close() (and so training) forever
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PIPE_SIZE = 1 << 20  # Linux's default limit for unprivileged users (/proc/sys/fs/pipe-max-size)
_IOV_MAX = 1024  # buffers per writev


class FFmpegProcess:
    """One ffmpeg process encoding raw rgb24 frames from its stdin into an mp4 file."""

    def __init__(
        self,
        path: str,
        width: int,
        height: int,
        fps: float,
        quality: int,
        lossless: bool,
        preset: str,
    ):
        import imageio_ffmpeg

        rate = Fraction(fps).limit_denominator(1_000_000)  # the real fps, as an exact rational
        cmd = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-nostdin", "-loglevel", "error",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(rate),
            "-i", "-", "-an",
        ]  # fmt: skip
        if lossless:  # exact RGB: for tests and pixel-exact analysis; fewer players support it
            cmd += ["-c:v", "libx264rgb", "-qp", "0", "-pix_fmt", "rgb24"]
        else:
            cmd += ["-c:v", "libx264", "-crf", str(quality_to_crf(quality)), "-pix_fmt", "yuv420p"]
        cmd += ["-preset", str(getattr(preset, "value", preset)), "-f", "mp4", path]
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
        self.pid = self.proc.pid
        try:  # a frame or more per pipe fill: fewer wake-ups of ffmpeg and of the encoder thread
            fcntl.fcntl(self.proc.stdin.fileno(), _F_SETPIPE_SZ, _PIPE_SIZE)  # type: ignore[union-attr]
        except (AttributeError, OSError):  # not Linux, or above the user's pipe size limit
            pass
        try:  # where cores are scarce, the training thread goes first; the bounded queue
            os.setpriority(os.PRIO_PROCESS, self.pid, 10)  # keeps ffmpeg from falling behind
        except (AttributeError, OSError):
            pass

    def _error(self, what: str) -> EncoderError:
        self.proc.poll()
        self._stderr.seek(0)
        lines = self._stderr.read()[-4000:].decode(errors="replace").strip().splitlines()
        tail = "; ".join(line.strip() for line in lines[-3:] if line.strip())
        code = self.proc.returncode
        status = f"ffmpeg exit status {code}" if code is not None else "ffmpeg still running"
        return EncoderError(f"{what} ({status}){': ' + tail if tail else ''}")

    def write(self, images: List[np.ndarray]) -> None:
        """Writes contiguous frames, all of them in one blocking ``writev`` where it can."""
        views = [memoryview(image).cast("B") for image in images]
        try:
            fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
            while views:
                n = os.writev(fd, views[:_IOV_MAX])
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if n:
                    views[0] = views[0][n:]
        except (BrokenPipeError, OSError, ValueError) as err:
            raise self._error(f"writing a frame to ffmpeg failed: {err}") from None

    def finish(self) -> None:
        """Ends the stream and waits for ffmpeg; raises EncoderError unless it exited with 0."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass
        try:
            # a clip's tail takes ffmpeg well under a second
            self.proc.wait(timeout=FINISH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            if self.proc.returncode != 0:
                raise self._error("ffmpeg did not finish the clip")
        finally:
            self._stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass
        self.proc.wait()
        self._stderr.close()
