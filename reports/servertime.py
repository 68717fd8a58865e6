"""Where the time went: each request's server span (spans.parquet, `replay run --otlp`) joined to
its record by trace id, its TTFT and E2E split into client+network, queue, prefill and decode,
and a bottleneck map naming, per time window, what limited the run (with the evidence).

Durations are the server's own (gen_ai.latency.*), so no clock is compared with another; the
client's share is the rest: net_ms = ttft_ms - server_ttft_ms (client, network, HTTP front end).
A record without its span has no decomposition: counted as missing, never guessed; a span that
contradicts its record (spans.resolve: anyone who can post to the receiver can send one) is
counted as impossible and never joined. Components are kept for successful requests only, the
population of the client latencies they split.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .validity import LATE_MS
from .breakdown import length_buckets
from .errors import ReportError
from .metrics import as_f64
from .schema import SPANS_SCHEMA
from .slo import SPAN_METRICS
from .spans import SPANS_FILE, own_trace_ids, resolve
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
# SLOWED: prefill, decode and client+network are named only where the window is this much slower than
# the run's quiet windows (BASELINE_Q over windows): at light load TTFT is mostly prefill and the
# TPOT is the model's own, which is physics, not a limit. NET_FLOOR_MS: below this the client's
# part is a LAN round trip and JSON parsing whatever its share. MIN_JOINED: fewer joined spans
# than this in a window say nothing about it. BATCH_GREW: decode-bound needs the batch (running,
# else in flight) this many times the quiet windows' too: a TPOT that rose at the same batch is
# noise or another tenant, not decode at high batch (seen: a light run's 6-token requests).
# Client/host needs both: sends late in the window (LATE_WINDOW of them, at least 2, more than
# LATE_MS late) and client+network NET_SHARE of its TTFT (one late send beside a TTFT of queue and
# prefill is no client bottleneck); client+network dominating without late sends is the network or
# the front end. LONG_PROMPT: prefill-bound "under long prompts" only when the window's input p50
# is this many times the run's (a run of 300-token prompts is prefill-bound, not long-prompted).
DOMINANT, KV_FULL, SLOWED, BASELINE_Q, NET_FLOOR_MS, MIN_JOINED, BATCH_GREW = 0.5, 0.9, 1.5, 10, 20.0, 3, 2.0
NET_SHARE, LATE_WINDOW, LONG_PROMPT = 0.25, 0.05, 2.0
LABELS = {"kv": "queueing behind a full KV cache", "sched": "queueing (scheduler limit, KV not full)",
          "client": "client/host", "net": "client+network", "prefill": "prefill-bound", "decode": "decode-bound",
          "healthy": "healthy", "unknown": "too few spans"}
LABEL_COLORS = {"kv": "#d62728", "sched": "#ff7f0e", "client": "#7f7f7f", "net": "#b0b0b0", "prefill": "#1f77b4",
                "decode": "#2ca02c", "healthy": "#c7e9c0", "unknown": "#eeeeee"}


@dataclass
class ServerTime:
    row: np.ndarray        # per record: its span's row in `spans` (spans.resolve), -1: none
    joined: np.ndarray     # bool per record
    spans: pa.Table        # sorted by received_s (null last), file order among equals
    counts: dict


def load_spans(run_dir: Path | None) -> pa.Table | None:
    if run_dir is None or not (path := Path(run_dir) / SPANS_FILE).exists():
        return None
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
    client = {"ttft_s": rm.columns["ttft_ms"] / 1e3, "e2e_s": rm.columns["e2e_ms"] / 1e3,
              **{k: as_f64(run.column(k)) for k in ("prompt_tokens", "completion_tokens")}}
    row, rejected, resolved = resolve(tid, client, sp)
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
    received, missing, n_own = pick("received_s"), traced & ~joined & ~rejected, int(own.sum())
    counts = {"spans": sp.num_rows, "traced": int(traced.sum()), "joined": int(joined.sum()),
              "missing_ok": int((missing & rm.ok).sum()), "missing_failed": int((missing & ~rm.ok).sum()),
              "rejected": int((traced & rejected).sum()), **{k: resolved[k] for k in ("impossible", "duplicate")},
              "unmatched": sp.num_rows - int(matched.sum()) - n_own, "own": n_own, "deadline_s": deadline,
              "late": int((joined & (received > deadline)).sum()) if deadline is not None else None}
    cols = {name: np.where(joined & rm.ok, pick(src) * 1e3, np.nan) for name, src in (
        ("server_ttft_ms", "ttft_s"), ("server_e2e_ms", "e2e_s"), ("queue_ms", "queue_s"), ("prefill_ms", "prefill_s"),
        ("decode_ms", "decode_s"))}
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


def clock(config: dict | None, *times: float) -> str | None:
    """Times of the run (s from t0) in UTC, '-'-joined, when run.json has its wall-clock start."""
    wall = (config or {}).get("t0_wall")
    if isinstance(wall, (int, float)) and 1e9 < wall < 1e11:
        return "-".join(time.strftime("%H:%M:%S", time.gmtime(wall + t)) for t in times) + " UTC"
    return None


def _window(rm, ts: dict) -> np.ndarray:
    """Each request's window of the summary's time series, by send time (as breakdown.timeseries)."""
    k = np.floor(np.nan_to_num((rm.sent - ts["t0_s"]) / ts["window_s"]))
    return np.clip(k, 0, len(ts["t_s"]) - 1).astype(np.int64)


def _stats(an, codes: np.ndarray, ngroups: int) -> dict[str, np.ndarray]:
    """Per group of requests (a window, a segment): its joined requests' mean parts and shares of
    their mean TTFT (E2E for decode), queue p99, input and TPOT p50, and its sends and late sends."""
    rm = an.rm
    pt, pe = parts(rm), parts(rm, "e2e")
    p = {**pt, "decode_ms": pe["decode_ms"], "ttft_ms": rm.columns["ttft_ms"], "e2e_ms": rm.columns["e2e_ms"]}
    rows = an.server.joined & rm.ok & ~np.isnan(pt["net_ms"] + pe["net_ms"])
    count = lambda sel: np.bincount(codes[sel], minlength=ngroups)[:ngroups]   # noqa: E731
    pct = lambda v, q: grouped_percentiles(np.where(rows, v, np.nan), codes, ngroups, [q])[1][:, 0]  # noqa: E731
    n = count(rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = {k: np.bincount(codes[rows], weights=v[rows], minlength=ngroups)[:ngroups] / n for k, v in p.items()}
        share = {f"{x}_share": mean[f"{x}_ms"] / mean["ttft_ms"] for x in ("net", "queue", "prefill")}
        decode = mean["decode_ms"] / mean["e2e_ms"]
    sent = ~np.isnan(rm.sent)
    return {"requests": n, "ttft_ms_mean": mean["ttft_ms"], "e2e_ms_mean": mean["e2e_ms"],
            "net_ms_mean": mean["net_ms"], **share, "decode_share_e2e": decode,
            "queue_ms_p99": pct(rm.columns["queue_ms"], 99),
            "input_tokens_p50": pct(rm.input_len.astype(float), 50), "tpot_ms_p50": pct(rm.columns["tpot_ms"], 50),
            "sends": count(sent), "late_sends": count(sent & (rm.columns["lag_ms"] > LATE_MS))}


def bottleneck_map(an, ts: dict) -> list[dict]:
    """Per time window of the summary's time series: what limited the run, with its evidence."""
    rm, nwin, win = an.rm, len(ts["t_s"]), _window(an.rm, ts)
    e = _stats(an, win, nwin)
    srv = ts.get("server") or {}
    s = {k: np.array(srv.get(k) or [np.nan] * nwin, float) for k in ("kv_cache_usage", "waiting", "running",
                                                                       "preemptions")}
    batch = np.where(np.isnan(s["running"]), np.array(ts.get("inflight") or [np.nan] * nwin, float), s["running"])
    good = e["requests"] >= MIN_JOINED
    base = {k: np.nanpercentile(x[good], BASELINE_Q) if (good & ~np.isnan(x)).any() else np.nan
            for k, x in (("ttft_baseline_ms", e["ttft_ms_mean"]), ("tpot_baseline_ms", e["tpot_ms_p50"]),
                         ("batch_baseline", batch))}
    known = rm.input_len[an.server.joined & rm.ok & ~np.isnan(rm.input_len)]
    run_input = float(np.median(known)) if len(known) else np.nan
    out = []
    for k in range(nwin):
        ev = {"t_s": ts["t_s"][k], **{x: v[k] for x, v in e.items()}, **base, "batch": batch[k],
              "run_input_tokens_p50": run_input, **{x: s[x][k] for x in s}}
        slowed = ev["ttft_ms_mean"] >= SLOWED * base["ttft_baseline_ms"]
        late = ev["late_sends"] >= max(2, LATE_WINDOW * ev["sends"])
        net = ev["net_ms_mean"] >= NET_FLOOR_MS
        if not good[k]:
            key = "unknown"
        elif ev["queue_share"] >= DOMINANT:
            key = "kv" if s["kv_cache_usage"][k] >= KV_FULL or s["preemptions"][k] > 0 else "sched"
        elif late and net and ev["net_share"] >= NET_SHARE:
            key = "client"
        elif net and ev["net_share"] >= DOMINANT and slowed:
            key = "net"
        elif ev["prefill_share"] >= DOMINANT and slowed:
            key = "prefill"
        elif ev["decode_share_e2e"] >= DOMINANT and ev["tpot_ms_p50"] >= SLOWED * base["tpot_baseline_ms"] and \
                batch[k] >= max(BATCH_GREW * base["batch_baseline"], 2):
            key = "decode"
        else:
            key = "healthy"
        label = LABELS[key] + (f" at batch {batch[k]:.0f}" if key == "decode" else "")
        if key == "prefill" and ev["input_tokens_p50"] >= LONG_PROMPT * run_input:
            label += " under long prompts"
        out.append({"key": key, "label": label, "evidence": {x: (None if isinstance(v, float) and np.isnan(v) else v)
                                                              for x, v in ev.items()}})
    return out


