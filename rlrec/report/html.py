"""``report.html``: one self-contained page of a run dir (or of a sweep dir) that opens from disk,
offline. Nothing is fetched: the curves are inline SVG, the styles inline, no script; the videos
are the run dir's own files, referenced by relative paths (so the page works wherever the run dir
is moved, and a Content-Security-Policy forbids anything else).

A run's page: whether a signal stopped it, the figures of its last evaluation (a success rate with
its 95% Wilson interval and episode count, here and in every table), its health (clips and frames
the recorders dropped, encoder stalls, stops and resumes), the learning curves, the progress video,
every evaluation with its clip, the failed eval episodes with their seeds and the command that
replays each, and the config (the user's overrides first). A sweep's page: one row per job (its
overrides and final figures, a link to the job's own page), a row for each group of jobs that differ
only by their seed (their last evaluations' mean return, their success over all their episodes,
their eval return curves on one panel) and, for each job with an eval clip on disk, its last eval
clip beside its return curves. Neither page names an absolute path: it links to its own folder.
"""

from __future__ import annotations

import contextlib
import html
import json
import signal
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import quote

from rlrec.checks import ConfigError
from rlrec.files import write_atomic
from rlrec.layout import PROGRESS_VIDEO, RunDir, SweepDir
from rlrec.report.config import ReportConfig, run_settings
from rlrec.report.curves import PANELS, curves_svg, overlay_svg
from rlrec.report.progress import write_progress
from rlrec.report.rundata import (
    RunData,
    read_overrides,
    read_rows,
    read_run,
    read_sidecar,
    success_text,
)

SUCCESS, EPISODES = "eval/success", "eval/episodes"
SUCCESS_HEAD = "success [95% interval]"  # the interval: Wilson's
HEALTH_HEAD = ["clips dropped", "frames dropped", "encoder stalls", "eval clips missing or lost"]
HEALTH_HEAD += ["stops (signals, preemptions)", "resumes"]

# nothing but inline styles and the run dir's own files: a report never reaches a network
_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
media-src 'self' file:; img-src 'self' data:">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title><style>{style}</style></head><body>
{body}
</body></html>
"""
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1280px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right;vertical-align:middle}th{background:#f4f4f4}td.l,th.l{text-align:left}
code,pre{font:12px/1.35 ui-monospace,monospace;background:#f6f6f6}pre{padding:.6em;overflow:auto}
.bad{color:#b00020;font-weight:600}.ok{color:#1b7d2a}.muted{color:#777}
.cards{display:flex;flex-wrap:wrap;gap:12px}.cards figure{margin:0}
video{image-rendering:pixelated;background:#000}
"""


def _e(value):
    return html.escape(str(value))


def _fmt(value):
    if value is None:
        return "&ndash;"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.4g}" if isinstance(value, float) else _e(value)


def _success(metrics):
    """An eval line's (or a sweep row's) success with its 95% interval and episode count."""
    rate = metrics.get(SUCCESS)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        return _fmt(rate)
    return _e(success_text(float(rate), metrics.get(EPISODES)))


