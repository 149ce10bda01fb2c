"""The files and folders of a run dir and of a sweep dir: the one place that names them.

Every reader and writer (the logger, checkpoints, the evaluation, the timeline a resume moves
aside, the report, replay, the run-dir lock, the sweep summary) builds its paths here;
``tests/test_layout.py`` fails on a name spelled here (a string) spelled anywhere else in rlrec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

# the names that others read alone (relative to the run dir, or a folder's entries)
METRICS = "metrics.jsonl"  # every logged dict, one JSON object a line
EVAL_EPISODES = "eval_episodes.jsonl"  # one line per eval episode
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"
PERIODIC_CHECKPOINT = "iter_"  # iter_NNNNNN.pt, NNNNNN: the iteration
CHECKPOINT_FILES = "*.pt"
VIDEOS = "videos"  # videos/<kind>/: the clips of the train and the eval recorder
PROGRESS_VIDEO = "videos/progress.mp4"  # the report links it relative to the run dir
TENSORBOARD = "tensorboard"
TENSORBOARD_EVENTS = "events.out.tfevents.*"
SUPERSEDED = "superseded"  # superseded/<n>-step<S>/: what a resume moved aside
WANDB_RUN = "wandb_run.json"  # the id of the run's W&B run and the last step sent to it
HYDRA = ".hydra"  # Hydra's output subdir
HYDRA_SWEEP = "multirun.yaml"  # Hydra's config of a sweep, in the sweep dir
ROW_FILES = "[0-9]*.json"  # a sweep's job rows, NNNNNN.json

_PERIODIC = re.compile(rf"^{PERIODIC_CHECKPOINT}(\d+)\.pt$")


def periodic_iteration(name: str) -> Optional[int]:
    """The iteration of a periodic checkpoint's file name (``iter_NNNNNN.pt``), else None."""
    m = _PERIODIC.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunDir:
    """The paths of the run dir ``root``."""

    root: Union[str, os.PathLike]

    metrics = property(lambda self: Path(self.root, METRICS))
    eval_episodes = property(lambda self: Path(self.root, EVAL_EPISODES))
    checkpoints = property(lambda self: Path(self.root, CHECKPOINTS))
    last_checkpoint = property(lambda self: Path(self.root, CHECKPOINTS, LAST_CHECKPOINT))
    progress_video = property(lambda self: Path(self.root, PROGRESS_VIDEO))
    tensorboard = property(lambda self: Path(self.root, TENSORBOARD))
    report = property(lambda self: Path(self.root, "report.html"))
    wandb_run = property(lambda self: Path(self.root, WANDB_RUN))
    hydra_config = property(lambda self: Path(self.root, HYDRA, "config.yaml"))
    hydra_overrides = property(lambda self: Path(self.root, HYDRA, "overrides.yaml"))
    lock = property(lambda self: Path(self.root, ".rlrec.lock"))
    exported = property(lambda self: Path(self.root, "exported"))  # python -m rlrec.export
    datasets = property(lambda self: Path(self.root, "datasets.jsonl"))  # each one made of it

    def periodic_checkpoint(self, iteration: int) -> Path:
        return self.checkpoints / f"{PERIODIC_CHECKPOINT}{int(iteration):06d}.pt"

    def videos(self, kind: str) -> Path:
        """The clips of the ``kind`` ("train", "eval") recorder, without a ``recorder.dir``."""
        return Path(self.root, VIDEOS, kind)

    def replay(self, step: int, env: int) -> Path:
        """Where ``rlrec.run.replay`` writes its run of eval episode (``step``, ``env``)."""
        return Path(self.root, f"replay/step{int(step):09d}-env{int(env):03d}")

    def dataset(self, step: int, keep: str) -> Path:
        """Where ``rlrec.dataset`` writes a dataset of ``step``'s checkpoint, without a dir."""
        return Path(self.root, f"datasets/step{int(step):09d}-{keep}")


@dataclass(frozen=True)
class SweepDir:
    """The paths of the sweep dir ``root`` (each job's run dir in it is Hydra's)."""

    root: Union[str, os.PathLike]

    summary = property(lambda self: Path(self.root, "summary.csv"))
    report = property(lambda self: RunDir(self.root).report)
    rows = property(lambda self: Path(self.root, ".rlrec_summary"))  # the rows, the stop's files
    fixed = property(lambda self: self.rows / "fixed.json")
    attempt = property(lambda self: self.rows / "attempt.json")
    stop = property(lambda self: self.rows / "stop.json")
    rows_lock = property(lambda self: self.rows / "lock")
    running = property(lambda self: self.rows / "running")

    def row(self, job: int) -> Path:
        return self.rows / f"{int(job):06d}.json"

    def running_entry(self, job: int) -> Path:
        return self.running / f"{int(job):06d}.json"

    def is_sweep(self) -> bool:
        return self.summary.is_file() or self.rows.is_dir()
