"""The sweep summary: one row per finished job (its overrides and final eval figures).

:class:`SweepSummary` is a Hydra callback (wired in ``conf/config.yaml``). In multirun mode, each
job, when it ends, writes its own row file ``<sweep dir>/.rlrec_summary/<job num>.json`` (atomic
rename) and then rebuilds ``<sweep dir>/summary.csv`` from every row file under an exclusive file
lock, so parallel jobs (joblib, submitit, ray) never interleave writes and the CSV is complete as
of the last job that finished. The launching process prints the table once the sweep is over.

The figures come from the job's own ``metrics.jsonl`` (its last eval line), so a job that ran in
another process or on another node is summarised from what it left on disk.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

SUMMARY_FILE = "summary.csv"
ROWS_DIR = ".rlrec_summary"
# figures of the last eval line copied into the summary, in this order
EVAL_KEYS = ("eval/return", "eval/success", "eval/length", "eval/episodes")
_FIRST = ("job", "status", "step", *EVAL_KEYS, "swept", "overrides")
_LAST = ("run_dir", "error")


def final_figures(run_dir: Path) -> Dict[str, Any]:
    """``step`` (the last logged env step) and the last eval line's figures of a run dir."""
    out: Dict[str, Any] = {}
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: the earlier ones still count
            continue
        out["step"] = max(int(rec.get("step", 0)), int(out.get("step", 0)))
        if "eval/return" in rec:
            for k in EVAL_KEYS:
                if k in rec:
                    out[k] = rec[k]
                else:
                    out.pop(k, None)
    return out


def fixed_keys(task_overrides: List[str]) -> List[str]:
    """Keys the sweep's command line sets to one value for every job (not sweeps)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    return sorted(o.get_key_element() for o in parsed if not o.is_sweep_override())


def swept_overrides(overrides: List[str], sweep_dir: Path) -> List[str]:
    """The overrides that tell this job apart (``seed=2`` of ``seed=1,2``, the learning rate an
    Optuna trial drew): those whose key the command line did not fix for the whole sweep."""
    try:
        fixed = set(json.loads((Path(sweep_dir) / ROWS_DIR / "fixed.json").read_text()))
    except (OSError, ValueError):  # not written (yet): every override counts
        return overrides
    return [o for o in overrides if o.partition("=")[0] not in fixed]


def job_row(config: DictConfig, job_return: Any) -> Dict[str, Any]:
    """The summary row of one finished job."""
    hydra = config.hydra
    run_dir = Path(hydra.runtime.output_dir)
    overrides: List[str] = list(OmegaConf.to_container(hydra.overrides.task))  # type: ignore[arg-type]
    status = getattr(getattr(job_return, "status", None), "name", "UNKNOWN")
    row: Dict[str, Any] = {
        "job": int(hydra.job.num),
        "status": status,
        "swept": " ".join(swept_overrides(overrides, Path(str(hydra.sweep.dir)))),
        "overrides": " ".join(overrides),
    }
    for item in overrides:  # one column per override key, so the CSV sorts and plots directly
        key, sep, value = item.partition("=")
        if sep:
            row[key.lstrip("+~")] = value
    row.update(final_figures(run_dir))
    if status == "FAILED":
        # JobReturn.return_value re-raises a failed job's exception: read the stored one
        err = job_return._return_value
        row["error"] = f"{type(err).__name__}: {err}"
    row["run_dir"] = str(run_dir)
    return row


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:  # e.g. a full disk: no half-written temporary left in the sweep dir
        tmp.unlink(missing_ok=True)
        raise


def read_rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    """Every job row written so far, ordered by job number."""
    rows = []
    for p in (Path(sweep_dir) / ROWS_DIR).glob("[0-9]*.json"):  # not fixed.json
        try:
            rows.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(rows, key=lambda r: r.get("job", 0))


def columns(rows: List[Dict[str, Any]]) -> List[str]:
    keys = {k for r in rows for k in r}
    first = [k for k in _FIRST if k in keys]
    last = [k for k in _LAST if k in keys]
    middle = sorted(keys - set(first) - set(last))
    return first + middle + last


def write_summary(sweep_dir: Path, row: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Adds ``row`` (if given) and rebuilds ``summary.csv``, holding the sweep's lock."""
    rows_dir = Path(sweep_dir) / ROWS_DIR
    rows_dir.mkdir(parents=True, exist_ok=True)
    with open(rows_dir / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if row is not None:
            _write_atomic(rows_dir / f"{int(row['job']):06d}.json", json.dumps(row))
        rows = read_rows(sweep_dir)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns(rows), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        _write_atomic(Path(sweep_dir) / SUMMARY_FILE, buf.getvalue())
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A plain-text table (job, status, step, eval figures, swept overrides) for the console."""
    cols = [c for c in _FIRST if c != "overrides" and any(c in r for r in rows)]
    cells = [[c.replace("eval/", "") for c in cols]] + [
        [_fmt(r.get(c)) for c in cols] for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback: ``<sweep dir>/summary.csv`` as jobs finish, a table at the end of the
    sweep."""

    def __init__(self, print_table: bool = True):
        self.print_table = print_table

    @staticmethod
    def _multirun(config: DictConfig) -> bool:
        return str(OmegaConf.select(config, "hydra.mode")) == "RunMode.MULTIRUN"

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # the launching process knows which keys are swept; jobs (maybe elsewhere) read it back
        rows_dir = Path(str(config.hydra.sweep.dir)) / ROWS_DIR
        rows_dir.mkdir(parents=True, exist_ok=True)
        task = list(OmegaConf.to_container(config.hydra.overrides.task))  # type: ignore[arg-type]
        _write_atomic(rows_dir / "fixed.json", json.dumps(fixed_keys(task)))

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not self._multirun(config):
            return
        row = job_row(config, job_return)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        write_summary(sweep_dir, row)
        figures = ", ".join(f"{k.split('/')[1]} {_fmt(row[k])}" for k in EVAL_KEYS[:3] if k in row)
        swept = f" ({row['swept']})" if row["swept"] else ""
        print(
            f"rlrec sweep: job {row['job']} {row['status'].lower()}{swept}"
            f"{': ' + figures if figures else ''} -> {sweep_dir / SUMMARY_FILE}",
            flush=True,
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not (sweep_dir / ROWS_DIR).is_dir():
            return
        rows = write_summary(sweep_dir)
        if self.print_table and rows:
            print(
                f"rlrec sweep summary ({sweep_dir / SUMMARY_FILE}):\n{format_table(rows)}",
                file=sys.stdout,
                flush=True,
            )
