"""`replay trace compare A B`: realism statistics (`traces.stats`) of two traces side by side,
a verdict per metric. A trace without a `model` column counts as one model, the same as any
single label on the other side.

- **fail** when one side has a metric and the other lacks it, with the reason ("B has no
  hash_ids"). A trace without `hash_ids` counts as one without prefix reuse (hit ratio 0:
  replay sends unrelated prompts), one without `session_id` and `hash_ids` as single-request
  conversations, one without `num_images` as imageless: such a row names the missing column
  and fails unless the other side has no more of it (a Mooncake hour without reuse passes);
- **n/a** only when neither side has it (counted apart, not as passing);
- **not judged**: an index of dispersion (IDC) from fewer than `MIN_WINDOWS` complete windows
  on either side (the fitter's threshold) says "only k windows" and cannot fail;
- else **pass** when the difference is within max(tolerance, sampling band). The tolerance
  (`TOLERANCES`) is the model error accepted; the band is what two realisations of one
  process differ by chance, two-sided at 0.05 / m for m rows judged (Bonferroni: two seeds of
  one spec fail at most 5 % of the time where the error models hold), z sqrt(se_A^2 + se_B^2)
  from each side's standard error:
  - IDC from k windows: (k - 1) IDC / E[IDC] is about chi-square(k - 1) (the dispersion
    test), so IDC_B / IDC_A is F(k_B - 1, k_A - 1): the band is its quantiles (x3.7 at 24);
  - mean rate: rate sqrt(D / n), n requests, D >= 1 the IDC at the largest scale judged
    (mean of both sides; Var(count) = D n); inter-arrival CV: delta method on the gaps'
    moments (CV / sqrt(n) for Poisson);
  - length quantiles (distribution-free): a quarter of the spread between the quantiles at
    q +- 2 sqrt(q (1 - q) / n); shares: sqrt(p (1 - p) / n); Spearman: (1 - rho^2)
    sqrt(1.06 / (n - 3)) (Fieller).
  Prefix hit ratio, reuse distance, shared-prefix lengths, turns and mean images (correlated
  units) keep the fixed tolerance. Windows, gaps and requests are taken as independent: strongly correlated
  (bursty) traffic still needs long traces to pass.
"""
from __future__ import annotations

import html
from collections import Counter
from typing import Any

import numpy as np
from scipy import stats as sst

from . import prefixes, stats
from .fit_dists import IDC_SCALES, MIN_WINDOWS

# metric family -> (kind, tolerance): "rel" compares |b - a| / |a|, "abs" compares |b - a|
TOLERANCES = {
    "mean_rate": ("rel", 0.02), "interarrival_cv": ("rel", 0.10), "idc": ("rel", 0.20), "length": ("rel", 0.10),
    "spearman": ("abs", 0.10), "model_share": ("abs", 0.02), "prefix_hit": ("abs", 0.05),
    "prefix_share": ("abs", 0.05), "prefix_blocks": ("rel", 0.10), "image_share": ("abs", 0.02),
    "image_mean": ("rel", 0.10), "reasoning_share": ("abs", 0.05), "reuse_distance": ("rel", 0.25),
    "turns": ("rel", 0.10), "turn_gap": ("rel", 0.20), "agent_steps": ("rel", 0.10), "fanout_share": ("abs", 0.03),
    "delay": ("rel", 0.10), "growth": ("rel", 0.10)}
FAMILY_ALPHA = 0.05       # two realisations of one spec fail at most this often (Bonferroni)
MIN_COUNT_SHARE = 0.01    # image counts this rare in both traces get no row of their own