EVIDENCE = {"kv": ("KV {kv_cache_usage:.0%}", "{waiting:.0f} waiting", "{preemptions:.0f} preemptions",
                   "queue {queue_share:.0%} of TTFT"),
            "sched": ("queue {queue_share:.0%} of TTFT", "{waiting:.0f} waiting", "KV {kv_cache_usage:.0%}"),
            "client": ("client+network {net_share:.0%} of TTFT",
                       f"{{late_sends:.0f}} of {{sends:.0f}} sends > {LATE_MS:g} ms late"),
            "net": ("client+network {net_share:.0%} of TTFT ({net_ms_mean:.0f} ms)",),
            "prefill": ("prefill {prefill_share:.0%} of TTFT",
                        "input p50 {input_tokens_p50:.0f} tokens (run p50 {run_input_tokens_p50:.0f})"),
            "decode": ("decode {decode_share_e2e:.0%} of E2E", "TPOT p50 {tpot_ms_p50:.3g} ms",
                       "quiet-window TPOT {tpot_baseline_ms:.3g} ms", "quiet-window batch {batch_baseline:.0f}")}


def _evidence_text(key: str, v: dict) -> str:
    """A segment's own values in words (a figure without its value is left out)."""
    import string
    txt = []
    for t in EVIDENCE.get(key, ()):
        names = [f for _, f, _, _ in string.Formatter().parse(t) if f]
        if all(v.get(f) is not None for f in names) and (names != ["preemptions"] or v["preemptions"]):
            txt.append(t.format(**v))
    return ", ".join(txt)


