"""Small inline-SVG charts for the HTML report: a scatter, a bar histogram and a per-row timeline.

No JavaScript and no external library: each function returns one ``<svg>`` element as text, with ``<title>``
tooltips on marks, so the report opens from disk and prints. Coordinates are rounded to keep the output stable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["PALETTE", "Axis", "Point", "Series", "bars", "scatter", "timeline"]

PALETTE = ("#2563eb", "#d97706", "#059669", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9333ea")
BAD = "#dc2626"
W, H = 640, 320
ML, MR, MT, MB = 78, 20, 16, 52  # margins: left (y tick labels), right, top, bottom (x tick labels + title)


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    tip: str
    bad: bool = False


@dataclass(frozen=True)
class Series:
    """A named set of points; ``mark`` is ``dot`` (filled circle) or ``dash`` (a short horizontal bar)."""

    name: str
    points: tuple[Point, ...]
    color: str
    mark: str = "dot"


@dataclass(frozen=True)
class Axis:
    """A linear or log2 axis from `lo` to `hi` with a tick label formatter."""

    lo: float
    hi: float
    log: bool
    fmt: Callable[[float], str]

    @classmethod
    def fit(cls, values: Sequence[float], fmt: Callable[[float], str], *, zero: bool = True) -> Axis:
        pos = [v for v in values if v > 0]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        # log when the data spans more than 2^8: a linear axis would crush the small shapes into one pixel
        if pos and len(pos) == len(values) and max(pos) / min(pos) > 256:
            # one power of two of headroom above the largest value, so a mark never sits on the frame
            return cls(2 ** math.floor(math.log2(min(pos))), 2 ** (math.floor(math.log2(max(pos))) + 1), True, fmt)
        lo = min(0.0, lo) if zero else lo
        if hi <= lo:
            hi = lo + 1
        step = _nice_step((hi - lo) / 5)
        return cls(math.floor(lo / step) * step, math.ceil(hi / step) * step, False, fmt)

    def frac(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            span = max(1e-12, math.log2(self.hi) - math.log2(self.lo))
            return float((math.log2(v) - math.log2(self.lo)) / span)
        return float((v - self.lo) / (self.hi - self.lo))

    def ticks(self) -> list[float]:
        if self.log:
            a, b = round(math.log2(self.lo)), round(math.log2(self.hi))
            stride = max(1, math.ceil((b - a) / 6))
            return [2.0**k for k in range(a, b + 1, stride)]
        step = _nice_step((self.hi - self.lo) / 5)
        n = round((self.hi - self.lo) / step)
        return [self.lo + i * step for i in range(n + 1)]


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _r(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _frame(
    svg_id: str, label: str, x: Axis | None, y: Axis, x_title: str, y_title: str, size: tuple[int, int]
) -> list[str]:
    """The plot area, grid lines, tick labels and axis titles; `x` None draws no x ticks (categorical axis)."""
    W, H = size
    pw, ph = W - ML - MR, H - MT - MB
    out = [
        f'<svg id="{escape(svg_id)}" class="plot" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="11">',
        f"<title>{escape(label)}</title>",
        f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot-bg"/>',
    ]
    for t in y.ticks():
        py = MT + ph * (1 - y.frac(t))
        out.append(f'<line x1="{ML}" x2="{ML + pw}" y1="{_r(py)}" y2="{_r(py)}" class="grid"/>')
        out.append(f'<text x="{ML - 6}" y="{_r(py + 4)}" text-anchor="end" class="tick">{escape(y.fmt(t))}</text>')
    for t in x.ticks() if x is not None else []:
        assert x is not None  # for the type checker: the loop is empty without an x axis
        px = ML + pw * x.frac(t)
        out.append(f'<line x1="{_r(px)}" x2="{_r(px)}" y1="{MT}" y2="{MT + ph}" class="grid"/>')
        out.append(f'<text x="{_r(px)}" y="{MT + ph + 16}" text-anchor="middle" class="tick">{escape(x.fmt(t))}</text>')
    out.append(
        f'<text x="{ML + pw / 2:.0f}" y="{H - 10}" text-anchor="middle" class="axis-title">{escape(x_title)}</text>'
    )
    out.append(
        f'<text transform="translate(14 {MT + ph / 2:.0f}) rotate(-90)" text-anchor="middle" class="axis-title">'
        f"{escape(y_title)}</text>"
    )
    return out


def scatter(
    svg_id: str,
    label: str,
    series: Sequence[Series],
    *,
    x_fmt: Callable[[float], str],
    y_fmt: Callable[[float], str],
    x_title: str,
    y_title: str,
    size: tuple[int, int] = (W, H),
) -> str:
    """A scatter of every series on shared axes (log2 where the data spans orders of magnitude)."""
    xs = [p.x for s in series for p in s.points]
    ys = [p.y for s in series for p in s.points]
    x, y = Axis.fit(xs, x_fmt), Axis.fit(ys, y_fmt)
    pw, ph = size[0] - ML - MR, size[1] - MT - MB
    out = _frame(svg_id, label, x, y, x_title, y_title, size)
    for s in series:
        out.append(f'<g class="series" data-series="{escape(s.name)}">')
        for p in s.points:
            px, py = ML + pw * x.frac(p.x), MT + ph * (1 - y.frac(p.y))
            color = BAD if p.bad else s.color
            if s.mark == "dash":
                out.append(
                    f'<line x1="{_r(px - 5)}" x2="{_r(px + 5)}" y1="{_r(py)}" y2="{_r(py)}" stroke="{color}" '
                    f'stroke-width="2" class="mark"><title>{escape(p.tip)}</title></line>'
                )
            else:
                ring = f' stroke="{BAD}" stroke-width="2.5"' if p.bad else ' stroke="#fff" stroke-width="0.6"'
                out.append(
                    f'<circle cx="{_r(px)}" cy="{_r(py)}" r="{4.5 if p.bad else 3.2}" fill="{color}"{ring} '
                    f'fill-opacity="0.8" class="mark"><title>{escape(p.tip)}</title></circle>'
                )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def bars(
    svg_id: str,
    label: str,
    data: Sequence[tuple[str, int]],
    *,
    x_title: str,
    y_title: str,
    color: str = PALETTE[0],
    tip: Callable[[str, int], str] | None = None,
    size: tuple[int, int] = (W, H),
) -> str:
    """A bar histogram of (category, count), categories in the given order, counts written above the bars."""
    # counts read best on a linear axis from zero, even when skewed
    hi = float(max((v for _, v in data), default=1) or 1)
    step = max(1.0, _nice_step(hi / 5))
    y = Axis(0.0, math.ceil(hi / step) * step, False, lambda v: f"{v:g}")
    pw, ph = size[0] - ML - MR, size[1] - MT - MB
    out = _frame(svg_id, label, None, y, x_title, y_title, size)
    n = max(1, len(data))
    slot = pw / n
    bw = max(2.0, min(48.0, slot * 0.8))
    every = max(1, math.ceil(n / 16))  # at most ~16 category labels
    for i, (cat, v) in enumerate(data):
        cx = ML + slot * (i + 0.5)
        top = MT + ph * (1 - y.frac(v))
        text = tip(cat, v) if tip else f"{cat}: {v}"
        out.append(
            f'<rect x="{_r(cx - bw / 2)}" y="{_r(top)}" width="{_r(bw)}" height="{_r(MT + ph - top)}" fill="{color}" '
            f'class="bar"><title>{escape(text)}</title></rect>'
        )
        if v and n <= 24:
            out.append(f'<text x="{_r(cx)}" y="{_r(top - 3)}" text-anchor="middle" class="count">{v}</text>')
        if i % every == 0:
            out.append(f'<text x="{_r(cx)}" y="{MT + ph + 16}" text-anchor="middle" class="tick">{escape(cat)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def timeline(
    svg_id: str,
    label: str,
    rows: Sequence[tuple[str, str, str, float | None, Sequence[float]]],
    t_max: float,
    *,
    t_fmt: Callable[[float], str],
    width: int = W,
) -> str:
    """One row per check: a tick per step that raised it and a large marker at the first (time to first finding).

    `rows` are (key, label, colour, first time or None, all times); the key goes into ``data-key``.
    """
    row_h = 30
    top, left, right, bottom = 12, 230, 120, 40
    h = top + row_h * max(1, len(rows)) + bottom
    pw = width - left - right
    x = Axis.fit([0.0, max(t_max, 1e-9)], t_fmt)
    out = [
        f'<svg id="{escape(svg_id)}" class="plot" viewBox="0 0 {width} {h}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="11">',
        f"<title>{escape(label)}</title>",
    ]
    for t in x.ticks():
        px = left + pw * x.frac(t)
        out.append(f'<line x1="{_r(px)}" x2="{_r(px)}" y1="{top}" y2="{h - bottom}" class="grid"/>')
        out.append(
            f'<text x="{_r(px)}" y="{h - bottom + 16}" text-anchor="middle" class="tick">{escape(t_fmt(t))}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2:.0f}" y="{h - 8}" text-anchor="middle" class="axis-title">time into the run</text>'
    )
    for i, (key, name, color, first, times) in enumerate(rows):
        cy = top + row_h * i + row_h / 2
        out.append(f'<g class="row" data-key="{escape(key)}">')
        out.append(f'<text x="{left - 10}" y="{_r(cy + 4)}" text-anchor="end" class="row-label">{escape(name)}</text>')
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{_r(cy)}" y2="{_r(cy)}" class="lane"/>')
        for t in times:
            px = left + pw * x.frac(t)
            out.append(
                f'<line x1="{_r(px)}" x2="{_r(px)}" y1="{_r(cy - 7)}" y2="{_r(cy + 7)}" stroke="{color}" '
                f'stroke-opacity="0.45" stroke-width="1.5"><title>{escape(f"{name} at {t_fmt(t)}")}</title></line>'
            )
        if first is None:
            note = (
                "no sampled step for it (a crash or hang ends a step before it is sampled; static findings have none)"
            )
            out.append(f'<text x="{left + 6}" y="{_r(cy + 4)}" class="note">{note}</text>')
        else:
            px = left + pw * x.frac(first)
            out.append(
                f'<path d="M{_r(px)} {_r(cy - 8)} L{_r(px + 8)} {_r(cy)} L{_r(px)} {_r(cy + 8)} '
                f'L{_r(px - 8)} {_r(cy)} Z" '
                f'fill="{color}" stroke="#fff" class="first"><title>{escape(f"first {name} at {t_fmt(first)}")}'
                "</title></path>"
            )
            out.append(
                f'<text x="{left + pw + 8}" y="{_r(cy + 4)}" class="first-label">first {escape(t_fmt(first))}'
                f" · {len(times)}×</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
