"""Text renderings: rich tables rendered to plain text for the terminal, Markdown for CI comments."""
from __future__ import annotations

import io
import math


NOISE = 1e-12     # below this a report number is float noise (a 1.7e-18 ms bound is 0 ms)


def fmt(v: object, digits: int = 4) -> str:
    """Numbers with `digits` significant figures, thousands kept whole; None/NaN as '-'; float
    noise as 0; [lo, hi] pairs as intervals (fmt_ci)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isfinite(v) and abs(v) < NOISE:
        return "0"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and abs(v) < 10 ** -(digits - 1):
            return f"{v:.{digits - 1}e}"
        if abs(v) >= 10 ** digits:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    if not (isinstance(v, (list, tuple)) and len(v) == 2):
        return str(v)
    lo, hi = (x if isinstance(x, (int, float)) and math.isfinite(x) else None for x in v)
    if all(isinstance(x, (int, float)) for x in v) and (lo is None) == (hi is None):
        return fmt_ci(*v)       # both ends finite, or neither
    if any(isinstance(x, (int, float)) for x in v):
        # a gate's one-sided bounds: too few samples for one side (inf, or null in summary.json)
        return f"[{'-∞' if lo is None else fmt(lo, digits)}, {'∞' if hi is None else fmt(hi, digits)}]"
    return f"[{fmt(v[0], digits)}, {fmt(v[1], digits)}]"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    """An interval to the precision its width supports: both ends with the decimals that give the
    width two significant figures ([232.6, 452.2] -> [233, 452]; [0.2101, 0.2513] -> [0.210,
    0.251]). An end smaller than 1e-9 of the other (bootstrap float noise, 1.7e-18) is 0."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    scale = max(abs(lo), abs(hi))
    lo, hi = (0.0 if abs(v) < max(NOISE, 1e-9 * scale) else v for v in (lo, hi))
    width = hi - lo
    if width <= 0:
        return f"[{fmt(lo)}, {fmt(hi)}]"
    decimals = min(max(0, 1 - math.floor(math.log10(width))), 9)

    def one(v: float) -> str:
        return "0" if v == 0 else f"{v:,.{decimals}f}"
    return f"[{one(lo)}, {one(hi)}]"


def render_table(title: str | None, columns: list[str], rows: list[list[object]], *,
                 width: int = 120, caption: str | None = None) -> str:
    """A rich table rendered to plain text (no colours, so logs and CI stay readable)."""
    from rich.console import Console
    from rich.table import Table
    from rich import box
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left",
                  box=box.SIMPLE_HEAD)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*[fmt(v) for v in row])
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()


