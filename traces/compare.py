"""`replay trace compare A B`: realism statistics of two traces side by side, with a verdict
per metric against a tolerance (relative for rates, dispersion and lengths; absolute for
correlations, shares and hit ratios). The statistics come from `traces.stats`. A trace
without a `model` column counts as one model, the same as any single label on the other side.
"""
from __future__ import annotations

from typing import Any

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
}
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
