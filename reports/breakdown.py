"""Breakdowns of a measured run: per model, per slo_class, per input-length bucket, and time
series in windows joined with the server's scraped metrics (KV usage, queue, preemptions).

Everything is grouped with integer codes and bincount / one stable sort: the Python loops
run over groups and windows, never over requests.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from .analysis import Analysis
from .stats import grouped_percentiles, regrouped_percentiles
from .window import inflight

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


def _clean(x) -> list:
    return [None if (v is None or (isinstance(v, float) and math.isnan(v))) else v for v in
            (x.tolist() if hasattr(x, "tolist") else x)]


MAX_CELLS = 1 << 16   # beyond this many label combinations, each grouping is counted on its own


def groups(an: Analysis, codes: np.ndarray, labels: list[str]) -> list[dict]:
    """One row per non-empty group of the measured requests: counts, rates, latency percentiles."""
    return breakdowns(an, {"key": (codes, labels)})["key"]


def breakdowns(an: Analysis, kinds: dict[str, tuple[np.ndarray, list[str]]]) -> dict[str, list[dict]]:
    """groups() for several groupings at once: requests are counted and their latencies
    histogrammed once per fine cell (the combination of every grouping's label), and each
    grouping's rows are sums of cells, so the work over requests does not grow with groupings."""
    sizes = [max(len(labels), 1) for _, labels in kinds.values()]
    if len(kinds) > 1 and math.prod(sizes) > MAX_CELLS:
        return {k: groups(an, *v) for k, v in kinds.items()}
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
    okm = m & rm.ok
    okm &= ~np.isnan(rm.n_out)
    # Output tokens of the measured successes; other rows add 0.0 (sums of whole numbers: exact).
    out_tok = np.bincount(cells, weights=np.where(okm, rm.n_out, 0.0), minlength=ncells)
    lat = {}
    for name in GROUP_LATENCIES + (GROUP_REASONING if rm.has_reasoning else ()):
        vals = np.where(rm.ok, rm.reasoning, np.nan) if name == "reasoning_tokens" else rm.columns[name]
        lat[name] = regrouped_percentiles(vals if everything else vals[m], cells if everything else cells[m],
                                          ncells, list(zip(maps, sizes)), [50, 90, 99])
    d = an.duration_s
    out = {}
    for k, ((_, labels), to, size) in enumerate(zip(kinds.values(), maps, sizes)):
        def total(x):
            return np.bincount(to, weights=x, minlength=size)[:size]
        issued, ok, good = total(per.sum(axis=1)), total(per[:, 1] + per[:, 3]), total(per[:, 3])
        tok = total(out_tok)
        rows = []
        for i, label in enumerate(labels):
            if issued[i] == 0:
                continue
            row = {"key": label, "issued": int(issued[i]), "ok": int(ok[i]),
                   "error_rate": float(1 - ok[i] / issued[i]), "attainment": float(good[i] / issued[i]),
                   "requests_per_s": float(ok[i] / d) if d else None,
                   "goodput_rps": float(good[i] / d) if d else None,
                   "output_tokens_per_s": float(tok[i] / d) if d else None}
            for name, per_grouping in lat.items():
                counts, pct = per_grouping[k]
                row[name] = {"n": int(counts[i]), "p50": pct[i, 0], "p90": pct[i, 1], "p99": pct[i, 2]}
                row[name] = {key: (None if isinstance(v, float) and math.isnan(v) else v)
                             for key, v in row[name].items()}
            rows.append(row)
        out[list(kinds)[k]] = rows
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
    basis = np.where(np.isnan(rm.scheduled), rm.sent, rm.scheduled)
    if rm.n == 0 or np.isnan(basis).all():
        return {}
    t0 = float(np.nanmin(basis))
    first_sent = np.fmin.reduce(rm.sent) if rm.n else np.nan     # NaN only when nothing was sent
    if not np.isnan(first_sent):
        t0 = min(t0, float(first_sent))
    t1 = float(np.nanmax(rm.end)) if not np.isnan(rm.end).all() else float(np.nanmax(basis))
    w = window_s or nice_window(t1 - t0, int(np.count_nonzero(~np.isnan(basis))))
    edges = window_edges(t0, t1, w)
    nwin, widths = len(edges) - 1, np.diff(edges)

    def idx(t: np.ndarray) -> np.ndarray:
        k = np.subtract(t, t0)
        k /= w
        np.floor(k, out=k)
        k[np.isnan(k)] = 0
        return np.clip(k, 0, nwin - 1, out=k).astype(np.int64)   # the merged tail is in the last

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
        vals = rm.columns[name]
        _, pct = grouped_percentiles(vals, sent_w, nwin, [50, 99])
        out[f"{name}_p50"], out[f"{name}_p99"] = _clean(pct[:, 0]), _clean(pct[:, 1])
    out["server"] = server_series(server, edges) if server is not None and server.num_rows else {}
    return out


def server_series(server: pa.Table, edges: np.ndarray) -> dict:
    """Scraped samples folded into the same windows: gauges averaged (summed across label sets
    at each scrape, KV usage averaged), counters turned into increases per window."""
    df = server.to_pandas()
    nwin = len(edges) - 1

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
            t, v = sel["time_s"].to_numpy(), inc.to_numpy()
            series = np.bincount(window_of(t), weights=v, minlength=nwin)[:nwin]
        else:
            per_scrape = sel.groupby("time_s")["value"].agg("mean" if how == "mean" else "sum")
            t, v = per_scrape.index.to_numpy(), per_scrape.to_numpy()
            wi = window_of(t)
            cnt = np.bincount(wi, minlength=nwin)[:nwin]
            with np.errstate(invalid="ignore"):
                series = np.bincount(wi, weights=v, minlength=nwin)[:nwin] / cnt
            # A gauge holds its value until the next scrape: windows shorter than the scrape
            # interval would otherwise alternate with gaps and draw no line at all.
            filled = np.maximum.accumulate(np.where(cnt > 0, np.arange(nwin), -1))
            series = np.where(filled >= 0, series[np.maximum(filled, 0)], np.nan)
        out[key] = _clean(series)
    return out
