"""Inline SVG charts made in Python, so report.html needs no JavaScript, CDN or network.

One function, `chart`: lines or points, an optional right-hand axis, a shaded band (the
measured window). Gaps (None/NaN) break lines.
"""
from __future__ import annotations

import html
import math

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H, L, R, T, B = 600, 280, 62, 62, 30, 42


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.1e}"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"


def _finite(vals) -> list[float]:
    return [v for v in vals if v is not None and math.isfinite(v)]


def _range(series: list[dict], key: str, zero: bool) -> tuple[float, float]:
    vals = [v for s in series for v in _finite(s[key])]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if zero:
        lo = min(lo, 0.0)
    return (lo, hi) if hi > lo else (lo, lo + (abs(lo) or 1.0))


def chart(series: list[dict], *, title: str, xlabel: str, ylabel: str, y2label: str | None = None,
          kind: str = "line", band: tuple[float, float] | None = None, logx: bool = False) -> str:
    """series: dicts with label, x, y, optional axis (1 or 2) and dash. Returns an <svg> string.
    With logx, x is drawn on a log10 scale (non-positive x are left out)."""
    if logx:
        series = [dict(s, x=[math.log10(x) if x is not None and x > 0 else None for x in s["x"]])
                  for s in series]
    s1 = [s for s in series if s.get("axis", 1) == 1]
    s2 = [s for s in series if s.get("axis", 1) == 2]
    x0, x1 = _range(series, "x", zero=False)
    ranges = {1: _range(s1, "y", zero=True), 2: _range(s2, "y", zero=True)}
    pw, ph = W - L - R, H - T - B

    def sx(x: float) -> float:
        return L + (x - x0) / (x1 - x0) * pw

    def sy(y: float, axis: int = 1) -> float:
        lo, hi = ranges[axis]
        return T + ph - (y - lo) / (hi - lo) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>',
           f'<text x="{L}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    if band and all(v is not None for v in band):
        a, b = max(sx(band[0]), L), min(sx(band[1]), L + pw)
        if b > a:
            out.append(f'<rect x="{a:.1f}" y="{T}" width="{b - a:.1f}" height="{ph}" fill="#eef5ff"/>')
    for t in _ticks(*ranges[1]):
        y = sy(t)
        out.append(f'<line x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{L - 5}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_label(t)}</text>')
    if s2:
        for t in _ticks(*ranges[2]):
            out.append(f'<text x="{L + pw + 5}" y="{sy(t, 2) + 4:.1f}" font-size="10">{_label(t)}</text>')
    xticks = [float(t) for t in range(math.ceil(x0), math.floor(x1) + 1)] if logx else _ticks(x0, x1, 6)
    for t in xticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{T + ph}" y2="{T + ph + 4}" stroke="#555"/>'
                   f'<text x="{x:.1f}" y="{T + ph + 16}" font-size="10" text-anchor="middle">'
                   f'{_label(10 ** t if logx else t)}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#555"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 6}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{T + ph / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {T + ph / 2})">{html.escape(ylabel)}</text>')
    if y2label and s2:
        out.append(f'<text x="{W - 10}" y="{T + ph / 2}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(90 {W - 10} {T + ph / 2})">{html.escape(y2label)}</text>')
    for i, s in enumerate(series):
        color, axis = s.get("color") or PALETTE[i % len(PALETTE)], s.get("axis", 1)
        pts = [(x, y) for x, y in zip(s["x"], s["y"])]
        if kind == "scatter":
            out.append(f'<g fill="{color}" fill-opacity="0.45">' + "".join(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y, axis):.1f}" r="1.8"/>' for x, y in pts
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)) + "</g>")
        else:
            d, pen = [], "M"
            for x, y in pts:
                if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                    pen = "M"
                    continue
                d.append(f"{pen}{sx(x):.1f},{sy(y, axis):.1f}")
                pen = "L"
            dash = ' stroke-dasharray="5,3"' if s.get("dash") else ""
            out.append(f'<path d="{" ".join(d)}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
        lx = L + 8 + (i % 3) * 170
        ly = T + 14 + (i // 3) * 14
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{ly - 3}" font-size="10">{html.escape(str(s["label"]))}</text>')
    out.append("</svg>")
    return "".join(out)
