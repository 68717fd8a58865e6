"""`summarize_run`: the full report of a run, as summary.json (versioned schema, see
docs/reports.md, section summary.json), summary.md and report.html in the run directory."""
from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .analysis import Analysis, analyze, counter_increase, plain_pages, prefix_hit, with_column
from .validity import assess, load_cpu
from .certificate import certificate
from .steady import of_run
from .breakdown import LENGTH_EDGES, breakdowns, connections, image_groups, length_buckets, tenants, timeseries
from .gate import gate, unfinished
from .servertime import attach, clock, section as server_section
from .metrics import (BATCH, CHUNK_KINDS, LENGTH_CHECKS, POOLED, STREAMED_COLUMNS, as_f64, chunk_token_rows,
                      request_metrics)
from .records import ANALYSIS_COLUMNS, Run, load_run
from .schema import RECORDS_SCHEMA_VERSION, STATUSES
from .slo import load_slo
from .stats import describe
from .tasks import tasks_summary

SUMMARY_SCHEMA_VERSION = 1
REPORTED = ("ttft_ms", "ttfa_ms", "tpot_ms", "tpot_answer_ms", "icl_ms", "icl_answer_ms", "itl_ms",
            "itl_answer_ms", "e2e_ms", "ntpot_ms", "reasoning_ms", "answer_ms", "ttft_sched_ms", "ttfa_sched_ms",
            "e2e_sched_ms", "ntpot_sched_ms")
PLOT_SAMPLES = 200_000    # plots (not numbers) are drawn from at most this many requests


