"""Where a run's numbers go: metrics.jsonl (always), TensorBoard, optional W&B, and the console;
and the statistics of the training episodes that finished since the last log line."""

from __future__ import annotations

import contextlib
import datetime
import io
import itertools
import json
import math
import os
import queue
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from rlrec import distributed
from rlrec.config import LoggerConfig, LoggerName
from rlrec.files import remove_quietly, temporary_name, write_atomic
from rlrec.layout import RunDir
from rlrec.report.progress import read_frames
from rlrec.report.rundata import success_text

# keys shown in the progress bar and the status lines, in order
_PROGRESS_KEYS = ("train/return", "train/success", "eval/return", "eval/success")


def figure(x: float) -> str:
    """A return or success as the console shows it: 3 significant digits, a thousand or more in
    whole units (``4,226``, not ``4.23e+03``)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


class EpisodeStats:
    """Return, length and success of the collection episodes that finished (from AutoReset's
    ``info["episode"]``), summed on the device until :meth:`summary` reads them once per log.

    :meth:`add` never waits for the device: the finished rows are summed with a mask
    (``torch.where``), not picked out by boolean indexing, whose output size the host would have
    to read back on every step where an episode ends."""

    def __init__(self, on: bool = True):
        self.on = on  # off: add() does nothing (a rank that does not log)
        # float64 [5]: episodes, sum of returns, sum of lengths, episodes with a success flag,
        # sum of successes
        self._acc = None

    def add(self, info: Dict[str, Any]) -> None:
        if "_final" not in info or not self.on:
            return
        ep = info["episode"]
        mask = ep["_mask"].bool()
        rows = [mask, ep["return"], ep["length"]]
        if "success" in info:
            rows += [mask, info["success"]]
        if self._acc is None:
            self._acc = torch.zeros(5, dtype=torch.float64, device=mask.device)
        # one masked sum of every row (stack promotes them to one float dtype)
        self._acc[: len(rows)] += torch.where(mask, torch.stack(rows), 0.0).sum(dim=1)

    def summary(self) -> Dict[str, float]:
        """Means since the last call (``train/return``, ``train/length``, ``train/success``) and
        how many episodes they are of (``train/episodes``), then forgets them; empty when no
        episode finished."""
        if self._acc is None:
            return {}
        n, ret, length, n_success, success = self._acc.tolist()  # one read-back per log line
        self._acc = None
        means = zip(("return", "length", "success"), (ret, length, success), (n, n, n_success))
        out = {f"train/{k}": total / count for k, total, count in means if count}
        return {**out, "train/episodes": n} if out else {}


class Held:
    """Lines held until their clip is on disk, the one such mechanism (metrics.jsonl's eval lines,
    eval_episodes.jsonl's records): :meth:`hold` the lines of a step; :meth:`clip` fills them
    (``fill(lines, clip)``) and writes them (``write(lines)``), or, come first, is kept for them;
    :meth:`lost` writes those whose clip never came, filled with None. ``lines``: those held, by
    step."""

    def __init__(self, fill: Callable[[Any, Any], None], write: Callable[[Any], None]):
        self.fill, self.write = fill, write
        self.lines = {}
        self._came = {}  # the last clip, by its step

    def hold(self, step: int, lines: Any) -> None:
        if step in self._came:  # the clip came first
            self._out(lines, self._came[step])
        else:
            self.lines[step] = lines

    def clip(self, step: int, clip: Any) -> None:
        self._came = {step: clip}
        if step in self.lines:
            self._out(self.lines.pop(step), clip)

    def lost(self) -> None:
        for step in sorted(self.lines):
            self._out(self.lines.pop(step), None)

    def _out(self, lines, clip):
        self.fill(lines, clip)
        self.write(lines)


class RunLogger:
    """Writes every logged dict to ``metrics.jsonl`` (one JSON object per line, each with ``step``),
    to TensorBoard (scalars and clips) and, with ``logger=wandb``, to Weights & Biases. Every rank
    has one, and rank 0's alone writes: the others' lines go nowhere (``os.devnull``). With
    ``logger.progress``, the console shows a progress bar on a terminal, else a status line (see
    :meth:`progress`).

    ``wait_clips``: waits (bounded) until the clips that lines wait for are on disk
    (:meth:`settle`); ``resumed``: ``resume=auto`` continues the run from a checkpoint (its W&B
    run continues too: :class:`_WandbRun`)."""

    def __init__(
        self,
        cfg: LoggerConfig,
        run_dir: Path,
        total_steps: int,
        config_dict: dict,
        wait_clips: Optional[Callable[[], None]] = None,
        resumed: bool = False,
    ):
        self.run_dir, paths = Path(run_dir), RunDir(run_dir)
        self.writes = writes = distributed.is_main()
        self.episodes = EpisodeStats(writes)
        self._wait_clips = wait_clips
        self._tb = self._previews = self._progress = None  # TensorBoard, its clip previews; bar
        wandb = cfg.name == "wandb" and writes
        self._wandb = _WandbRun(cfg, self.run_dir, config_dict, resumed) if wandb else None
        self._metrics = open(paths.metrics if writes else os.devnull, "a", buffering=1)
        self._held = Held(self._name_clip, self._write)  # eval lines waiting for their clips
        self._losses = {}  # the recorders' losses on the last line that had them
        if cfg.name in (LoggerName.tensorboard, LoggerName.wandb) and writes:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(paths.tensorboard))
        self._latest = {}
        self.total_steps, self._sps, self._t0 = total_steps, 0.0, time.monotonic()
        # no bar off a terminal: a status line at most every status_every_sec (None: neither)
        self._status_every, self._status_at = None, self._t0
        terminal = sys.stderr.isatty() or bool(os.environ.get("RLREC_PROGRESS"))
        if cfg.progress and writes and not terminal:
            self._status_every = cfg.status_every_sec
        elif cfg.progress and writes:
            from rich import progress as bar

            self._progress = bar.Progress(
                bar.TextColumn("[bold]rlrec"),
                bar.BarColumn(),
                bar.MofNCompleteColumn(),
                bar.TextColumn("steps {task.fields[sps]} SPS"),
                bar.TimeRemainingColumn(),
                bar.TextColumn("{task.fields[info]}"),
            )
            self._task = self._progress.add_task("train", total=total_steps, sps="-", info="")
            self._progress.start()

    # ------------------------------------------------------------------ metrics
    def log(self, step: int, metrics: Dict[str, Any], clip: bool = False) -> None:
        """One line of metrics.jsonl, plus TensorBoard/W&B scalars for the numeric values.

        ``clip``: an eval clip was recorded for this line: the line names it, as ``"eval/clip"``
        (its path in the run dir), so it is written to metrics.jsonl once that clip is on disk
        (:meth:`log_clip`); the scalars go to TensorBoard/W&B now. A line whose clip never comes
        (an encoder failure) is written naming none by :meth:`settle` (before a checkpoint) or
        :meth:`close`."""
        finite = lambda v: not isinstance(v, float) or math.isfinite(v)  # noqa: E731
        line = {"step": int(step), **{k: v if finite(v) else None for k, v in metrics.items()}}
        self._losses.update((k, v) for k, v in line.items() if k.startswith("record/"))
        if clip:
            self._held.hold(int(step), line)
        else:
            self._write(line)
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None and numeric and self._wandb.takes(step):
            self._wandb.log(numeric, step=step)
        self._latest.update((k, numeric[k]) for k in _PROGRESS_KEYS if k in numeric)
        if "eval/return" in numeric:
            self._status(step)  # after each evaluation

    def event(self, step: int, name: str, **fields: Any) -> None:
        """One event line of metrics.jsonl, ``{"step": step, "event": name, **fields}`` (a stop by
        a signal; ``rlrec.train.timeline`` writes the ``resume`` ones): no scalars."""
        self._write({"step": int(step), "event": name, **fields})

    def _write(self, line):
        self._metrics.write(json.dumps(line) + "\n")

    def progress(self, step: int, sps: float) -> None:
        """The console after an iteration: the progress bar on a terminal; without one (a job's
        log, ``nohup``, CI) a status line once ``logger.status_every_sec`` passed since the last
        (and after each evaluation, :meth:`log`)."""
        self._sps = sps
        if self._progress is not None:
            self._progress.update(self._task, completed=step, sps=f"{sps:,.0f}", info=self._info())
        elif self._status_every is not None:
            if time.monotonic() - self._status_at >= self._status_every:
                self._status(step)

    def _info(self, sep="  "):
        """The latest figures, ``train return 1.2 success 0.5{sep}eval return 3.4 success 1``."""
        groups: Dict[str, str] = {}
        for key in (k for k in _PROGRESS_KEYS if k in self._latest):
            kind, name = key.split("/")
            groups[kind] = f"{groups.get(kind, kind)} {name} {figure(self._latest[key])}"
        return sep.join(groups.values())

    def _status(self, step):
        """One status line: steps, SPS, the latest returns and successes, elapsed, time left."""
        if self._status_every is None:
            return
        self._status_at = now = time.monotonic()
        clock = lambda s: str(datetime.timedelta(seconds=int(s)))  # noqa: E731
        total, sps = self.total_steps, self._sps
        parts = [
            f"rlrec: step {step:,}/{total:,} ({step / max(total, 1):.0%})",
            f"{sps:,.0f} SPS" if sps > 0 else "- SPS",
            *([self._info(" | ")] if self._latest else []),
            f"elapsed {clock(now - self._t0)}",
            f"left {clock((total - step) / sps) if sps > 0 else '-'}",
        ]
        print(" | ".join(parts), flush=True)

    def log_clip(self, clip, step: int) -> None:
        """Records a saved clip (a ``ClipInfo``) at the step its caller tagged it with (an eval
        clip finishes encoding after its evaluation), else ``step``: its path in metrics.jsonl,
        the video in TensorBoard and W&B. The TensorBoard preview (decode + GIF) is made on a
        background thread, from a private link to the clip made here while ``clip.path`` is this
        clip (the recorder reports it right after moving it there), so a later clip that
        replaces that name (``recorder.filename``) cannot show in this clip's preview."""
        step = step if clip.tag is None else int(clip.tag)
        rel, key = os.path.relpath(clip.path, self.run_dir), f"video/{clip.kind}"
        if clip.kind == "eval":
            self._held.clip(step, rel)
        self.log(step, {key: rel})
        if self._tb is not None:
            self._previews = self._previews or _Previews()
            self._previews.submit(_tb_add_clip, self._tb, clip, step, _private_link(clip.path))
        if self._wandb is not None and self._wandb.takes(step):
            import wandb

            self._wandb.log({key: wandb.Video(clip.path, format="mp4")}, step=step)

    def _name_clip(self, line, rel):
        line["eval/clip"] = rel
        if rel is None:
            line["eval/clip_lost"] = True

    def settle(self, wait: bool = True) -> None:
        """Before a checkpoint: the lines waiting for their clips go out (a resumed run would not
        redo those evaluations), once their clips were waited for (``wait_clips``; not ``wait``:
        as the run closes, once they all came), else naming none (``null``) and saying that their
        clip was lost (``"eval/clip_lost": true``)."""
        if wait and self._wait_clips and self._held.lines:
            self._wait_clips()
        self._held.lost()

    def close(self, step: int = 0, losses: Optional[Dict[str, int]] = None) -> None:
        """Writes the lines still waiting for their clips and, when they changed since the last
        line that carried them, the recorders' ``losses`` as the run closes (``record/...``: a
        clip lost at the final evaluation counts), as a last line of ``step``; then closes."""
        losses = losses or {}
        self._closed_at = step, losses  # what the summary says
        if not self._metrics.closed:
            self.settle(wait=False)
            if any(self._losses.get(k, 0) != v for k, v in losses.items()):
                self._write({"step": int(step), **losses})
            self._metrics.close()
        # in this order: the previews of the last clips before the TensorBoard writer closes
        bar, parts = self._progress, (self._previews, self._tb, self._wandb)
        self._progress = self._previews = self._tb = self._wandb = None
        if bar is not None:
            bar.stop()
        for part in filter(None, parts):
            part.close()

    def summary(self, seconds: float, last_eval: Dict[str, float], signum, resumable) -> None:
        """The run's last console line (rank 0's), once closed: done or stopped (by ``signum``:
        then, when ``resumable``, how to continue), in how long, its env steps, its last eval
        figures (a success with its 95% interval and episode count), what recording lost
        (``record/clips_dropped``, ... when any is nonzero) and its run dir."""
        if not self.writes:
            return
        (step, losses), ev, run_dir = self._closed_at, last_eval, self.run_dir
        ended = "stopped by signal" if signum is not None else "done"
        parts = [f"rlrec: {ended} in {seconds:.1f}s", f"{step:,} env steps"]
        if ev:
            figures = f"eval return {ev['eval/return']:.3f}, length {ev['eval/length']:.1f}"
            if "eval/success" in ev:
                figures += f", success {success_text(ev['eval/success'], ev.get('eval/episodes'))}"
            parts.append(figures)
        lost = [f"{k.split('/')[-1]} {v}" for k, v in losses.items() if v]
        parts += [f"recording lost {', '.join(lost)}"] if lost else []
        parts.append(f"run dir {run_dir}")
        if signum is not None:
            parts.append(f"signal {signal.Signals(signum).name}")
            if resumable:
                parts.append(f"to continue: the same command + resume=auto hydra.run.dir={run_dir}")
        print(" | ".join(parts), flush=True)


class _WandbRun:
    """The run's W&B run. Its id and the last step sent to it are kept in the run dir
    (``wandb_run.json``, rank 0's): a run that ``resume=auto`` continues from a checkpoint
    (``resumed``) continues that W&B run (``resume="allow"``), as its TensorBoard logs continue.
    W&B takes no step twice: the steps it has (the stopped run's, up to where it got past its
    checkpoint) are not sent again (:meth:`takes`); metrics.jsonl and TensorBoard hold the
    resumed run's lines of those steps. A run started again without a checkpoint starts a new
    one."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config_dict: dict, resumed: bool):
        import wandb  # the extra is checked before work (rlrec.run.preflight.check_logger_extra)

        self.path, kept = RunDir(run_dir).wandb_run, None
        if resumed:  # (a damaged file: a new W&B run)
            with contextlib.suppress(OSError, ValueError):
                kept = json.loads(self.path.read_text())
        known = isinstance(kept, dict) and isinstance(kept.get("id"), str)
        known = known and isinstance(kept.get("step"), int)
        # jobs of a sweep (multirun/<date>/<time>_<id>/<job>) are grouped under their sweep dir
        sweep = run_dir.parent.name if run_dir.name.isdigit() else None
        self.run = wandb.init(
            project=cfg.wandb_project,
            entity=cfg.wandb_entity,
            mode=cfg.wandb_mode,
            dir=str(run_dir),
            config=config_dict,
            name=f"{sweep}/{run_dir.name}" if sweep else run_dir.name,
            group=sweep,
            reinit="finish_previous",
            id=kept["id"] if known else None,
            resume="allow" if known else None,
        )
        self.floor = self.last = kept["step"] if known else -1  # the steps the W&B run has
        self._keep()

    def takes(self, step: int) -> bool:
        return step > self.floor

    def log(self, data: Dict[str, Any], step: int) -> None:
        self.run.log(data, step=step)
        if step > self.last:
            self.last = step
            self._keep()

    def _keep(self):
        write_atomic(self.path, json.dumps({"id": self.run.id, "step": self.last}))

    def close(self) -> None:
        self.run.finish()


PREVIEW_TIMEOUT_S = 60.0  # how long close() waits for the TensorBoard previews still queued
PREVIEW_FRAMES = 150  # a longer clip is subsampled to at most this many preview frames


class _Previews:
    """One daemon thread making TensorBoard clip previews in order, off the training thread.
    :meth:`close` waits for the queued ones at most ``timeout`` seconds (a preview stuck on a dead
    disk is left behind, a daemon thread, and said so), so closing a run never hangs on one."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rlrec-tb-clip", daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> None:
        self._queue.put((fn, args))

    def _run(self):
        for fn, args in iter(self._queue.get, None):  # until close()'s None
            fn(*args)  # catches and reports its own failures

    def close(self, timeout: float = PREVIEW_TIMEOUT_S) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            print(
                f"rlrec: TensorBoard clip previews did not finish within {timeout:g} s; "
                f"{self._queue.qsize() - 1} not made (the clips themselves are on disk)",
                file=sys.stderr,
            )


def _private_link(path):
    """A name of its own for the clip at ``path`` now: a hidden hard link (or copy, where the
    filesystem has no links) beside it, ``.NAME.preview.PID-N.part``, that no later clip
    replaces. ``path`` itself if neither can be made. :func:`_tb_add_clip` removes it."""
    private = temporary_name(path, tag="preview")
    for make in (os.link, shutil.copyfile):
        try:
            make(path, private)
            return private
        except OSError:
            remove_quietly(private)
    return path


def _tb_add_clip(writer, clip, step, source):
    """Adds ``clip`` (decoded from ``source``: its private link, removed after, or the clip) to
    TensorBoard as an animated GIF image summary (what add_video writes, without needing
    moviepy). Long clips are subsampled to ``PREVIEW_FRAMES`` while they are decoded, so at most
    that many frames are ever held. A clip that cannot be previewed is reported, never raised:
    it must not stop training."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    try:
        stride = max(1, math.ceil(clip.num_frames / PREVIEW_FRAMES))
        kept = itertools.islice(read_frames(Path(source)), 0, None, stride)  # every stride-th
        # each frame's own 256 colours, chosen by PIL's fast octree (its default for RGB frames,
        # median cut with dithering, takes 2.5x as long and makes a larger file)
        fast = Image.Quantize.FASTOCTREE
        images = [Image.fromarray(f).quantize(256, fast, dither=Image.Dither.NONE) for f in kept]
        buf, duration = io.BytesIO(), max(20, int(1000 * stride / clip.fps))
        images[0].save(
            buf, "GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
        )
        (w, h), gif = images[0].size, buf.getvalue()
        image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=gif)
        summary = Summary(value=[Summary.Value(tag=f"video/{clip.kind}", image=image)])
        writer._get_file_writer().add_summary(summary, step)
    except Exception as exc:
        print(f"rlrec: could not add {clip.path} to TensorBoard: {exc}", file=sys.stderr)
    finally:
        if source != clip.path:
            remove_quietly(source)
