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

# the recorders' loss counters (cumulative: the last value logged is the run's figure)
HEALTH_KEYS = ("record/clips_dropped", "record/frames_dropped", "record/encoder_stalls")


def _object(text):
    """The JSON object ``text`` holds, or None (not JSON, or no object)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    """A JSON object file (None when absent, unreadable or no object)."""
    try:
        return _object(Path(path).read_text())
    except OSError:
        return None


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line that does not parse (cut by a kill) is
    skipped. An absent file reads as no lines."""
    try:
        lines = Path(path).read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [rec for rec in map(_object, lines) if rec is not None]


def _number(value):
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
    # the clip's sidecar, when clip and sidecar exist (a sidecar is written after its whole mp4)
    sidecar: Optional[Dict[str, Any]] = None
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
        ret, success = self.ret, self.success
        verdict = None if success is None else f"s {success:.2f}"
        if len(envs) == 1:
            ret, success = _number(envs[0].get("return")), envs[0].get("success")
            verdict = None if success is None else ("ok" if success else "fail")
        figures = [None if ret is None else f"R {ret:.2f}", verdict]
        return [f"step {self.step}", " ".join(f for f in figures if f)]


@dataclass
class RunData:
    """A run dir as its files tell it."""

    path: Path
    lines: List[Dict[str, Any]]  # every line of metrics.jsonl
    evaluations: List[Evaluation]
    episodes: Optional[List[Dict[str, Any]]]  # eval_episodes.jsonl (None: the run wrote none)

    @property
    def events(self) -> List[Dict[str, Any]]:
        """The lines with an "event" (resume, stop, ...)."""
        return [rec for rec in self.lines if "event" in rec]

    def series(self, key: str) -> tuple:
        """(steps, values) of ``key`` over the metrics lines that hold a finite number for it."""
        points = [(rec.get("step"), _number(rec.get(key))) for rec in self.lines]
        points = [(int(step), v) for step, v in points if v is not None and step is not None]
        return [s for s, _ in points], [v for _, v in points]

    def health(self) -> Dict[str, float]:
        """The recorders' losses of the whole run (:data:`HEALTH_KEYS`, by their last part) and
        ``clips_missing``: the eval clips named but not on disk, or lost before they were
        written. Each process counts its losses from 0 and writes them cumulated, so each
        process's part (the lines up to a resume event, with what that resume moved aside: the
        killed process's lines after its checkpoint) adds its largest value."""
        parts: List[List[Dict[str, Any]]] = [[]]
        for rec in self.lines:
            if rec.get("event") == "resume":
                moved = _inside(rec.get("moved"))
                parts[-1] += read_jsonl(self.path / moved / METRICS) if moved else []
                parts.append([])
            parts[-1].append(rec)
        out = {
            key.split("/")[1]: sum(
                max([0.0, *(_number(r.get(key)) or 0.0 for r in p)]) for p in parts
            )
            for key in HEALTH_KEYS
        }
        lost = sum(ev.clip is not None and not ev.clip_ok for ev in self.evaluations)
        out["clips_missing"] = lost + sum(rec.get("eval/clip_lost") is True for rec in self.lines)
        return out


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
    rows = [read_json(p) for p in SweepDir(sweep_dir).rows.glob(ROW_FILES)]  # not attempt.json
    return sorted((r for r in rows if r), key=lambda r: int(r.get("job") or 0))


def _inside(clip):
    """``clip`` when it is a relative path that stays inside the run dir (what the report links
    to and the progress video decodes never points elsewhere)."""
    path = Path(clip) if isinstance(clip, str) and clip else None
    return None if path is None or path.is_absolute() or ".." in path.parts else path.as_posix()


def read_run(run_dir: Path) -> RunData:
    """Reads the run dir ``run_dir``."""
    run_dir = Path(run_dir)
    paths = RunDir(run_dir)
    lines = read_jsonl(paths.metrics)
    episodes = read_jsonl(paths.eval_episodes) if paths.eval_episodes.is_file() else None
    by_step: Dict[Any, List[Dict[str, Any]]] = {}
    for ep in episodes or []:
        by_step.setdefault(ep.get("step"), []).append(ep)
    evaluations = []
    for rec in lines:
        if "eval/return" in rec and "step" in rec:
            step, clip = int(rec["step"]), _inside(rec.get("eval/clip"))
            sidecar = None if clip is None else read_sidecar(run_dir, clip)
            evaluations.append(Evaluation(step, rec, clip, sidecar, by_step.get(step, [])))
    return RunData(run_dir, lines, evaluations, episodes)
