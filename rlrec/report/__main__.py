"""``python -m rlrec.report DIR`` (``rlrec-report DIR``): writes the report of a run dir or a
sweep dir (``DIR/report.html``, and each run's ``videos/progress.mp4``) and prints its path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from rlrec.checks import ConfigError


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rlrec-report",
        description="Writes report.html (and videos/progress.mp4) of a run dir or a sweep dir, "
        "with the run's own report.* settings (each job's, for a sweep) under the overrides.",
    )
    parser.add_argument("dir", type=Path, help="a run dir (or a sweep dir) of rlrec")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="report.KEY=VALUE",
        help="e.g. report.max_failures=6 report.max_tiles=8 report.progress_video=false",
    )
    args = parser.parse_args(argv)
    try:
        from rlrec.report.html import write_report

        # write_report refuses a dir of neither kind, or a bad override, before it writes anything
        print(write_report(args.dir, overrides=args.overrides).resolve())
    except ConfigError as err:
        print(f"rlrec-report: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
