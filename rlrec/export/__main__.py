"""``python -m rlrec.export RUN_DIR [export.step=S] [export.format=F] [export.verify=N]
[export.tolerance=T]`` (``rlrec-export``): the export (:func:`rlrec.export.export`), then its
closed-loop check (:mod:`rlrec.export.verify`; ``export.verify=0`` skips it), then the run's
``report.html`` rewritten (where the run has one) to show it. Exit status 2: bad input, nothing
written; 1: an exported file failed the check (moved to ``exported/rejected/``)."""

from __future__ import annotations

import contextlib
import sys
from typing import Dict, List, Optional

from rlrec.checks import ConfigError
from rlrec.export import ExportFormat, export
from rlrec.export.verify import TOLERANCE, verify
from rlrec.layout import RunDir
from rlrec.report.html import write_report

DEFAULTS = {
    "export.step": None,
    "export.format": "torchscript",
    "export.verify": "4",
    "export.tolerance": str(TOLERANCE),
}


def _options(args: List[str]) -> Dict[str, Optional[str]]:
    if not args or "=" in args[0] or args[0].startswith("-"):
        raise ConfigError(
            "usage: python -m rlrec.export RUN_DIR [export.step=S] [export.format="
            f"{'|'.join(ExportFormat.values())}] [export.verify=N] [export.tolerance=T]"
        )
    options = dict(DEFAULTS)
    for item in args[1:]:
        key, sep, value = item.partition("=")
        if key not in options or not sep:
            raise ConfigError(f"{item} is not an option: allowed keys are {', '.join(options)}")
        options[key] = value
    for key, what in (
        ("export.step", "the env step of a checkpoint"),
        ("export.verify", "episodes, 0: none"),
    ):
        if options[key] is not None and not options[key].isdigit():
            raise ConfigError(f"{key}={options[key]} is invalid: {what}, an integer >= 0")
    with contextlib.suppress(ValueError):
        if float(options["export.tolerance"]) > 0:
            return options
    raise ConfigError(f"export.tolerance={options['export.tolerance']} is invalid: a number > 0")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        options = _options(args)
        step, fmt = options["export.step"], options["export.format"]
        written = export(args[0], None if step is None else int(step), fmt)
    except ConfigError as exc:
        print(f"rlrec-export: {exc}", file=sys.stderr)
        return 2
    print(*written, sep="\n")
    n, tolerance = int(options["export.verify"]), float(options["export.tolerance"])
    if n == 0:
        return 0
    kinds = ExportFormat(fmt).kinds()
    formats = verify(args[0], kinds, n, tolerance)["formats"]
    for kind in kinds:
        f, bad = formats[kind], formats[kind]["failed"]
        head = f"verify {f['file']}: {n} episodes, max action diff {f['max_action_diff']:.3g}, "
        if f["passed"]:
            print(head + f"max obs diff {f['max_obs_diff']:.3g} <= {tolerance:g}: passed")
        else:
            print(
                head + f"FAILED: episode {bad['episode']} (seed {bad['seed']}) parts from the "
                f"checkpoint's at step {bad['parted_at_step']} (tolerance {tolerance:g}); {kind} "
                f"moved to {f['rejected']}",
                file=sys.stderr,
            )
    if RunDir(args[0]).report.is_file():  # the page shows the check beside the run's figures
        print(f"report {write_report(RunDir(args[0]).root)}")
    return 0 if all(formats[k]["passed"] for k in kinds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
