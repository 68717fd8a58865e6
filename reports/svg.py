"""Inline SVG charts made in Python, so report.html needs no JavaScript, CDN or network.

One function, `chart`: lines or points, an optional right-hand axis, a shaded band (the
measured window). Gaps (None/NaN) break lines.

Layout rules, so a chart never hides its own data:
- the data are drawn inside the frame with a few pixels' margin (a series at its axis' maximum
  or at zero is not drawn on the frame's border), and the y axes end on a round tick above the
  data;
- the legend sits below the frame and the x-axis label, never over the data;
- every series has its own colour and dash; lines are drawn largest first, each one thinner
  than the one drawn before it, so a small series (errors at zero) or one equal to another
  (goodput = completed ok without an SLO) stays visible on top.
"""
from __future__ import annotations

import html
import math
from itertools import groupby

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DASHES = ("", "7,3", "2,2", "9,3,2,3", "4,4", "1,3")
WIDTHS = (3.2, 2.4, 1.8, 1.4, 1.2, 1.0)       # by draw order: the first drawn is the widest
W, L, R, T, PH = 600, 62, 62, 30, 200            # width, margins left/right/top, frame height
PAD = 6                                          # px between the frame and the data
LEG_ROW = 15


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    a = abs(v)
    if a < 1e-12:
        return "0"
    if a >= 1e6 or a < 1e-3:
        return f"{v:.1e}"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"


def _range(series: list[dict], key: str, zero: bool) -> tuple[float, float]:
    vals = [v for s in series for v in s[key] if v is not None and math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals + [0.0] if zero else vals), max(vals)
    return (lo, hi) if hi > lo else (lo, lo + (abs(lo) or 1.0))


def _nice(lo: float, hi: float, extra: int = 0) -> tuple[float, float]:
    """The range widened to whole tick steps, so the axis ends on a labelled tick. The right-hand
    axis gets `extra` steps more, so its maximum does not fall on the left one's (a preemption
    count at its peak drawn over the running requests at theirs)."""
    t = _ticks(lo, hi)
    step = t[1] - t[0] if len(t) > 1 else (hi - lo)
    return math.floor(lo / step + 1e-9) * step, (math.ceil(hi / step - 1e-9) + extra) * step


def _legend(series: list[dict], styles: list[dict], top: float, kind: str) -> tuple[list[str], int]:
    """Legend entries in rows below the plot; returns the SVG parts and the rows used."""
    out, x, row = ['<g class="legend">'], L, 0
    for s, st in zip(series, styles):
        label = html.escape(str(s["label"]))
        width = 30 + 6.2 * len(str(s["label"]))
        if x > L and x + width > W - 8:
            x, row = L, row + 1
        y = top + row * LEG_ROW
        if kind == "scatter":
            out.append(f'<circle cx="{x + 10}" cy="{y - 4}" r="3" fill="{st["color"]}"/>')
        elif kind == "bars":
            out.append(f'<rect x="{x + 4}" y="{y - 9}" width="12" height="10" fill="{st["color"]}"/>')
        else:
            dash = f' stroke-dasharray="{st["dash"]}"' if st["dash"] else ""
            out.append(f'<line x1="{x}" x2="{x + 20}" y1="{y - 4}" y2="{y - 4}" stroke="{st["color"]}" '
                       f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 24}" y="{y}" font-size="10">{label}</text>')
        x += width
    out.append("</g>")
    return out, row + 1


