"""The timeline a resumed run continues, and the files of the one it replaces.

A run that ``resume=auto`` continues from a checkpoint may have written more after it (it was
killed, or stopped, later): clips and their sidecars, metrics.jsonl and eval_episodes.jsonl lines,
TensorBoard events. They belong to a timeline that no longer exists: the resumed run records them
again, under the same names. :func:`supersede` moves them aside, never deleting anything, into one
folder per resume,

    ``<run dir>/superseded/<n>-step<step:09d>/``   (``n``: 1 for the first resume that moved
                                                    something, then 2, ...; ``step``: the
                                                    checkpoint's global step)

keeping their paths relative to the run dir (``videos/train/...``, ``metrics.jsonl`` with the
lines that were after the checkpoint, ``tensorboard/events...`` with the events after it). The
files that stay are rewritten atomically (``rlrec.files``) with what was before the checkpoint.

What is after the checkpoint (:class:`Point`):

- a line (metrics.jsonl, eval_episodes.jsonl) or a TensorBoard event of a later step; of the
  checkpoint's own step, an evaluation's line when the checkpoint says that evaluation was cut
  (``eval_due``: the resumed run does it again);
- an evaluation's clip (``eval-stepSTEP.mp4``, and each per-episode clip
  ``eval-stepSTEP-envENV.mp4``): with its evaluation's lines, by the training step its name says,
  whatever recorder counts the checkpoint holds (none with the eval recorder off);
- any other clip (its sidecar says its kind and ``first_step``, the recorder's step count at its
  first frame; without a sidecar, the default name ``<kind>-epNNNNNN-stepNNNNNNNNN.mp4`` says it)
  that began after the recorder's step count in the checkpoint. A training clip that began at that
  count or before is the one in progress at the checkpoint, which a resumed run never continues:
  it stays. An evaluation begins with a reset at the count it starts from, so an eval clip that
  began at the checkpoint's count is the resumed run's next evaluation, and goes. A clip's
  ``video/<kind>`` line goes or stays with the clip. Clips in a ``recorder.dir`` outside the run
  dir (other runs may share it) stay where they are.

A run killed (or diverged) before its first checkpoint leaves none: ``resume=auto`` then starts
again from step 0, and everything the first attempt wrote is after that start (the point before
anything a run writes), moved to ``superseded/<n>-step000000000/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from rlrec.files import inside, write_atomic
from rlrec.layout import EVAL_EPISODES, METRICS, SUPERSEDED, TENSORBOARD, TENSORBOARD_EVENTS
from rlrec.record import names

_FOLDER = re.compile(r"^(?P<n>\d+)-step\d+$")


@dataclass(frozen=True)
class Point:
    """The checkpoint a run resumes from, as far as its files go."""

    step: int  # its global step
    eval_due: bool  # the evaluation of ``step`` was cut short: the resumed run does it again
    recorder_steps: Mapping[str, Optional[int]]  # by clip kind: the recorder's step count

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> "Point":
        """The point of a checkpoint's contents."""
        steps = {}
        for kind in ("train", "eval"):
            rec = (data.get(f"{kind}_env") or {}).get("recorder")
            steps[kind] = int(rec["steps"]) if isinstance(rec, dict) and "steps" in rec else None
        return cls(int(data["global_step"]), bool(data.get("eval_due")), steps)

    def line_after(self, line: Any, is_eval: bool) -> bool:
        """Whether a JSON line (``is_eval``: an evaluation's) was written after this point."""
        if not isinstance(line, dict) or not isinstance(line.get("step"), int):
            return True  # not a line a run writes whole: a torn last line of a killed run
        step = line["step"]
        return step > self.step or (step == self.step and self.eval_due and is_eval)


def supersede(
    run_dir: Path,
    checkpoint: Optional[Path],
    data: Optional[Mapping[str, Any]],
    video_dirs: Mapping[str, Path],
) -> Optional[Path]:
    """Moves what the run in ``run_dir`` wrote after ``checkpoint`` (its contents ``data``; None
    and None: the run left no checkpoint and starts again, from before anything) into a new
    ``superseded/<n>-step<step>/`` folder (see the module doc), says so in one line, and appends
    the ``resume`` event line to metrics.jsonl (none for a restart that finds nothing written).
    ``video_dirs``: each clip kind's directory; those outside the run dir are left alone.
    Returns the folder it moved them to (None: nothing was after the checkpoint)."""
    run_dir = Path(run_dir)
    # no checkpoint: the point before anything a run writes
    point = Point(-1, True, {"train": -1, "eval": -1}) if data is None else Point.of(data)
    plan = _Plan(run_dir, point)
    for kind, directory in video_dirs.items():
        if inside(Path(directory), run_dir):
            plan.clips(kind, Path(directory))
    plan.jsonl(METRICS, lambda line: any(str(k).startswith("eval/") for k in line))
    plan.jsonl(EVAL_EPISODES, lambda line: True)
    plan.tensorboard()
    folder = plan.carry_out()
    if checkpoint is None and folder is None:
        return None  # a new run: nothing to say
    rel = None if checkpoint is None else os.path.relpath(checkpoint, run_dir)
    step = max(point.step, 0)
    aside = None if folder is None else os.path.relpath(folder, run_dir)
    with open(run_dir / METRICS, "a") as f:
        f.write(json.dumps({"step": step, "event": "resume", "from": rel, "moved": aside}) + "\n")
    if folder is not None:
        start = f"continues from {rel} (step {step:,})"
        if rel is None:
            start = "found no checkpoint: the run starts again from step 0"
        what = ", ".join(f"{n} {what}" for what, n in plan.counts.items())
        print(
            f"rlrec: resume=auto {start}; what the run wrote after it ({what}) is moved to "
            f"{aside}/",
            file=sys.stderr,
            flush=True,
        )
    return folder


