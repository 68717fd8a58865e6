"""`replay trace compare A B`: realism statistics of two traces side by side, with a verdict
per metric against a tolerance (relative for rates, dispersion and lengths; absolute for
correlations, shares and hit ratios). The statistics come from `traces.stats`. A trace
without a `model` column counts as one model, the same as any single label on the other side.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np

from . import stats

# metric family -> (kind, tolerance): "rel" compares |b - a| / |a|, "abs" compares |b - a|
TOLERANCES = {
    "mean_rate": ("rel", 0.02),
    "interarrival_cv": ("rel", 0.10),
    "idc": ("rel", 0.20),
    "length": ("rel", 0.10),
    "spearman": ("abs", 0.10),
    "model_share": ("abs", 0.02),
    "prefix_hit": ("abs", 0.05),
    "image_share": ("abs", 0.02),
    "image_mean": ("rel", 0.10),
    "reuse_distance": ("rel", 0.25),
    "turns": ("rel", 0.10),
    "turn_gap": ("rel", 0.20),
}
LONG_IDC_S = 600.0        # IDC at 600 s: shown when both traces span 4 windows of it, judged
LONG_IDC_WINDOWS = 4      # only from 20 (the variance of 4-19 counts is too noisy: a Poisson
LONG_IDC_JUDGED = 20      # stream's own IDC estimate varies by sqrt(2 / (windows - 1)), 33% at 19)
MIN_COUNT_SHARE = 0.01    # image counts this rare in both traces get no row of their own


def _image_rows(ia: dict[str, Any] | None, ib: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The image-count distribution: share of requests with images, mean images per request,
    and the share of each count (0, 1, 2, ...) that holds >= 1% of either trace. A trace
    without `num_images` sends no images: it compares as all zeros."""
    none = {"share_with_images": 0.0, "mean_images": 0.0, "count_histogram": {"0": 1}}
    ia, ib = ia or none, ib or none
    rows = [_row("images.share_with_images", "image_share", ia["share_with_images"], ib["share_with_images"]),
            _row("images.mean_per_request", "image_mean", ia["mean_images"], ib["mean_images"])]
    sa, sb = ({int(k): v / max(sum(h.values()), 1) for k, v in h.items()}
              for h in (ia["count_histogram"], ib["count_histogram"]))
    for k in sorted(set(sa) | set(sb)):
        if max(sa.get(k, 0.0), sb.get(k, 0.0)) >= MIN_COUNT_SHARE:
            rows.append(_row(f"images.count_share.{k}", "image_share", sa.get(k, 0.0), sb.get(k, 0.0)))
    return rows


def _turn_rows(a: Any, b: Any) -> list[dict[str, Any]]:
    """Turns per conversation (mean, p90) and the gap between turns (p50). Both sides use
    `session_id` when both have it, else conversations inferred from `hash_ids` on both (so
    a Mooncake trace compares with its fitted copy, which has sessions)."""
    both_blocks = all("hash_ids" in stats._tbl(x).column_names for x in (a, b))
    source = "hash_ids" if both_blocks and not (stats.has_sessions(a) and stats.has_sessions(b)) else None
    ta, tb = (stats.turn_stats(x, _block_size(x), source) for x in (a, b))
    if not ta and not tb:
        return []
    ta, tb = ta or {"turns": {}, "gap_s": {}}, tb or {"turns": {}, "gap_s": {}}
    return [_row("turns_per_session.mean", "turns", ta["turns"].get("mean"), tb["turns"].get("mean")),
            _row("turns_per_session.p90", "turns", ta["turns"].get("p90"), tb["turns"].get("p90")),
            _row("turn_gap_s.p50", "turn_gap", ta["gap_s"].get("p50"), tb["gap_s"].get("p50"))]


def _row(metric: str, family: str, a: float | None, b: float | None) -> dict[str, Any]:
    kind, tol = TOLERANCES[family]
    if a is None or b is None:
        return {"metric": metric, "a": a, "b": b, "diff": None, "tolerance": f"{kind} {tol:g}", "verdict": "n/a"}
    diff = abs(b - a) / abs(a) if kind == "rel" and a != 0 else abs(b - a)
    return {"metric": metric, "a": a, "b": b, "diff": diff, "tolerance": f"{kind} {tol:g}",
            "verdict": "pass" if diff <= tol + 1e-12 else "fail"}


def _block_size(trace: Any) -> int | None:
    bs = getattr(trace, "metadata", {}).get("block_size")
    return int(bs) if isinstance(bs, (int, float)) else None