def _image_rows(ia: dict[str, Any] | None, ib: dict[str, Any] | None, n: tuple[int, int]) -> list[dict[str, Any]]:
    """The image-count distribution: share of requests with images, mean images per request,
    and the share of each count (0, 1, 2, ...) that holds >= 1% of either trace. A trace
    without `num_images` sends no images: it compares as all zeros."""
    none = {"share_with_images": 0.0, "mean_images": 0.0, "count_histogram": {"0": 1}}
    ia, ib = ia or none, ib or none
    rows = [_row("images.share_with_images", "image_share", ia["share_with_images"], ib["share_with_images"], n=n),
            _row("images.mean_per_request", "image_mean", ia["mean_images"], ib["mean_images"])]
    sa, sb = ({int(k): v / max(sum(h.values()), 1) for k, v in h.items()}
              for h in (ia["count_histogram"], ib["count_histogram"]))
    return rows + [_row(f"images.count_share.{k}", "image_share", sa.get(k, 0.0), sb.get(k, 0.0), n=n)
                   for k in sorted(set(sa) | set(sb)) if max(sa.get(k, 0.0), sb.get(k, 0.0)) >= MIN_COUNT_SHARE]


def _conversations(a: Any, b: Any) -> str | None:
    """Where both sides' conversations come from: `session_id` when both have it, else hash_ids
    chains on both (so a Mooncake trace compares with its fitted copy, which has sessions)."""
    both_blocks = all("hash_ids" in stats._tbl(x).column_names for x in (a, b))
    return "hash_ids" if both_blocks and not (prefixes.has_sessions(a) and prefixes.has_sessions(b)) else None


def _shared_prefix_rows(a: Any, b: Any) -> list[dict[str, Any]]:
    """Application prefixes shared across conversations (`prefixes.prefix_pool_stats`, a system
    prompt included): the share of conversations that open with one (binomial error), its
    length in blocks p50/p90 and the most used one's share of them. A side without hash_ids
    sends unrelated prompts: no conversation opens with one."""
    source = _conversations(a, b)
    pa_, pb_ = (prefixes.prefix_pool_stats(x, source, _block_size(x)) for x in (a, b))
    if not pa_ and not pb_:
        return []
    why = _lacks((pa_, pb_), "has no hash_ids")
    none = {"share": 0.0, "conversations": 0, "blocks": {}, "top_share": None}
    pa_, pb_ = pa_ or none, pb_ or none
    n = (pa_["conversations"], pb_["conversations"])
    rows = [_row("shared_prefix.share", "prefix_share", pa_["share"], pb_["share"], reason=why, n=n if all(n) else None)]
    miss = "opens no conversation with a shared prefix"
    rows += [_row(f"shared_prefix.blocks.{q}", "prefix_blocks", pa_["blocks"].get(q), pb_["blocks"].get(q),
                  missing=miss, reason=why) for q in ("p50", "p90")]
    rows.append(_row("shared_prefix.top_share", "prefix_share", pa_["top_share"], pb_["top_share"], missing=miss,
                     reason=why))
    return rows


def _turn_rows(a: Any, b: Any) -> list[dict[str, Any]]:
    """Turns per conversation (mean, p90) and the gap between turns (p50). Both sides use
    `session_id` when both have it, else conversations inferred from `hash_ids` on both (so
    a Mooncake trace compares with its fitted copy, which has sessions)."""
    source = _conversations(a, b)
    ta, tb = (prefixes.turn_stats(x, _block_size(x), source) for x in (a, b))
    if not ta and not tb:
        return []
    why = _lacks((ta, tb), "has no session_id or hash_ids")
    # without either column every request is a conversation of its own (one turn, no gap)
    one = {"turns": {"mean": 1.0, "p90": stats.count_quantile(np.ones(1), 0.9)}, "gap_s": {}}
    ta, tb = ta or one, tb or one
    return [_row("turns_per_session.mean", "turns", ta["turns"]["mean"], tb["turns"]["mean"], reason=why),
            _row("turns_per_session.p90", "turns", ta["turns"]["p90"], tb["turns"]["p90"], reason=why),
            _row("turn_gap_s.p50", "turn_gap", ta["gap_s"].get("p50"), tb["gap_s"].get("p50"), reason=why,
                 missing=why[2:] if why else "has no multi-turn conversation")]