def segments(an, wins: list[dict], config: dict | None, ts: dict) -> list[dict]:
    """Consecutive windows of one label merged; each segment's evidence is its own: its joined
    requests' shares, percentiles and late sends, its windows' mean gauges and summed preemptions."""
    out: list[dict] = []
    seg_of = np.empty(len(wins), np.int64)
    for k, w in enumerate(wins):
        if not (out and out[-1]["label"] == w["label"]):
            out.append({"key": w["key"], "label": w["label"], "windows": []})
        out[-1]["windows"].append(k)
        seg_of[k] = len(out) - 1
    e = _stats(an, seg_of[_window(an.rm, ts)], len(out))
    width = ts.get("width_s") or [ts["window_s"]] * len(wins)
    t0 = ts["t0_s"]
    for i, seg in enumerate(out):
        ks = seg.pop("windows")
        a, b = ts["t_s"][ks[0]], ts["t_s"][ks[-1]] + width[ks[-1]]
        ev = [wins[k]["evidence"] for k in ks]

        def over(x, f=np.mean):
            got = [w[x] for w in ev if w[x] is not None]
            return float(f(got)) if got else None
        v = {x: (None if np.isnan(c[i]) else c[i].item()) for x, c in e.items()}
        v |= {x: over(x) for x in ("kv_cache_usage", "waiting", "running", "batch")} | {"preemptions": over(
            "preemptions", np.sum)} | {x: ev[0][x] for x in ("ttft_baseline_ms", "tpot_baseline_ms", "batch_baseline",
                                                             "run_input_tokens_p50")}
        base = v["ttft_baseline_ms"]
        seg.update(start_s=a, end_s=b, requests=int(v["requests"]),
                   when=clock(config, t0 + a, t0 + b) or f"{t0 + a:g}-{t0 + b:g} s",
                   # TTFT its requests spent above the run's quiet windows: the headline names the worst
                   excess_ttft_s=0.0 if v["ttft_ms_mean"] is None or base is None else
                   v["requests"] * (v["ttft_ms_mean"] - base) / 1e3,
                   values=v, evidence=_evidence_text(seg["key"], v))
    return out


