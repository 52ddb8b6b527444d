"""Charts as inline SVG strings, built by hand (no plotting library, no JavaScript).

Every label is XML-escaped, so text from a store (website names, task names)
cannot inject markup into the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["bar_chart", "histogram", "line_chart", "short_labels"]

_W, _H = 520, 230
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 36, 54


#: Extra room under the plot for labels drawn upright (read bottom to top), and their
#: longest length: a label wider than its bar's slot is turned, so that none overlaps.
_SLANT_ROOM, _MAX_LABEL = 110, 24


def _frame(title: str, y_max: float, y_fmt: str, extra_bottom: int = 0) -> list[str]:
    plot_h = _H - _TOP - _BOTTOM
    height = _H + extra_bottom
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {_W} {height}" width="{_W}" '
        f'height="{height}" '
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
        labels: bar names (drawn under the bars; turned upright when one is wider than
            its bar's slot, so that labels never overlap; cut in the middle past 24
            characters).
        values: bar heights (finite; NaN draws no bar and the label "-").
        title: drawn above the chart and as its accessible title.
        y_max: top of the axis (default: the largest value, at least 1e-9).
        value_fmt: ``format`` spec of the value written on each bar and the axis.
        notes: optional text per bar appended to its tooltip (e.g. ``"12 of 30"``).

    Returns:
        An ``<svg>`` element as a string (520 x 230 user units; taller when its labels are turned).

    Raises:
        ValueError: ``labels`` and ``values`` differ in length.
    """
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    vals = np.asarray(values, dtype=float)
    finite = vals[np.isfinite(vals)]
    top = float(y_max) if y_max is not None else float(finite.max()) if finite.size else 1.0
    top = max(top, 1e-9)
    n = max(len(labels), 1)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / n
    rotate = _upright(labels, slot)
    parts = _frame(title, top, value_fmt, _SLANT_ROOM if rotate else 0)
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
        text = escape(_clip(str(label)))
        parts.append(_x_label(cx, ly, text, rotate))
    parts.append("</svg>")
    return "".join(parts)


def _upright(labels: Sequence[str], slot: float) -> bool:
    """Whether x labels must be turned upright: the widest (about 6.2 units a character at
    the tick font, cut at :data:`_MAX_LABEL`) is wider than a slot."""
    widest = max((len(_clip(str(label))) for label in labels), default=0)
    return widest * 6.2 > slot


def _x_label(cx: float, y: float, text: str, upright: bool) -> str:
    """An x-axis label (already escaped) centred at ``cx``; ``upright``: turned to read
    bottom to top, its end at the axis, so that labels a slot apart never overlap."""
    if upright:
        return (
            f'<text x="{cx + 4:.1f}" y="{y - 8:.1f}" text-anchor="end" class="tick" '
            f'transform="rotate(-90 {cx + 4:.1f} {y - 8:.1f})">{text}</text>'
        )
    return f'<text x="{cx:.1f}" y="{y:.1f}" text-anchor="middle" class="tick">{text}</text>'


def _clip(label: str, limit: int = _MAX_LABEL) -> str:
    """``label`` cut in its middle (``…``) when longer than ``limit``: both ends stay."""
    if len(label) <= limit:
        return label
    keep = limit - 1
    return label[: keep // 2] + "\u2026" + label[len(label) - (keep - keep // 2) :]


def short_labels(labels: Sequence[str]) -> tuple[list[str], str]:
    """Labels without the ``/``-ended prefix they all share (and the prefix).

    ``["127.0.0.1/miniwob/click-button.html", "127.0.0.1/miniwob/enter-text.html"]``
    gives ``["click-button.html", "enter-text.html"]`` and ``"127.0.0.1/miniwob/"``:
    the part that tells them apart is what a narrow axis shows. One label, or labels
    sharing no such prefix, are returned as they are (and ``""``).
    """
    texts = [str(label) for label in labels]
    if len(texts) < 2:
        return texts, ""
    common = texts[0]
    for text in texts[1:]:
        while not text.startswith(common):
            common = common[:-1]
    common = common[: common.rfind("/") + 1]
    if not common or any(len(text) == len(common) for text in texts):
        return texts, ""
    return [text[len(common) :] for text in texts], common


def line_chart(
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    title: str,
    *,
    y_max: float = 1.0,
    value_fmt: str = ".0%",
    reference: tuple[str, float] | None = None,
) -> str:
    """Lines over labelled points: the first series thick (with its values written),
    the others thin, and a legend under the axis.

    Args:
        labels: the x positions' names, in order.
        series: ``(name, values)`` pairs, each with one value per label (NaN: no point).
        title: drawn above the chart and as its accessible title.
        y_max: top of the axis.
        value_fmt: ``format`` spec of the axis and of the first series' values.
        reference: ``(name, value)`` drawn as a dashed horizontal line (e.g. a baseline).

    Raises:
        ValueError: a series has not one value per label.
    """
    for name, values in series:
        if len(values) != len(labels):
            raise ValueError(f"series {name!r}: {len(values)} values for {len(labels)} labels")
    n = max(len(labels), 1)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / n
    rotate = _upright(labels, slot)
    legend = [name for name, _ in series] + ([reference[0]] if reference else [])
    legend_rows = (len(legend) + 3) // 4
    extra = (_SLANT_ROOM if rotate else 0) + 16 * legend_rows
    parts = _frame(title, y_max, value_fmt, extra)
    top = max(float(y_max), 1e-9)

    def y_of(value: float) -> float:
        return _TOP + plot_h * (1 - min(max(value / top, 0.0), 1.0))

    if reference is not None:
        y = y_of(reference[1])
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            f'class="reference"><title>{escape(reference[0])}: '
            f"{escape(format(reference[1], value_fmt))}</title></line>"
        )
    for k, (name, values) in enumerate(series):
        points = [
            (_LEFT + (i + 0.5) * slot, y_of(v), v)
            for i, v in enumerate(np.asarray(values, dtype=float).tolist())
            if np.isfinite(v)
        ]
        css = "line-main" if k == 0 else f"line line-{k % 8}"
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
            parts.append(f'<polyline points="{path}" class="{css}"/>')
        for x, y, v in points:
            shown = format(v, value_fmt)
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3 if k == 0 else 2}" class="{css}">'
                f"<title>{escape(name)}: {escape(shown)}</title></circle>"
            )
            if k == 0:
                parts.append(
                    f'<text x="{x:.1f}" y="{y - 6:.1f}" text-anchor="middle" class="value">'
                    f"{escape(shown)}</text>"
                )
    ly = _TOP + plot_h + 14
    for i, label in enumerate(labels):
        cx = _LEFT + (i + 0.5) * slot
        text = escape(_clip(str(label)))
        parts.append(_x_label(cx, ly, text, rotate))
    legend_top = _H + (_SLANT_ROOM if rotate else 0) - 4
    for i, name in enumerate(legend):
        x = _LEFT + (i % 4) * (plot_w / 4)
        y = legend_top + 16 * (i // 4)
        if reference is not None and i == len(legend) - 1:
            css = "reference"
        else:
            css = "line-main" if i == 0 else f"line line-{i % 8}"
        parts.append(
            f'<line x1="{x:.1f}" x2="{x + 14:.1f}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" '
            f'class="{css} legend-key"/><text x="{x + 18:.1f}" y="{y:.1f}" class="tick legend">'
            f"{escape(_clip(name, 20))}</text>"
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
