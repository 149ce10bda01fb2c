"""``python -m rlrec.dataset RUN_DIR dataset.episodes=N [dataset.keep=all|success|failed]
[dataset.step=S] [dataset.dir=PATH] [dataset.sample=true] [dataset.tries=T] [KEY=VALUE ...]``
(``rlrec-dataset``): N eval episodes of the checkpoint of step S as a LeRobot dataset
(:mod:`rlrec.dataset`); ``KEY=VALUE``: overrides of the run's config (its eval env:
``eval_env.num_envs=32``, ``env.render_width=256``, ``eval_env.recorder.lossless=true``). Then the
run's ``report.html`` is rewritten (where the run has one) to list it. Exit status 2: bad input,
nothing written; 1: fewer than N episodes kept within ``dataset.tries``, nothing written."""

from __future__ import annotations

import sys
from typing import List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrec.checks import ConfigError, positive
from rlrec.config import unknown_key
from rlrec.dataset import DatasetConfig, Short, make
from rlrec.layout import RunDir
from rlrec.report.html import write_report

USAGE = "python -m rlrec.dataset RUN_DIR dataset.episodes=N [dataset.KEY=VALUE ...] [KEY=VALUE ...]"


def parse(items: List[str]) -> DatasetConfig:
    """The ``dataset.KEY=VALUE`` items, typed by :class:`DatasetConfig` (OmegaConf refuses a
    value of another type, naming the key, and an Enum's allowed values)."""
    for key in (item.partition("=")[0].removeprefix("dataset.") for item in items):
        if key not in DatasetConfig.__dataclass_fields__:
            raise unknown_key("dataset.", key, DatasetConfig)
    base = OmegaConf.create({"dataset": OmegaConf.structured(DatasetConfig)})
    cfg = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(items)))["dataset"]
    positive(cfg.episodes, "dataset.episodes")
    positive(cfg.tries, "dataset.tries", allow_none=True)
    return cfg


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if not args or "=" in args[0] or args[0].startswith("-"):
            raise ConfigError(f"usage: {USAGE}")
        cfg = parse([a for a in args[1:] if a.startswith("dataset.")])
        line = make(args[0], cfg, [a for a in args[1:] if not a.startswith("dataset.")])
    except (ConfigError, OmegaConfBaseException) as exc:
        print(f"rlrec-dataset: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Short as exc:
        print(f"rlrec-dataset: {exc}", file=sys.stderr)
        return 1
    print(f"rlrec-dataset: {line['episodes']} episodes, {line['frames']} frames: {line['path']}")
    if RunDir(args[0]).report.is_file():  # the page lists the datasets made of the run
        print(f"report {write_report(RunDir(args[0]).root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
