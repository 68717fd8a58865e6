"""Breakdowns of a measured run: per model, per slo_class, per input-length bucket, time series in
windows joined with the server's scraped metrics (KV usage, queue, preemptions), and new against
reused connections.

Everything is grouped with integer codes and bincount / one stable sort: the Python loops
run over groups and windows, never over requests.

Connections (summary.json `connections`): which requests paid a connection set-up, and what it
cost them. A record's `connect_s` is how long its new connection took to open (TCP connect, plus the TLS
handshake for https); null when it was sent on a kept-alive connection. `sent_s` is stamped
after the connect, so TTFT never contains it: what a burst of new connections does to TTFT is
the server's side of it (accepting, handshaking, a cold socket), which the section shows as TTFT
on new against reused connections.

New connections are opened in bursts, when every kept-alive one is busy: exactly when the
server is busiest and queueing, so over the whole run their TTFT is worse even when the set-up
costs nothing. The warning therefore compares like with like: each new-connection request with
the requests on reused connections sent within half a second of it (its 1-s window; each new
request's window weighs the same), and warns only when the new ones' TTFT tail is much worse than
that of their window peers. A new request with no reused one in its window cannot be told apart
from queueing and is left out of the comparison.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from .analysis import Analysis, jain
from .metrics import as_f64
from .stats import describe, grouped_percentiles, regrouped_percentiles
from .window import inflight, time_basis

LENGTH_EDGES = (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
GROUP_LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")
# Runs with reasoning also get, per group: time to the first answer token, time spent streaming
# reasoning and answer, and reasoning tokens per request.
GROUP_REASONING = ("ttfa_ms", "reasoning_ms", "answer_ms", "reasoning_tokens")
# vLLM's metric names (older and newer); engine_stub exposes the same ones.
SERVER_SERIES = {
    "kv_cache_usage": (("kv_cache_usage_perc", "gpu_cache_usage_perc"), "mean"),
    "running": (("num_requests_running",), "sum"),
    "waiting": (("num_requests_waiting",), "sum"),
    "preemptions": (("num_preemptions_total", "num_preemptions"), "counter"),
}


def _clean(x: np.ndarray) -> list:
    return [None if v != v else v for v in x.tolist()]     # NaN -> None


MAX_CELLS = 1 << 16   # beyond this many label combinations, each grouping is counted on its own


def breakdowns(an: Analysis, kinds: dict[str, tuple[np.ndarray, list[str]]]) -> dict[str, list[dict]]:
    """Per grouping (codes, labels), one row per non-empty group of the measured requests: counts,
    rates, latency percentiles. Requests are counted and their latencies histogrammed once per
    fine cell (the combination of every grouping's label), and each grouping's rows are sums of
    cells, so the work over requests does not grow with groupings."""
    sizes = [max(len(labels), 1) for _, labels in kinds.values()]
    if len(kinds) > 1 and math.prod(sizes) > MAX_CELLS:
        return {k: breakdowns(an, {k: v})[k] for k, v in kinds.items()}
    ncells, rm, m = math.prod(sizes), an.rm, an.mask
    cells = np.zeros(rm.n, dtype=np.int64)
    for (codes, _), size in zip(kinds.values(), sizes):
        cells *= size
        cells += codes
    maps = np.unravel_index(np.arange(ncells), sizes)      # cell -> group, per grouping
    everything = m.all()
    state = cells * 4                                     # + 1 ok, + 2 good (good implies ok)
    state += rm.ok
    state += an.good
    state += an.good
    per = np.bincount(state if everything else state[m], minlength=4 * ncells).reshape(ncells, 4)
    del state
    # Output tokens of the measured successes; other rows add 0.0 (sums of whole numbers: exact).
    out_tok = np.bincount(cells, weights=np.where(m & rm.ok & ~np.isnan(rm.n_out), rm.n_out, 0.0), minlength=ncells)
    lat = {}
    for name in GROUP_LATENCIES + (GROUP_REASONING if rm.has_reasoning else ()):
        vals = np.where(rm.ok, rm.reasoning, np.nan) if name == "reasoning_tokens" else rm.columns[name]
        lat[name] = regrouped_percentiles(vals if everything else vals[m], cells if everything else cells[m],
                                          ncells, list(zip(maps, sizes)), [50, 90, 99])
    d = an.duration_s

    def rate(x: float) -> float | None:
        return float(x / d) if d else None
    out = {}
    for k, (kind, (_, labels), to, size) in enumerate(zip(kinds, kinds.values(), maps, sizes)):
        issued, ok, good, tok = (np.bincount(to, weights=x, minlength=size)[:size]
                                 for x in (per.sum(axis=1), per[:, 1] + per[:, 3], per[:, 3], out_tok))
        out[kind] = [{"key": label, "issued": int(issued[i]), "ok": int(ok[i]),
                      "error_rate": float(1 - ok[i] / issued[i]), "attainment": float(good[i] / issued[i]),
                      "requests_per_s": rate(ok[i]), "goodput_rps": rate(good[i]), "output_tokens_per_s": rate(tok[i]),
                      **{name: {"n": int(g[k][0][i]), **dict(zip(("p50", "p90", "p99"), _clean(g[k][1][i])))}
                         for name, g in lat.items()}}
                     for i, label in enumerate(labels) if issued[i]]
    return out


JAIN = "Jain's index (sum x)^2 / (n sum x^2) over the tenants' attainment x: 1 when equal, 1/n when one gets all"


def tenants(an: Analysis) -> dict | None:
    """Per tenant (Analysis.tenants): requests, attainment, goodput, TTFT and TPOT p50/p99, and the
    fairness of their attainment; None with fewer than two tenants among the measured requests."""
    column, codes, labels = an.tenants
    rows = breakdowns(an, {"tenant": (codes, labels)})["tenant"]
    if len(rows) < 2:
        return None
    x = np.array([r["attainment"] for r in rows])
    worst, best = (rows[int(f(x))] for f in (np.argmin, np.argmax))
    return {"column": column, "rows": [
        {"tenant": r["key"], "requests": r["issued"], "attainment": r["attainment"], "goodput_rps": r["goodput_rps"],
         **{m: {q: r[m][q] for q in ("p50", "p99")} for m in ("ttft_ms", "tpot_ms")}} for r in rows],
        "fairness": {"service": service_fairness(an, an.mask), "jain": float(jain(x)), "method": JAIN,
                     **{k: {"tenant": r["key"], "attainment": r["attainment"]} for k, r in (("worst", worst),
                                                                                         ("best", best))}}}


SERVICE = ("per window the server was contended in, Jain's index over the tenants' streamed tokens, each divided by "
           "its max-min fair share of the window's tokens given what it had asked for and not yet got; the run's "
           "value is its worst window")
PER_WINDOW, BOOT = 50, 200   # successes per window (4 to 24 windows); Poisson-bootstrap replicates


def water_fill(capacity: float, demand: np.ndarray) -> np.ndarray:
    """Max-min fair split of `capacity` over `demand`: each gets min(demand, level), the level set
    so the shares add up to the capacity (to the whole demand when that is less)."""
    d = np.sort(demand)
    split = (capacity - np.concatenate(([0.0], np.cumsum(d)[:-1]))) / (len(d) - np.arange(len(d)))
    over = np.flatnonzero(d > split)
    return np.minimum(demand, split[over[0]] if len(over) else np.inf)


def service_fairness(an: Analysis, rows: np.ndarray, conf: float | None = None) -> dict | None:
    """How evenly the server shared its output among tenants that wanted it (SERVICE): a tenant
    that got less than its max-min fair share of a window's tokens while another got more lowers
    that window's index; a tenant asking for more than its share and getting just its share does
    not. Each success's tokens are spread evenly from its first token to its last; a tenant asks,
    at its rows' scheduled times, for the tokens they streamed. With `conf`: a Poisson bootstrap
    over requests (seeded) gives the one-sided bounds at `conf` on both sides. 1 when no window was
    contended; None with fewer than two tenants."""
    _, codes, labels = an.tenants
    rm = an.rm
    sel = rows & rm.ok & (rm.n_out > 0)
    first = (rm.sent + rm.columns["ttft_ms"] / 1e3)[sel]
    end, sched, n_out, who = rm.end[sel], time_basis(rm)[sel], rm.n_out[sel], codes[sel]
    if len(np.unique(who)) < 2:
        return None
    nw = int(np.clip(len(who) // PER_WINDOW, 4, 24))   # fewer, fuller windows: a min over noisy ones sinks
    edges = np.linspace(np.nanmin(sched), np.nanmax(end), nw + 1)
    span = np.maximum(end - first, 1e-9)
    got = np.diff(np.clip((edges[None, :] - first[:, None]) / span[:, None], 0, 1), axis=1) * n_out[:, None]
    asked = np.zeros_like(got)
    asked[np.arange(len(n_out)), np.clip(np.searchsorted(edges, sched, "right") - 1, 0, nw - 1)] = n_out
    k = len(labels)
    one_hot = np.zeros((len(who), k))
    one_hot[np.arange(len(who)), who] = 1

    def worst(weights: np.ndarray) -> tuple[float, int, int]:
        g, a = (((weights[:, None] * one_hot).T @ m) for m in (got, asked))   # tenants x windows
        wants = np.cumsum(a, axis=1) - np.concatenate((np.zeros((k, 1)), np.cumsum(g, axis=1)[:, :-1]), axis=1)
        index = np.full(nw, np.inf)   # an uncontended window: each tenant got what it asked (1)
        for w in range(nw):
            on = wants[:, w] > 1e-9
            # contended: what was left over at the window's start alone would have taken all it served
            if on.sum() >= 2 and 0 < g[on, w].sum() <= (wants[on, w] - a[on, w]).sum():
                index[w] = jain(g[on, w] / np.maximum(water_fill(g[on, w].sum(), wants[on, w]), 1e-9))
        judged = np.isfinite(index)
        return (float(index.min()) if judged.any() else 1.0), int(index.argmin()), int(judged.sum())

    value, at, contended = worst(np.ones(len(who)))
    out = {"value": value, "window_s": [float(edges[at]), float(edges[at + 1])] if contended else None,
           "contended_windows": contended, "windows": nw, "method": SERVICE, "ci": None}
    if conf is not None:
        rng = np.random.default_rng(0)
        boot = np.array([worst(rng.poisson(1.0, len(who)))[0] for _ in range(BOOT)])
        out["ci"] = (float(np.quantile(boot, 1 - conf)), float(np.quantile(boot, conf)))
    return out


def image_groups(images: np.ndarray, top: int = 9) -> tuple[np.ndarray, list[str]]:
    """Codes of the image count per request: 0..top-1 each, then `top+`."""
    return np.minimum(images, top).astype(np.int64), [str(i) for i in range(top)] + [f"{top}+"]


def length_buckets(input_len: np.ndarray, edges=LENGTH_EDGES) -> tuple[np.ndarray, list[str]]:
    """Codes of input-length buckets [edges[i], edges[i+1]); unknown lengths get their own."""
    e = np.asarray(edges, dtype=np.float64)
    # The bucket is the number of edges <= x, minus one: counted with one comparison per edge
    # (a dozen linear passes; a binary search per value costs three times as much). NaN and
    # values below the first edge compare False everywhere and end up unknown.
    codes = np.full(len(input_len), -1, dtype=np.int8 if len(e) < 127 else np.int64)
    for edge in e:
        codes += input_len >= edge
    codes = codes.astype(np.int64)
    labels = [f"{int(a)}-{int(b) - 1}" for a, b in zip(e[:-1], e[1:])] + [f">={int(e[-1])}"]
    codes[codes < 0] = len(labels)
    return codes, labels + ["(unknown)"]


MAX_WINDOWS = 100       # a time series is read by eye: more points than this are noise
MIN_PER_WINDOW = 10     # requests a window holds at least, on average, so its rate and p50 mean something


def nice_window(span: float, count: int | None = None, target: int = MAX_WINDOWS,
                per_window: int = MIN_PER_WINDOW) -> float:
    """The time-series window: the shortest round length (1, 2 or 5 x 10^k s) that gives at most
    `target` windows over `span` seconds and, when `count` requests spread over the span, holds
    at least `per_window` of them on average (w >= span * per_window / count). A 135-request run
    of 49 s gets 5 s windows (about 14 requests each), not 0.5 s ones (1.4 each)."""
    raw = max(span / target, span * per_window / count if count else 0.0, 1e-3)
    k = 10 ** math.floor(math.log10(raw))
    return next(m * k for m in (1, 2, 5, 10) if m * k >= raw * (1 - 1e-9))


def window_edges(t0: float, t1: float, w: float) -> np.ndarray:
    """Edges of windows of width w from t0 to the run's end t1. The last window ends at t1, not
    at the next multiple of w: its rates divide by the time it covers. A remainder shorter than
    half a window is merged into the previous window (which then covers up to 1.5 w), so no
    rate divides by a sliver of a window (one request in 0.05 s would read as 20 req/s)."""
    span = t1 - t0
    nwin = max(int(math.ceil(span / w - 1e-9)), 1)
    if nwin > 1 and span - (nwin - 1) * w < w / 2:
        nwin -= 1
    edges = t0 + w * np.arange(nwin + 1, dtype=np.float64)
    edges[-1] = max(t1, edges[-2] + (w if span <= 0 else 0.0))
    return edges


def timeseries(an: Analysis, server: pa.Table | None = None, window_s: float | None = None) -> dict:
    """Per-window series over the whole run (warm-up included, so it can be seen)."""
    rm = an.rm
    basis = time_basis(rm)
    if rm.n == 0 or np.isnan(basis).all():
        return {}
    t0 = float(np.fmin(np.nanmin(basis), np.fmin.reduce(rm.sent)))     # fmin.reduce: NaN when nothing was sent
    t1 = float(np.nanmax(rm.end)) if not np.isnan(rm.end).all() else float(np.nanmax(basis))
    w = window_s or nice_window(t1 - t0, int(np.count_nonzero(~np.isnan(basis))))
    edges = window_edges(t0, t1, w)
    nwin, widths = len(edges) - 1, np.diff(edges)

    def idx(t: np.ndarray) -> np.ndarray:
        k = np.subtract(t, t0)
        np.floor(np.divide(k, w, out=k), out=k)
        return np.clip(np.nan_to_num(k, copy=False), 0, nwin - 1, out=k).astype(np.int64)   # the merged tail: last

    def per_window(window: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.bincount(window[rows], minlength=nwin)[:nwin] / widths

    sent_w, end_w = idx(rm.sent), idx(rm.end)      # each time's window, computed once
    out: dict = {"window_s": w, "t_s": _clean(edges[:-1] - t0 + 0.0), "t0_s": t0,
                 "width_s": _clean(widths),        # w each, the last one what it really covers
                 "offered_rps": _clean(per_window(idx(basis), ~np.isnan(basis))),
                 "achieved_rps": _clean(per_window(end_w, rm.ok)),
                 "goodput_rps": _clean(per_window(end_w, an.good)),
                 "errors_per_s": _clean(per_window(end_w, ~rm.ok & ~np.isnan(rm.sent))),
                 "inflight": _clean(inflight(rm.sent, rm.end, edges))}
    for name in ("ttft_ms", "tpot_ms", "lag_ms"):
        _, pct = grouped_percentiles(rm.columns[name], sent_w, nwin, [50, 99])
        out[f"{name}_p50"], out[f"{name}_p99"] = _clean(pct[:, 0]), _clean(pct[:, 1])
    out["server"] = server_series(server, edges) if server is not None and server.num_rows else {}
    return out


def server_series(server: pa.Table, edges: np.ndarray) -> dict:
    """Scraped samples folded into the same windows: gauges averaged (summed across label sets
    at each scrape, KV usage averaged), counters turned into increases per window."""
    df, nwin = server.to_pandas(), len(edges) - 1

    def window_of(t: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(edges, t, "right") - 1, 0, nwin - 1)
    out = {}
    for key, (suffixes, how) in SERVER_SERIES.items():
        sel = df[df["name"].map(lambda n: any(str(n).endswith(s) for s in suffixes))]
        sel = sel[(sel["time_s"] >= edges[0]) & (sel["time_s"] <= edges[-1])].dropna(subset=["value"])
        if sel.empty:
            continue
        if how == "counter":
            sel = sel.sort_values("time_s")
            inc = sel.groupby(sel["labels"].fillna(""), sort=False)["value"].diff().clip(lower=0).fillna(0)
            series = np.bincount(window_of(sel["time_s"].to_numpy()), weights=inc.to_numpy(), minlength=nwin)[:nwin]
        else:
            per_scrape = sel.groupby("time_s")["value"].agg("mean" if how == "mean" else "sum")
            wi, v = window_of(per_scrape.index.to_numpy()), per_scrape.to_numpy()
            cnt = np.bincount(wi, minlength=nwin)[:nwin]
            with np.errstate(invalid="ignore"):
                series = np.bincount(wi, weights=v, minlength=nwin)[:nwin] / cnt
            # A gauge holds its value until the next scrape: windows shorter than the scrape
            # interval would otherwise alternate with gaps and draw no line at all.
            filled = np.maximum.accumulate(np.where(cnt > 0, np.arange(nwin), -1))
            series = np.where(filled >= 0, series[np.maximum(filled, 0)], np.nan)
        out[key] = _clean(series)
    return out


TAIL_FACTOR = 2.0    # warn when TTFT p99 on new connections is more than this x the reused ones'
TAIL_GAP_MS = 10.0   # ... and more than this many ms higher
MATCH_WINDOW_S = 1.0  # a new request's peers: reused ones sent within half of this of it
QUEUEING_NOTE = ("the slow first tokens on new connections are matched by reused ones sent in the same "
                 "seconds: server queueing, not connection set-up")


def _stats(x: np.ndarray, keys=("p50", "p99")) -> dict:
    d = describe(x, ci=())
    return {"n": d["n"], **{k: d[k] for k in keys}}


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float | None]:
    """Percentiles `qs` (0..100) of `values` weighted by `weights` (> 0): each value sits at the
    middle of its share of the total weight, linear in between, the ends held (equal weights give
    Hazen's percentiles, numpy's method="hazen"). None for no values."""
    if not len(values):
        return [None for _ in qs]
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    at = (np.cumsum(w) - w / 2) / w.sum()
    return [float(x) for x in np.interp(np.asarray(qs, dtype=np.float64) / 100, at, v)]


def window_peers(sent_new: np.ndarray, sent_reused: np.ndarray, window_s: float = MATCH_WINDOW_S):
    """For each new send, the slice [lo, hi) of the sorted reused sends within window_s / 2 of it;
    and each reused send's weight: the sum over the windows holding it of 1 / that window's size
    (0 exactly for one in no window)."""
    lo = np.searchsorted(sent_reused, sent_new - window_s / 2, side="left")
    hi = np.searchsorted(sent_reused, sent_new + window_s / 2, side="right")
    has, size = hi > lo, len(sent_reused) + 1
    step, w = np.zeros(size), 1.0 / (hi - lo)[has]
    np.add.at(step, np.concatenate([lo[has], hi[has]]), np.concatenate([w, -w]))   # in this order, as before
    held = np.bincount(lo[has], minlength=size) - np.bincount(hi[has], minlength=size)
    return lo, hi, np.where(np.cumsum(held)[:-1] > 0, np.cumsum(step)[:-1], 0.0)


def peak_per_second(times: np.ndarray) -> int:
    """The most of `times` (seconds, NaN ignored) within any one-second window."""
    ts = np.sort(times[~np.isnan(times)])
    return int((np.searchsorted(ts, ts + 1.0, side="left") - np.arange(len(ts))).max(initial=0))


def connections(an, config: dict | None = None) -> dict:
    """The `connections` section for the measured rows of `an` (reports.analysis.Analysis).
    `config`: run.json, whose run config says the records carry connect_s even when every
    request reused a connection (older runs and imported results do not: `recorded` false)."""
    rm, m, t = an.rm, an.mask, an.table
    c = as_f64(t.column("connect_s")) if "connect_s" in t.column_names else np.full(rm.n, np.nan)
    new = ~np.isnan(c)
    run_config = config.get("config") if isinstance(config, dict) else None
    recorded = bool(new.any()) or (isinstance(run_config, dict) and "preconnect" in run_config)
    empty = {"n": 0, "p50": None, "p99": None}
    out = {"recorded": recorded, "opened": None, "reused": None, "peak_opened_per_s": None,
           "connect_ms": {**empty, "max": None},
           "ttft_ms": dict.fromkeys(("new", "reused", "new_matched", "reused_matched", "new_matched_excess"), empty),
           "match_window_s": MATCH_WINDOW_S, "unmatched_new": None, "note": None, "warning": None}
    if not recorded:
        return out
    opened = m & new
    reused = m & ~new & ~np.isnan(rm.sent)
    ttft = rm.columns["ttft_ms"]
    # when each connection was opened: its request's send less the set-up (schedule if never sent)
    when = np.where(np.isnan(rm.sent), rm.scheduled, rm.sent - np.nan_to_num(c))[opened]
    out.update(opened=int(np.count_nonzero(opened)), reused=int(np.count_nonzero(reused)),
               peak_opened_per_s=peak_per_second(when), connect_ms=_stats(c[opened] * 1e3, ("p50", "p99", "max")),
               ttft_ms={"new": _stats(ttft[opened]), "reused": _stats(ttft[reused]),
                        **_matched(rm.sent, ttft, opened, reused)})
    tt = out["ttft_ms"]
    out["unmatched_new"] = tt["new"]["n"] - tt["new_matched"]["n"]
    p_new, p_old = tt["new_matched"]["p99"], tt["reused_matched"]["p99"]
    if _much_worse(p_new, p_old):
        n = out["peak_opened_per_s"] or out["opened"]
        out["warning"] = (f"{out['opened']:,} requests paid a connection set-up (connect p99 "
                          f"{out['connect_ms']['p99']:.1f} ms): their TTFT p99 was {p_new:.1f} ms against "
                          f"{p_old:.1f} ms on kept-alive connections sent in the same seconds "
                          f"({tt['new_matched']['n']:,} of them had such peers); open connections before T0 "
                          f"with `--preconnect {n}` (the most opened within one second)")
    elif _much_worse(tt["new"]["p99"], tt["reused"]["p99"]) and p_new is not None:
        out["note"] = QUEUEING_NOTE     # worse over the run, not within the same seconds
    return out


def _much_worse(p_new: float | None, p_old: float | None) -> bool:
    return p_new is not None and p_old is not None and p_new > TAIL_FACTOR * p_old and p_new - p_old > TAIL_GAP_MS


def _matched(sent: np.ndarray, ttft: np.ndarray, opened: np.ndarray, reused: np.ndarray) -> dict:
    """TTFT of the new-connection requests that had reused peers in their window (`new_matched`),
    of those peers (`reused_matched`: each new request's window weighs the same; n: distinct peers),
    and the difference at p50 and p99 (`new_matched_excess`; n: the new requests compared)."""
    new_i = np.flatnonzero(opened & ~np.isnan(ttft) & ~np.isnan(sent))
    old_i = np.flatnonzero(reused & ~np.isnan(ttft))
    old_i = old_i[np.argsort(sent[old_i], kind="stable")]
    lo, hi, weight = window_peers(sent[new_i], sent[old_i])
    new_m = new_i[hi > lo]
    peer = weight > 0
    ref = weighted_quantiles(ttft[old_i][peer], weight[peer], (50, 99))
    nm = _stats(ttft[new_m])
    return {"new_matched": nm, "reused_matched": {"n": int(np.count_nonzero(peer)), "p50": ref[0], "p99": ref[1]},
            "new_matched_excess": {"n": len(new_m), **{k: nm[k] - r if len(new_m) else None
                                                        for k, r in zip(("p50", "p99"), ref)}}}
