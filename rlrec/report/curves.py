"""The learning curves of a run as one inline SVG, written here directly: no plotting library to
import (it took longer than the rest of the report), no display, no file, no font or script
fetched (the text is in the page's own sans-serif font)."""

from __future__ import annotations

import math
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
COLORS = ("#1f77b4", "#ff7f0e")  # a panel's first and second curve
PANEL = (307, 230)  # width, height of a panel in px
MARGIN = (52, 18, 26, 38)  # left, right, top, bottom: the plot area's margins in a panel


def curves_svg(run: RunData, panels_of: List[Tuple[str, Tuple[str, ...]]] = PANELS) -> str:
    """The ``<svg>`` element of the run's curves (those of ``panels_of``; "" when the run logged
    none): four panels a row, each with its title, its axes' ticks and grid, its curves (an eval
    curve with markers) and, with two curves, their legend."""
    panels = []
    for title, keys in panels_of:
        series = [(key, *_thin(*run.series(key))) for key in keys]
        series = [s for s in series if s[1]]
        if series:
            panels.append((title, series))
    if not panels:
        return ""
    cols = min(4, len(panels))
    width, height = cols * PANEL[0], -(-len(panels) // cols) * PANEL[1]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9">'
    ]
    for i, (title, series) in enumerate(panels):
        out += _panel((i % cols) * PANEL[0], (i // cols) * PANEL[1], title, series)
    return "\n".join(out + ["</svg>"])


def _panel(left: int, top: int, title: str, series: list) -> List[str]:
    """The elements of one panel whose top left corner is at (left, top)."""
    x0, x1 = left + MARGIN[0], left + PANEL[0] - MARGIN[1]
    y0, y1 = top + MARGIN[2], top + PANEL[1] - MARGIN[3]  # y0 the top of the plot area
    xt = _ticks([x for s in series for x in s[1]])
    yt = _ticks([y for s in series for y in s[2]])

    def px(x: float) -> float:
        return x0 + (x - xt[0]) / (xt[-1] - xt[0]) * (x1 - x0)

    def py(y: float) -> float:
        return y1 - (y - yt[0]) / (yt[-1] - yt[0]) * (y1 - y0)

    grid = "".join(f"M{px(x):.1f} {y0}V{y1}" for x in xt) + "".join(
        f"M{x0} {py(y):.1f}H{x1}" for y in yt
    )
    out = [
        f'<text x="{(x0 + x1) / 2}" y="{top + 16}" text-anchor="middle" font-size="13">'
        f"{title}</text>",
        f'<path d="{grid}" stroke="#b0b0b0" stroke-opacity="0.5" stroke-width="0.8"/>',
        f'<path d="M{x0} {y0}H{x1}V{y1}H{x0}Z" fill="none" stroke="#000" stroke-width="0.8"/>',
        f'<text x="{(x0 + x1) / 2}" y="{y1 + 32}" text-anchor="middle" font-size="11">'
        "env steps</text>",
    ]
    out += [
        f'<text x="{px(x):.1f}" y="{y1 + 12}" text-anchor="middle">{_label(x)}</text>' for x in xt
    ]
    out += [
        f'<text x="{x0 - 4}" y="{py(y) + 3:.1f}" text-anchor="end">{_label(y)}</text>' for y in yt
    ]
    for (key, steps, values), color in zip(series, COLORS):
        points = [(px(x), py(y)) for x, y in zip(steps, values)]
        line = "L".join(f"{x:.1f} {y:.1f}" for x, y in points)
        out.append(f'<path d="M{line}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        if key.startswith("eval/") or len(points) == 1:  # a lone point: its marker alone
            out += [
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in points
            ]
    if len(series) > 1:  # the legend, in the plot area's top right corner
        out.append(
            f'<rect x="{x1 - 84}" y="{y0 + 4}" width="80" height="{12 * len(series) + 6}" '
            'fill="#fff" fill-opacity="0.8" stroke="#ccc"/>'
        )
        for j, ((key, _, _), color) in enumerate(zip(series, COLORS)):
            y = y0 + 14 + 12 * j
            out.append(f'<path d="M{x1 - 80} {y - 3}h14" stroke="{color}" stroke-width="1.6"/>')
            out.append(f'<text x="{x1 - 62}" y="{y}">{key}</text>')
    return out


def _ticks(values: list) -> List[float]:
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


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _thin(steps: list, values: list) -> tuple:
    """At most about :data:`MAX_POINTS` of a series, evenly spaced, its last point kept."""
    k = -(-len(steps) // MAX_POINTS)
    if k <= 1:
        return steps, values
    idx = sorted({*range(0, len(steps), k), len(steps) - 1})
    return [steps[i] for i in idx], [values[i] for i in idx]
