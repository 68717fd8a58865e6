"""Where the time went: each request's server span (spans.parquet, `replay run --otlp`) joined to
its record by trace id, its TTFT and E2E split into client+network, queue, prefill and decode,
and a bottleneck map naming, per time window, what limited the run (with the evidence).

Durations are the server's own (gen_ai.latency.*), so no clock is compared with another; the
client's share is the rest: net_ms = ttft_ms - server_ttft_ms (client, network, HTTP front end).
A record without its span has no decomposition: counted as missing, never guessed. Components
are kept for successful requests only, the population of the client latencies they split.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .breakdown import length_buckets
from .errors import ReportError
from .metrics import as_f64
from .schema import SPANS_SCHEMA
from .slo import SPAN_METRICS
from .spans import SPANS_FILE, own_trace_ids
from .stats import PERCENTILES, grouped_percentiles

# Stacked parts: TTFT = net + queue + prefill + other (server TTFT - queue - prefill: the API
# server's tokenising and hand-off to the engine, before the request is queued); E2E adds decode.
TTFT_PARTS = ("net_ms", "queue_ms", "prefill_ms", "other_ms")
E2E_PARTS = TTFT_PARTS + ("decode_ms",)
COLORS = {"net_ms": "#7f7f7f", "queue_ms": "#d62728", "prefill_ms": "#1f77b4", "other_ms": "#bcbd22",
          "decode_ms": "#2ca02c"}
# Bottleneck map. DOMINANT: a part that is half of the window's TTFT (or decode half of its E2E)
# outweighs all the others together. KV_FULL is on window means (summary.KV_FULL, 0.95, is on
# single scrapes): a cache full most of a window, draining for a moment, averages about 0.9.
# SLOWED: prefill, decode and the client are named only where the window is this much slower than
# the run's quiet windows (BASELINE_Q over windows): at light load TTFT is mostly prefill and the
# TPOT is the model's own, which is physics, not a limit. NET_FLOOR_MS: below this the client's
# part is a LAN round trip and JSON parsing whatever its share. MIN_JOINED: fewer joined spans
# than this in a window say nothing about it. BATCH_GREW: decode-bound needs the batch (running,
# else in flight) this many times the quiet windows' too: a TPOT that rose at the same batch is
# noise or another tenant, not decode at high batch (seen: a light run's 6-token requests).
DOMINANT, KV_FULL, SLOWED, BASELINE_Q, NET_FLOOR_MS, MIN_JOINED, BATCH_GREW = 0.5, 0.9, 1.5, 10, 20.0, 3, 2.0
LABELS = {"kv": "queueing behind a full KV cache", "sched": "queueing (scheduler limit, KV not full)",
          "client": "client/host", "prefill": "prefill-bound under long prompts", "decode": "decode-bound",
          "healthy": "healthy", "unknown": "too few spans"}
LABEL_COLORS = {"kv": "#d62728", "sched": "#ff7f0e", "client": "#7f7f7f", "prefill": "#1f77b4",
                "decode": "#2ca02c", "healthy": "#c7e9c0", "unknown": "#eeeeee"}


@dataclass
class ServerTime:
    row: np.ndarray        # per record: its span's row in `spans` (first received), -1: none
    joined: np.ndarray     # bool per record
    spans: pa.Table        # sorted by received_s (null last), file order among equals
    counts: dict


def load_spans(run_dir: Path | None) -> pa.Table | None:
    path = Path(run_dir) / SPANS_FILE if run_dir is not None else None
    if path is None or not path.exists():
        return None
    import pyarrow.parquet as pq
    try:
        t = pq.read_table(path)
        return pa.table({f.name: t.column(f.name).cast(f.type) if f.name in t.column_names
                         else pa.nulls(t.num_rows, f.type) for f in SPANS_SCHEMA})
    except (pa.ArrowException, OSError, KeyError) as e:
        raise ReportError(f"cannot read server spans: {e}", file=path) from None


def attach(an, run) -> None:
    """Join the run's spans (if it has spans.parquet) to its records: `an.server` and the
    SPAN_METRICS columns of `an.rm` (ms, NaN where no span or the request failed)."""
    spans = load_spans(run.dir)
    if spans is None:
        return
    rm = an.rm
    tid = run.column("trace_id").combine_chunks()
    sp = spans.take(pc.sort_indices(spans, [("received_s", "ascending")]))
    stid = sp.column("trace_id").combine_chunks()
    row = pc.fill_null(pc.index_in(tid, value_set=stid), -1).to_numpy(zero_copy_only=False)  # first match
    traced = tid.is_valid().to_numpy(zero_copy_only=False) & ~np.isnan(rm.sent)
    joined = traced & (row >= 0)
    matched = pc.is_in(stid, value_set=tid.drop_null()).to_numpy(zero_copy_only=False)
    own = pc.is_in(stid, value_set=pa.array(sorted(own_trace_ids(((run.config or {}).get("config") or {}).get(
        "run_id"))), pa.string())).to_numpy(zero_copy_only=False)   # the probe's and warm-ups' spans
    cfg = (run.config or {}).get("otlp") or {}
    deadline = cfg.get("deadline_s")
    if deadline is None and cfg.get("wait_s") is not None:   # the receiver waited wait_s after the last end
        deadline = float(np.nanmax(as_f64(run.column("end_s")), initial=0.0)) + float(cfg["wait_s"])
    at = np.where(row >= 0, row, sp.num_rows)       # no span: the NaN appended after the last

    def pick(name: str) -> np.ndarray:
        return np.append(as_f64(sp.column(name)), np.nan)[at]
    received = pick("received_s")
    missing = traced & ~joined
    n_match = int(matched.sum())
    counts = {"spans": sp.num_rows, "traced": int(traced.sum()), "joined": int(joined.sum()),
              "missing_ok": int((missing & rm.ok).sum()), "missing_failed": int((missing & ~rm.ok).sum()),
              "duplicate": n_match - len(pc.unique(stid.filter(pa.array(matched)))),
              "unmatched": sp.num_rows - n_match - int(own.sum()), "own": int(own.sum()), "deadline_s": deadline,
              "late": int((joined & (received > deadline)).sum()) if deadline is not None else None}
    keep = joined & rm.ok
    cols = {}
    for name, src in (("server_ttft_ms", "ttft_s"), ("server_e2e_ms", "e2e_s"), ("queue_ms", "queue_s"),
                      ("prefill_ms", "prefill_s"), ("decode_ms", "decode_s")):
        v = pick(src) * 1e3
        v[~keep] = np.nan
        cols[name] = v
    ttft = rm.columns["ttft_ms"]
    cols["net_ms"] = ttft - cols["server_ttft_ms"]
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in ("queue", "prefill", "net"):
            cols[f"{k}_share"] = cols[f"{k}_ms"] / ttft
    assert set(cols) == set(SPAN_METRICS)
    rm.columns.update(cols)
    an.server = ServerTime(row, joined, sp, counts)


def parts(rm, kind: str = "ttft") -> dict[str, np.ndarray]:
    """Per record, the additive parts of its client TTFT (or E2E): they sum to it."""
    c = rm.columns
    out = {"net_ms": c["net_ms"], "queue_ms": c["queue_ms"], "prefill_ms": c["prefill_ms"],
           "other_ms": c["server_ttft_ms"] - c["queue_ms"] - c["prefill_ms"]}
    if kind == "e2e":
        out.update(net_ms=rm.columns["e2e_ms"] - c["server_e2e_ms"], decode_ms=c["decode_ms"],
                   other_ms=c["server_e2e_ms"] - c["queue_ms"] - c["prefill_ms"] - c["decode_ms"])
    return out


def tail_parts(an, metric: str = "ttft_ms", stat: str = "p99") -> dict | None:
    """Mean parts of the measured joined requests at or above `metric`'s `stat` (all of them for
    the mean): where the time of the tail went. None when there is none."""
    if an.server is None:
        return None
    x = an.rm.columns[metric]
    rows = an.measured_ok & an.server.joined & ~np.isnan(an.rm.columns["server_ttft_ms"])
    if not rows.any():
        return None
    if stat != "mean":
        rows &= x >= np.percentile(x[rows], PERCENTILES[stat])
    out = {k: float(np.nanmean(v[rows])) for k, v in parts(an.rm, "e2e" if metric == "e2e_ms" else "ttft").items()}
    return {"requests": int(rows.sum()), metric: float(x[rows].mean()), **out}


def _pct(counts, res, i: int) -> dict:
    return {"n": int(counts[i]), **{q: float(res[i, j]) for j, q in enumerate(("p50", "p90", "p99"))}}


def _grouped(rm, rows: np.ndarray, codes: np.ndarray, labels: list[str]) -> list[dict]:
    out = {k: grouped_percentiles(rm.columns[k][rows], codes[rows], len(labels), [50, 90, 99]) for k in SPAN_METRICS}
    ttft = parts(rm)
    cnt = np.bincount(codes[rows & ~np.isnan(ttft["net_ms"])], minlength=len(labels))
    return [{"key": lab, **{k: _pct(*out[k], i) for k in SPAN_METRICS},
             "mean_ttft_parts": {k: float(np.nanmean(v[rows & (codes == i)])) for k, v in ttft.items()}}
            for i, lab in enumerate(labels) if cnt[i]]


def _clock(config: dict | None, a: float, b: float) -> str:
    """A stretch of the run, in UTC when run.json has its wall-clock start, else in s from t0."""
    wall = (config or {}).get("t0_wall")
    if isinstance(wall, (int, float)) and 1e9 < wall < 1e11:
        return "-".join(time.strftime("%H:%M:%S", time.gmtime(wall + t)) for t in (a, b)) + " UTC"
    return f"{a:g}-{b:g} s"


def _window(rm, ts: dict) -> np.ndarray:
    """Each request's window of the summary's time series, by send time (as breakdown.timeseries)."""
    k = np.floor(np.nan_to_num((rm.sent - ts["t0_s"]) / ts["window_s"]))
    return np.clip(k, 0, len(ts["t_s"]) - 1).astype(np.int64)


def bottleneck_map(an, ts: dict, lag: dict | None) -> list[dict]:
    """Per time window of the summary's time series: what limited the run, with its evidence."""
    rm, nwin, win = an.rm, len(ts["t_s"]), _window(an.rm, ts)
    pt, pe = parts(rm), parts(rm, "e2e")
    p = {**pt, "decode_ms": pe["decode_ms"], "ttft_ms": rm.columns["ttft_ms"], "e2e_ms": rm.columns["e2e_ms"]}
    rows = an.server.joined & rm.ok & ~np.isnan(pt["net_ms"] + pe["net_ms"])
    n = np.bincount(win[rows], minlength=nwin)[:nwin]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = {k: np.bincount(win[rows], weights=v[rows], minlength=nwin)[:nwin] / n for k, v in p.items()}
    _, q99 = grouped_percentiles(np.where(rows, rm.columns["queue_ms"], np.nan), win, nwin, [99])
    _, inp = grouped_percentiles(np.where(rows, rm.input_len, np.nan), win, nwin, [50])
    srv = ts.get("server") or {}
    s = {k: np.array([np.nan if v is None else v for v in srv.get(k) or [None] * nwin], float)
         for k in ("kv_cache_usage", "waiting", "running", "preemptions")}
    tpot = np.array([np.nan if v is None else v for v in ts.get("tpot_ms_p50") or [None] * nwin], float)
    batch = np.where(np.isnan(s["running"]), np.array(ts.get("inflight") or [np.nan] * nwin, float), s["running"])
    good = n >= MIN_JOINED
    base_ttft = np.nanpercentile(mean["ttft_ms"][good], BASELINE_Q) if good.any() else np.nan
    base_tpot, base_batch = (np.nanpercentile(x[good], BASELINE_Q) if (good & ~np.isnan(x)).any() else np.nan
                             for x in (tpot, batch))
    late = [(w["start_s"] - ts["t0_s"], w["end_s"] - ts["t0_s"]) for w in (lag or {}).get("windows") or []
            if w.get("cause") and w["cause"] != "unexplained"]
    out = []
    for k in range(nwin):
        a, b = ts["t_s"][k], ts["t_s"][k] + (ts.get("width_s") or [ts["window_s"]] * nwin)[k]
        ttft = mean["ttft_ms"][k]
        share = {x: mean[f"{x}_ms"][k] / ttft for x in ("net", "queue", "prefill")}
        ev = {"t_s": a, "requests": int(n[k]), "ttft_ms_mean": ttft, "e2e_ms_mean": mean["e2e_ms"][k],
              **{f"{x}_share": v for x, v in share.items()}, "decode_share_e2e": mean["decode_ms"][k] / mean["e2e_ms"][k],
              "queue_ms_p99": q99[k, 0], "input_tokens_p50": inp[k, 0], "tpot_ms_p50": tpot[k],
              "tpot_baseline_ms": base_tpot, "ttft_baseline_ms": base_ttft, "batch": batch[k],
              "batch_baseline": base_batch,
              **{x: s[x][k] for x in ("kv_cache_usage", "waiting", "running", "preemptions")},
              "late_sends": any(lo < b and hi > a for lo, hi in late)}
        slowed = ttft >= SLOWED * base_ttft
        if not good[k]:
            key = "unknown"
        elif share["queue"] >= DOMINANT:
            key = "kv" if s["kv_cache_usage"][k] >= KV_FULL or s["preemptions"][k] > 0 else "sched"
        elif ev["late_sends"] or (share["net"] >= DOMINANT and mean["net_ms"][k] >= NET_FLOOR_MS and slowed):
            key = "client"
        elif share["prefill"] >= DOMINANT and slowed:
            key = "prefill"
        elif ev["decode_share_e2e"] >= DOMINANT and tpot[k] >= SLOWED * base_tpot and \
                batch[k] >= max(BATCH_GREW * base_batch, 2):
            key = "decode"
        else:
            key = "healthy"
        out.append({"key": key, "label": LABELS[key] + (f" at batch {batch[k]:.0f}" if key == "decode" else ""),
                    "evidence": {x: (None if isinstance(v, float) and np.isnan(v) else v) for x, v in ev.items()}})
    return out


