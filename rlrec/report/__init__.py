"""The run report: ``report.html`` and ``videos/progress.mp4`` of a run dir (or a sweep dir).

``python -m rlrec.report DIR`` (or ``rlrec-report DIR``) writes them for any run dir; a run
writes them itself when it ends (``report.enabled``, :class:`ReportConfig`). The report reads only
the run dir's files, so this package sits low: it imports the recorder's file formats and nothing
of the training loop.
"""

from rlrec.report.config import ReportConfig

__all__ = ["ReportConfig", "end_warm_up", "warm_up", "write_at_end"]


def write_at_end(run_dir, cfg: ReportConfig, stopped: bool = False):
    """The end of a run (its main rank, after training, every env and encoder closed): writes
    the report and prints its path. A report that fails does not fail the run (the message says
    so); a stopped run (a signal, a preemption: its time is short) writes none and says how to
    write it later. Returns the page's path, or None."""
    import sys
    import time
    from pathlib import Path

    if not cfg.enabled:
        return None
    command = f"python -m rlrec.report {run_dir}"
    if stopped:
        print(f"rlrec: no report of a stopped run: {command} writes it", flush=True)
        return None
    from rlrec.report.html import write_run_report

    start = time.perf_counter()
    try:
        path = write_run_report(Path(run_dir), cfg)
    except Exception as exc:  # the run itself is done and saved: say what failed, go on
        print(f"rlrec: the report failed ({type(exc).__name__}: {exc}); {command}", file=sys.stderr)
        return None
    secs = time.perf_counter() - start
    print(f"rlrec: report {path.resolve()} (written in {secs:.1f} s)", flush=True)
    return path


def _import_plotting() -> None:
    try:
        import matplotlib.backends.backend_svg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except Exception:  # write_at_end meets the same error and says it in one line
        pass


WARM_UP_WAIT_S = 30.0  # how long the end of a run waits for the warm-up's import at most
_warming: list = []  # the warm-up's thread while it may run


def warm_up(cfg: ReportConfig) -> None:
    """Imports what the report draws its curves with (matplotlib: about a second) on a daemon
    thread while the run trains, so that the end of the run does not wait for it. The report's
    own import takes what is loaded by then; :func:`end_warm_up` waits for the rest."""
    if cfg.enabled:
        import threading

        thread = threading.Thread(target=_import_plotting, name="rlrec-report-import", daemon=True)
        thread.start()
        _warming.append(thread)


def end_warm_up() -> None:
    """Every end of a run (also a divergence, a refusal, an interrupt) waits here, at most
    :data:`WARM_UP_WAIT_S`, for the warm-up's import: a thread still in an extension module's
    code as the interpreter exits can abort the process (SIGABRT) after the run's last line."""
    while _warming:
        _warming.pop().join(WARM_UP_WAIT_S)
