"""The benchmarks' harness: the command line (``--write-docs`` writes the printed table into
docs/benchmarks.md between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, NAME the script's
stem), the table, timing, rounds in which the configurations take turns, and ``train.py`` runs
timed from outside, their metrics read as they are written."""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Bench:
    """A benchmark's command line and table: ``out`` prints a line and keeps it; ``finish``
    writes the kept lines into ``--write-docs``'s file between the script's markers."""

    def __init__(self, file: str, doc: str, runs: bool = False, fenced: bool = False):
        self.name, self.lines, self.runs, self.fenced = Path(file).stem, [], None, fenced
        self.parser = p = argparse.ArgumentParser(
            f"scripts/{self.name}.py",
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        docs = ROOT / "docs" / "benchmarks.md"
        help = f"write the table between FILE's bench:{self.name} markers (default {docs.name})"
        p.add_argument("--write-docs", nargs="?", const=docs, type=Path, metavar="FILE", help=help)
        if runs:  # it makes train.py run folders
            p.add_argument("--keep-runs", action="store_true", help="keep the runs' folders")

    def args(self, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
        """The parsed arguments; ``--write-docs``'s markers are checked now, before any work."""
        a = self.parser.parse_args(argv)
        given, self.argv, self.docs = list(sys.argv[1:] if argv is None else argv), [], a.write_docs
        for i, arg in enumerate(given):  # the command as the docs show it: no --write-docs
            its_value = i and given[i - 1] == "--write-docs" and not arg.startswith("-")
            if not (arg.startswith("--write-docs") or its_value):
                self.argv.append(arg)
        if self.docs is not None:
            try:
                self._markers(self.docs.read_text())
            except (OSError, ValueError) as e:
                self.parser.error(f"--write-docs {self.docs}: {e}")
        if getattr(a, "keep_runs", None) is not None:
            self.runs = RunDirs(a.keep_runs)
        return a

    def _markers(self, text: str) -> Tuple[int, int]:
        start, end = f"<!-- bench:{self.name} -->", f"<!-- /bench:{self.name} -->"
        if text.count(start) != 1 or text.count(end) != 1 or text.find(start) > text.find(end):
            raise ValueError(f"it needs one {start} and, after it, one {end}")
        return text.find(start) + len(start), text.find(end)

    def out(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def table(self, head: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """A Markdown table (after an empty line), its columns padded to read as text too."""
        if self.lines and self.lines[-1]:
            self.out()
        cells = [[str(c) for c in r] for r in [head, *rows]]
        widths = [max(3, *(len(r[i]) for r in cells)) for i in range(len(head))]
        for r in cells[:1] + [["-" * w for w in widths]] + cells[1:]:
            self.out("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")

    def finish(self) -> None:
        """With ``--write-docs``: the command and the kept lines replace the text between the
        markers (the file read again now and replaced whole: never left half written)."""
        if self.docs is None:
            return
        text = self.docs.read_text()
        try:
            a, b = self._markers(text)
        except ValueError as e:
            sys.exit(f"--write-docs {self.docs}: {e}; the table above is not written")
        command = " ".join([f"python scripts/{self.name}.py", *self.argv])
        lines = ["```text", *self.lines, "```"] if self.fenced else self.lines
        block = [f"`{command}` ({os.cpu_count()} CPU cores):", "", *lines]
        tmp = self.docs.with_name(self.docs.name + ".partial")
        tmp.write_text(text[:a] + "\n" + "\n".join(block) + "\n" + text[b:])
        os.replace(tmp, self.docs)
        print(f"{self.name}: table written into {self.docs}")


def compare(b: Bench, runs: Dict[str, List[dict]], columns: Sequence, ratio_of=()) -> None:
    """A row per side: the median over its runs of each column ``(label, fn(run) -> value or
    None, format)`` (a run with None left out, the count said); with ``ratio_of=(a, b)`` a row of
    a's medians over b's."""
    rows, meds = [], {}
    for side, rs in runs.items():
        values = [list(map(fn, rs)) for _, fn, _ in columns]
        meds[side] = [median(v) for v in values]
        counts = [f" ({k}/{len(rs)})" if k < len(rs) else "" for k in map(known, values)]
        rows.append([side, *(fmt(m, c[2]) + n for m, c, n in zip(meds[side], columns, counts))])
    if ratio_of:
        rows.append([" / ".join(ratio_of), *map(ratio, *(meds[s] for s in ratio_of))])
    b.table(["", *(c[0] for c in columns)], rows)


def against(b: Bench, ref: str, need: Tuple[str, str], threshold: float, worker, run):
    """rlrec against the reference ``ref`` (``need``: its module and the distribution that
    installs it), the sides interleaved seed by seed: ``run(side, seed, args)`` per run (with
    ``args.bench``); ``worker(args, seed, out)`` is the reference's run in its own process
    (``--worker SEED OUT``). Returns the args and each side's runs."""
    p = b.parser
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--threshold", type=float, default=threshold)
    p.add_argument("--only", choices=["rlrec", ref], help="one side only")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    p.add_argument("--rlrec-override", nargs="*", default=[], help="extra overrides for train.py")
    p.add_argument("--worker", nargs=2, metavar=("SEED", "OUT"), help="(internal) a reference run")
    a = b.args()
    a.bench = b
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        sys.exit(worker(a, int(a.worker[0]), a.worker[1]))
    sides = [s for s in ("rlrec", ref) if a.only in (None, s)]
    if ref in sides:
        require(*need)
    runs = {s: [] for s in sides}
    for seed in a.seeds:
        for side in sides:
            runs[side].append(run(side, seed, a))
    return a, runs


def known(xs) -> int:
    return sum(x is not None for x in xs)


def median(xs) -> Optional[float]:
    """The median of the values that are not None (None when there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: Optional[float], spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def require(module: str, dist: str) -> None:
    if importlib.util.find_spec(module) is None:
        sys.exit(f"{dist} is missing: pip install -c scripts/constraints.txt -e '.[bench]'")


def per_call(fn: Callable[[], object], n: int) -> Tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) per call of ``fn``, over ``n`` calls."""
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w) / n, (time.thread_time() - c) / n


def cpu(children_only: bool = False) -> float:
    """User + system CPU seconds of this process (unless ``children_only``) and of its ended,
    waited-for children (ffmpeg, train.py)."""
    who = [resource.RUSAGE_CHILDREN] + [resource.RUSAGE_SELF] * (not children_only)
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


def rounds(configs: Dict[str, Callable[[], object]], n: int, warmup: int = 0) -> Dict[str, list]:
    """What each configuration returns in each of ``n`` rounds, the configurations taking turns
    (who goes first rotates) so that load from other processes falls on all alike, after
    ``warmup`` rounds not kept. The i-th results of all come from one round (paired)."""
    names, out = list(configs), {k: [] for k in configs}
    for r in range(warmup + n):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            value = configs[name]()
            if r >= warmup:
                out[name].append(value)
    return out


def timed(cmd: list, cwd: Path = ROOT, refused: bool = False, **kw) -> Tuple[float, float, str]:
    """(wall seconds, CPU seconds of it and its children, output) of one command, which must exit
    0 (non-zero where ``refused``)."""
    w, c = time.perf_counter(), cpu(children_only=True)
    proc = subprocess.run(list(map(str, cmd)), cwd=cwd, capture_output=True, text=True, **kw)
    wall, used = time.perf_counter() - w, cpu(children_only=True) - c
    if (proc.returncode != 0) != refused:
        sys.exit(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, used, proc.stdout + proc.stderr


class RunDirs:
    """The run folders a benchmark makes (``new``: a fresh ``mkdtemp`` folder that only its run
    writes into), removed at exit (those alone) unless ``keep`` (``--keep-runs``)."""

    def __init__(self, keep: bool = False) -> None:
        self.keep, self.made = keep, []
        atexit.register(self.remove)

    def new(self, prefix: str) -> Path:
        self.made.append(Path(tempfile.mkdtemp(prefix=prefix)))
        return self.made[-1]

    def remove(self) -> None:
        if self.keep and self.made:
            print(f"run folders kept: {', '.join(map(str, self.made))}")
        while self.made and not self.keep:
            shutil.rmtree(self.made.pop(), ignore_errors=True)


def env(threads: Optional[int] = 1, **extra: str) -> Dict[str, str]:
    """A child's environment: ``threads`` OpenMP/MKL threads (None: as set), no forced progress."""
    n = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    return {**os.environ, **n, "RLREC_PROGRESS": "", **extra}


def train_cmd(overrides: Sequence[str], run_dir: Path, threads: Optional[int] = 1) -> List[str]:
    """``python train.py`` in ``run_dir`` with no logger and ``threads`` torch threads (None: the
    config's)."""
    cmd = [sys.executable, "train.py", "logger=none", f"hydra.run.dir={run_dir}"]
    return cmd + [f"torch_threads={threads}"] * bool(threads) + list(overrides)


def follow(cmd: List[str], metrics: Path, stop=None, sig=signal.SIGTERM, cwd=ROOT, **kw) -> dict:
    """``cmd`` in a fresh process timed from just before its start (imports included), the new
    complete lines of its ``metrics`` (jsonl) read every 10 ms: ``{"lines": [(seconds, record)],
    "wall": seconds, "out": its output}``. Once ``stop(seconds, record)`` is true the process gets
    ``sig`` (SIGTERM: rlrec checkpoints and exits); its lines until it exits are kept. Raises with
    its output's tail when it fails unstopped."""
    lines, stopped, pos, buf = [], False, 0, ""
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, **kw)
        while True:
            done = proc.poll() is not None
            if Path(metrics).exists():
                with open(metrics) as f:
                    f.seek(pos)
                    buf += f.read()
                    pos = f.tell()
            *new, buf = buf.split("\n")  # a line still being written waits for the next read
            for rec in map(json.loads, new):
                lines.append((time.time() - t0, rec))
                if stop is not None and not stopped and stop(lines[-1][0], rec):
                    proc.send_signal(sig)  # its own child
                    stopped = True
            if done:
                break
            time.sleep(0.01)
        wall = time.time() - t0
        log.seek(0)
        out = log.read()
    if proc.returncode != 0 and not stopped:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-3000:]}")
    return {"lines": lines, "wall": wall, "out": out}


def job(runs: RunDirs, over: list, target=1.0, stop=False, threads=None, cwd=ROOT) -> dict:
    """One ``train.py`` run followed: seconds and env steps to its first evaluation with
    eval/success >= ``target`` (``stop``: SIGTERM there), its training steps/s (env steps over
    time/collect + time/learn: start-up and evaluations left out) and collection steps/s, its
    seconds to the end and its report's own seconds (the line it ends with)."""
    run_dir, hit, train = runs.new("bench_train_"), {}, []

    def at(t: float, x: dict) -> bool:
        train.extend([x] * ("time/collect" in x))
        if not hit and x.get("eval/success", -1) >= target:
            hit.update(t=t, step=x["step"])
            return stop
        return False

    cmd = train_cmd(over, run_dir, threads)
    r = follow(cmd, run_dir / "metrics.jsonl", at, cwd=cwd, env=env(threads))
    steps = train[-1]["step"] - train[0]["step"] if len(train) > 1 else 0
    learn = sum(x["time/collect"] + x["time/learn"] for x in train[1:])
    collect = sum(x["time/collect"] for x in train[1:])
    report = re.search(r"\(written in ([\d.]+) s\)", r["out"])
    out = {"t": hit.get("t"), "step": hit.get("step"), "wall": r["wall"]}
    out.update(train=steps / learn if learn else None, collect=steps / collect if collect else None)
    return {**out, "report": float(report[1]) if report else None}


def columns(target: str, *keys: str) -> list:
    """``compare``'s columns of a run's figures named by ``keys``: ``t`` and ``step`` (seconds and
    env steps to ``target``, None where not reached), ``sps`` (their ratio) and :func:`job`'s."""
    labels = {"t": f"s to {target}", "step": f"steps to {target}", "sps": f"steps/s to {target}"}
    labels.update(train="train steps/s", collect="collect steps/s", wall="s to the end")
    labels["report"] = "report s"
    spec = {"t": ".1f", "wall": ".2f", "report": ".2f"}
    get = {"sps": lambda r: r["step"] / r["t"] if r["step"] else None}
    return [(labels[k], get.get(k, lambda r, k=k: r[k]), spec.get(k, ",.0f")) for k in keys]