def _agent_rows(a: Any, b: Any) -> list[dict[str, Any]]:
    """Task graphs (`stats.agent_samples`): steps per task p50/p90 (`count_quantile`), the
    fan-out share (binomial error over the steps that may fan out), delay_s and context
    growth p50/p90 (quantile errors). A side without depends_on fails them."""
    ga, gb = stats.agent_samples(a), stats.agent_samples(b)
    if not ga and not gb:
        return []
    why = _lacks((ga, gb), "has no depends_on (no agentic tasks)")
    miss = why[2:] if why else "has no value"
    rows = []
    for key, fam, name in (("steps", "agent_steps", "agent.steps_per_task"), ("delay_s", "delay", "agent.delay_s"),
                           ("growth", "growth", "agent.growth_tokens")):
        qa, qb = (_quantiles_se(g[key]) if g and len(g[key]) else None for g in (ga, gb))
        for q, p in (("p50", 0.5), ("p90", 0.9)):
            va, vb = ((stats.count_quantile(g[key], p) if key == "steps" else qx[q][0]) if qx else None
                      for g, qx in ((ga, qa), (gb, qb)))
            rows.append(_row(f"{name}.{q}", fam, va, vb, tuple(qx[q][1] if qx else None for qx in (qa, qb)),
                             missing=miss, reason=why))
    fa, fb = (g["fanned"] if g else np.zeros(0) for g in (ga, gb))
    share = (float((f > 0).mean()) if len(f) else None for f in (fa, fb))
    rows.append(_row("agent.fanout_share", "fanout_share", *share, missing=miss, reason=why, n=(len(fa), len(fb))))
    return rows


def _lacks(pair: tuple, what: str) -> str | None:
    """'B has no hash_ids' when the statistic of one side of `pair` is missing."""
    return None if bool(pair[0]) == bool(pair[1]) else f"{'AB'[bool(pair[0])]} {what}"


def _row(metric: str, family: str, a: float | None, b: float | None, se: tuple = (None, None),
         missing: str | tuple[str, str] = "has no value", dof: tuple[int, int] | None = None,
         reason: str | None = None, n: tuple[int, int] | None = None) -> dict[str, Any]:
    """A row before `_judge`: "fail" when only one side has the value (reason: that side and
    `missing`, per side when a pair), "n/a" when neither has it, else "judge" with the sampling
    error of each side (`se`, in the metric's unit; for shares of n requests, binomial) or, for
    an IDC, the degrees of freedom (`dof`: B, A). `reason`: e.g. the column a value stands for."""
    kind, tol = TOLERANCES[family]
    if n and a is not None and b is not None:
        se = tuple(float(np.sqrt(p * (1 - p) / k)) if k else 0.0 for p, k in zip((a, b), n))
    r = {"metric": metric, "a": a, "b": b, "diff": None, "tolerance": f"{kind} {tol:g}", "limit": None,
         "verdict": "n/a", "reason": reason, "_judge": (kind, tol, se, dof)}
    if (a is None) != (b is None):
        side = int(a is not None)
        r.update(verdict="fail", reason=f"{'AB'[side]} {missing if isinstance(missing, str) else missing[side]}")
    elif a is not None:
        r.update(diff=abs(b - a) / abs(a) if kind == "rel" and a != 0 else abs(b - a), verdict="judge")
    return r