def _evidence_text(key: str, ws: list[dict]) -> str:
    def top(x, f=max):
        v = [w["evidence"][x] for w in ws if w["evidence"][x] is not None]
        return f(v) if v else None
    parts_ = {"kv": [("KV {:.0%}", "kv_cache_usage"), ("{:.0f} waiting", "waiting"), ("{:.0f} preemptions", "preemptions"),
                     ("queue {:.0%} of TTFT", "queue_share")],
              "sched": [("queue {:.0%} of TTFT", "queue_share"), ("{:.0f} waiting", "waiting"), ("KV {:.0%}", "kv_cache_usage")],
              "client": [("client+network {:.0%} of TTFT", "net_share")],
              "prefill": [("prefill {:.0%} of TTFT", "prefill_share"), ("input p50 {:.0f} tokens", "input_tokens_p50")],
              "decode": [("decode {:.0%} of E2E", "decode_share_e2e"), ("TPOT p50 {:.3g} ms", "tpot_ms_p50"),
                         ("quiet-window TPOT {:.3g} ms", "tpot_baseline_ms"),
                         ("quiet-window batch {:.0f}", "batch_baseline")]}.get(key, [])
    txt = [f.format(top(x)) for f, x in parts_ if top(x) is not None and not (x == "preemptions" and not top(x))]
    if key == "client" and any(w["evidence"]["late_sends"] for w in ws):
        txt.append("the replay sent late here")
    return ", ".join(txt)