def section(an, run, ts: dict) -> dict | None:
    """summary.json `server_time`: counts, component percentiles (overall, per model, per
    input-length bucket, per window), the bottleneck map and the slowest requests."""
    if an.server is None:
        return None
    rm, m = an.rm, an.mask
    st: dict = {"counts": an.server.counts, "receiver": (run.config or {}).get("otlp"),
                "overall": {k: _pct(*grouped_percentiles(rm.columns[k][m], np.zeros(int(m.sum()), np.int64), 1,
                                                         [50, 90, 99]), 0) for k in SPAN_METRICS},
                "ttft_tail": tail_parts(an, "ttft_ms", "p99"), "ttft_mean": tail_parts(an, "ttft_ms", "mean"),
                "e2e_mean": tail_parts(an, "e2e_ms", "mean"), "by_model": _grouped(rm, m, *rm.model),
                "by_input_length": _grouped(rm, m, *length_buckets(rm.input_len))}
    if ts.get("t_s"):
        win, nwin, pt = _window(rm, ts), len(ts["t_s"]), parts(rm)
        st["timeseries"] = {f"{k}_{q}": grouped_percentiles(rm.columns[k], win, nwin, [50, 99])[1][:, j].tolist()
                            for k in ("net_ms", "queue_ms", "prefill_ms", "decode_ms") for j, q in enumerate(("p50", "p99"))}
        rows = an.server.joined & rm.ok & ~np.isnan(sum(pt.values()))
        c = np.bincount(win[rows], minlength=nwin)
        with np.errstate(invalid="ignore", divide="ignore"):
            st["timeseries"] |= {f"{k}_mean": (np.bincount(win[rows], weights=v[rows], minlength=nwin) / c).tolist()
                                 for k, v in pt.items()}
        st["map"] = bottleneck_map(an, ts)
        st["segments"] = segments(an, st["map"], run.config, ts)
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
    c = st["counts"]
    st["sentence"] = sentence(st) + (f" ({c['impossible']:,} impossible server spans ignored: above the client's "
                                     "TTFT or E2E, or other token counts)" if c.get("impossible") else "")
    bad = {k: c[k] for k in ("missing_ok", "rejected", "impossible", "duplicate", "unmatched", "late") if c.get(k)}
    st["warning"] = None if not bad else (f"server spans: {c['joined']:,} of {c['traced']:,} traced requests joined; "
        + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in bad.items()) + " (counted, never guessed)")
    return st


def sentence(st: dict) -> str:
    """The headline's line: the parts of the slowest 1% TTFT and the worst limited stretch."""
    t = st.get("ttft_tail")
    if not t:
        c = st["counts"]
        return (f"no server span joined ({c['traced']:,} traced, {c['missing_ok'] + c['missing_failed']:,} missing"
                + (f", {c['rejected']:,} with no credible span)" if c.get("rejected") else ")"))
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
