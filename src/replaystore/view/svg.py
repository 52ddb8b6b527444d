"""Charts as inline SVG strings, built by hand (no plotting library, no JavaScript).

Every label is XML-escaped, so text from a store (website names, task names)
cannot inject markup into the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["bar_chart", "histogram"]

_W, _H = 520, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 26, 54


def _frame(title: str, y_max: float, y_fmt: str) -> list[str]:
    plot_h = _H - _TOP - _BOTTOM
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<text x="{_W / 2}" y="16" text-anchor="middle" class="chart-title">'
        f"{escape(title)}</text>",
    ]
    for frac in (0.0, 0.5, 1.0):
        y = _TOP + plot_h * (1 - frac)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{escape(format(y_max * frac, y_fmt))}</text>"
        )
    return parts


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    *,
    y_max: float | None = None,
    value_fmt: str = ".0%",
    notes: Sequence[str] | None = None,
) -> str:
    """A vertical bar chart: one bar per label.

    Args:
        labels: bar names (drawn under the bars, rotated when there are many).
        values: bar heights (finite; NaN draws no bar and the label "-").
        title: drawn above the chart and as its accessible title.
        y_max: top of the axis (default: the largest value, at least 1e-9).
        value_fmt: ``format`` spec of the value written on each bar and the axis.
        notes: optional text per bar appended to its tooltip (e.g. ``"12 of 30"``).

    Returns:
        An ``<svg>`` element as a string (520 x 220 user units).

    Raises:
        ValueError: ``labels`` and ``values`` differ in length.
    """
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    vals = np.asarray(values, dtype=float)
    finite = vals[np.isfinite(vals)]
    top = float(y_max) if y_max is not None else float(finite.max()) if finite.size else 1.0
    top = max(top, 1e-9)
    parts = _frame(title, top, value_fmt)
    n = max(len(labels), 1)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / n
    rotate = n > 6
    for i, (label, v) in enumerate(zip(labels, vals.tolist(), strict=True)):
        x = _LEFT + i * slot
        cx = x + slot / 2
        note = f" ({notes[i]})" if notes else ""
        shown = "-" if not np.isfinite(v) else format(v, value_fmt)
        if np.isfinite(v):
            h = plot_h * min(max(v / top, 0.0), 1.0)
            y = _TOP + plot_h - h
            parts.append(
                f'<rect x="{x + slot * 0.15:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{h:.1f}" class="bar"><title>{escape(str(label))}: {shown}'
                f"{escape(note)}</title></rect>"
            )
            parts.append(
                f'<text x="{cx:.1f}" y="{y - 3:.1f}" text-anchor="middle" class="value">'
                f"{escape(shown)}</text>"
            )
        ly = _TOP + plot_h + 14
        text = escape(str(label)[:18])
        if rotate:
            parts.append(
                f'<text x="{cx:.1f}" y="{ly:.1f}" text-anchor="end" class="tick" '
                f'transform="rotate(-35 {cx:.1f} {ly:.1f})">{text}</text>'
            )
        else:
            parts.append(
                f'<text x="{cx:.1f}" y="{ly:.1f}" text-anchor="middle" class="tick">{text}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def histogram(values: ArrayLike, title: str, *, bins: int = 30) -> str:
    """A histogram of ``values`` (NaN and infinities are left out and counted in the title).

    Cost: one ``numpy.histogram`` pass, O(n); the SVG has ``bins`` rectangles.

    Returns:
        An ``<svg>`` element as a string; for no finite value, a chart saying so.
    """
    data = np.asarray(values, dtype=float).ravel()
    finite = data[np.isfinite(data)]
    dropped = int(data.size - finite.size)
    suffix = f" ({finite.size:,} values" + (f", {dropped:,} not finite)" if dropped else ")")
    if finite.size == 0:
        parts = _frame(title + " (no finite values)", 1.0, ".0f")
        parts.append("</svg>")
        return "".join(parts)
    lo, hi = float(finite.min()), float(finite.max())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(finite, bins=int(bins), range=(lo, hi))
    top = float(counts.max())
    parts = _frame(title + suffix, top, ",.0f")
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    width = plot_w / counts.size
    for i, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        h = plot_h * c / top
        parts.append(
            f'<rect x="{_LEFT + i * width:.1f}" y="{_TOP + plot_h - h:.1f}" '
            f'width="{max(width - 1, 0.5):.1f}" height="{h:.1f}" class="bar">'
            f"<title>[{edges[i]:.4g}, {edges[i + 1]:.4g}): {c:,}</title></rect>"
        )
    y = _TOP + plot_h + 14
    parts.append(f'<text x="{_LEFT}" y="{y}" text-anchor="start" class="tick">{lo:.4g}</text>')
    parts.append(f'<text x="{_W - _RIGHT}" y="{y}" text-anchor="end" class="tick">{hi:.4g}</text>')
    parts.append("</svg>")
    return "".join(parts)