def segments(wins: list[dict], config: dict | None, ts: dict) -> list[dict]:
    """Consecutive windows of one label merged, with the evidence in words."""
    out: list[dict] = []
    for k, w in enumerate(wins):
        if out and out[-1]["label"] == w["label"]:
            out[-1]["windows"].append(k)
        else:
            out.append({"key": w["key"], "label": w["label"], "windows": [k]})
    width = ts.get("width_s") or [ts["window_s"]] * len(wins)
    for seg in out:
        ks = seg.pop("windows")
        a, b = ts["t_s"][ks[0]], ts["t_s"][ks[-1]] + width[ks[-1]]
        ev = [wins[k]["evidence"] for k in ks]
        seg.update(start_s=a, end_s=b, requests=sum(e["requests"] for e in ev), when=_clock(config, ts["t0_s"] + a,
                                                                                           ts["t0_s"] + b),
                   # TTFT its requests spent above the run's quiet windows: the headline names the worst
                   excess_ttft_s=sum(e["requests"] * (e["ttft_ms_mean"] - e["ttft_baseline_ms"]) / 1e3 for e in ev
                                     if e["ttft_ms_mean"] is not None and e["ttft_baseline_ms"] is not None),
                   evidence=_evidence_text(seg["key"], [wins[k] for k in ks]))
    return out


