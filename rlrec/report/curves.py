"""The learning curves of a run as one inline SVG, written here directly: no plotting library to
import (it took longer than the rest of the report), no display, no file, no font or script
fetched (the text is in the page's own sans-serif font)."""

from __future__ import annotations

import html
import math
from typing import List, Tuple

from rlrec.report.rundata import RunData

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
# a panel's curves in turn (matplotlib's tab10)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
PANEL = (307, 230)  # width, height of a panel in px (without its legend's rows)
MARGIN = (52, 18, 26, 38)  # left, right, top, bottom: the plot area's margins in a panel
LEGEND_ROW = 14  # px: a row of legend entries, below the panel's axis label (outside the plot)

Series = Tuple[str, list, list, bool]  # label, steps, values, markers at its points


def curves_svg(run: RunData, panels_of: List[Tuple[str, Tuple[str, ...]]] = PANELS) -> str:
    """The ``<svg>`` element of the run's curves (those of ``panels_of``; "" when the run logged
    none): four panels a row, each with its title, its axes' ticks and grid, its curves (an eval
    curve with markers) and, with two curves, their legend."""
    panels = [
        (title, [(key, *run.series(key), key.startswith("eval/")) for key in keys])
        for title, keys in panels_of
    ]
    return _svg(panels)


def overlay_svg(title: str, curves: List[Tuple[str, RunData]], key: str = "eval/return") -> str:
    """One panel of the ``key`` curves of several runs (``curves``: each run with its label), each
    with markers ("" when none logged it)."""
    return _svg([(title, [(label, *run.series(key), True) for label, run in curves])])


def _svg(panels):
    """The panels that hold a curve with points (each series thinned to :data:`MAX_POINTS`), four
    a row; "" when none does."""
    panels = [(t, [(k, *_thin(x, y), m) for k, x, y, m in series if x]) for t, series in panels]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        return ""
    cols = min(4, len(panels))
    rows = max(_legend(0, [s[0] for s in series])[1] for _, series in panels)
    panel_h = PANEL[1] + LEGEND_ROW * rows
    width, height = cols * PANEL[0], -(-len(panels) // cols) * panel_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9">'
    ]
    for i, (title, series) in enumerate(panels):
        out += _panel((i % cols) * PANEL[0], (i // cols) * panel_h, title, series)
    return "\n".join(out + ["</svg>"])


def _legend(x0, labels):
    """Where each legend entry goes, (x, row), in rows from ``x0`` across a panel's plot width,
    and the rows it takes (none for one curve: the panel's title names it)."""
    if len(labels) < 2:
        return [], 0
    places, x, row, right = [], x0, 0, x0 + PANEL[0] - MARGIN[0] - MARGIN[1]
    for label in labels:
        width = 22 + 5.5 * len(label)  # its line, and its text at about 5.5 px a character
        if x > x0 and x + width > right:
            x, row = x0, row + 1
        places.append((x, row))
        x += width
    return places, row + 1


def _panel(left, top, title, series):
    """The elements of one panel whose top left corner is at (left, top)."""
    x0, x1 = left + MARGIN[0], left + PANEL[0] - MARGIN[1]
    y0, y1 = top + MARGIN[2], top + PANEL[1] - MARGIN[3]  # y0 the top of the plot area
    xt = _ticks([x for s in series for x in s[1]])
    yt = _ticks([y for s in series for y in s[2]])

    def px(x):
        return x0 + (x - xt[0]) / (xt[-1] - xt[0]) * (x1 - x0)

    def py(y):
        return y1 - (y - yt[0]) / (yt[-1] - yt[0]) * (y1 - y0)

    grid = "".join(f"M{px(x):.1f} {y0}V{y1}" for x in xt) + "".join(
        f"M{x0} {py(y):.1f}H{x1}" for y in yt
    )
    out = [
        f'<text x="{(x0 + x1) / 2}" y="{top + 16}" text-anchor="middle" font-size="13">'
        f"{html.escape(title)}</text>",
        f'<path d="{grid}" stroke="#b0b0b0" stroke-opacity="0.5" stroke-width="0.8"/>',
        f'<path d="M{x0} {y0}H{x1}V{y1}H{x0}Z" fill="none" stroke="#000" stroke-width="0.8"/>',
        f'<text x="{(x0 + x1) / 2}" y="{y1 + 32}" text-anchor="middle" font-size="11">'
        "env steps</text>",
    ]
    out += [
        f'<text x="{px(x):.1f}" y="{y1 + 12}" text-anchor="middle">{label}</text>'
        for x, label in zip(xt, tick_labels(xt))
    ]
    out += [
        f'<text x="{x0 - 4}" y="{py(y) + 3:.1f}" text-anchor="end">{label}</text>'
        for y, label in zip(yt, tick_labels(yt))
    ]
    for i, (_, steps, values, markers) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        points = [(px(x), py(y)) for x, y in zip(steps, values)]
        line = "L".join(f"{x:.1f} {y:.1f}" for x, y in points)
        out.append(f'<path d="M{line}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        if markers or len(points) == 1:  # a lone point: its marker alone
            out += [
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in points
            ]
    # the legend, below the axis label: outside the plot area, it hides no data
    places, rows = _legend(x0, [s[0] for s in series])
    if rows:
        out.append(
            f'<rect x="{x0}" y="{y1 + 36}" width="{x1 - x0}" height="{LEGEND_ROW * rows}" '
            'fill="none" stroke="#ccc"/>'
        )
    for i, ((label, *_), (x, row)) in enumerate(zip(series, places)):
        y, color = y1 + 46 + LEGEND_ROW * row, COLORS[i % len(COLORS)]
        out.append(f'<path d="M{x + 4} {y - 3}h14" stroke="{color}" stroke-width="1.6"/>')
        out.append(f'<text x="{x + 20}" y="{y}">{html.escape(label)}</text>')
    return out


def _ticks(values):
    """Round values (1, 2, 2.5 or 5 times a power of ten apart) from at or below the least of
    ``values`` to at or above the greatest: an axis's ticks, its first and last its ends."""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi), 1.0):  # one value: a range around it
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / 5
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step), math.ceil(hi / step)
    return [k * step for k in range(first, last + 1)]


def tick_labels(ticks: List[float]) -> List[str]:
    """The labels of an axis's ``ticks`` (:func:`_ticks`): as many decimals as their step needs
    (2.825 of a 0.005 step, 2.8395 of a 0.0005 one), so each label is its tick's value and no
    two are alike."""
    step = (ticks[-1] - ticks[0]) / (len(ticks) - 1)
    decimals = next(d for d in range(17) if abs(round(step, d) - step) <= 1e-6 * step)
    return [f"{t + 0.0:,.{decimals}f}" for t in ticks]  # + 0.0: no "-0"


def _thin(steps, values):
    """At most about :data:`MAX_POINTS` of a series, evenly spaced, its last point kept."""
    k = -(-len(steps) // MAX_POINTS)
    if k <= 1:
        return steps, values
    idx = sorted({*range(0, len(steps), k), len(steps) - 1})
    return [steps[i] for i in idx], [values[i] for i in idx]