def _judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verdicts: pass when diff <= limit = max(tolerance, sampling band); the bands are
    two-sided at FAMILY_ALPHA / (rows judged)."""
    alpha = FAMILY_ALPHA / max(sum(r["verdict"] == "judge" for r in rows), 1)
    z = float(sst.norm.isf(alpha / 2))
    for r in rows:
        kind, tol, se, dof = r.pop("_judge")
        if r["verdict"] != "judge":
            continue
        a, b = r["a"], r["b"]
        if dof and a > 0:   # IDC_B / IDC_A ~ F(k_B - 1, k_A - 1)
            band = abs((sst.f.isf(alpha / 2, *dof) if b >= a else sst.f.ppf(alpha / 2, *dof)) - 1)
        else:
            band = z * float(np.hypot(se[0] or 0.0, se[1] or 0.0)) / (abs(a) if kind == "rel" and a else 1.0)
        r["limit"] = float(max(tol, band))
        r["verdict"] = "pass" if r["diff"] <= r["limit"] + 1e-12 else "fail"
        if band > tol:
            r["tolerance"] += f", sampling {band:.3g}"
    return rows


def _block_size(trace: Any) -> int | None:
    bs = getattr(trace, "metadata", {}).get("block_size")
    return int(bs) if isinstance(bs, (int, float)) else None


def _cv_se(x: Any) -> float | None:
    """Delta method: CV = sd / mean of the gaps, influence (d^2 / var - 1) / 2 - d / mean."""
    g, cv = stats.interarrivals_s(x), stats.interarrival_cv(x)
    if not cv:
        return None
    d = g - g.mean()
    return cv * float(np.sqrt(((d ** 2 / g.var() - 1) / 2 - d / g.mean()).var() / len(g)))


def _quantiles_se(v: np.ndarray) -> dict[str, tuple[float | None, float | None]]:
    """{p50/p90/p99: (value as stats.quantiles, standard error)}; the error is a quarter of the
    spread of the quantiles at q +- 2 sqrt(q (1 - q) / n), two binomial sd of the order statistic."""
    if not len(v):
        return {k: (None, None) for k in stats.QUANTILES}
    qs = np.array(list(stats.QUANTILES.values())) / 100
    h = 2 * np.sqrt(qs * (1 - qs) / len(v))
    lo, hi = np.percentile(v, 100 * np.clip(np.stack([qs - h, qs + h]), 0, 1))
    q = stats.quantiles(v)
    return {k: (q[k], float(x - y) / 4) for k, x, y in zip(stats.QUANTILES, hi, lo)}


def compare_traces(a: Any, b: Any) -> list[dict[str, Any]]:
    """One row per metric: {metric, a, b, diff, tolerance, limit, verdict, reason}; verdict in
    pass / fail / not judged / n/a (see the module docstring)."""
    n = [stats._tbl(x).num_rows for x in (a, b)]
    ia, ib = (stats.index_of_dispersion(x, IDC_SCALES) for x in (a, b))
    ka, kb = ([int((t[-1] - t[0]) // max(int(round(w * 1e9)), 1)) if len(t) else 0 for w in IDC_SCALES]
              for t in (stats.arrivals_ns(a), stats.arrivals_ns(b)))  # complete windows per scale
    # the count variance over the span is about D n, D the IDC at the largest scale judged
    # (the mean of both sides: one process under the null; at least Poisson's 1: it is noisy)
    judged = [[v for v, k in zip(i.values(), kx) if k >= MIN_WINDOWS and v] or [1.0]
              for i, kx in ((ia, ka), (ib, kb))]
    d = max(1.0, (judged[0][-1] + judged[1][-1]) / 2)
    ra, rb = stats.mean_rate(a), stats.mean_rate(b)
    rows = [_row("mean_rate", "mean_rate", ra, rb, tuple(r and r * np.sqrt(d / k) for r, k in zip((ra, rb), n))),
            _row("interarrival_cv", "interarrival_cv", stats.interarrival_cv(a), stats.interarrival_cv(b),
                 (_cv_se(a), _cv_se(b)))]
    for key, wa, wb in zip(ia, ka, kb):
        rows.append(_row(f"idc_{key}", "idc", ia[key], ib[key], dof=(wb - 1, wa - 1)))
        if min(wa, wb) < MIN_WINDOWS:
            rows[-1].update(verdict="not judged", reason=f"only {min(wa, wb)} window{'s' * (min(wa, wb) != 1)}")
    ga, gb = stats.length_groups(a), stats.length_groups(b)
    for prefix in [g for g in ga if not g or len(ga) > 2]:   # per model when A has several
        for col in ("input_tokens", "output_tokens"):
            qa, qb = _quantiles_se(ga[prefix][col]), _quantiles_se(gb.get(prefix, {}).get(col, np.zeros(0)))
            for q in stats.QUANTILES:
                rows.append(_row(f"{prefix}{col}.{q}", "length", qa[q][0], qb[q][0], (qa[q][1], qb[q][1]),
                                 f"has no requests of model {prefix[:-1]}" if prefix not in gb else "has no value"))
    sp = [stats.spearman_io(x) for x in (a, b)]
    m = [stats._tbl(x).num_rows - stats._tbl(x).column("output_tokens").null_count for x in (a, b)]
    rows.append(_row("spearman_input_output", "spearman", *sp,
                     tuple(None if r is None else (1 - r * r) * np.sqrt(1.06 / max(k - 3, 1)) for r, k in zip(sp, m))))
    ma, mb = stats.model_mix(a), stats.model_mix(b)
    # no model column = one unnamed model: it matches a single label on the other side (fit ->
    # generate names it `default`); shares are compared when a side has several or they differ
    ma, mb = ma or (mb if len(mb) == 1 else {}), mb or (ma if len(ma) == 1 else {})
    if len(ma) > 1 or set(ma) != set(mb):
        rows += [_row(f"model_share.{k}", "model_share", ma.get(k, 0.0), mb.get(k, 0.0), n=n)
                 for k in {**ma, **mb}]
    pa_, pb_ = stats.prefix_cache_hits(a, _block_size(a)), stats.prefix_cache_hits(b, _block_size(b))
    if pa_ or pb_:   # without hash_ids replay sends unrelated prompts: a hit ratio of 0
        hit = ((p or {}).get("block_hit_ratio", 0.0) for p in (pa_, pb_))
        rows.append(_row("prefix_block_hit_ratio", "prefix_hit", *hit, reason=_lacks((pa_, pb_), "has no hash_ids")))
        ra, rb = prefixes.reuse_distances(a), prefixes.reuse_distances(b)
        why = tuple("has no prefix-cache hits" if p else "has no hash_ids" for p in (pa_, pb_))
        rows += [_row(f"reuse_distance_requests.{q}", "reuse_distance",
                      *((r or {}).get("requests", {}).get(q) for r in (ra, rb)), missing=why) for q in ("p50", "p90")]
    rows += _shared_prefix_rows(a, b)
    rows += _turn_rows(a, b)
    rows += _agent_rows(a, b)
    ia, ib = stats.image_stats(a), stats.image_stats(b)
    if ia or ib:
        rows += _image_rows(ia, ib, n)
    ra, rb = stats.reasoning_stats(a), stats.reasoning_stats(b)
    if ra or rb:  # reasoning tokens / output tokens; a side without the column says nothing of it
        rows.append(_row("reasoning_share", "reasoning_share", *((r or {}).get("share") for r in (ra, rb)),
                         tuple((r or {}).get("se") for r in (ra, rb)), missing="has no reasoning_tokens"))
    return _judge(rows)


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def summary(rows: list[dict[str, Any]]) -> str:
    """'17 of 17 judged metrics within tolerance; 1 not judged (too few windows); 2 not applicable'."""
    c = Counter(r["verdict"] for r in rows)
    extra = (("fail", "outside"), ("not judged", "not judged (too few windows)"), ("n/a", "not applicable"))
    return "; ".join([f"{c['pass']} of {c['pass'] + c['fail']} judged metrics within tolerance"] +
                     [f"{c[k]} {text}" for k, text in extra if c[k]])


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    """A row as the table shows it: metric, A, B, diff, tolerance, verdict (with its reason)."""
    return (r["metric"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["diff"]), r["tolerance"],
            r["verdict"].upper() + (f" ({r['reason']})" if r.get("reason") else ""))


def format_table(rows: list[dict[str, Any]], name_a: str = "A", name_b: str = "B") -> str:
    body = [("metric", name_a, name_b, "diff", "tolerance", "verdict"), *map(_cells, rows)]
    widths = [max(map(len, column)) for column in zip(*body)]
    return "\n".join(["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body] + [summary(rows)])


QQ_PROBS = np.concatenate([[0.001, 0.005], np.arange(0.01, 1.0, 0.01), [0.995, 0.999]])


def qq_points(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Inter-arrival quantiles (s) of A and B at QQ_PROBS, over the positive gaps (a log axis
    has no 0; the share of zero gaps of each trace is returned beside them)."""
    gaps = [stats.interarrivals_s(x) for x in (a, b)]
    zeros = {k: float((g <= 0).mean()) if len(g) else 0.0 for k, g in zip("ab", gaps)}
    pos = [g[g > 0] for g in gaps]
    xa, yb = (np.quantile(g, QQ_PROBS) if all(map(len, pos)) else np.zeros(0) for g in pos)
    return xa, yb, zeros