def section(an, run, ts: dict, lag: dict | None) -> dict | None:
    """summary.json `server_time`: counts, component percentiles (overall, per model, per
    input-length bucket, per window), the bottleneck map and the slowest requests."""
    if an.server is None:
        return None
    rm, m = an.rm, an.mask
    st: dict = {"counts": an.server.counts, "receiver": (run.config or {}).get("otlp"),
                "overall": {k: _pct(*grouped_percentiles(rm.columns[k][m], np.zeros(int(m.sum()), np.int64), 1,
                                                         [50, 90, 99]), 0) for k in SPAN_METRICS},
                "ttft_tail": tail_parts(an, "ttft_ms", "p99"), "ttft_mean": tail_parts(an, "ttft_ms", "mean"),
                "e2e_mean": tail_parts(an, "e2e_ms", "mean"),
                "by_model": _grouped(rm, m, *rm.model),
                "by_input_length": _grouped(rm, m, *length_buckets(rm.input_len))}
    if ts.get("t_s"):
        win = _window(rm, ts)
        st["timeseries"] = {f"{k}_{q}": grouped_percentiles(rm.columns[k], win, len(ts["t_s"]), [50, 99])[1][:, j].tolist()
                            for k in ("net_ms", "queue_ms", "prefill_ms", "decode_ms") for j, q in enumerate(("p50", "p99"))}
        pt = parts(rm)
        rows = an.server.joined & rm.ok & ~np.isnan(sum(pt.values()))
        c = np.bincount(win[rows], minlength=len(ts["t_s"]))
        with np.errstate(invalid="ignore", divide="ignore"):
            st["timeseries"] |= {f"{k}_mean": (np.bincount(win[rows], weights=v[rows],
                                                           minlength=len(ts["t_s"])) / c).tolist()
                                 for k, v in pt.items()}
        st["map"] = bottleneck_map(an, ts, lag)
        st["segments"] = segments(st["map"], run.config, ts)
    ttft = np.where(m & rm.ok, rm.columns["ttft_ms"], -np.inf)
    top = np.argpartition(-ttft, min(10, rm.n) - 1)[:10] if rm.n else np.empty(0, np.int64)
    slow = [int(i) for i in top[np.argsort(-ttft[top], kind="stable")] if np.isfinite(ttft[i])]
    ids = run.column("request_id").take(pa.array(slow, pa.int64())).to_pylist()
    p = parts(rm, "e2e") | parts(rm)
    srid = an.server.spans.column("server_request_id")
    st["slowest"] = [{"request_id": rid, "model": rm.model[1][rm.model[0][i]], "input_tokens": rm.input_len[i],
                      "ttft_ms": ttft[i], "e2e_ms": rm.columns["e2e_ms"][i], "joined": bool(an.server.joined[i]),
                      "server_request_id": srid[int(an.server.row[i])].as_py() if an.server.joined[i] else None,
                      **{k: float(p[k][i]) for k in E2E_PARTS}} for i, rid in zip(slow, ids)]
    st["sentence"] = sentence(st)
    c = st["counts"]
    bad = {k: c[k] for k in ("missing_ok", "duplicate", "unmatched", "late") if c.get(k)}
    st["warning"] = None if not bad else (
        f"server spans: {c['joined']:,} of {c['traced']:,} traced requests joined; "
        + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in bad.items()) + " (counted, never guessed)")
    return st


