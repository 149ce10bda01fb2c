"""The report's settings (``report.*`` of a run's config; ``conf/report/default.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from rlrec.checks import ConfigError, positive
from rlrec.layout import RunDir


@dataclass
class ReportConfig:
    """What the end of a run writes into its run dir: ``report.html`` and
    ``videos/progress.mp4`` (``python -m rlrec.report DIR`` writes them for any run dir)."""

    enabled: bool = True  # write them at the end of a run (main rank, after training)
    progress_video: bool = True  # videos/progress.mp4: the eval clips across evaluations
    max_tiles: int = 16  # evaluations in the progress video: an even subset, first and last kept
    max_failures: int = 100  # failed eval episodes listed in the report (the latest ones)

    def check(self, key: str = "report") -> None:
        positive(self.max_tiles, f"{key}.max_tiles")
        positive(self.max_failures, f"{key}.max_failures")


def run_settings(run_dir: Path, overrides: Iterable[str] = ()) -> ReportConfig:
    """The report settings of the run dir ``run_dir``: its own ``report.*`` (``.hydra/config.yaml``;
    the defaults where it has none), then ``overrides`` (``report.KEY=VALUE``), checked.
    ConfigError names a bad override and the allowed keys."""
    import yaml

    defaults = vars(ReportConfig())
    try:
        saved = yaml.safe_load(RunDir(run_dir).hydra_config.read_text())
    except (OSError, yaml.YAMLError):
        saved = None
    saved = saved.get("report") if isinstance(saved, dict) else None
    values = {k: v for k, v in (saved or {}).items() if k in defaults}
    for item in overrides:
        key, sep, text = item.partition("=")
        name = key.removeprefix("report.")
        if not sep or name == key or name not in defaults:
            raise ConfigError(
                f"{item!r} is not a report setting: give report.KEY=VALUE with KEY one of "
                f"{', '.join(defaults)}"
            )
        values[name] = yaml.safe_load(text)
    for name, value in values.items():
        kind = type(defaults[name])
        if type(value) is not kind:  # bool is no int here, nor int a bool
            want = "true or false" if kind is bool else "an integer"
            raise ConfigError(f"report.{name}={value!r} is invalid: must be {want}")
    cfg = ReportConfig(**values)
    cfg.check()
    return cfg