def markdown_table(columns: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


LAT_COLUMNS = ["metric", "n", "mean", "p50", "p90", "p95", "p99", "p99.9", "max", "p99 95% CI"]
SHOWN = ("ttft_ms", "ttfa_ms", "tpot_ms", "tpot_answer_ms", "icl_ms", "icl_answer_ms", "itl_ms", "itl_answer_ms",
         "e2e_ms", "ntpot_ms", "reasoning_ms", "answer_ms", "ttft_sched_ms", "ttfa_sched_ms", "e2e_sched_ms")
# Shown only with reasoning in the run: without it the answer metrics equal their all-token twins.
REASONING_ONLY = {"ttfa_ms", "ttfa_sched_ms", "tpot_answer_ms", "icl_answer_ms", "itl_answer_ms", "reasoning_ms",
                  "answer_ms"}
REASONING_COLUMNS = ["model", "with reasoning", "reasoning tok p50", "reasoning ms p50", "reasoning ms p99",
                     "ttft p50", "ttfa p50", "ttfa p99", "answer ms p50"]


def _has_reasoning(s: dict) -> bool:
    return bool((s.get("reasoning") or {}).get("requests"))


def latency_names(s: dict, names=None) -> list[str]:
    """The latencies worth a row (default: all of summary.json's): without reasoning in the run,
    not the REASONING_ONLY ones."""
    keep = _has_reasoning(s)
    return [k for k in (names or s["latency"]) if keep or k not in REASONING_ONLY]


_STATS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")


def lat_row(name: str, d: dict) -> list[object]:
    """A latency's row: its name, n, the _STATS and the p99's confidence interval."""
    return [name, d["n"], *[d[k] for k in _STATS], (d.get("ci") or {}).get("p99")]


def _latency_rows(s: dict) -> list[list[object]]:
    """One row per latency; where every chunk carried one token, ITL is ICL (inter-token = inter-
    chunk gaps): one row `icl_ms = itl_ms`, not two identical ones."""
    rows = []
    for name in latency_names(s, SHOWN):
        d = s["latency"].get(name)
        if not (d and d["n"]):
            continue
        twin = next((r for r in rows if r[0] == name.replace("itl", "icl", 1)), None)   # itl's twin: icl
        if twin is not None and twin[1:9] == lat_row(name, d)[1:9]:
            twin[0] = f"{twin[0]} = {name}"
        else:
            rows.append(lat_row(name, d))
    return rows


ITL_SOURCES = {"chunk_tokens": "per-chunk usage", "one_token_usage": "1/chunk by usage",
               "one_token_assumed": "1/chunk assumed", "several_tokens": "several/chunk: left out"}


def run_rows(s: dict) -> list[list[object]]:
    c, t, g, lag = s["counts"], s["throughput"], s["goodput"], s["dispatch_lag"]
    cn, r, src = s.get("connections") or {}, s.get("reasoning") or {}, s.get("itl_source") or {}
    asked = "" if r.get("asked_share") is None else f" (the trace asked {r['asked_share']:.1%})"
    return [["state", (s.get("state") or {}).get("sentence", "-")],
            ["requests (measured / records)", f"{c['measured']:,} / {c['records']:,}"],
            ["ok / failed", f"{c['ok']:,} / {c['failed']:,}"], ["duration D (s)", t["duration_s"]],
            ["requests/s", t["requests_per_s"]], ["output tokens/s", t["output_tokens_per_s"]],
            ["total tokens/s", t["total_tokens_per_s"]],
            ["attainment" + ("" if g["per_request_slo"] else " (no per-request SLO: success rate)"), g["attainment"]],
            ["goodput req/s", g["goodput_rps"]], ["token goodput/s", g["token_goodput_per_s"]],
            ["dispatch lag p50 / p99 / max (ms)", f"{fmt(lag['p50'])} / {fmt(lag['p99'])} / {fmt(lag['max'])}"],
            ["n_out from", s["n_out_source"]["used"]],
            ["ITL tokens from (requests)",
             ", ".join(f"{v} {src[k]:,}" for k, v in ITL_SOURCES.items() if src.get(k)) or "-"],
            ["connections opened / reused (connect p99 ms)",
             f"{cn['opened']:,} / {cn['reused']:,} ({fmt(cn['connect_ms']['p99'])})" if cn.get("recorded") else "-"],
            *([["reasoning share of output tokens", f"{r['share']:.1%}{asked}"]] if r.get("share") is not None else []),
            *([["where the time went", s["server_time"]["sentence"]]] if s.get("server_time") else []),
            *([["server cache", s["cache_state"]["sentence"]]] if s.get("cache_state") else []),
            *([["prefix hit achieved / intended", _prefix_hit(s["prefix_cache"])]]
              if (s.get("prefix_cache") or {}).get("achieved_hit_ratio") is not None else [])]


def _prefix_hit(p: dict) -> str:
    intended = "-" if p["intended_token_hit_ratio"] is None else f"{p['intended_token_hit_ratio']:.1%}"
    return f"{p['achieved_hit_ratio']:.1%} / {intended} (from {p['achieved_source']})"


def reasoning_rows(s: dict) -> list[list[object]]:
    """Per model: where a reasoning model's time goes (first token, reasoning, first answer, answer)."""
    stats = (("reasoning_tokens", "n"), ("reasoning_tokens", "p50"), ("reasoning_ms", "p50"), ("reasoning_ms", "p99"),
             ("ttft_ms", "p50"), ("ttfa_ms", "p50"), ("ttfa_ms", "p99"), ("answer_ms", "p50"))
    return [[r["key"], *[r[m][q] for m, q in stats]] for r in s["breakdowns"]["model"] if "reasoning_tokens" in r]


def _first_errors(s: dict, k: int = 3) -> str:
    """The most frequent distinct error messages (the server's own words), with their counts."""
    top = s["errors"].get("top_messages") or []
    return "".join(["most frequent errors:\n"] + [f"  x{e['count']}: {e['message']}\n" for e in top[:k]]) if top else ""


TASK_COLUMNS = ["", "n", "mean", "p50", "p90", "p99", "max"]
DEPTH_COLUMNS = ["depth", "requests", "ok", "ttft p50 (ms)", "ttft p90 (ms)", "prompt cached"]


def task_rows(s: dict) -> list[list[object]]:
    """Agentic tasks: counts, task time, steps, and the critical path's split (seconds)."""
    t, pad = s["tasks"], [""] * 5
    limit = f" (task_s <= {fmt(t['task_s_limit'])})" if t["task_s_limit"] else " (completion rate)"
    rows = [["tasks (completed / good)", f"{t['tasks']:,} ({t['completed']:,} / {t['good']:,})", *pad],
            ["task attainment" + limit, t["task_attainment"], *pad],
            ["task goodput / tasks per s", f"{fmt(t['task_goodput_per_s'])} / {fmt(t['tasks_per_s'])}", *pad]]
    for name, d in [("task_s", t["task_s"]), ("steps per task", t["steps"])] + [
            (f"critical path: {k[:-2]} s", v) for k, v in t["critical_path"].items()]:
        if d and d.get("n"):
            rows.append([name if "share" not in d or d["share"] is None else f"{name} ({d['share']:.0%})", d["n"],
                         d["mean"], d["p50"], d["p90"], d["p99"], d["max"]])
    return rows


def depth_rows(s: dict) -> list[list[object]]:
    return [[d["depth"] if d.get("to", d["depth"]) == d["depth"] else f"{d['depth']}-{d['to']}",
             d["requests"], d["ok"], d["ttft_ms_p50"], d["ttft_ms_p90"],
             "-" if d.get("cached_share") is None else f"{d['cached_share']:.0%}"] for d in s["tasks"]["by_depth"]]


GATE_COLUMNS = ["objective", "scope", "measured", "limit", "n", "verdict"]
GROUPS = (("model", "Per model", (("ttft_ms", "p99"), ("tpot_ms", "p99"))),
          ("target", "Per target", (("ttft_ms", "p99"), ("tpot_ms", "p99"))),
          ("num_images", "Per image count", (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("e2e_ms", "p99"))))


TENANT_ROWS = 20    # the worst tenants shown; summary.json has them all
TENANT_COLUMNS = ["tenant", "requests", "attainment", "goodput req/s", "ttft p50", "ttft p99", "tpot p50", "tpot p99"]


def tenant_table(s: dict) -> tuple[str, list[str], list[list[object]]]:
    """Per tenant, worst attainment first, titled with the fairness of their attainment."""
    t, f = s["tenants"], s["tenants"]["fairness"]
    rows = sorted(t["rows"], key=lambda r: r["attainment"])
    more = f", worst {TENANT_ROWS} of {len(rows)}" if len(rows) > TENANT_ROWS else ""
    sv = f["service"]
    where = "worst window {:.4g}-{:.4g} s".format(*sv["window_s"]) if sv and sv["window_s"] else "never contended"
    service = f"fairness {sv['value']:.3f} ({where}); " if sv else ""
    title = (f"Per tenant ({t['column']}{more}): {service}attainment Jain {f['jain']:.3f}; "
             f"worst {f['worst']['tenant']} {f['worst']['attainment']:.1%}, "
             f"best {f['best']['tenant']} {f['best']['attainment']:.1%}")
    return title, TENANT_COLUMNS, [[r["tenant"], r["requests"], r["attainment"], r["goodput_rps"], r["ttft_ms"]["p50"],
                                    r["ttft_ms"]["p99"], r["tpot_ms"]["p50"], r["tpot_ms"]["p99"]]
                                   for r in rows[:TENANT_ROWS]]


def _tables(s: dict, markdown: bool = False) -> list[tuple[str, list[str], list[list[object]]]]:
    """The summary's tables after the headline, in order, as (title, columns, rows); the per-group
    ones only on the terminal."""
    out = [("Latency (ms, successful requests)", LAT_COLUMNS, _latency_rows(s))]
    if _has_reasoning(s):
        out.append(("Reasoning (ms, successful requests)", REASONING_COLUMNS, reasoning_rows(s)))
    if s.get("tasks"):
        out += [("Agentic tasks (s)", TASK_COLUMNS, task_rows(s)),
                ("Steps by depth in the task graph", DEPTH_COLUMNS, depth_rows(s))]
    if s.get("tenants"):
        out.append(tenant_table(s))
    if s["errors"]["failed"]:
        out.append(("Errors", ["status", "count"], list(s["errors"]["by_status"].items())))
    for key, title, stats in () if markdown else GROUPS:
        rows = s["breakdowns"].get(key)
        if rows is not None and (key != "model" or len(rows) > 1):
            out.append((title, [{"num_images": "images"}.get(key, key), "issued", "ok",
                                *[f"{m[:-3]} {q}" for m, q in stats], "attainment"],
                        [[r["key"], r["issued"], r["ok"], *[r[m][q] for m, q in stats], r["attainment"]]
                         for r in rows]))
    if s.get("gate"):
        out.append((f"SLO gate (exit {s['gate']['exit_code']})", GATE_COLUMNS,
                    [[r[k] for k in GATE_COLUMNS] for r in s["gate"]["rows"]]))
    return out


def format_summary(summary: dict) -> str:
    """The compact terminal summary of a run (rich tables rendered to text)."""
    parts = [render_table("Run", ["", "value"], run_rows(summary), width=100)]
    for title, columns, rows in _tables(summary):
        parts.append(render_table(title, columns, rows, width=60 if title == "Errors" else 120))
        parts += [_first_errors(summary)] if title == "Errors" else []
    return "".join(parts + [f"warning: {w}\n" for w in summary["warnings"]])


def summary_markdown(summary: dict) -> str:
    """summary.md: the same numbers as Markdown (without the per-group tables), for CI comments."""
    out = ["# llm-replay run summary", "", markdown_table(["", "value"], run_rows(summary)), ""]
    for title, columns, rows in _tables(summary, markdown=True):
        out += [f"## {title}", "", markdown_table(columns, rows), ""]
        out += [_first_errors(summary, 5)] if title == "Errors" else []
    if summary["warnings"]:
        out += ["## Warnings", ""] + [f"- {w}" for w in summary["warnings"]] + [""]
    return "\n".join(out)


def headline(s: dict) -> dict[str, float | int | None]:
    """The key numbers of a run (summary.json) as a flat dict (pytest plugin metrics, JUnit properties)."""
    out: dict[str, float | int | None] = {
        "requests": s["counts"]["measured"], "ok": s["counts"]["ok"], "failed": s["counts"]["failed"],
        "requests_per_s": s["throughput"]["requests_per_s"],
        "output_tokens_per_s": s["throughput"]["output_tokens_per_s"], "attainment": s["goodput"]["attainment"],
        "goodput_rps": s["goodput"]["goodput_rps"], "lag_ms_p99": s["dispatch_lag"].get("p99")}
    out |= {f"{m}_{q}": (s["latency"].get(m) or {}).get(q) for m in ("ttft_ms", "ttfa_ms", "tpot_ms", "e2e_ms")
            for q in ("p50", "p99")}
    if _has_reasoning(s):
        out["reasoning_tokens_p50"] = s["reasoning"]["tokens"]["p50"]
    out |= {f"{m}_p99": d.get("p99") for m, d in ((s.get("server_time") or {}).get("overall") or {}).items()}
    if s.get("tasks"):
        t = s["tasks"]
        out.update(tasks=t["tasks"], task_attainment=t["task_attainment"], task_goodput_per_s=t["task_goodput_per_s"],
                   task_s_p50=(t["task_s"] or {}).get("p50"), task_s_p90=(t["task_s"] or {}).get("p90"))
    return out