class _Plan:
    """What moves where; nothing is touched before :meth:`carry_out`."""

    def __init__(self, run_dir: Path, point: Point):
        self.run_dir, self.point = run_dir, point
        self.files = []  # moved whole
        self.split = {}  # file -> (kept, moved) contents
        self.moved_clips = {}  # clip path relative to the run dir -> moved
        self.counts = Counter()  # what moves, counted, by what it is

    def clips(self, kind: str, directory: Path) -> None:
        for video in sorted(directory.glob("*.mp4")):
            if video.name.startswith(".") or not video.is_file():
                continue
            step = names.evaluation_step(video.name, kind)
            if step is not None:  # an evaluation's clip goes or stays with its lines
                after = self.point.line_after({"step": step}, True)
            else:  # by the recorder's count at its first frame (unknown: the clip stays)
                first, saved = _first_step(video, kind), self.point.recorder_steps.get(kind)
                if first is None or saved is None:
                    continue
                # an evaluation begins with a reset at the count it starts from
                after = first > saved if kind == "train" else first >= saved
            self.moved_clips[os.path.relpath(video, self.run_dir)] = after
            sidecar = video.with_suffix(".json")
            for path, what in ((video, "clip(s)"), (sidecar, "sidecar(s)")):
                if after and path.is_file():
                    self.files.append(path)
                    self.counts[what] += 1

    def jsonl(self, name: str, is_eval) -> None:
        path = self.run_dir / name
        if not path.is_file():
            return
        kept, moved = [], []
        for raw in path.read_bytes().splitlines(keepends=True):
            if not raw.strip():
                continue
            line = None
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
            after = self.point.line_after(line, isinstance(line, dict) and is_eval(line))
            # the logger's {"video/<kind>": path} line of a clip goes or stays with the clip
            for key, value in line.items() if isinstance(line, dict) else ():
                if str(key).startswith("video/") and isinstance(value, str):
                    after = self.moved_clips.get(os.path.normpath(value), after)
            (moved if after else kept).append(raw if raw.endswith(b"\n") else raw + b"\n")
        if moved:
            self.split[path] = (b"".join(kept), b"".join(moved))
            self.counts[f"{name} line(s)"] = len(moved)

    def tensorboard(self) -> None:
        # (a glob of a dir that is not there finds nothing)
        for path in sorted((self.run_dir / TENSORBOARD).glob(TENSORBOARD_EVENTS)):
            parts = _split_events(path.read_bytes(), self.point.step) if path.is_file() else None
            if parts is not None:
                self.split[path] = parts[:2]
                self.counts["TensorBoard event(s)"] += parts[2]

    def carry_out(self) -> Optional[Path]:
        if not self.files and not self.split:
            return None
        folder = _new_folder(self.run_dir / SUPERSEDED, max(self.point.step, 0))
        # the moved part first: a kill in between leaves a line in both places, never in none
        for path in [*self.split, *self.files]:
            dest = folder / path.relative_to(self.run_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path in self.split:
                write_atomic(dest, self.split[path][1], durable=True)
            else:
                os.replace(path, dest)
        for path, (kept, _) in self.split.items():
            write_atomic(path, kept, durable=True)
        return folder


def _new_folder(base, step):
    base.mkdir(exist_ok=True)
    taken = [int(m.group("n")) for p in base.iterdir() if (m := _FOLDER.match(p.name))]
    n = max(taken, default=0) + 1
    while True:
        folder = base / f"{n}-step{step:09d}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


def _first_step(video, kind):
    """The recorder's step count at the clip's first frame: its sidecar's, or its default
    name's; None when neither says (or the clip is of another kind)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        side = json.loads(video.with_suffix(".json").read_text())
        if side.get("kind", kind) == kind and isinstance(side.get("first_step"), int):
            return side["first_step"]
    return names.first_step(video.name, kind)


# TensorBoard event files: records of <length u64><crc u32><data><crc u32>, each an Event
_HEADER = struct.Struct("<QI")


def _split_events(data, step):
    """(kept, moved, moved events) of an event file's bytes: the events of later steps move (with
    a copy of the file-version record, so each part is an event file; a torn last record of a
    killed writer moves too); None when nothing moves."""
    from tensorboard.compat.proto.event_pb2 import Event

    kept, moved, head, n, pos = [], [], b"", 0, 0
    while pos < len(data):
        whole = pos + _HEADER.size <= len(data)  # else a torn header: the record is torn
        end = pos + _HEADER.size + 4 + (_HEADER.unpack_from(data, pos)[0] if whole else len(data))
        if end > len(data):  # a torn last record
            moved.append(data[pos:])
            break
        record, event = data[pos:end], Event()
        try:
            event.ParseFromString(data[pos + _HEADER.size : end - 4])
            later = event.step > step and not event.HasField("file_version")
        except Exception:  # not an event: left where it is
            later = False
        if event.HasField("file_version") and not head:
            head = record
        (moved if later else kept).append(record)
        n, pos = n + later, end
    return (b"".join(kept), head + b"".join(moved), n) if moved else None