def sentence(st: dict) -> str:
    """The headline's line: the parts of the slowest 1% TTFT and the worst limited stretch."""
    t = st.get("ttft_tail")
    if not t:
        c = st["counts"]
        return f"no server span joined ({c['traced']:,} traced, {c['missing_ok'] + c['missing_failed']:,} missing)"
    txt = (f"slowest 1% TTFT (mean {t['ttft_ms']:.0f} ms) = net {t['net_ms']:.0f} + queue {t['queue_ms']:.0f} + "
           f"prefill {t['prefill_ms']:.0f} + other {t['other_ms']:.0f} ms")
    bad = [s for s in st.get("segments") or [] if s["key"] not in ("healthy", "unknown")]
    if bad:
        s = max(bad, key=lambda s: s["excess_ttft_s"])
        more = f" (+{len(bad) - 1} more stretches)" if len(bad) > 1 else ""
        return f"{txt}; {s['when']} {s['label']} ({s['evidence']}){more}"
    return txt + ("; no window was limited" if st.get("segments") else "")


def grown(base, cand, metric: str, stat: str) -> str | None:
    """For a regressed TTFT/E2E row: which part grew most among the requests at or above it."""
    b, c = tail_parts(base, metric, stat), tail_parts(cand, metric, stat)
    if b is None or c is None:
        return None
    d = {k: c[k] - b[k] for k in (E2E_PARTS if metric == "e2e_ms" else TTFT_PARTS)}
    top = max(d, key=d.get)
    rest = ", ".join(f"{k[:-3]} {v:+.0f}" for k, v in d.items() if k != top)
    where = "over all requests" if stat == "mean" else f"among the requests at or above their {stat}"
    return (f"{metric}.{stat} regressed: {where}, {top[:-3]} grew most ({b[top]:.0f} -> {c[top]:.0f} ms, "
            f"{d[top]:+.0f} ms on average; {rest} ms)")


