"""For the benchmarks under scripts/ that time a ``train.py`` process from outside: its run
folder (:class:`RunDirs`) and its ``metrics.jsonl`` read while the run writes it
(:class:`MetricsTail`: each read returns the complete lines that appeared since the last one, each
with the seconds since the run was started; the benchmarks read every 10 ms, so a line is timed
within 10 ms of being written)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import List, Tuple


class RunDirs:
    """The temporary run folders (``hydra.run.dir``) of a benchmark's ``train.py`` runs:
    :meth:`new` makes one, :meth:`remove` deletes those it made (and only those: each is a new
    ``mkdtemp`` folder that only that run wrote into), unless ``keep`` (``--keep-runs``)."""

    def __init__(self) -> None:
        self.keep = False
        self.made: List[Path] = []

    @staticmethod
    def add_argument(parser) -> None:
        """The benchmark's ``--keep-runs`` flag."""
        parser.add_argument(
            "--keep-runs", action="store_true", help="keep the runs' folders (removed by default)"
        )

    def start(self, keep: bool) -> None:
        """The folders made from now on are removed when the benchmark exits, unless ``keep``."""
        self.keep = keep
        atexit.register(self.remove)

    def new(self, prefix: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self.made.append(path)
        return path

    def remove(self) -> None:
        if self.keep:
            if self.made:
                print(f"run folders kept: {', '.join(map(str, self.made))}")
            return
        while self.made:
            shutil.rmtree(self.made.pop(), ignore_errors=True)


class MetricsTail:
    def __init__(self, path: Path, t0: float):
        self.path, self.t0 = Path(path), t0
        self._pos, self._buf = 0, ""

    def read(self) -> List[Tuple[float, dict]]:
        """``(seconds since t0, record)`` for each complete line new since the last read."""
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        now = time.time() - self.t0
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        return [(now, json.loads(line)) for line in lines]