def jsonable(obj):
    """NaN/inf -> None, NumPy scalars -> Python, tuples -> lists (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _errors(an: Analysis) -> dict:
    failed = an.mask & ~an.rm.ok
    counts = np.bincount(an.rm.status_codes[an.mask], minlength=len(STATUSES))
    by_status = {s: int(c) for s, c in zip(STATUSES, counts) if c and s != "ok"}
    out = {"failed": int(failed.sum()), "by_status": by_status, "by_http_status": {}, "top_messages": []}
    if failed.any():
        sub = an.table.select(["http_status", "error"]).filter(pa.array(failed))
        http, msgs = (sorted(pc.value_counts(sub.column(col).drop_null().combine_chunks()).to_pylist(),
                             key=lambda d: -d["counts"]) for col in ("http_status", "error"))
        out["by_http_status"] = {str(d["values"]): d["counts"] for d in http}
        out["top_messages"] = [{"message": d["values"][:300], "count": d["counts"]} for d in msgs[:5]]
    return out


def _mismatches(an: Analysis, run: Run) -> dict:
    """Requested vs reported lengths of the measured successes (metrics.LENGTH_CHECKS)."""
    rows, out = an.mask & an.rm.ok, {}
    for kind, (want, got) in LENGTH_CHECKS.items():
        lc = an.rm.length_checks[kind]
        checked = int(np.count_nonzero(lc.both & rows))
        sel = rows[lc.bad_rows]
        bad_rows, diff, mismatched = lc.bad_rows[sel], lc.bad_diff[sel], int(np.count_nonzero(sel))
        out[kind] = {"requested": want, "reported": got, "checked": checked, "mismatched": mismatched,
                     "share": mismatched / checked if checked else None,    # sums of whole numbers:
                     "mean_diff": float(diff.sum()) / mismatched if mismatched else None,   # exact
                     "examples": run.column("request_id").take(pa.array(bad_rows[:5])).to_pylist()}
    return out


def _plots(an: Analysis) -> dict:
    """Downsampled data for the HTML plots: CDF curves per model and a length/latency sample."""
    rng = np.random.default_rng(0)
    rows = np.flatnonzero(an.mask & an.rm.ok)
    if len(rows) > PLOT_SAMPLES:
        rows = np.sort(rng.choice(rows, PLOT_SAMPLES, replace=False))
    (codes, labels), q, cdf = an.rm.model, np.linspace(0, 100, 201), {}
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms") + (("ttfa_ms",) if an.rm.has_reasoning else ()):
        cdf[metric] = {}
        for i, label in enumerate(labels):
            x = an.rm.columns[metric][rows[codes[rows] == i]]
            if (x := x[~np.isnan(x)]).size:
                cdf[metric][label] = (np.percentile(x, q).tolist(), (q / 100).tolist())
    pts = rows if len(rows) <= 3000 else rng.choice(rows, 3000, replace=False)
    return {"cdf": cdf, "scatter": {"input_len": an.rm.input_len[pts].tolist(),
                                    "ttft_ms": an.rm.columns["ttft_ms"][pts].tolist(),
                                    "e2e_ms": an.rm.columns["e2e_ms"][pts].tolist()}}


def _latency(an: Analysis) -> dict:
    """describe() of every REPORTED metric. One that is the very array of another is copied, not
    described again: without reasoning the answer metrics are their all-token twins, and ITL is
    ICL when every chunk carried one token (metrics.py)."""
    out, seen = {}, []        # (source array, its description); the arrays stay alive, so `is` holds
    for k in REPORTED:
        if k == "reasoning_ms" and not an.rm.has_reasoning:
            out[k] = describe(np.empty(0))
            continue
        base = k.replace("_sched_ms", "_ms")
        src = an.pooled()[base] if base in POOLED else an.rm.latency(k)
        same = next((d for y, d in seen if y is src), None)
        out[k] = dict(same) if same is not None else describe(an.column(k))
        seen.append((src, out[k]))
    return out


def _itl_source(an: Analysis) -> dict:
    """Where ITL's tokens per chunk came from, per measured success (metrics.CHUNK_KINDS):
    per-chunk usage (`chunk_tokens`), one token a chunk confirmed by the usage total or assumed
    without usage, or unknown (several tokens a chunk: left out of ITL, their gaps are in ICL)."""
    okm = an.mask & an.rm.ok
    have = chunk_token_rows(an.table, okm)
    kinds = np.bincount(an.rm.chunk_kind[okm & ~have], minlength=len(CHUNK_KINDS))
    out = {"chunk_tokens": int(have.sum()), **{k: int(v) for k, v in zip(CHUNK_KINDS[1:], kinds[1:])}}
    used = [k for k in ("chunk_tokens", "one_token_usage", "one_token_assumed") if out[k]]
    out["used"] = used[0] if len(used) == 1 else ("mixed" if used else None)
    return out


def _reasoning(an: Analysis) -> dict:
    """Reasoning in the measured successes: how many requests streamed it, reported it without
    streaming it (hidden: it is inside their TTFT), or never reached an answer."""
    rm, okm = an.rm, an.mask & an.rm.ok
    if not rm.has_reasoning:
        return {"requests": 0, "streamed": 0, "hidden": 0, "no_answer": 0, "ok": int(np.count_nonzero(okm)),
                "tokens": describe(np.empty(0), ci=()), "tokens_total": 0.0}
    phase = okm & (rm.reasoning_chunks > 0)
    hidden = okm & (rm.reasoning > 0) & (rm.reasoning_chunks == 0)
    no_answer = phase & np.isnan(rm.columns["ttfa_ms"])
    tokens = np.where(okm, rm.reasoning, np.nan)
    return {"requests": int(np.count_nonzero(phase | hidden)), "streamed": int(np.count_nonzero(phase)),
            "hidden": int(np.count_nonzero(hidden)), "no_answer": int(np.count_nonzero(no_answer)),
            "ok": int(np.count_nonzero(okm)), "tokens": describe(tokens, ci=()),
            "tokens_total": float(np.nansum(tokens))}


def _reasoning_share(run: Run, an: Analysis) -> dict:
    """The share of the successes' output that is reasoning: `share` as generated (reasoning
    tokens over n_out) and `asked_share` as the trace asked (asked_reasoning_tokens over
    output_tokens), over the successes whose row asked a count (else over all successes when
    some reasoned); None when there is none."""
    asked = as_f64(run.column("asked_reasoning_tokens"))
    rows = an.mask & an.rm.ok & (~np.isnan(asked) if not np.isnan(asked).all() else an.rm.has_reasoning)
    n_out = np.nansum(an.rm.n_out[rows])
    if not n_out:
        return {"share": None, "asked_share": None}
    out = np.nansum(as_f64(run.column("output_tokens"))[rows])
    return {"share": float(np.nansum(an.rm.reasoning[rows]) / n_out),
            "asked_share": float(asked[rows].sum() / out) if out and not np.isnan(asked[rows]).any() else None}


def build_summary(run: Run, an: Analysis, *, window_s: float | None = None,
                  length_edges=LENGTH_EDGES, cpu: pa.Table | None = None) -> dict:
    rm, m, sc, slo = an.rm, an.mask, an.scalars(), an.slo
    okm = m & rm.ok
    n_usage = int(rm.n_out_from_usage[okm].sum())
    n_chunks = int((okm & ~rm.n_out_from_usage & ~np.isnan(rm.n_out)).sum())
    kinds = {"model": rm.model, "slo_class": rm.slo_class, "input_length": length_buckets(rm.input_len, length_edges)}
    if rm.target is not None and len(rm.target[1]) > 1:   # a fleet: one deployment per model
        kinds["target"] = rm.target
    if rm.images.any():
        kinds["num_images"] = image_groups(rm.images)
    series, stimulus = timeseries(an, run.server_metrics, window_s), certificate(an, run.config, cpu)
    summary = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "records_schema_version": RECORDS_SCHEMA_VERSION,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run": {"dir": str(run.dir) if run.dir else None, "records": str(run.records_path), "config": run.config},
        "window": an.window,
        "steady": of_run(an),   # steady.py: warm-up and level shifts, the window a gate judges
        "counts": {"records": rm.n, "measured": sc["issued"], "ok": sc["ok"], "failed": sc["failed"],
                   "ok_without_tokens": int(m[rm.empty_ok].sum())},
        "n_out_source": {"completion_tokens": n_usage, "chunks": n_chunks,
                         "used": "completion_tokens" if not n_chunks else ("chunks" if not n_usage else "mixed")},
        "throughput": {k: sc[k] for k in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s",
                                          "total_tokens_per_s")} | {"duration_s": an.duration_s},
        # One thread: on these VMs worker threads made it slower (10M records: 17-18 s wall and CPU
        # with two workers, 10-11 s alone), their page faults and allocations contend.
        "latency": _latency(an),
        "reasoning": {**_reasoning(an), **_reasoning_share(run, an)},
        "itl_source": _itl_source(an),
        "goodput": {"slo": slo.to_dict() if slo else None,
                    "per_request_slo": bool(slo and slo.has_per_request),
                    **{k: sc[k] for k in ("good", "issued", "attainment", "goodput_rps", "token_goodput_per_s")}},
        "errors": _errors(an),
        "dispatch_lag": an.bottleneck or assess(an, run.config, cpu),
        "stimulus": stimulus,
        "length_mismatch": _mismatches(an, run),
        "connections": connections(an, run.config),
        "prefix_cache": prefix_cache(run.config, run.server_metrics, an),
        "cache_state": cache_state(run.config),
        "tasks": None if an.tasks is None else tasks_summary(an.tasks, rm, m, an.duration_s,
                                                              (slo.per_task if slo else {}).get("task_s")),
        "breakdowns": breakdowns(an, kinds),
        "tenants": tenants(an),
        "timeseries": series,
        "unfinished": unfinished(run.config, rm),
        "state": run_state(series, run.config),
        "server_time": server_section(an, run, series),
    }
    gated = slo is not None and (slo.objectives or any(c.objectives for c in slo.classes.values()))
    return summary | {"warnings": _warnings(summary)} | (
        {"gate": gate(an, slo, config=run.config, stimulus=stimulus).to_dict()} if gated else {})


KV_FULL = 0.95     # KV cache usage at or above this share of the pool: full


def run_state(ts: dict, config: dict | None) -> dict:
    """The run's state in words, from the evidence the time series hold: the server's KV cache,
    queue and preemptions when scraped, else what the client saw: in-flight growth, completed vs
    offered rate, TTFT over the run (the client alone cannot see the server keep up).
    `verdict`: saturated, queueing, healthy, falling_behind, latency_grew, not_observed or unknown;
    `sentence`."""
    def at(k: int) -> str:
        return clock(config, ts["t0_s"] + ts["t_s"][k]) or f"{ts['t_s'][k]:g} s"
    if not ts or not ts.get("t_s"):
        return {"verdict": "unknown", "sentence": "no requests were sent"}
    srv = ts.get("server") or {}
    kv, waiting, pre = (np.array(srv.get(k) or [], float) for k in ("kv_cache_usage", "waiting", "preemptions"))
    if len(kv) or len(waiting):
        kv_max = float(np.nanmax(kv)) if len(kv) and not np.isnan(kv).all() else None
        q_max = float(np.nanmax(waiting)) if len(waiting) and not np.isnan(waiting).all() else 0.0
        n_pre = int(np.nansum(pre)) if len(pre) else 0
        full = (kv >= KV_FULL) if kv_max is not None else np.zeros(len(waiting), bool)
        queued = np.nan_to_num(waiting) >= 1 if len(waiting) else np.zeros(len(full), bool)
        kv_txt = f"KV cache peak {kv_max:.0%}" if kv_max is not None else "KV cache not scraped"
        kv_at = f"KV cache at {kv_max:.0%}, " if kv_max is not None else ""
        out = {"kv_cache_max": kv_max, "queue_max": q_max, "preemptions": n_pre}
        if queued.any() and (full.any() or n_pre):
            k = int(np.argmax(queued | full))
            return {"verdict": "saturated", "from_s": ts["t_s"][k], **out,
                    "sentence": f"saturated from {at(k)}: {kv_at}queue up to {q_max:.0f}, {n_pre} preemptions"}
        if queued.any():
            k = int(np.argmax(queued))
            return {"verdict": "queueing", "from_s": ts["t_s"][k], **out,
                    "sentence": f"requests queued in the server from {at(k)} (up to {q_max:.0f} waiting); "
                                f"{kv_txt}, no preemption"}
        return {"verdict": "healthy", **out,
                "sentence": f"healthy: no request waited in the server's queue; {kv_txt}"
                            + (f", {n_pre} preemptions" if n_pre else ", no preemption")}
    off, ach, infl = (np.array(ts[k], float) for k in ("offered_rps", "achieved_rps", "inflight"))
    third = max(1, len(infl) // 3)
    grew = len(infl) >= 3 and np.nanmean(infl[-third:]) > 2 * max(1.0, np.nanmean(infl[:third]))
    ratio = np.nansum(ach) / np.nansum(off) if np.nansum(off) else None
    if grew and ratio is not None and ratio < 0.9:
        return {"verdict": "falling_behind",
                "sentence": f"falling behind: requests in flight grew from {np.nanmean(infl[:third]):.0f} to "
                            f"{np.nanmean(infl[-third:]):.0f} while {ratio:.0%} of the offered rate completed "
                            "(--scrape the server's /metrics to see its queue and KV cache)"}
    # Completions matching the offered rate do not show that the server kept up: its queue is not
    # seen, and a TTFT that grows over the run is a queue growing. Say what the client saw.
    ttft = np.array(ts.get("ttft_ms_p50") or [np.nan], float)
    first, last = (float(np.nanmean(x)) if not np.isnan(x).all() else np.nan for x in (ttft[:third], ttft[-third:]))
    ms = lambda v: f"{v / 1e3:.3g} s" if v >= 1e3 else f"{v:.0f} ms"  # noqa: E731
    done = f"{ratio:.0%} of the offered rate completed" if ratio is not None else "nothing was offered"
    unseen = "the server's queue was not observed (--scrape the server's /metrics to see its queue and KV cache)"
    if len(ttft) >= 3 and last > 2 * first:
        return {"verdict": "latency_grew",
                "sentence": f"TTFT p50 grew from {ms(first)} to {ms(last)} over the run while {done}; {unseen}"}
    txt = f"TTFT p50 {ms(first)} to {ms(last)} (first to last third)" if not np.isnan(first + last) else "no TTFT"
    return {"verdict": "not_observed", "sentence": f"{done}; {txt}; {unseen}"}


FLATTERED = 0.10   # the server's prefix-cache hit ratio this far above the trace's intent: a warning


UNDER = 0.05      # the achieved hit ratio this far below the trace's intent: a warning


def prefix_cache(config: dict | None, server: pa.Table | None, an: Analysis | None = None) -> dict | None:
    """The server's prefix-cache hits over the run (vLLM's and engine-stub's token counters)
    against the reuse the trace's hash_ids intend (run.json `intended_prefix_reuse`): a server
    that hits far more than intended was flattered (an earlier run's prompt bytes repeated with
    --salt, a warm-up, sharing the trace does not model). `achieved_hit_ratio`: what the measured
    requests got (analysis.prefix_hit: their cached_tokens, else the counters); far below the
    intent, the trace's reuse was not delivered."""
    intended = ((config or {}).get("intended_prefix_reuse") or {}).get("token_hit_ratio")
    hits, queries = (counter_increase(server, f"prefix_cache_{k}_total") for k in ("hits", "queries"))
    hit = prefix_hit(an) if an is not None else None
    if intended is None and not queries and hit is None:
        return None
    ratio = hits / queries if queries else None
    warning = (f"the server's prefix cache hit {ratio:.0%} of prompt tokens where the trace's hash_ids intend "
               f"{intended:.0%}: the run was flattered by sharing the trace does not have (an earlier run's prompt "
               "bytes repeated with --salt, a warm-up, a common system prompt)"
               if ratio is not None and intended is not None and ratio > intended + FLATTERED else None)
    achieved = hit["ratio"] if hit else None
    under = (f"the server did not deliver the prefix reuse the trace intends: {achieved:.0%} vs {intended:.0%} of "
             f"prompt tokens were cached (from {hit['source']})"
             if achieved is not None and intended is not None and achieved < intended - UNDER else None)
    return {"intended_token_hit_ratio": intended, "server_hits": hits, "server_queries": queries,
            "server_hit_ratio": ratio, "warning": warning, "achieved_hit_ratio": achieved,
            "achieved_source": hit["source"] if hit else None, "achieved_requests": hit["requests"] if hit else None,
            "delivery_warning": under}


