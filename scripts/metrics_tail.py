"""A run's ``metrics.jsonl`` read while the run writes it, for the benchmarks under scripts/ that
time a ``train.py`` process from outside: each read returns the complete lines that appeared
since the last one, each with the seconds since the run was started (the benchmarks read every
10 ms, so a line is timed within 10 ms of being written)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Tuple


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