def _head(title: str, h: float) -> list[str]:
    """The <svg> element's opening: a white page and the title."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" '
            f'role="img" aria-label="{html.escape(title)}">',
            f'<rect x="0" y="0" width="{W}" height="{h}" fill="#fff"/>',
            f'<text x="{L}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>']


def _grid(t: float, y: float, pw: float) -> str:
    """A horizontal grid line at y and its tick label t on the left axis."""
    return (f'<line x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{L - 5}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_label(t)}</text>')


def _frame(pw: float, ph: float, xlabel: str, ylabel: str) -> list[str]:
    """The plot frame with the x-axis label below it and the y-axis label turned on its left."""
    return [f'<rect class="frame" x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#555"/>',
            f'<text x="{L + pw / 2}" y="{T + ph + 32}" font-size="11" text-anchor="middle">'
            f'{html.escape(xlabel)}</text>',
            *([f'<text x="14" y="{T + ph / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {T + ph / 2})">{html.escape(ylabel)}</text>'] if ylabel else [])]


def chart(series: list[dict], *, title: str, xlabel: str, ylabel: str, y2label: str | None = None,
          kind: str = "line", band: tuple[float, float] | None = None, logx: bool = False,
          xlim: tuple[float, float] | None = None) -> str:
    """series: dicts with label, x, y, optional axis (1 or 2), color and dash. Returns an <svg>.
    With logx, x is drawn on a log10 scale (non-positive x are left out). xlim fixes the x range
    (points outside it are left out)."""
    if logx:
        series = [dict(s, x=[math.log10(x) if x is not None and x > 0 else None for x in s["x"]])
                  for s in series]
    s1, s2 = ([s for s in series if s.get("axis", 1) == axis] for axis in (1, 2))
    x0, x1 = xlim if xlim else _range(series, "x", zero=False)
    ranges = {1: _nice(*_range(s1, "y", zero=True)), 2: _nice(*_range(s2, "y", zero=True), extra=1)}
    pw, ph = W - L - R, PH

    def sx(x: float) -> float:
        return L + PAD + (x - x0) / (x1 - x0) * (pw - 2 * PAD)

    def sy(y: float, axis: int = 1) -> float:
        lo, hi = ranges[axis]
        return T + ph - PAD - (y - lo) / (hi - lo) * (ph - 2 * PAD)

    def inside(x, y) -> bool:
        return x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x0 <= x <= x1

    # Styles follow the caller's order (legend order); draw order puts the largest first.
    styles = [{"color": s.get("color") or PALETTE[i % len(PALETTE)],
               "dash": {1: "5,3"}.get(s.get("dash"), s.get("dash")) if s.get("dash") else DASHES[i % len(DASHES)]}
              for i, s in enumerate(series)]
    seen = set()
    for st in styles:                       # two series never look alike
        while (st["color"], st["dash"]) in seen:
            st["dash"] = DASHES[(DASHES.index(st["dash"]) + 1) % len(DASHES)] if st["dash"] in DASHES else ""
        seen.add((st["color"], st["dash"]))

    def size(s: dict) -> float:
        lo, hi = ranges[s.get("axis", 1)]
        ys = [y for x, y in zip(s["x"], s["y"]) if inside(x, y)]
        return sum((y - lo) / (hi - lo) for y in ys) / len(ys) if ys else 0.0
    order = sorted(range(len(series)), key=lambda i: -size(series[i]))

    leg_top = T + ph + 44
    legend, rows = _legend(series, styles, leg_top, kind)
    h = leg_top + rows * LEG_ROW
    out = _head(title, h)
    if band and all(v is not None for v in band):
        a, b = max(sx(band[0]), L), min(sx(band[1]), L + pw)
        if b > a:
            out.append(f'<rect class="band" x="{a:.1f}" y="{T}" width="{b - a:.1f}" height="{ph}" fill="#eef5ff"/>')
    out += [_grid(t, sy(t), pw) for t in _ticks(*ranges[1])]
    out += [f'<text x="{L + pw + 5}" y="{sy(t, 2) + 4:.1f}" font-size="10">{_label(t)}</text>'
            for t in (_ticks(*ranges[2]) if s2 else [])]
    xticks = [float(t) for t in range(math.ceil(x0), math.floor(x1) + 1)] if logx else _ticks(x0, x1, 6)
    out += [f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{T + ph}" y2="{T + ph + 4}" stroke="#555"/>'
            f'<text x="{sx(t):.1f}" y="{T + ph + 16}" font-size="10" text-anchor="middle">'
            f'{_label(10 ** t if logx else t)}</text>' for t in xticks]
    out += _frame(pw, ph, xlabel, ylabel)
    if y2label and s2:
        out.append(f'<text x="{W - 10}" y="{T + ph / 2}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(90 {W - 10} {T + ph / 2})">{html.escape(y2label)}</text>')
    for rank, i in enumerate(order):
        s, st = series[i], styles[i]
        axis, label = s.get("axis", 1), html.escape(str(s["label"]))
        pts = list(zip(s["x"], s["y"]))
        if kind == "scatter":
            r = 2.6 if len(pts) < 500 else 1.8          # a few dots can be bigger than a cloud
            out.append(f'<g class="series" data-label="{label}" fill="{st["color"]}" fill-opacity="0.5">' + "".join(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y, axis):.1f}" r="{r}"/>' for x, y in pts if inside(x, y))
                + "</g>")
            continue
        segs = [[(sx(x), sy(y, axis)) for x, y in run]      # runs of consecutive drawable points
                for drawable, run in groupby(pts, key=lambda p: inside(*p)) if drawable]
        d = " ".join("M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in seg) for seg in segs if len(seg) > 1)
        dash = f' stroke-dasharray="{st["dash"]}"' if st["dash"] else ""
        width = WIDTHS[min(rank, len(WIDTHS) - 1)]
        out.append(f'<path class="series" data-label="{label}" d="{d}" fill="none" '
                   f'stroke="{st["color"]}" stroke-width="{width}"{dash} stroke-linejoin="round"/>')
        # A point between two gaps has no line to be part of: a dot shows it.
        out += [f'<circle class="series" data-label="{label}" cx="{seg[0][0]:.1f}" cy="{seg[0][1]:.1f}" '
                f'r="2.2" fill="{st["color"]}"/>' for seg in segs if len(seg) == 1]
    out += legend
    out.append("</svg>")
    return "".join(out)


def bars(categories: list[str], stacks: list[dict], *, title: str, xlabel: str, ylabel: str,
         height: int = PH, ticks: bool = True) -> str:
    """Stacked bars, one per category; stacks: dicts with label, values (one per category; None
    or NaN: nothing drawn) and optional color, drawn bottom-up in order. With a small `height` and
    no `ticks`, one unit-high stack per category gives a coloured strip (a label per category)."""
    tot = [sum(v for v in vals if v is not None and math.isfinite(v)) for vals in
           zip(*[s["values"] for s in stacks])] if stacks else []
    lo, hi = _nice(0.0, max(tot or [1.0]) or 1.0) if ticks else (0.0, 1.0)
    pw, n = W - L - R, max(len(categories), 1)
    bw = pw / n

    def sy(y: float) -> float:
        return T + height - (y - lo) / (hi - lo) * height
    styles = [{"color": s.get("color") or PALETTE[i % len(PALETTE)], "dash": ""} for i, s in enumerate(stacks)]
    leg_top = T + height + 44
    legend, rows = _legend(stacks, styles, leg_top, "bars")
    h = leg_top + rows * LEG_ROW
    out = _head(title, h) + [_grid(t, sy(t), pw) for t in (_ticks(lo, hi) if ticks else [])]
    base = [0.0] * n
    for s, st in zip(stacks, styles):
        label = html.escape(str(s["label"]))
        rects = []
        for i, v in enumerate(s["values"]):
            if v is None or not math.isfinite(v) or v <= 0:
                continue
            y0, y1 = sy(base[i]), sy(base[i] + v)
            gap = 0.1 if ticks else 0.0       # a strip is continuous
            rects.append(f'<rect x="{L + i * bw + bw * gap:.1f}" y="{y1:.1f}" width="{bw * (1 - 2 * gap):.1f}" '
                         f'height="{y0 - y1:.1f}"/>')
            base[i] += v
        out.append(f'<g class="series" data-label="{label}" fill="{st["color"]}">' + "".join(rects) + "</g>")
    every = math.ceil(n / 12)          # at most a dozen category labels, so they never overlap
    for i, c in enumerate(categories):
        if i % every == 0:
            out.append(f'<text x="{L + (i + 0.5) * bw:.1f}" y="{T + height + 16}" font-size="10" '
                       f'text-anchor="middle">{html.escape(str(c))}</text>')
    return "".join(out + _frame(pw, height, xlabel, ylabel) + legend + ["</svg>"])
