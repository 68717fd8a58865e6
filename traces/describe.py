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
    out = {"source": meta.get("source"), "columns": trace.table.column_names, "transforms": meta.get("transforms", []),
           "block_size": meta.get("block_size"), **summarize(trace.table, windows_s, meta.get("block_size"))}
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
    if isinstance(v, float):
        return f"{v:,.{nd}f}" if abs(v) < 1e6 else f"{v:,.0f}"
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def _qs(q: dict, keys: str = "p50 p90", nd: int = 0, unit: str = "", width: int = 0) -> str:
    """Quantiles as 'p50=13 p90=2,725', each figure right-aligned in `width` and followed by `unit`."""
    return " ".join(f"{k}={_f(q[k], nd):>{width}}{unit}" for k in keys.split())


def _share_list(counts: dict, shown: int) -> str:
    """'0: 37.5%, 1: 37.5%' for the first `shown` counts, the rest summed ('>11: 42.9%'):
    up to 65 image counts would not fit a line."""
    items, total = list(counts.items()), sum(counts.values()) or 1
    rest = [(f">{items[shown - 1][0]}", sum(v for _, v in items[shown:]))] if len(items) > shown else []
    return ", ".join(f"{k}: {v / total:.1%}" for k, v in items[:shown] + rest)


def render(d: dict[str, Any], file: str) -> str:
    """The terminal report: a line per part, its label in the first 17 columns."""
    src, fit, ln = d.get("source") or {}, d["interarrival_fit"], d["lengths"]
    lines = [f"{file}: {d['requests']:,} requests over {_f(d['duration_s'])} s"
             + (f" (imported from {src.get('format')}: {src.get('file')})" if src.get("format") else ""), "arrivals",
             f"  mean rate      {_f(d['mean_rate'])} req/s   peak (60 s window) {_f(d['peak_rate_60s'])} req/s",
             f"  inter-arrival  CV={_f(d['interarrival_cv'])}  gamma shape={_f(fit['gamma_shape'])}  "
             f"weibull shape={_f(fit['weibull_shape'])}  zero gaps={_f(fit['zero_gap_share'])}",
             "  dispersion     index of dispersion of counts: "
             + ", ".join(f"{k}={_f(v, 2)}" for k, v in d["index_of_dispersion"].items()), "lengths (tokens)",
             *(f"  {c:<14}{_qs(ln[f'{c}_tokens'], 'p50 p90 p99 max', width=9)} "
               f"mean={_f(ln[f'{c}_tokens']['mean'], 1):>9}" for c in ("input", "output")),
             f"  spearman(input, output) = {_f(d['spearman_input_output'])}"]
    if d["model_mix"]:
        lines.append("models (share, input and output tokens)")
    for m, share in d["model_mix"].items():
        pi, po = (ln["per_model"][m][f"{c}_tokens"] for c in ("input", "output"))
        lines.append(f"  {m:<24} {share:7.2%}  in {_qs(pi, 'p50 p99')}  out {_qs(po, 'p50 p99')}")
    if pc := d["prefix_cache"]:
        lines.append(f"prefix cache     unbounded-cache hit ratio: blocks {_f(pc['block_hit_ratio'])}, "
                     f"tokens {_f(pc['token_hit_ratio'])} (block_size {_f(d['block_size'])}), "
                     f"requests with a hit {_f(pc['requests_with_hit'])}")
    if rd := d.get("reuse_distance"):
        lines.append(f"  reuse distance requests since the block's last use {_qs(rd['requests'], 'p50 p90 p99')}; "
                     f"seconds {_qs(rd['seconds'], nd=1)}")
    # the numbers `compare` judges (turn_stats): from session_id, and from hash_ids chains,
    # which it uses on both sides when one has no session_id
    for key, label in (("turns", "conversations"), ("turns_from_hash_ids", "  hash_ids chains")):
        if (tx := d.get(key)) and tx["sessions"] < d["requests"]:
            tq, chains = tx["turns"], key != "turns"
            src = " from session_id" if tx["source"] == "session_id" else " inferred from hash_ids chains"
            lines.append(f"{label:<16} {tx['sessions']:,}{'' if chains else src} (turns mean {_f(tq['mean'], 2)}, "
                         f"p90 {_f(tq['p90'], 2)}, max {_f(tq['max'], 0)}; "
                         f"in multi-turn ones {_f(tx['multi_turn_share'])})"
                         + ("; compare uses these against a trace without session_id" if chains else ""))
    if (ts := d.get("turns")) and ts["sessions"] < d["requests"]:
        lines.append(f"  between turns  gap {_qs(ts['gap_s'], nd=1, unit=' s')}; "
                     f"new tokens per turn {_qs(ts['new_tokens'])}")
    if (sp := d.get("shared_prefixes")) and sp["prefixes"]:
        lines.append(f"shared prefixes  {sp['prefixes']:,} open {_f(sp['share'])} of the conversations (each used by "
                     f">= {prefixes.MIN_SHARED_USES}; a system prompt is one): "
                     f"length {_qs(sp['blocks'], 'p50 p90 max')} blocks; "
                     f"the most used opens {_f(sp['top_share'])} of those")
    if ag := d.get("agents"):
        lines += [f"agent tasks      {ag['tasks']:,} judged (wholly inside the trace): "
                  f"steps {_qs(ag['steps'], nd=1)} mean={_f(ag['steps']['mean'], 2)}; "
                  f"fan-out share {_f(ag['fanout_share'])} (width mean {_f(ag['fanout_width']['mean'], 2)}), "
                  f"{ag['subagent_calls']:,} subagent calls",
                  f"  delay_s        {_qs(ag['delay_s'], nd=2)} s; context growth per step {_qs(ag['growth'])} tokens"
                  + (f"; history cut at {_f(ag['context'], 0)} tokens" if ag["context"] else "")]
    if im := d.get("images"):
        more, null = im["image_px_distinct"] - len(im["image_px"]), im["image_px_defaulted"]
        lines += [f"images           {im['share_with_images']:.2%} of requests have images; "
                  f"mean {_f(im['mean_images'], 3)} per request, max {im['max_images']}",
                  f"  count          {_share_list(im['count_histogram'], 12)}"]
        if im["image_px"]:
            lines.append("  image_px       " + ", ".join(f"{k} {v:.1%}" for k, v in im["image_px"].items())
                         + (f" (+{more} other sizes)" if more > 0 else "")
                         + (f"; {null:.1%} null, sent as the default" if null else ""))
    if rs := d.get("reasoning"):
        lines.append(f"reasoning        {rs['share']:.1%} of output tokens ({rs['rows']:,} requests say how many)")
    if d["failed_in_source"]:
        lines.append(f"failed in source {d['failed_in_source']:,} requests (flagged, kept)")
    if d["output_tokens_null"]:
        lines.append(f"output unknown   {d['output_tokens_null']:,} requests (server decides)")
    lines += [f"transform        {t}" for t in d["transforms"]]
    lines += [f"warning          {w}" for w in d.get("warnings", [])]
    return "\n".join(lines) + "\n"


def describe_file(path: str | Path, *, as_json: bool = False, windows_s=stats.DEFAULT_WINDOWS_S) -> str:
    trace = Trace.read(path)
    d = describe(trace, windows_s, str(path))
    return json.dumps(d, indent=1, allow_nan=False) + "\n" if as_json else render(d, str(path))
