"""The report's settings (``report.*`` of a run's config; ``conf/report/default.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from rlrec.checks import positive

__all__ = ["ReportConfig"]


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