def compare_traces(a: Any, b: Any) -> list[dict[str, Any]]:
    """One row per metric: {metric, a, b, diff, tolerance, verdict in pass/fail/n/a}."""
    rows = [_row("mean_rate", "mean_rate", stats.mean_rate(a), stats.mean_rate(b)),
            _row("interarrival_cv", "interarrival_cv", stats.interarrival_cv(a), stats.interarrival_cv(b))]
    ia, ib = stats.index_of_dispersion(a), stats.index_of_dispersion(b)
    rows += [_row(f"idc_{w}", "idc", ia[w], ib.get(w)) for w in ia]
    span = min(stats.duration_s(a), stats.duration_s(b))
    key = f"{LONG_IDC_S:g}s"
    long = _row(f"idc_{key}", "idc", *(stats.index_of_dispersion(x, (LONG_IDC_S,))[key]
                                       if span >= LONG_IDC_WINDOWS * LONG_IDC_S else None for x in (a, b)))
    if span < LONG_IDC_JUDGED * LONG_IDC_S:  # shown, not judged
        long.update(verdict="n/a", tolerance=f"{long['tolerance']} (>= {LONG_IDC_JUDGED:g} windows)")
    rows.append(long)
    la, lb = stats.length_quantiles(a), stats.length_quantiles(b)
    groups = [("", la, lb)]
    per_a, per_b = la.get("per_model", {}), lb.get("per_model", {})
    if len(per_a) > 1:
        groups += [(f"{m}.", per_a[m], per_b.get(m, {})) for m in per_a]
    for prefix, ga, gb in groups:
        for col in ("input_tokens", "output_tokens"):
            for q in ("p50", "p90", "p99"):
                rows.append(_row(f"{prefix}{col}.{q}", "length", ga[col][q], gb.get(col, {}).get(q)))
    rows.append(_row("spearman_input_output", "spearman", stats.spearman_io(a), stats.spearman_io(b)))
    ma, mb = stats.model_mix(a), stats.model_mix(b)
    # no model column = one unnamed model: it matches a single label on the other side (fit ->
    # generate names it `default`); shares are compared when a side has several or they differ
    if not ma and len(mb) == 1:
        ma = dict(mb)
    if not mb and len(ma) == 1:
        mb = dict(ma)
    if len(ma) > 1 or set(ma) != set(mb):
        rows += [_row(f"model_share.{m}", "model_share", ma.get(m, 0.0), mb.get(m, 0.0)) for m in {**ma, **mb}]
    pa_, pb_ = stats.prefix_cache_hits(a, _block_size(a)), stats.prefix_cache_hits(b, _block_size(b))
    if pa_ or pb_:
        rows.append(_row("prefix_block_hit_ratio", "prefix_hit", (pa_ or {}).get("block_hit_ratio"),
                         (pb_ or {}).get("block_hit_ratio")))
    if pa_ or pb_:
        ra, rb = stats.reuse_distances(a), stats.reuse_distances(b)
        for q in ("p50", "p90"):
            rows.append(_row(f"reuse_distance_requests.{q}", "reuse_distance", (ra or {}).get("requests", {}).get(q),
                             (rb or {}).get("requests", {}).get(q)))
    rows += _turn_rows(a, b)
    ia, ib = stats.image_stats(a), stats.image_stats(b)
    if ia or ib:
        rows += _image_rows(ia, ib)
    return rows


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def format_table(rows: list[dict[str, Any]], name_a: str = "A", name_b: str = "B") -> str:
    head = ("metric", name_a, name_b, "diff", "tolerance", "verdict")
    body = [(r["metric"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["diff"]), r["tolerance"], r["verdict"].upper())
            for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    fails = sum(r["verdict"] == "fail" for r in rows)
    lines.append(f"{len(rows) - fails} of {len(rows)} metrics within tolerance" +
                 (f"; {fails} outside" if fails else ""))
    return "\n".join(lines)


QQ_PROBS = np.concatenate([[0.001, 0.005], np.arange(0.01, 1.0, 0.01), [0.995, 0.999]])


def qq_points(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Inter-arrival quantiles (s) of A and B at QQ_PROBS, over the positive gaps (a log axis
    has no 0; the share of zero gaps of each trace is returned beside them)."""
    ga, gb = stats.interarrivals_s(a), stats.interarrivals_s(b)
    zeros = {"a": float((ga <= 0).mean()) if len(ga) else 0.0, "b": float((gb <= 0).mean()) if len(gb) else 0.0}
    ga, gb = ga[ga > 0], gb[gb > 0]
    if not len(ga) or not len(gb):
        return np.zeros(0), np.zeros(0), zeros
    return np.quantile(ga, QQ_PROBS), np.quantile(gb, QQ_PROBS), zeros


def qq_svg(xa: np.ndarray, yb: np.ndarray, name_a: str, name_b: str, size: int = 360) -> str:
    """A log-log QQ plot as inline SVG (no script): B's quantiles against A's, the diagonal
    y = x, decade ticks. Every point lies inside the frame."""
    m, w = 48, size
    inner = w - 2 * m
    if not len(xa):
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{w}"><text x="{m}" y="{w // 2}">no positive inter-arrival gaps</text></svg>'
    lo = np.floor(np.log10(min(xa.min(), yb.min())))
    hi = np.ceil(np.log10(max(xa.max(), yb.max())))
    hi = hi if hi > lo else lo + 1
    pos = lambda v: m + (np.log10(v) - lo) / (hi - lo) * inner  # noqa: E731
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    out = [f'<svg class="qq" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{w}" viewBox="0 0 {w} {w}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect class="frame" x="{m}" y="{m}" width="{inner}" height="{inner}" fill="none" stroke="#888"/>']
    for d in range(int(lo), int(hi) + 1):
        p = m + (d - lo) / (hi - lo) * inner
        label = f"{10.0 ** d:g}"
        out += [f'<line x1="{p:.1f}" y1="{m}" x2="{p:.1f}" y2="{w - m}" stroke="#eee"/>',
                f'<line x1="{m}" y1="{w - p:.1f}" x2="{w - m}" y2="{w - p:.1f}" stroke="#eee"/>',
                f'<text x="{p:.1f}" y="{w - m + 14}" text-anchor="middle">{label}</text>',
                f'<text x="{m - 4}" y="{w - p + 4:.1f}" text-anchor="end">{label}</text>']
    out.append(f'<line class="diagonal" x1="{m}" y1="{w - m}" x2="{w - m}" y2="{m}" stroke="#c33" stroke-dasharray="4 3"/>')
    for x, y, q in zip(xa, yb, QQ_PROBS):
        out.append(f'<circle class="pt" cx="{pos(x):.1f}" cy="{w - pos(y):.1f}" r="2.2" fill="#2b6cb0">'
                   f'<title>p{q * 100:g}: {x:.4g} s vs {y:.4g} s</title></circle>')
    out += [f'<text x="{w / 2}" y="{w - 10}" text-anchor="middle">{esc(name_a)} inter-arrival (s)</text>',
            f'<text x="12" y="{w / 2}" text-anchor="middle" transform="rotate(-90 12 {w / 2})">'
            f'{esc(name_b)} inter-arrival (s)</text>', "</svg>"]
    return "\n".join(out)


def render_html(rows: list[dict[str, Any]], a: Any, b: Any, name_a: str = "A", name_b: str = "B") -> str:
    """A self-contained page: the comparison table (tolerance and verdict per metric) and the
    QQ plot of the two traces' inter-arrival times. No script, no external resource."""
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    fails = sum(r["verdict"] == "fail" for r in rows)
    body = "\n".join(f'<tr class="{esc(r["verdict"].replace("/", ""))}"><td>{esc(r["metric"])}</td><td>{_fmt(r["a"])}</td>'
                     f'<td>{_fmt(r["b"])}</td><td>{_fmt(r["diff"])}</td><td>{esc(r["tolerance"])}</td>'
                     f'<td>{esc(r["verdict"].upper())}</td></tr>' for r in rows)
    xa, yb, zeros = qq_points(a, b)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trace compare: {esc(name_a)} vs {esc(name_b)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
tr.fail td:last-child {{ color: #c33; font-weight: bold; }} tr.pass td:last-child {{ color: #2a7; }}
tr.na td:last-child {{ color: #888; }}
</style></head><body>
<h1>trace compare</h1>
<p>A = {esc(name_a)}<br>B = {esc(name_b)}</p>
<p>{len(rows) - fails} of {len(rows)} metrics within tolerance{f"; {fails} outside" if fails else ""}</p>
<table><tr><th>metric</th><th>A</th><th>B</th><th>diff</th><th>tolerance</th><th>verdict</th></tr>
{body}
</table>
<h2>Inter-arrival QQ plot</h2>
<p>Quantiles p0.1 to p99.9 of the positive gaps, log axes; on the dashed diagonal the distributions agree.
Zero gaps (simultaneous arrivals): A {zeros["a"]:.1%}, B {zeros["b"]:.1%}.</p>
{qq_svg(xa, yb, name_a, name_b)}
</body></html>
"""