def cache_state(config: dict | None) -> dict | None:
    """run.json `cache_state` (replay run: was the server's prefix cache reset before T0) with a
    `sentence` saying so; None when the run did not record it."""
    cs = (config or {}).get("cache_state")
    if not cs:
        return None
    reset, up = cs.get("reset"), cs.get("uptime_s")
    how = {"cold": f"reset via POST {reset} before T0" if reset else "a fresh server: no prefix-cache query before T0",
           "warm": "not reset: the server had cached prefixes of earlier requests",
           "uncontrolled": "not reset, and the server reports no prefix-cache counter: earlier runs' prefixes may be "
                           "cached"}.get(cs.get("state"))
    uptime = f", server up {up:.0f} s" if up is not None else ""
    return cs | {"sentence": f"{cs.get('state')} ({how or 'unknown'}{uptime})"}


def _warnings(s: dict) -> list[str]:
    w, c, r = [s["unfinished"]] if s.get("unfinished") else [], s["counts"], s["reasoning"]
    if c["measured"] == 0:
        w.append("no requests in the measured window")
    elif c["ok"] == 0:
        w.append("every measured request failed: no latency to report")
    if c["ok_without_tokens"]:
        w.append(f"{c['ok_without_tokens']} of {c['ok']} successful requests streamed no token although their rows "
                 "asked for output (an empty 200 from the server?): their latencies are missing and they count as ok")
    if s["dispatch_lag"]["warning"]:
        w.append(s["dispatch_lag"]["warning"])
    st = s.get("steady")
    cold = (s.get("cache_state") or {}).get("state") == "cold"
    if st and st["steady"] is None:
        w.append(f"no steady state: {st['reason']}; a gate judges the whole run")
        seg = st.get("segments") or []
        if cold and len(seg) > 1 and seg[0]["ttft_ms_p50"] > seg[-1]["ttft_ms_p50"]:
            w.append(f"cold cache: the first {seg[1]['start_s'] - seg[0]['start_s']:.4g} s ({seg[0]['requests']:,} "
                     f"requests, TTFT p50 {seg[0]['ttft_ms_p50']:,.0f} ms against {seg[-1]['ttft_ms_p50']:,.0f} ms at "
                     "the end) ran while the reset prefix cache filled")
    elif st and not st["steady"]["whole_run"] and cold:
        seg = st["segments"]
        w.append(f"cold cache: the first {st['steady']['start_s'] - seg[0]['start_s']:.4g} s "
                 f"({sum(g['requests'] for g in seg) - st['steady']['requests']:,} requests) ran while the reset prefix "
                 f"cache filled, before steady from {st['steady']['start_s']:.4g} s, which a gate judges "
                 "(--whole-run: every request)")
    elif st and not st["steady"]["whole_run"]:
        w.append(f"warm-up or level shift: steady from {st['steady']['start_s']:.4g} s "
                 f"({st['steady']['requests']:,} requests), which a gate judges (--whole-run: every request)")
    if s["stimulus"]["delivered"] is False:
        w.append("the stimulus was not delivered (a gate cannot pass): " + "; ".join(s["stimulus"]["reasons"]))
    pcache = s.get("prefix_cache") or {}
    w += [x for x in (s["connections"]["warning"], pcache.get("warning"), pcache.get("delivery_warning"),
                      (s.get("server_time") or {}).get("warning")) if x]
    if r["no_answer"]:
        w.append(f"{r['no_answer']} of {r['ok']} successful requests streamed reasoning but no answer (the token "
                 "budget ran out while reasoning?): they have no TTFA and count as not good under a ttfa_ms threshold")
    if r["hidden"]:
        w.append(f"{r['hidden']} successful requests reported reasoning tokens that the stream did not carry "
                 "(hidden reasoning): their TTFT includes the reasoning time")
    if s["n_out_source"]["used"] == "mixed":
        w.append("output token counts come from server usage for some requests and chunk counts for others; "
                 "TPOT mixes both")
    if s["itl_source"]["several_tokens"]:
        w.append(f"{s['itl_source']['several_tokens']} of {c['ok']} successful requests streamed chunks of several "
                 "tokens (their usage total exceeds the chunk count, e.g. speculative decoding or a stream interval): "
                 "their per-token ITL is unknown and left out of itl_ms; icl_ms has their chunk gaps")
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        if set(s["latency"][key].get("thin", [])) - {"p99.9"}:
            w += [f"{key}: {msg}" for msg in s["latency"][key]["warnings"]]
    for kind, mm in s["length_mismatch"].items():
        if mm["mismatched"]:
            w.append(f"{kind} length: {mm['mismatched']} of {mm['checked']} successful requests got a different "
                     f"{mm['reported']} than the trace's {mm['requested']} (mean difference {mm['mean_diff']:+.1f}), "
                     f"e.g. {', '.join(map(str, mm['examples'][:3]))}")
    return w