def qq_svg(xa: np.ndarray, yb: np.ndarray, name_a: str, name_b: str, size: int = 360) -> str:
    """A log-log QQ plot as inline SVG (no script): B's quantiles against A's, the diagonal
    y = x, decade ticks. Every point lies inside the frame."""
    m, w = 48, size
    inner = w - 2 * m
    out = [f'<svg class="qq" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{w}" viewBox="0 0 {w} {w}" '
           'font-family="sans-serif" font-size="11">']
    if not len(xa):
        return f'{out[0]}<text x="{m}" y="{w // 2}">no positive inter-arrival gaps</text></svg>'
    lo = np.floor(np.log10(min(xa.min(), yb.min())))
    hi = max(np.ceil(np.log10(max(xa.max(), yb.max()))), lo + 1)
    pos = lambda v: m + (np.log10(v) - lo) / (hi - lo) * inner  # noqa: E731
    out.append(f'<rect class="frame" x="{m}" y="{m}" width="{inner}" height="{inner}" fill="none" stroke="#888"/>')
    for d in 10.0 ** np.arange(lo, hi + 1):
        p = pos(d)
        out.append(f'<path d="M{p:.1f},{m}V{w - m}M{m},{w - p:.1f}H{w - m}" stroke="#eee"/>'
                   f'<text x="{p:.1f}" y="{w - m + 14}" text-anchor="middle">{d:g}</text>'
                   f'<text x="{m - 4}" y="{w - p + 4:.1f}" text-anchor="end">{d:g}</text>')
    out.append(f'<line class="diagonal" x1="{m}" y1="{w - m}" x2="{w - m}" y2="{m}" stroke="#c33" '
               'stroke-dasharray="4 3"/>')
    out += [f'<circle class="pt" cx="{pos(x):.1f}" cy="{w - pos(y):.1f}" r="2.2" fill="#2b6cb0">'
            f'<title>p{q * 100:g}: {x:.4g} s vs {y:.4g} s</title></circle>' for x, y, q in zip(xa, yb, QQ_PROBS)]
    out += [f'<text x="{w / 2}" y="{w - 10}" text-anchor="middle">{html.escape(name_a)} inter-arrival (s)</text>',
            f'<text x="12" y="{w / 2}" text-anchor="middle" transform="rotate(-90 12 {w / 2})">'
            f'{html.escape(name_b)} inter-arrival (s)</text>', "</svg>"]
    return "\n".join(out)


