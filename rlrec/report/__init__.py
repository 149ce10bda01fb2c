"""The run report: ``report.html`` and ``videos/progress.mp4`` of a run dir (or a sweep dir).

``python -m rlrec.report DIR`` (or ``rlrec-report DIR``) writes them for any run dir; a run
writes them itself when it ends (``report.enabled``, :class:`ReportConfig`). The report reads only
the run dir's files, so this package sits low: it imports the recorder's file formats and nothing
of the training loop.
"""

from rlrec.report.config import ReportConfig

__all__ = ["ReportConfig", "write_at_end"]


def write_at_end(run_dir, cfg: ReportConfig):
    """The end of a run (its main rank, after training, every env and encoder closed): writes
    the report and prints its path. A stopped run (a signal, a preemption) writes it too: the
    page says it was stopped (its last event). A report that fails does not fail the run (the
    message says so). Returns the page's path, or None."""
    import sys
    import time

    if not cfg.enabled:
        return None
    from rlrec.report.html import write_run_report

    start = time.perf_counter()
    try:
        path = write_run_report(run_dir, cfg)
    except Exception as exc:  # the run itself is done and saved: say what failed, go on
        command = f"python -m rlrec.report {run_dir}"
        print(f"rlrec: the report failed ({type(exc).__name__}: {exc}); {command}", file=sys.stderr)
        return None
    secs = time.perf_counter() - start
    print(f"rlrec: report {path.resolve()} (written in {secs:.1f} s)", flush=True)
    return path
