"""What this process holds between Hydra's callbacks and its task function: the one mutable
global of rlrec/run/, so that what a process carries from one to the other is read in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Process:
    # what Preflight checked and claimed, by (run dir, config): the run's task function takes it
    # (rlrec.run.preflight.take)
    checked: Dict[Any, Any] = field(default_factory=dict)
    # the user's HYDRA_FULL_ERROR while Hydra composes (rlrec.run.preflight.overrides_refused)
    full_error: List[Optional[str]] = field(default_factory=list)
    # the sweep this process takes part in: its stop flag and records (rlrec.run.sweep)
    sweep: Any = None


PROCESS = Process()