def charts(s: dict) -> list[str]:
    """Stacked TTFT parts per model, per input-length bucket and over time; the map as a strip."""
    from .svg import bars
    st, out = s.get("server_time") or {}, []
    stack = [{"label": k[:-3].replace("net", "client+network"), "color": COLORS[k]} for k in TTFT_PARTS]
    for key, name in (("by_model", "model"), ("by_input_length", "input length (tokens)")):
        rows = st.get(key) or []
        if rows:
            out.append(bars([r["key"] for r in rows], [dict(x, values=[r["mean_ttft_parts"][k] for r in rows])
                                                       for x, k in zip(stack, TTFT_PARTS)],
                            title=f"Mean TTFT decomposition per {name}", xlabel=name, ylabel="ms"))
    ts, tst = s.get("timeseries") or {}, st.get("timeseries") or {}
    if tst and ts.get("t_s"):
        x = [f"{t:g}" for t in ts["t_s"]]
        out.append(bars(x, [dict(a, values=tst[f"{k}_mean"]) for a, k in zip(stack, TTFT_PARTS)],
                        title="Mean TTFT decomposition over time", xlabel="window start (s, by send time)", ylabel="ms"))
        keys = [k for k in LABELS if any(w["key"] == k for w in st["map"])]
        out.append(bars(x, [{"label": LABELS[k], "color": LABEL_COLORS[k],
                             "values": [1.0 if w["key"] == k else None for w in st["map"]]} for k in keys],
                        title="Bottleneck map", xlabel="window start (s)", ylabel="", height=24, ticks=False))
    return out
