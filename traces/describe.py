"""`replay trace describe`: the statistics of `traces.stats` and `traces.prefixes` as a terminal report or JSON."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import prefixes, stats
from .errors import TraceError
from .trace import Trace


def describe(trace: Trace, windows_s=stats.DEFAULT_WINDOWS_S, path: str | None = None) -> dict[str, Any]:
    """The JSON body of `describe --json`: file-level facts plus `summarize`."""
    meta = trace.metadata
    out = {"source": meta.get("source"), "columns": trace.table.column_names,
           "transforms": meta.get("transforms", []), "block_size": meta.get("block_size")}
    out.update(summarize(trace.table, windows_s, meta.get("block_size")))
    failed = trace.table.column("failed_in_source") if "failed_in_source" in trace.table.column_names else None
    out["failed_in_source"] = int(failed.fill_null(False).cast("int64").to_numpy().sum()) if failed is not None else 0
    out["output_tokens_null"] = trace.table.column("output_tokens").null_count
    out["warnings"] = _warnings(trace, out, path)
    return out


def summarize(table: Any, windows_s=stats.DEFAULT_WINDOWS_S, block_size: int | None = None) -> dict[str, Any]:
    """Every statistic of `traces.stats` and `traces.prefixes` in one JSON-able dict (the body of
    `replay trace describe --json`)."""
    t = stats._tbl(table)
    if block_size is None and hasattr(table, "metadata"):
        block_size = table.metadata.get("block_size")
    return {
        "requests": t.num_rows,
        "duration_s": stats.duration_s(t),
        "mean_rate": stats.mean_rate(t),
        "peak_rate_60s": stats.peak_rate(t, 60.0),
        "interarrival_cv": stats.interarrival_cv(t),
        "index_of_dispersion": stats.index_of_dispersion(t, windows_s),
        "interarrival_fit": stats.interarrival_fits(t),
        "lengths": stats.length_quantiles(t),
        "spearman_input_output": stats.spearman_io(t),
        "model_mix": stats.model_mix(t),
        "sessions": stats.session_stats(t),
        "prefix_cache": stats.prefix_cache_hits(t, block_size),
        "reuse_distance": prefixes.reuse_distances(t),
        "turns": prefixes.turn_stats(t, block_size),
        "turns_from_hash_ids": prefixes.turn_stats(t, block_size, "hash_ids") if prefixes.has_sessions(t) else None,
        "shared_prefixes": prefixes.prefix_pool_stats(t, block_size=block_size),
        "images": stats.image_stats(t),
        "reasoning": stats.reasoning_stats(t),
        "agents": stats.agent_stats(t),
    }


SHAPE_RANGE = (1e-2, 1e3)   # inter-arrival shapes outside this are artefacts, not arrival processes


def _warnings(trace: Trace, d: dict[str, Any], path: str | None = None) -> list[str]:
    """Bucketed timestamps (unless dequantized) and implausible inter-arrival shapes; the fix named
    is one that works: `import --dequantize uniform` only for formats whose importer takes it."""
    out = []
    b = None if any(t.get("op") == "dequantize" for t in d["transforms"]) else stats.timestamp_buckets(trace.table)
    if b:
        jitter = f" (0 to {b['jitter_ns'] / 1e6:g} ms)" if b["jitter_ns"] else ""
        out.append(f"timestamps look bucketed: {b['tied_share']:.0%} of the gaps are ties{jitter}, the rest near "
                   f"multiples of {b['quantum_ns'] / 1e6:g} ms; the inter-arrival statistics describe the buckets, "
                   f"not the arrival process ({_dequantize_hint(trace, path)})")
    for name, v in d["interarrival_fit"].items():
        if name.endswith("_shape") and v is not None and not SHAPE_RANGE[0] <= v <= SHAPE_RANGE[1]:
            out.append(f"inter-arrival {name.replace('_', ' ')} {v:.3g} is implausible for an arrival process: "
                       "timestamps are bucketed, rounded or synthetic")
    return out


def _dequantize_hint(trace: Trace, path: str | None) -> str:
    fmt = ((trace.metadata.get("source") or {}).get("format") if isinstance(trace.metadata.get("source"), dict)
           else None)
    transform = f"spread them with `replay trace transform {path or 'TRACE'} --dequantize '' -o OUT.parquet`"
    try:
        from .importers import module
        if fmt and hasattr(module(fmt), "postprocess"):
            return f"re-import with `replay trace import {fmt} SRC -o OUT.parquet --dequantize uniform`, or {transform}"
    except TraceError:
        pass
    return transform


def _f(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}" if abs(v) < 1e6 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _qline(name: str, q: dict) -> str:
    return f"  {name:<14}" + "".join(f"{k}={_f(q[k], 0 if k != 'mean' else 1):>9}  " for k in ("p50", "p90", "p99", "max", "mean"))


def _image_lines(im: dict[str, Any], shown: int = 12) -> list[str]:
    """Share with images, mean and max, the count histogram as shares (the first `shown`
    counts; the rest summed, up to 65 counts would not fit a line) and the top sizes."""
    items = list(im["count_histogram"].items())
    total = sum(v for _, v in items) or 1
    hist = [f"{k}: {v / total:.1%}" for k, v in items[:shown]]
    if len(items) > shown:
        hist.append(f">{items[shown - 1][0]}: {sum(v for _, v in items[shown:]) / total:.1%}")
    lines = [f"images           {im['share_with_images']:.2%} of requests have images; "
             f"mean {_f(im['mean_images'], 3)} per request, max {im['max_images']}",
             f"  count          {', '.join(hist)}"]
    if im["image_px"]:
        more = im["image_px_distinct"] - len(im["image_px"])
        null = im["image_px_defaulted"]
        lines.append("  image_px       " + ", ".join(f"{k} {v:.1%}" for k, v in im["image_px"].items())
                     + (f" (+{more} other sizes)" if more > 0 else "")
                     + (f"; {null:.1%} null, sent as the default" if null else ""))
    return lines


def render(d: dict[str, Any], file: str) -> str:
    src = d.get("source") or {}
    lines = [f"{file}: {d['requests']:,} requests over {_f(d['duration_s'])} s"
             + (f" (imported from {src.get('format')}: {src.get('file')})" if src.get("format") else "")]
    fit = d["interarrival_fit"]
    idc = ", ".join(f"{k}={_f(v, 2)}" for k, v in d["index_of_dispersion"].items())
    lines += [
        "arrivals",
        f"  mean rate      {_f(d['mean_rate'])} req/s   peak (60 s window) {_f(d['peak_rate_60s'])} req/s",
        f"  inter-arrival  CV={_f(d['interarrival_cv'])}  gamma shape={_f(fit['gamma_shape'])}  "
        f"weibull shape={_f(fit['weibull_shape'])}  zero gaps={_f(fit['zero_gap_share'])}",
        f"  dispersion     index of dispersion of counts: {idc}",
        "lengths (tokens)",
        _qline("input", d["lengths"]["input_tokens"]), _qline("output", d["lengths"]["output_tokens"]),
        f"  spearman(input, output) = {_f(d['spearman_input_output'])}",
    ]
    per = d["lengths"].get("per_model") or {}
    if d["model_mix"]:
        lines.append("models (share, input p50/p99, output p50/p99)")
        for m, share in d["model_mix"].items():
            pi, po = per[m]["input_tokens"], per[m]["output_tokens"]
            lines.append(f"  {m:<24} {share:7.2%}  in {_f(pi['p50'], 0)}/{_f(pi['p99'], 0)}"
                         f"  out {_f(po['p50'], 0)}/{_f(po['p99'], 0)}")
    pcache = d["prefix_cache"]
    if pcache:
        lines.append(f"prefix cache     unbounded-cache hit ratio: blocks {_f(pcache['block_hit_ratio'])}, "
                     f"tokens {_f(pcache['token_hit_ratio'])} (block_size {_f(d['block_size'])}), "
                     f"requests with a hit {_f(pcache['requests_with_hit'])}")
    rd = d.get("reuse_distance")
    if rd:
        r, sec = rd["requests"], rd["seconds"]
        lines.append(f"  reuse distance requests since the block's last use p50={_f(r['p50'], 0)} p90={_f(r['p90'], 0)} "
                     f"p99={_f(r['p99'], 0)}; seconds p50={_f(sec['p50'], 1)} p90={_f(sec['p90'], 1)}")
    ts = d.get("turns")
    # the numbers `compare` judges (turn_stats): from session_id, and from hash_ids chains,
    # which it uses on both sides when one has no session_id
    for key, how in (("turns", None), ("turns_from_hash_ids", "  hash_ids chains")):
        tx = d.get(key)
        if tx and tx["sessions"] < d["requests"]:
            tq = tx["turns"]
            src = "from session_id" if tx["source"] == "session_id" else "inferred from hash_ids chains"
            lines.append(f"{how or 'conversations':<16} {tx['sessions']:,} {src if how is None else ''}".rstrip()
                         + f" (turns mean {_f(tq['mean'], 2)}, p90 {_f(tq['p90'], 2)}, max {_f(tq['max'], 0)}; "
                         f"in multi-turn ones {_f(tx['multi_turn_share'])})"
                         + ("; compare uses these against a trace without session_id" if how else ""))
    if ts and ts["sessions"] < d["requests"]:
        lines.append(f"  between turns  gap p50={_f(ts['gap_s']['p50'], 1)} s p90={_f(ts['gap_s']['p90'], 1)} s; "
                     f"new tokens per turn p50={_f(ts['new_tokens']['p50'], 0)} p90={_f(ts['new_tokens']['p90'], 0)}")
    sp = d.get("shared_prefixes")
    if sp and sp["prefixes"]:
        b = sp["blocks"]
        lines.append(f"shared prefixes  {sp['prefixes']:,} open {_f(sp['share'])} of the conversations (each used by "
                     f">= {prefixes.MIN_SHARED_USES}; a system prompt is one): length p50={_f(b['p50'], 0)} "
                     f"p90={_f(b['p90'], 0)} max={_f(b['max'], 0)} blocks; the most used opens {_f(sp['top_share'])} of those")
    ag = d.get("agents")
    if ag:
        st, dl, gr = ag["steps"], ag["delay_s"], ag["growth"]
        lines += [f"agent tasks      {ag['tasks']:,} judged (wholly inside the trace): steps p50={_f(st['p50'], 1)} "
                  f"p90={_f(st['p90'], 1)} mean={_f(st['mean'], 2)}; fan-out share {_f(ag['fanout_share'])} "
                  f"(width mean {_f(ag['fanout_width']['mean'], 2)}), {ag['subagent_calls']:,} subagent calls",
                  f"  delay_s        p50={_f(dl['p50'], 2)} p90={_f(dl['p90'], 2)} s; context growth per step "
                  f"p50={_f(gr['p50'], 0)} p90={_f(gr['p90'], 0)} tokens"
                  + (f"; history cut at {_f(ag['context'], 0)} tokens" if ag["context"] else "")]
    if d.get("images"):
        lines += _image_lines(d["images"])
    if d.get("reasoning"):
        rs = d["reasoning"]
        lines.append(f"reasoning        {rs['share']:.1%} of output tokens ({rs['rows']:,} requests say how many)")
    if d["failed_in_source"]:
        lines.append(f"failed in source {d['failed_in_source']:,} requests (flagged, kept)")
    if d["output_tokens_null"]:
        lines.append(f"output unknown   {d['output_tokens_null']:,} requests (server decides)")
    for t in d["transforms"]:
        lines.append(f"transform        {t}")
    for w in d.get("warnings", []):
        lines.append(f"warning          {w}")
    return "\n".join(lines) + "\n"


def describe_file(path: str | Path, *, as_json: bool = False, windows_s=stats.DEFAULT_WINDOWS_S) -> str:
    trace = Trace.read(path)
    d = describe(trace, windows_s, str(path))
    return json.dumps(d, indent=1, allow_nan=False) + "\n" if as_json else render(d, str(path))
