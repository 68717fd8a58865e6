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
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        if all(math.isfinite(x) for x in v) or not any(math.isfinite(x) for x in v):
            return fmt_ci(*v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and any(isinstance(x, (int, float)) for x in v):
        # a gate's one-sided bounds: too few samples for one side (inf, or null in summary.json)
        lo, hi = (x if isinstance(x, (int, float)) and math.isfinite(x) else None for x in v)
        return f"[{'-∞' if lo is None else fmt(lo, digits)}, {'∞' if hi is None else fmt(hi, digits)}]"
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"[{fmt(v[0], digits)}, {fmt(v[1], digits)}]"
    return str(v)


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


def _latency_rows(s: dict) -> list[list[object]]:
    """One row per latency; where every chunk carried one token, ITL is ICL (inter-token = inter-
    chunk gaps): one row `icl_ms = itl_ms`, not two identical ones."""
    rows = []
    for name in latency_names(s, SHOWN):
        d = s["latency"].get(name)
        if not (d and d["n"]):
            continue
        twin = next((r for r in rows if r[0] == name.replace("itl", "icl", 1)), None) if name.startswith("itl") else None
        if twin is not None and twin[1:9] == [d["n"], *[d[k] for k in _STATS]]:
            twin[0] = f"{twin[0]} = {name}"
            continue
        rows.append([name, d["n"], *[d[k] for k in _STATS], (d.get("ci") or {}).get("p99")])
    return rows


def _headline(s: dict) -> list[list[object]]:
    c, t, g, lag = s["counts"], s["throughput"], s["goodput"], s["dispatch_lag"]
    return [["state", (s.get("state") or {}).get("sentence", "-")],
            ["requests (measured / records)", f"{c['measured']:,} / {c['records']:,}"],
            ["ok / failed", f"{c['ok']:,} / {c['failed']:,}"],
            ["duration D (s)", t["duration_s"]],
            ["requests/s", t["requests_per_s"]], ["output tokens/s", t["output_tokens_per_s"]],
            ["total tokens/s", t["total_tokens_per_s"]],
            ["attainment" + ("" if g["per_request_slo"] else " (no per-request SLO: success rate)"),
             g["attainment"]],
            ["goodput req/s", g["goodput_rps"]], ["token goodput/s", g["token_goodput_per_s"]],
            ["dispatch lag p50 / p99 / max (ms)", f"{fmt(lag['p50'])} / {fmt(lag['p99'])} / {fmt(lag['max'])}"],
            ["n_out from", s["n_out_source"]["used"]],
            ["ITL tokens from (requests)", _itl_line(s)],
            ["connections opened / reused (connect p99 ms)", _connections_line(s)],
            *_share_rows(s),
            *([["where the time went", s["server_time"]["sentence"]]] if s.get("server_time") else [])]


def _share_rows(s: dict) -> list[list[object]]:
    r = s.get("reasoning") or {}
    if r.get("share") is None:
        return []
    asked = "" if r.get("asked_share") is None else f" (the trace asked {r['asked_share']:.1%})"
    return [["reasoning share of output tokens", f"{r['share']:.1%}{asked}"]]


def _connections_line(s: dict) -> str:
    cn = s.get("connections") or {}
    if not cn.get("recorded"):
        return "-"
    return f"{cn['opened']:,} / {cn['reused']:,} ({fmt(cn['connect_ms']['p99'])})"


def _itl_line(s: dict) -> str:
    src = s.get("itl_source") or {}
    names = {"chunk_tokens": "per-chunk usage", "one_token_usage": "1/chunk by usage",
             "one_token_assumed": "1/chunk assumed", "several_tokens": "several/chunk: left out"}
    parts = [f"{label} {src[k]:,}" for k, label in names.items() if src.get(k)]
    return ", ".join(parts) or "-"


def _reasoning_rows(s: dict) -> list[list[object]]:
    """Per model: where a reasoning model's time goes (first token, reasoning, first answer, answer)."""
    rows = []
    for r in s["breakdowns"]["model"]:
        if "reasoning_tokens" in r:
            rows.append([r["key"], r["reasoning_tokens"]["n"], r["reasoning_tokens"]["p50"], r["reasoning_ms"]["p50"],
                         r["reasoning_ms"]["p99"], r["ttft_ms"]["p50"], r["ttfa_ms"]["p50"], r["ttfa_ms"]["p99"],
                         r["answer_ms"]["p50"]])
    return rows


def _first_errors(s: dict, k: int = 3) -> str:
    """The most frequent distinct error messages (the server's own words), with their counts."""
    top = s["errors"].get("top_messages") or []
    return "".join(["most frequent errors:\n"] + [f"  x{e['count']}: {e['message']}\n" for e in top[:k]]) if top else ""


TASK_COLUMNS = ["", "n", "mean", "p50", "p90", "p99", "max"]
DEPTH_COLUMNS = ["depth", "requests", "ok", "ttft p50 (ms)", "ttft p90 (ms)", "prompt cached"]


def _task_rows(s: dict) -> list[list[object]]:
    """Agentic tasks: counts, task time, steps, and the critical path's split (seconds)."""
    t = s["tasks"]
    rows = [["tasks (completed / good)", f"{t['tasks']:,} ({t['completed']:,} / {t['good']:,})", "", "", "", "", ""],
            ["task attainment" + (f" (task_s <= {fmt(t['task_s_limit'])})" if t["task_s_limit"] else
                                  " (completion rate)"), t["task_attainment"], "", "", "", "", ""],
            ["task goodput / tasks per s", f"{fmt(t['task_goodput_per_s'])} / {fmt(t['tasks_per_s'])}", "", "", "", "", ""]]
    for name, d in [("task_s", t["task_s"]), ("steps per task", t["steps"])] + [
            (f"critical path: {k[:-2]} s", v) for k, v in t["critical_path"].items()]:
        if d and d.get("n"):
            rows.append([name if "share" not in d or d["share"] is None else f"{name} ({d['share']:.0%})", d["n"],
                         d["mean"], d["p50"], d["p90"], d["p99"], d["max"]])
    return rows


def _depth_rows(s: dict) -> list[list[object]]:
    return [[d["depth"] if d.get("to", d["depth"]) == d["depth"] else f"{d['depth']}-{d['to']}",
             d["requests"], d["ok"], d["ttft_ms_p50"], d["ttft_ms_p90"],
             "-" if d.get("cached_share") is None else f"{d['cached_share']:.0%}"] for d in s["tasks"]["by_depth"]]


def format_summary(summary: dict) -> str:
    """The compact terminal summary of a run (rich tables rendered to text)."""
    s = summary
    parts = [render_table("Run", ["", "value"], _headline(s), width=100),
             render_table("Latency (ms, successful requests)", LAT_COLUMNS, _latency_rows(s))]
    if _has_reasoning(s):
        parts.append(render_table("Reasoning (ms, successful requests)", REASONING_COLUMNS, _reasoning_rows(s)))
    if s.get("tasks"):
        parts.append(render_table("Agentic tasks (s)", TASK_COLUMNS, _task_rows(s)))
        parts.append(render_table("Steps by depth in the task graph", DEPTH_COLUMNS, _depth_rows(s)))
    if s["errors"]["failed"]:
        parts.append(render_table("Errors", ["status", "count"], list(s["errors"]["by_status"].items()),
                                  width=60))
        parts.append(_first_errors(s))
    if len(s["breakdowns"]["model"]) > 1:
        parts.append(render_table("Per model", ["model", "issued", "ok", "ttft p99", "tpot p99", "attainment"],
                                  [[r["key"], r["issued"], r["ok"], r["ttft_ms"]["p99"], r["tpot_ms"]["p99"],
                                    r["attainment"]] for r in s["breakdowns"]["model"]]))
    if "target" in s["breakdowns"]:
        parts.append(render_table("Per target", ["target", "issued", "ok", "ttft p99", "tpot p99", "attainment"],
                                  [[r["key"], r["issued"], r["ok"], r["ttft_ms"]["p99"], r["tpot_ms"]["p99"],
                                    r["attainment"]] for r in s["breakdowns"]["target"]]))
    if "num_images" in s["breakdowns"]:
        parts.append(render_table("Per image count", ["images", "issued", "ok", "ttft p50", "ttft p99", "e2e p99",
                                                      "attainment"],
                                  [[r["key"], r["issued"], r["ok"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"],
                                    r["e2e_ms"]["p99"], r["attainment"]] for r in s["breakdowns"]["num_images"]]))
    if s.get("gate"):
        parts.append(render_table(f"SLO gate (exit {s['gate']['exit_code']})",
                                  ["objective", "scope", "measured", "limit", "n", "verdict"],
                                  [[r["objective"], r["scope"], r["measured"], r["limit"], r["n"], r["verdict"]]
                                   for r in s["gate"]["rows"]]))
    parts += [f"warning: {w}\n" for w in s["warnings"]]
    return "".join(parts)


def summary_markdown(summary: dict) -> str:
    """summary.md: the same numbers as Markdown, for CI comments."""
    s = summary
    out = ["# llm-replay run summary", "", markdown_table(["", "value"], _headline(s)), "",
           "## Latency (ms, successful requests)", "", markdown_table(LAT_COLUMNS, _latency_rows(s)), ""]
    if _has_reasoning(s):
        out += ["## Reasoning (ms, successful requests)", "", markdown_table(REASONING_COLUMNS, _reasoning_rows(s)), ""]
    if s.get("tasks"):
        out += ["## Agentic tasks (s)", "", markdown_table(TASK_COLUMNS, _task_rows(s)), "",
                "## Steps by depth in the task graph", "", markdown_table(DEPTH_COLUMNS, _depth_rows(s)), ""]
    if s["errors"]["failed"]:
        out += ["## Errors", "", markdown_table(["status", "count"], list(s["errors"]["by_status"].items())), "",
                _first_errors(s, 5)]
    if s.get("gate"):
        out += [f"## SLO gate (exit {s['gate']['exit_code']})", "",
                markdown_table(["objective", "scope", "measured", "limit", "n", "verdict"],
                               [[r["objective"], r["scope"], r["measured"], r["limit"], r["n"], r["verdict"]]
                                for r in s["gate"]["rows"]]), ""]
    if s["warnings"]:
        out += ["## Warnings", ""] + [f"- {w}" for w in s["warnings"]] + [""]
    return "\n".join(out)


def headline(summary: dict) -> dict[str, float | int | None]:
    """The key numbers of a run as a flat dict (pytest plugin metrics, JUnit properties)."""
    s = summary
    out: dict[str, float | int | None] = {
        "requests": s["counts"]["measured"], "ok": s["counts"]["ok"], "failed": s["counts"]["failed"],
        "requests_per_s": s["throughput"]["requests_per_s"],
        "output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
        "attainment": s["goodput"]["attainment"], "goodput_rps": s["goodput"]["goodput_rps"],
        "lag_ms_p99": s["dispatch_lag"].get("p99"),
    }
    for metric in ("ttft_ms", "ttfa_ms", "tpot_ms", "e2e_ms"):
        d = s["latency"].get(metric) or {}
        for stat in ("p50", "p99"):
            out[f"{metric}_{stat}"] = d.get(stat)
    if _has_reasoning(s):
        out["reasoning_tokens_p50"] = s["reasoning"]["tokens"]["p50"]
    for metric, d in ((s.get("server_time") or {}).get("overall") or {}).items():
        out[f"{metric}_p99"] = d.get("p99")
    if s.get("tasks"):
        t = s["tasks"]
        out.update(tasks=t["tasks"], task_attainment=t["task_attainment"], task_goodput_per_s=t["task_goodput_per_s"],
                   task_s_p50=(t["task_s"] or {}).get("p50"), task_s_p90=(t["task_s"] or {}).get("p90"))
    return out
