"""What a run dir holds, read back from its files: the metrics lines, the evaluations and their
clips (with their sidecars), the per-episode eval records, the run's health and its config.

Everything comes from disk (``metrics.jsonl``, ``eval_episodes.jsonl`` when the run wrote it,
each clip's sidecar, ``.hydra/``), so a report can be written for any run dir, also one of an
older run, one that was stopped, or one that ran on another machine. A line cut by a kill is
skipped; the lines before it still count.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from rlrec.layout import METRICS, ROW_FILES, RunDir, SweepDir
from rlrec.record.sidecar import sidecar_path

__all__ = [
    "HEALTH_KEYS",
    "Evaluation",
    "RunData",
    "read_json",
    "read_jsonl",
    "read_overrides",
    "read_rows",
    "read_run",
    "success_text",
    "wilson",
]

# the recorders' loss counters (cumulative: the last value logged is the run's figure)
HEALTH_KEYS = ("record/clips_dropped", "record/frames_dropped", "record/encoder_stalls")


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line that does not parse (cut by a kill) is
    skipped. An absent file reads as no lines."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def wilson(successes: float, n: int, z: float = 1.96) -> Tuple[float, float]:
    """The 95% (``z``) Wilson score interval of a success rate: ``successes`` of ``n`` episodes."""
    if n <= 0:
        return 0.0, 1.0
    p, zz = successes / n, z * z / n
    centre = (p + zz / 2) / (1 + zz)
    half = z / (1 + zz) * math.sqrt(p * (1 - p) / n + zz / (4 * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def success_text(rate: float, episodes: Any) -> str:
    """An eval success rate with its 95% Wilson interval and its episode count,
    ``0.900 [0.596, 0.982] of 10 episodes`` (the rate alone without a count: an older run's)."""
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes <= 0:
        return f"{rate:.3f}"
    lo, hi = wilson(round(rate * episodes), episodes)
    return f"{rate:.3f} [{lo:.3f}, {hi:.3f}] of {episodes} episodes"


@dataclass
class Evaluation:
    """One eval line of metrics.jsonl, with its clip (when it has one) and its episodes."""

    step: int
    metrics: Dict[str, Any]
    clip: Optional[str] = None  # path relative to the run dir, as the eval line names it
    sidecar: Optional[Dict[str, Any]] = None  # the clip's sidecar, when clip and sidecar exist
    episodes: List[Dict[str, Any]] = field(default_factory=list)  # its eval_episodes.jsonl lines

    @property
    def ret(self) -> Optional[float]:
        return _number(self.metrics.get("eval/return"))

    @property
    def success(self) -> Optional[float]:
        return _number(self.metrics.get("eval/success"))

    @property
    def clip_ok(self) -> bool:
        """The clip is on disk with its sidecar (a sidecar is written after its whole mp4)."""
        return self.sidecar is not None

    def tile_label(self) -> List[str]:
        """The progress video's label of this evaluation's clip: its step, and the return (and
        success) of the clip's one env, or of the evaluation when the clip shows several."""
        envs = (self.sidecar or {}).get("envs") or []
        if len(envs) == 1:
            ret, success = _number(envs[0].get("return")), envs[0].get("success")
            verdict = None if success is None else ("ok" if success else "fail")
        else:
            ret, success = self.ret, self.success
            verdict = None if success is None else f"s {success:.2f}"
        second = [] if ret is None else [f"R {ret:.2f}"]
        second += [] if verdict is None else [verdict]
        return [f"step {self.step}", " ".join(second)]


@dataclass
class RunData:
    """A run dir as its files tell it."""

    path: Path
    lines: List[Dict[str, Any]]  # every line of metrics.jsonl
    evaluations: List[Evaluation]
    episodes: List[Dict[str, Any]]  # eval_episodes.jsonl (empty for a run that did not write it)
    has_episode_file: bool
    events: List[Dict[str, Any]]  # lines with an "event" (resume, stop, ...)
    health: Dict[str, float]
    overrides: List[str]
    config_text: str

    def series(self, key: str) -> tuple:
        """(steps, values) of ``key`` over the metrics lines that hold a finite number for it."""
        steps, values = [], []
        for rec in self.lines:
            value = _number(rec.get(key))
            if value is not None and "step" in rec:
                steps.append(int(rec["step"]))
                values.append(value)
        return steps, values

    def count_events(self, name: str) -> int:
        return sum(1 for e in self.events if e.get("event") == name)


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    """A JSON object file (None when absent, unreadable or no object)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_sidecar(run_dir: Path, clip: str) -> Optional[Dict[str, Any]]:
    """The sidecar of ``clip`` (relative to the run dir) when both files are there."""
    video = run_dir / clip
    return read_json(Path(sidecar_path(str(video)))) if video.is_file() else None


def read_overrides(run_dir: Path) -> List[str]:
    """The command line's overrides of a run (Hydra's ``.hydra/overrides.yaml``); none when the
    file is absent (not written yet) or not a YAML list."""
    try:
        import yaml  # PyYAML comes with Hydra (omegaconf depends on it)

        loaded = yaml.safe_load(RunDir(run_dir).hydra_overrides.read_text())
    except Exception:
        return []
    return [str(x) for x in loaded] if isinstance(loaded, list) else []


def read_rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    """The job rows of a sweep dir written so far (``rlrec.run.sweep``), ordered by job number."""
    rows = [read_json(p) for p in SweepDir(sweep_dir).rows.glob(ROW_FILES)]  # not fixed.json
    return sorted((r for r in rows if r), key=lambda r: int(r.get("job") or 0))


def _inside(run_dir: Path, clip: Any) -> Optional[str]:
    """``clip`` when it is a relative path that stays inside the run dir (what the report links
    to and the progress video decodes never points elsewhere)."""
    if not isinstance(clip, str) or not clip:
        return None
    path = Path(clip)
    if path.is_absolute() or ".." in path.parts:
        return None
    return path.as_posix()


def _health(run_dir: Path, lines: List[Dict[str, Any]]) -> Dict[str, float]:
    """The recorders' losses of the whole run (:data:`HEALTH_KEYS`) and ``eval/clips_lost``, the
    eval lines whose clip was lost. Each process counts its losses from 0 and writes them
    cumulated, so each process's part (the lines up to a resume event, with what that resume
    moved aside: the killed process's lines after its checkpoint) adds its largest value."""
    parts: List[List[Dict[str, Any]]] = [[]]
    for rec in lines:
        if rec.get("event") == "resume":
            moved = _inside(run_dir, rec.get("moved"))
            if moved is not None:
                parts[-1] += read_jsonl(run_dir / moved / METRICS)
            parts.append([])
        parts[-1].append(rec)
    total = {
        key: sum(max([0.0, *(_number(rec.get(key)) or 0.0 for rec in part)]) for part in parts)
        for key in HEALTH_KEYS
    }
    total["eval/clips_lost"] = float(sum(1 for rec in lines if rec.get("eval/clip_lost") is True))
    return total


def read_run(run_dir: Path) -> RunData:
    """Reads the run dir ``run_dir``."""
    run_dir = Path(run_dir)
    paths = RunDir(run_dir)
    lines = read_jsonl(paths.metrics)
    episodes = read_jsonl(paths.eval_episodes)
    by_step: Dict[int, List[Dict[str, Any]]] = {}
    for ep in episodes:
        if "step" in ep:
            by_step.setdefault(int(ep["step"]), []).append(ep)
    evaluations: List[Evaluation] = []
    for rec in lines:
        if "eval/return" in rec and "step" in rec:
            step, clip = int(rec["step"]), _inside(run_dir, rec.get("eval/clip"))
            sidecar = None if clip is None else read_sidecar(run_dir, clip)
            evaluations.append(Evaluation(step, rec, clip, sidecar, by_step.get(step, [])))
    try:
        config_text = paths.hydra_config.read_text()
    except OSError:
        config_text = ""
    return RunData(
        path=run_dir,
        lines=lines,
        evaluations=evaluations,
        episodes=episodes,
        has_episode_file=paths.eval_episodes.is_file(),
        events=[rec for rec in lines if "event" in rec],
        health=_health(run_dir, lines),
        overrides=read_overrides(run_dir),
        config_text=config_text,
    )
