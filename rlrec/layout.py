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


def _at(*parts: str) -> property:
    """A path of the dir ``self.root``."""
    return property(lambda self: Path(self.root, *parts))


@dataclass(frozen=True)
class RunDir:
    """The paths of the run dir ``root``."""

    root: Union[str, os.PathLike]

    metrics = _at(METRICS)
    eval_episodes = _at(EVAL_EPISODES)
    checkpoints = _at(CHECKPOINTS)
    last_checkpoint = _at(CHECKPOINTS, LAST_CHECKPOINT)
    progress_video = _at(PROGRESS_VIDEO)
    tensorboard = _at(TENSORBOARD)
    report = _at("report.html")
    wandb_run = _at(WANDB_RUN)
    hydra_config = _at(HYDRA, "config.yaml")
    hydra_overrides = _at(HYDRA, "overrides.yaml")
    lock = _at(".rlrec.lock")
    exported = _at("exported")  # python -m rlrec.export
    datasets = _at("datasets.jsonl")  # each one made of it (python -m rlrec.dataset)

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


_ROWS = ".rlrec_summary"  # a sweep's rows, and the files of its stop


@dataclass(frozen=True)
class SweepDir:
    """The paths of the sweep dir ``root`` (each job's run dir in it is Hydra's)."""

    root: Union[str, os.PathLike]

    summary = _at("summary.csv")
    report = RunDir.report
    rows = _at(_ROWS)
    attempt = _at(_ROWS, "attempt.json")  # this attempt of the sweep: who launched it, its keys
    stop = _at(_ROWS, "stop.json")
    rows_lock = _at(_ROWS, "lock")
    running = _at(_ROWS, "running")

    def row(self, job: int) -> Path:
        return self.rows / f"{int(job):06d}.json"

    def running_entry(self, job: int) -> Path:
        return self.running / f"{int(job):06d}.json"

    def is_sweep(self) -> bool:
        return self.summary.is_file() or self.rows.is_dir()
