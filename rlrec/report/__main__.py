"""``python -m rlrec.report DIR`` (``rlrec-report DIR``): writes the report of a run dir or a
sweep dir (``DIR/report.html``, and each run's ``videos/progress.mp4``) and prints its path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from rlrec.report.config import ReportConfig


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rlrec-report",
        description="Writes report.html (and videos/progress.mp4) of a run dir or a sweep dir.",
    )
    parser.add_argument("dir", type=Path, help="a run dir (or a sweep dir) of rlrec")
    defaults = ReportConfig()
    parser.add_argument(
        "--max-tiles", type=int, default=defaults.max_tiles,
        help=f"evaluations in the progress video (default {defaults.max_tiles})",
    )  # fmt: skip
    parser.add_argument(
        "--no-progress-video", action="store_true", help="do not write videos/progress.mp4"
    )
    args = parser.parse_args(argv)
    cfg = ReportConfig(progress_video=not args.no_progress_video, max_tiles=args.max_tiles)
    if args.max_tiles <= 0:
        parser.error(f"--max-tiles={args.max_tiles} is invalid: must be a positive number")
    if not args.dir.is_dir() or not (
        (args.dir / "metrics.jsonl").is_file() or (args.dir / "summary.csv").is_file()
        or (args.dir / ".rlrec_summary").is_dir()
    ):  # fmt: skip
        print(f"rlrec-report: {args.dir} is not a run dir or a sweep dir of rlrec", file=sys.stderr)
        raise SystemExit(2)
    from rlrec.report.html import write_report

    print(write_report(args.dir, cfg).resolve())


if __name__ == "__main__":
    main()
