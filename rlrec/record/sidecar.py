"""The sidecar of a clip: ``NAME.json`` beside ``NAME.mp4``, saying what the clip shows.

It is written once the mp4 is complete under its final name, atomically (a hidden temporary in the
same directory, then ``os.replace``), so a reader that finds the json finds the whole mp4 it
describes (its ``sha256`` says which bytes). Keys:

- ``video``: the mp4's file name; ``sha256``; ``frames``; ``fps``; ``width``, ``height``;
- ``encoder``: ``codec``, ``crf`` (or ``qp`` 0 when lossless), ``preset``, ``pix_fmt``, ``quality``;
- ``kind``, ``tag``: the recorder's kind (train, eval, ...) and the caller's tag at the first frame;
- ``env_idx``, ``episodes``: the recorded envs and the index of the episode each was in at the
  clip's first frame; ``seed``: the first env's own seed at the reset that began its episode
  (the reset's seed plus its index where the backend seeds each env; null when it began at a
  reset without one, e.g. an autoreset);
- ``first_step``, ``last_step``: the recorder's step count at the first and the last frame;
- ``envs``: per recorded env, of that episode: ``return`` and ``length`` (steps) within the clip,
  ``success`` (ever true within the clip; null when the env reports none) and ``end``:
  ``terminated`` or ``truncated`` (the episode ended within the clip) or ``cut`` (the clip ended
  first: its length, a full reset, or close).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict

from rlrec.files import atomic_file


def sidecar_path(video: str) -> str:
    """``NAME.json`` for ``NAME.mp4``."""
    return os.path.splitext(video)[0] + ".json"


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sidecar(video: str, data: Dict[str, Any]) -> str:
    """Writes ``data`` (plus ``version`` and ``video``) as the sidecar of ``video``, atomically;
    returns its path."""
    path = sidecar_path(video)
    body = {"version": 1, "video": os.path.basename(video), **data}  # the sidecar's version
    # the one temporary-name scheme (.NAME.PID-N.part): a resumed run removes one left by a kill
    with atomic_file(path, "w") as f:
        # anything json cannot write (a tag of the caller's, say) is written as its repr
        json.dump(body, f, indent=1, default=repr)
        f.write("\n")
    return path