def _video(rel, sidecar=None, least=128):
    """An inline player of the run dir's file ``rel`` (a relative URL), shown at least ``least``
    px tall (an integer scale: pixels stay sharp) when its ``sidecar`` gives its size."""
    size, width, height = "", *(int((sidecar or {}).get(k) or 0) for k in ("width", "height"))
    if width and height:
        scale = max(1, -(-least // height))
        size = f' width="{width * scale}" height="{height * scale}"'
    return f'<video controls preload="metadata" muted src="{quote(rel, safe="/")}"{size}></video>'


def _table(head, rows, left=0):
    """Cells are HTML already; the first ``left`` columns are left-aligned."""
    align = ' class="l"'

    def row(cells, tag):
        cells = (f"<{tag}{align * (i < left)}>{c}</{tag}>" for i, c in enumerate(cells))
        return f"<tr>{''.join(cells)}</tr>"

    return f"<table>{row(map(_e, head), 'th')}{''.join(row(r, 'td') for r in rows)}</table>"


def _section(anchor, title, *parts: str):
    return "\n".join([f'<h2 id="{anchor}">{title}</h2>', *parts])


def _span(cls, text, attrs=""):
    return f'<span class="{cls}"{attrs}>{text}</span>'


# --------------------------------------------------------------------------- a run


def _replay(run, episode):
    """The command, run in the run dir (``.``: it holds wherever the dir is moved), that replays
    eval episode ``episode`` (an eval_episodes.jsonl line) from the checkpoint of its step
    (``rlrec.run.replay``): its iteration's periodic checkpoint, last.pt when the episode is of
    the run's last evaluation, or none at step 0 (the untrained policy is rebuilt from the run's
    seed). None when no such checkpoint is kept, or the episode began at an autoreset (no seed
    restarts it)."""
    iteration, step = episode.get("iteration"), episode.get("step")
    if not isinstance(iteration, int) or not isinstance(step, int) or episode.get("seed") is None:
        return None
    paths, last = RunDir(run.path), run.evaluations[-1].step if run.evaluations else None
    kept = step == 0 or paths.periodic_checkpoint(iteration).is_file()
    if kept or step == last and paths.last_checkpoint.is_file():
        return f"python -m rlrec.run.replay . replay.step={step} replay.env={int(episode['env'])}"
    return None


def _summary(run):
    steps = max((int(r["step"]) for r in run.lines if "step" in r), default=0)
    parts = [f"{steps:,} env steps", f"{len(run.evaluations)} evaluations"]
    if run.evaluations:
        last = run.evaluations[-1]
        parts.append(f"last eval return {_fmt(last.ret)}")
        if last.success is not None:
            parts.append(f"success {_success(last.metrics)}")
    if RunDir(run.path).checkpoints.is_dir():  # its policy for a robot (rlrec.export)
        parts.append("export its policy (in the run dir): <code>python -m rlrec.export .</code>")
    # the run dir by a relative link (this page's folder), not its path: it holds once moved
    return f'<p>{" &middot; ".join(parts)} &middot; <a href="./">the run dir</a></p>'


def _stopped(run):
    """A note when a signal stopped the run (its last stop or resume event is a stop)."""
    ends = [e for e in run.events if e.get("event") in ("stop", "resume")]
    if not ends or ends[-1]["event"] != "stop":
        return ""
    step, signum = int(ends[-1].get("step", 0)), ends[-1].get("signal")
    with contextlib.suppress(ValueError, TypeError):
        signum = signal.Signals(signum).name
    return (
        f'<p class="bad" data-stopped="{step}">Stopped by {_e(signum)} at step {step:,}, '
        "before the end of the run: this page shows what it did. The same command with "
        "<code>resume=auto</code> and this run dir continues it.</p>"
    )


def _health(run):
    """One row: what the recorders lost, and the run's stops and resumes (each event below)."""
    figures = {**run.health(), "stops": 0, "resumes": 0}
    for e in run.events:
        figures[f"{e.get('event')}s"] = figures.get(f"{e.get('event')}s", 0) + 1
    cells = [
        _span(
            "muted" if key == "resumes" else "bad" if figures[key] else "ok",
            int(figures[key]),
            f' data-health="{key}"',
        )
        for key in (
            "clips_dropped",
            "frames_dropped",
            "encoder_stalls",
            "clips_missing",
            "stops",
            "resumes",
        )
    ]
    detail = [
        [
            _e(e["event"]),
            _fmt(e.get("step")),
            _e(", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "step"))),
        ]
        for e in run.events
    ]
    events = [_table(["event", "step", "details"], detail, left=1)] if detail else []
    return _section("health", "Health", _table(HEALTH_HEAD, [cells]), *events)


def _evaluations(run):
    if not run.evaluations:
        return _section("evaluations", "Evaluations", "<p>No evaluation was logged.</p>")
    metrics = [k for ev in run.evaluations for k in ev.metrics if k.startswith("eval/")]
    keys = [k for k in dict.fromkeys(metrics) if k not in ("eval/clip", "eval/clip_lost")]
    rows = []
    for ev in run.evaluations:
        clip = _span("muted", "no clip")
        if ev.clip_ok:
            clip = _video(str(ev.clip), ev.sidecar)
        elif ev.clip:
            clip = f"{_span('bad', 'clip missing')} <code>{_e(ev.clip)}</code>"
        elif ev.metrics.get("eval/clip_lost") is True:
            clip = _span("bad", "clip lost")
        cells = (_success(ev.metrics) if k == SUCCESS else _fmt(ev.metrics.get(k)) for k in keys)
        rows.append([_fmt(ev.step), *cells, clip])
    head = ["step", *(SUCCESS_HEAD if k == SUCCESS else k.split("/", 1)[1] for k in keys), "clip"]
    return _section("evaluations", "Evaluations", _table(head, rows))


def _progress(run, progress, failed):
    text = "<p>No progress video: the run has no eval clip on disk.</p>"
    if failed is not None:
        text = f'<p class="bad">The progress video could not be written: {_e(failed)}</p>'
    elif progress is not None:
        text = (
            "<p>The eval clips across evaluations, played in sync (the same start states: every "
            "evaluation resets with the same seed); a finished tile holds its last frame.</p>\n"
            + _video(progress, read_sidecar(run.path, progress), least=300)
        )
    return _section("progress", "Progress", text)


def _failures(run, max_rows):
    episodes = run.episodes or []
    failed = [e for e in episodes if e.get("success") is False]  # oldest first
    shown = failed[-max_rows:]
    note = f" (the last {len(shown)} shown)" if len(shown) < len(failed) else ""
    text = f"<p>{len(failed)} of {len(episodes)} eval episodes failed{note}.</p>"
    if run.episodes is None:
        text = (
            "<p>This run wrote no per-episode eval records (<code>eval_episodes.jsonl</code>).</p>"
        )
    elif all(e.get("success") is None for e in episodes):
        text = "<p>The env reports no success: no episode counts as failed.</p>"
    elif not failed:
        text = f'<p class="ok">None of {len(episodes)} eval episodes failed.</p>'
    rows = []
    for ep in shown:
        clip, frames = ep.get("clip"), ep.get("frames")
        cell = _span("muted", "no clip")
        if isinstance(clip, str) and (run.path / clip).is_file():
            cell = _video(clip, read_sidecar(run.path, clip))
            if frames:
                cell += "<br>" + _span("muted", f"frames {_e(frames[0])}&ndash;{_e(frames[-1])}")
        command = _replay(run, ep)
        replay = (
            f"<code>{_e(command)}</code>"
            if command
            else _span("muted", "no checkpoint of its step kept")
        )
        figures = [_fmt(ep.get(k)) for k in ("step", "env", "seed", "return", "length")]
        rows.append([*figures, _e(ep.get("ended", "")), cell, replay])
    head = ["step", "env", "seed", "return", "length", "ended", "clip", "replay (in the run dir)"]
    return _section("failures", "Failed eval episodes", text, *[_table(head, rows)] * bool(rows))


def _config(run):
    overrides = read_overrides(run.path)
    items = "".join(f"<li><code>{_e(o)}</code></li>" for o in overrides)
    parts = [
        f"<p>The command line's overrides:</p><ul>{items}</ul>"
        if overrides
        else "<p>No overrides: the defaults.</p>"
    ]
    with contextlib.suppress(OSError):
        whole = f"<pre>{_e(RunDir(run.path).hydra_config.read_text())}</pre>"
        parts.append(f"<details><summary>The whole config</summary>{whole}</details>")
    return _section("config", "Config", *parts)


def _verified(run):
    """The export's closed-loop check (exported/verify.json): per format its figures, and its clip
    of env 0's episode beside the checkpoint's of the same seed."""
    path = RunDir(run.path).exported / "verify.json"
    if not path.is_file():
        return ""
    report = json.loads(path.read_text())

    def clip(rel):
        return _video(f"exported/{rel}") if rel else "no clip"

    rows = [
        [
            f"<code>{_e(f['file'])}</code>",
            "passed" if f["passed"] else _span("bad", f"failed: {_e(f['failed'])}"),
            *(f"{f[k]:.3g}" for k in ("max_action_diff", "max_obs_diff", "max_return_diff")),
            clip(report["checkpoint"]["clip"]) + clip(f["clip"]),
        ]
        for f in report["formats"].values()
    ]
    head = ["file", "check", "max action diff", "max obs diff", "max return diff", "clips"]
    return _section(
        "export-check",
        f"Export of step {report['step']:,}, checked in closed loop",
        f"<p>{report['episodes']} eval episodes by the checkpoint and by each file (tolerance "
        f"{report['tolerance']:g}); env 0's episode: the checkpoint's, then the file's.</p>",
        _table(head, rows, left=2),
    )


def _page(title, body):
    return _PAGE.format(title=_e(title), style=_STYLE, body="\n".join(body))


def _datasets(run: RunData) -> str:
    """The LeRobot datasets made of the run (``python -m rlrec.dataset``: datasets.jsonl)."""
    path = RunDir(run.path).datasets
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    keys = ("step", "episodes", "frames", "tried")
    rows = [[f"<code>{_e(d['path'])}</code>", *(f"{d[k]:,}" for k in keys)] for d in lines]
    return _section("datasets", "Datasets", _table(["path", *keys], rows, 1)) if rows else ""


def run_page(
    run: RunData, cfg: ReportConfig, progress: Optional[str], failed: Optional[str]
) -> str:
    """The page of ``run``: ``progress`` its progress video (relative), ``failed`` why it could not
    be written."""
    name = run.path.resolve().name
    inline = " ".join(f"<code>{_e(o)}</code>" for o in read_overrides(run.path))  # first
    body = [
        f"<h1>rlrec run {_e(name)}</h1>",
        _stopped(run),
        _summary(run),
        '<p><a href="#health">health</a> &middot; <a href="#progress">progress</a> &middot; '
        '<a href="#curves">curves</a> &middot; <a href="#evaluations">evaluations</a> &middot; '
        '<a href="#failures">failed episodes</a> &middot; <a href="#config">config</a></p>',
        f"<p>Overrides: {inline}</p>" if inline else "",
        _health(run),
        _progress(run, progress, failed),
        _section("curves", "Learning curves", curves_svg(run) or "<p>No metrics logged.</p>"),
        _evaluations(run),
        _failures(run, cfg.max_failures),
        _verified(run),
        _datasets(run),
        _config(run),
    ]
    return _page(f"rlrec run {name}", body)


# --------------------------------------------------------------------------- a sweep


def _job_dir(sweep_dir, row):
    """The job's run dir when it lies inside the sweep dir (the page links only below itself)."""
    for candidate in filter(None, (row.get("run_dir"), sweep_dir / str(row.get("job", "")))):
        path = Path(candidate).resolve()
        if path.is_dir() and sweep_dir.resolve() in path.parents:
            return path
    return None


def _seed_groups(jobs, runs):
    """A row for each group of completed jobs that differ only by their seed: the mean return of
    their last evaluations [least, greatest], the success of all their episodes together with its
    95% interval, and their eval return curves on one panel."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row, _, _ in jobs:
        if row.get("status") == "COMPLETED" and isinstance(row.get("eval/return"), (int, float)):
            keys = str(row.get("swept") or row.get("overrides", "")).split()
            rest = " ".join(o for o in keys if o.partition("=")[0].lstrip("+~") != "seed")
            groups.setdefault(rest, []).append(row)
    table = []
    for rest, rows in groups.items():
        if len(rows) < 2:
            continue
        returns = [float(r["eval/return"]) for r in rows]
        success = "&ndash;"
        if all(isinstance(r.get(key), (int, float)) for r in rows for key in (SUCCESS, EPISODES)):
            n = sum(int(r[EPISODES]) for r in rows)
            success = _e(success_text(sum(round(r[SUCCESS] * r[EPISODES]) for r in rows) / n, n))
        curves = [(f"seed={r.get('seed')}", runs[r["job"]]) for r in rows if r["job"] in runs]
        mean = f"{_fmt(sum(returns) / len(returns))} [{_fmt(min(returns))}, {_fmt(max(returns))}]"
        swept = f"<code>{_e(rest)}</code>" if rest else "(the seed alone is swept)"
        seeds = _e(" ".join(str(r.get("seed")) for r in rows))
        table.append([swept, seeds, mean, success, overlay_svg("eval return", curves)])
    if not table:
        return "<p>No jobs that differ only by their seed.</p>"
    head = ["swept overrides", "seeds", "return: mean [least, greatest]", SUCCESS_HEAD, "curves"]
    return _table(head, table, left=1)


def sweep_page(sweep_dir: Path, jobs: List[tuple]) -> str:
    """The page of a sweep: ``jobs`` holds each job's summary row, its run dir inside the sweep dir
    and its report (relative to the sweep dir), where it has them."""
    table, cards, runs = [], [], {}
    for row, job_dir, report in jobs:
        job, status = int(row.get("job") or 0), row.get("status", "")
        link = _e(job) if report is None else f'<a href="{quote(report, safe="/")}">{job}</a>'
        swept = row.get("swept") or row.get("overrides", "")
        cells = [
            link,
            _span("ok" if status == "COMPLETED" else "bad", _e(status)),
            f"<code>{_e(swept)}</code>",
        ]
        figures = [_fmt(row.get("step")), _fmt(row.get("eval/return")), _success(row)]
        table.append([*cells, *figures, _e(row.get("error") or "")])
        if job_dir is None:
            continue
        run = runs[row.get("job")] = read_run(job_dir)
        last = next((ev for ev in reversed(run.evaluations) if ev.clip_ok), None)
        if last is not None:
            rel = job_dir.relative_to(sweep_dir.resolve()).as_posix()
            caption = f"job {job} &middot; step {last.step:,} &middot; return {_fmt(last.ret)}"
            cards.append(
                f"<figure>{_video(f'{rel}/{last.clip}', last.sidecar)}"
                f"{curves_svg(run, PANELS[:1])}"  # its return curves, training and eval
                f"<figcaption>{caption}<br><code>{_e(swept)}</code></figcaption></figure>"
            )
    head = ["job", "status", "overrides", "step", "return", SUCCESS_HEAD, "error"]
    jobs_table = _table(head, table, left=3) if table else "<p>No job has finished yet.</p>"
    clips = (
        f'<div class="cards">{"".join(cards)}</div>' if cards else "<p>No eval clip on disk.</p>"
    )
    name = sweep_dir.resolve().name
    body = [
        f"<h1>rlrec sweep {_e(name)}</h1>",
        f'<p>{len(jobs)} jobs &middot; <a href="./">the sweep dir</a></p>',
        _section("jobs", "Jobs", jobs_table),
        _section("seeds", "Jobs that differ only by their seed", _seed_groups(jobs, runs)),
        _section("clips", "Last eval clip and return curves of each job", clips),
    ]
    return _page(f"rlrec sweep {name}", body)


# --------------------------------------------------------------------------- writing


def write_run_report(run_dir: Path, cfg: Optional[ReportConfig] = None) -> Path:
    """Writes ``videos/progress.mp4`` (``cfg.progress_video``) and ``report.html`` of the run dir
    ``run_dir``; returns the page's path. A progress video that fails leaves the page, saying why
    (every ffmpeg wait inside it is bounded: a stalled encoder is killed)."""
    cfg, paths = cfg or ReportConfig(), RunDir(run_dir)
    run = read_run(paths.root)
    progress = PROGRESS_VIDEO if paths.progress_video.is_file() else None
    failed = None
    try:
        if cfg.progress_video:
            progress = write_progress(run, cfg.max_tiles) and PROGRESS_VIDEO
    except Exception as exc:  # the page without it, saying why
        progress, failed = None, f"{type(exc).__name__}: {exc}"
    write_atomic(paths.report, run_page(run, cfg, progress, failed))
    return paths.report


def write_report(
    path: Path, cfg: Optional[ReportConfig] = None, overrides: Sequence[str] = ()
) -> Path:
    """The report of a run dir, or of a sweep dir (with each job's own report); returns the
    page's path; a ConfigError when ``path`` is neither. ``cfg``: the settings of every page;
    None: each run's own ``report.*`` (:func:`~rlrec.report.config.run_settings`) under
    ``overrides``."""
    path = Path(path)
    if not SweepDir(path).is_sweep():
        if not RunDir(path).metrics.is_file():  # (either file inside it says it is a directory)
            raise ConfigError(f"{path} is not a run dir or a sweep dir of rlrec")
        return write_run_report(path, cfg or run_settings(path, overrides))
    if cfg is None:
        run_settings(path, overrides)  # a bad override is refused before any job's report
    jobs = []
    for row in read_rows(path):
        job_dir, report = _job_dir(path, row), None
        if job_dir is not None and RunDir(job_dir).metrics.is_file():
            page = write_run_report(job_dir, cfg or run_settings(job_dir, overrides))
            report = page.relative_to(path.resolve()).as_posix()
        jobs.append((row, job_dir, report))
    write_atomic(SweepDir(path).report, sweep_page(path, jobs))
    return SweepDir(path).report