def render_html(rows: list[dict[str, Any]], a: Any, b: Any, name_a: str = "A", name_b: str = "B") -> str:
    """A self-contained page: the comparison table (tolerance and verdict per metric) and the
    QQ plot of the two traces' inter-arrival times. No script, no external resource."""
    esc = html.escape
    body = "\n".join(f'<tr class="{r["verdict"].replace("/", "").replace(" ", "")}">'
                     + "".join(f"<td>{esc(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    xa, yb, zeros = qq_points(a, b)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trace compare: {esc(name_a)} vs {esc(name_b)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
tr.fail td:last-child {{ color: #c33; font-weight: bold; }} tr.pass td:last-child {{ color: #2a7; }}
tr.na td:last-child, tr.notjudged td:last-child {{ color: #888; }}
</style></head><body>
<h1>trace compare</h1>
<p>A = {esc(name_a)}<br>B = {esc(name_b)}</p>
<p>{esc(summary(rows))}</p>
<table><tr><th>metric</th><th>A</th><th>B</th><th>diff</th><th>tolerance</th><th>verdict</th></tr>
{body}
</table>
<h2>Inter-arrival QQ plot</h2>
<p>Quantiles p0.1 to p99.9 of the positive gaps, log axes; on the dashed diagonal the distributions agree.
Zero gaps (simultaneous arrivals): A {zeros["a"]:.1%}, B {zeros["b"]:.1%}.</p>
{qq_svg(xa, yb, name_a, name_b)}
</body></html>
"""
