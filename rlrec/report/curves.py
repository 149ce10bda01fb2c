"""The learning curves of a run as one inline SVG, drawn with matplotlib (no display, no file, no
font or script fetched: the glyphs are drawn as paths)."""

from __future__ import annotations

import io
from typing import List, Tuple

from rlrec.report.rundata import RunData

__all__ = ["PANELS", "curves_svg"]

# (title, keys): one panel each, those of a run that has none of its keys are left out
MAX_POINTS = 400  # points drawn per curve: a longer series is drawn every k-th point (and its last)

PANELS: List[Tuple[str, Tuple[str, ...]]] = [
    ("return", ("train/return", "eval/return")),
    ("success", ("train/success", "eval/success")),
    ("episode length", ("train/length", "eval/length")),
    ("policy loss", ("loss/policy",)),
    ("value loss", ("loss/value",)),
    ("entropy", ("loss/entropy",)),
    ("approx. KL", ("loss/approx_kl",)),
    ("steps per second", ("sps/total", "sps/collect")),
]


def curves_svg(run: RunData) -> str:
    """The ``<svg>`` element of the run's curves ("" when the run logged none)."""
    panels = []
    for title, keys in PANELS:
        series = [(key, *_thin(*run.series(key))) for key in keys]
        series = [s for s in series if s[1]]
        if series:
            panels.append((title, series))
    if not panels:
        return ""
    from matplotlib import rc_context
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    # fixed ids (the same report for the same run), text as text in a local font
    with rc_context({"svg.hashsalt": "rlrec-report", "svg.fonttype": "none"}):
        # fixed margins (matplotlib's constrained layout takes longer than the drawing)
        fig = Figure(figsize=(3.2 * cols, 2.4 * rows))
        fig.subplots_adjust(left=0.06, right=0.99, bottom=0.32 / rows, top=1 - 0.2 / rows,
                            wspace=0.3, hspace=0.7)  # fmt: skip
        for i, (title, series) in enumerate(panels):
            ax = fig.add_subplot(rows, cols, i + 1)
            for key, steps, values in series:
                marker = "o" if key.startswith("eval/") else None
                ax.plot(steps, values, label=key, marker=marker, markersize=3, linewidth=1.2)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("env steps", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(fontsize=7)
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # the element alone: no XML declaration or doctype


def _thin(steps: list, values: list) -> tuple:
    """At most about :data:`MAX_POINTS` of a series, evenly spaced, its last point kept."""
    k = -(-len(steps) // MAX_POINTS)
    if k <= 1:
        return steps, values
    idx = sorted({*range(0, len(steps), k), len(steps) - 1})
    return [steps[i] for i in idx], [values[i] for i in idx]