def summarize_run(run_dir: str | Path, *, warmup=None, cooldown=None, steady_state: float | None = None,
                  slo=None, window_s: float | None = None, length_buckets=None, bin_s: float = 1.0,
                  write: bool = True, suffix: str = "", tenant_column: str | None = None) -> dict:
    """Compute the summary of a run; with write=True also write summary.json, summary.md and
    report.html into the run directory (next to the records file when given a file), or
    summary.SUFFIX.json, summary.SUFFIX.md and report.SUFFIX.html with a `suffix`. `tenant_column`:
    the records column that names each request's tenant (Analysis.tenants)."""
    spec = load_slo(slo) if slo is not None else None
    with plain_pages():
        # Times and token counts are used only for the per-request metrics (and length checks):
        # streamed into them, they are never in memory whole (10M records: ~0.5 GB less).
        run = load_run(run_dir, columns=[c for c in ANALYSIS_COLUMNS if c not in STREAMED_COLUMNS])
        if spec is None and run.dir is not None and (run.dir / "slo.json").is_file():
            spec = load_slo(run.dir / "slo.json")   # replay run --slo's own
        rm = request_metrics(run.records, stream=run.batches(STREAMED_COLUMNS, BATCH))
        an = analyze(with_column(run, tenant_column), warmup=warmup, cooldown=cooldown, steady_state=steady_state,
                     slo=spec, bin_s=bin_s, rm=rm, tenant_column=tenant_column)
        an.server_metrics = run.server_metrics
        cpu = load_cpu(run.dir)
        an.bottleneck = assess(an, run.config, cpu)
        attach(an, run)
        summary = build_summary(run, an, window_s=window_s, length_edges=length_buckets or LENGTH_EDGES, cpu=cpu)
        plots = _plots(an) if write else None
    summary = jsonable(summary)
    if write:
        out = run.dir or run.records_path.parent
        from .html import render_report
        from .text import summary_markdown
        names = {k: k.replace(".", f".{suffix}.") if suffix else k for k in ("summary.json", "summary.md", "report.html")}
        (out / names["summary.json"]).write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
        (out / names["summary.md"]).write_text(summary_markdown(summary))
        (out / names["report.html"]).write_text(render_report(summary, jsonable(plots)))
        summary["files"] = {k: str(out / v) for k, v in names.items()}
    return summary
