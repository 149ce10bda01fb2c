"""What gpu_check.py and physx_parts.py share: the report of checks and figures, and train.py
runs, bounded, their metrics followed as they are written."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def merge(*lists: List[str]) -> List[str]:
    """Hydra overrides, a later value of a key replacing an earlier one (Hydra refuses two)."""
    out: Dict[str, str] = {}
    for lst in lists:
        for o in lst:
            out[o.split("=", 1)[0]] = o
    return list(out.values())


class Report:
    """Checks and figures by part, saved as JSON after each part (atomically)."""

    def __init__(self, path: Optional[Path], meta: Dict[str, Any]):
        self.path = path
        self.data: Dict[str, Any] = {**meta, "parts": {}, "ok": False}
        self.part = "setup"

    def start(self, part: str) -> None:
        self.part = part
        self.data["parts"][part] = {"status": "running", "checks": [], "figures": {}}

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        ok = bool(ok)
        self._entry()["checks"].append({"name": name, "ok": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def info(self, name: str, detail: str) -> None:
        """Reported, not checked (a goal under --quick or on the CPU)."""
        self._entry()["checks"].append({"name": name, "ok": None, "detail": detail})
        print(f"INFO {name}: {detail}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        """A check this machine cannot run, and why."""
        self._entry()["checks"].append({"name": name, "ok": None, "skipped": reason})
        print(f"SKIP {name}: {reason}", flush=True)

    def goal(self, enforce: bool, ok: bool, name: str, detail: str) -> None:
        if enforce:
            self.check(ok, name, detail)
        else:
            self.info(name, f"{detail} (goal not checked here)")

    def figure(self, key: str, value: Any) -> None:
        if isinstance(value, float):
            value = round(value, 4) if math.isfinite(value) else str(value)
        self._entry()["figures"][key] = value

    def end(self, part: str, status: str, seconds: float, error: str = "") -> None:
        entry = self.data["parts"].setdefault(part, {"checks": [], "figures": {}})
        entry.update(status=status, s=round(seconds, 1))
        if error:
            entry["error"] = error
        self.save()

    def _entry(self) -> dict:
        return self.data["parts"].setdefault(
            self.part, {"status": "running", "checks": [], "figures": {}}
        )

    def results(self) -> List[bool]:
        return [
            c["ok"] for p in self.data["parts"].values() for c in p["checks"] if c["ok"] is not None
        ]

    def save(self) -> None:
        self.data["ok"] = bool(self.results()) and all(self.results())
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.partial")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


def diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def decode(path: str) -> np.ndarray:
    from rlrec.testing import decode as decode_mp4

    return decode_mp4(path)[0]


def _pythonpath() -> str:
    parts = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    return ":".join(parts)


def train_cmd(overrides: List[str], run_dir: Path, launcher: Optional[str] = None) -> List[str]:
    cmd = [sys.executable]
    cmd += ["-c", launcher] if launcher else [str(REPO / "train.py")]
    return [*cmd, *overrides, f"hydra.run.dir={run_dir}", "logger=none", "logger.progress=false"]


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


def new_metrics(path: Path, pos: int) -> tuple:
    """The metrics lines a running train.py has completed in ``path`` since byte ``pos`` (a line
    still being written is left for the next call), and the position after them."""
    if not path.exists():
        return [], pos
    with open(path, "rb") as f:
        f.seek(pos)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines()], pos + len(complete)


def train_run(
    args,
    rep,
    name: str,
    overrides: List[str],
    budget: float,
    max_iters: Optional[int],
    launcher: Optional[str] = None,
    watch: Optional[Callable[[List[dict], float], Optional[str]]] = None,
    grace: float = 30.0,
) -> dict:
    """``train.py overrides`` in a subprocess, its metrics.jsonl followed as it grows; ended
    (SIGTERM: rlrec saves a checkpoint and exits, within ``grace`` seconds or killed) after
    ``max_iters`` iterations, when ``watch(new metrics lines, wall seconds)`` names a reason to
    stop, or when ``budget`` seconds pass."""
    run_dir = Path(args.tmp) / name
    log_path = Path(args.tmp) / f"{name}.out"
    log = open(log_path, "w")
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    proc = subprocess.Popen(
        train_cmd(overrides, run_dir, launcher),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    iters: List[dict] = []
    first_iter_s = None
    pos = 0
    stopped_by = "exit"
    metrics = run_dir / "metrics.jsonl"
    try:
        while proc.poll() is None:
            time.sleep(0.25)
            wall = time.perf_counter() - t0
            lines, pos = new_metrics(metrics, pos)
            for m in lines:
                if "sps/total" in m:
                    iters.append(m)
                    if first_iter_s is None:
                        first_iter_s = wall
            if watch is not None:
                stopped_by = watch(lines, wall) or stopped_by
            if stopped_by == "exit" and max_iters is not None and len(iters) >= max_iters:
                stopped_by = "count"
            if stopped_by == "exit" and wall > budget:
                stopped_by = "budget"
            if stopped_by != "exit":
                proc.send_signal(signal.SIGTERM)
                break
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
    rc = proc.returncode
    clean = rc == 0 or (stopped_by != "exit" and rc in (-signal.SIGTERM, 128 + signal.SIGTERM))
    if not clean:
        print(f"  {name}: train.py exited {rc}:\n{tail(log_path.read_text())}", flush=True)
    res = {
        "rc": rc,
        "clean_exit": clean,
        "stopped_by": stopped_by,
        "wall_s": time.perf_counter() - t0,
        "first_iteration_s": first_iter_s,
        "iterations": len(iters),
        "iters": iters,
    }
    for key in ("rc", "stopped_by", "wall_s", "first_iteration_s", "iterations"):
        rep.figure(f"{name}_{key}", res[key])
    return res
