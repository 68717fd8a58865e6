"""report.html: one self-contained offline file (inline SVG and CSS, no script, no network).

Every table header names its unit; run.json, the measured window and the SLO are small
key/value tables (wall-clock epochs as ISO UTC), not JSON dumps.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from .svg import chart
from .text import (DEPTH_COLUMNS, LAT_COLUMNS as TEXT_LAT_COLUMNS, TASK_COLUMNS, depth_rows, fmt,  # noqa: F401
                   fmt_ci, lat_row, latency_names, reasoning_rows, run_rows, task_rows)

TEMPLATES = Path(__file__).parent / "templates"

LAT_COLUMNS = ["metric", "n (samples)", *[f"{c} (ms)" for c in TEXT_LAT_COLUMNS[2:]]]
REASONING_COLUMNS = ["model", "with reasoning (requests)", "reasoning p50 (tokens)", "reasoning p50 (ms)",
                     "reasoning p99 (ms)", "TTFT p50 (ms)", "TTFA p50 (ms)", "TTFA p99 (ms)", "answer p50 (ms)"]
COMPARE_COLUMNS = ["metric", "unit", "base (unit)", "cand (unit)", "delta (unit)", "delta (%)",
                   "99% CI of delta (%)", "p (probability)", "verdict"]


UNITS = {"error_rate": "fraction", "attainment": "fraction", "requests_per_s": "req/s", "output_tokens_per_s": "tok/s"}


def compare_unit(metric: str) -> str:
    """The unit of a compare row, from its metric's name (compare.py's rows)."""
    return "probability" if "rank test" in metric else "ms" if "_ms" in metric else UNITS.get(metric, "-")


def _env():
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, pct=lambda v: "-" if v is None else fmt(100 * v))
    return env


def iso_utc(epoch_s: float) -> str:
    return _dt.datetime.fromtimestamp(epoch_s, _dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", " UTC")


def _is_wall(key: str, v: object) -> bool:
    """A wall-clock epoch in run.json: started_wall, ended_wall, t0_wall (and *_epoch, *_at)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and 1e9 < v < 1e10
            and (key.endswith(("_wall", "_epoch", "_at")) or "wall" in key))


def kv_rows(d: dict, prefix: str = "") -> list[tuple[str, str]]:
    """A nested dict (run.json, the SLO) as rows of dotted key and human value."""
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            rows += kv_rows(v, key + ".")
        elif _is_wall(str(k), v):
            rows.append((key, f"{iso_utc(float(v))} (epoch {v:.3f} s)"))
        elif isinstance(v, (list, tuple)):
            rows.append((key, ", ".join(fmt(x) if not isinstance(x, (dict, list)) else str(x) for x in v) or "-"))
        else:
            rows.append((key, "-" if v == {} else fmt(v)))   # fmt(None): "-"
    return rows


def _bound(b: dict | None, what: str) -> str:
    if not b:
        return "none"
    amount = f"{fmt(b['value'])} s" if b["by"] == "time" else f"{int(b['value']):,} requests"
    return f"{what} {amount} (cut at {fmt(b['cut_s'])} s)"


def window_rows(s: dict) -> list[tuple[str, str]]:
    """The measured window in words; times in s from the records' t0 (like the plots' x axis)."""
    w, st, ts = s["window"], s["window"].get("steady_state"), s.get("timeseries") or {}
    return [("warm-up excluded", _bound(w.get("warmup"), "first")),
            ("cool-down excluded", _bound(w.get("cooldown"), "last")),
            ("steady state", f">= {fmt(100 * st['fraction'])}% of peak concurrency: {fmt(st['start_s'])} to "
                             f"{fmt(st['end_s'])} s" if st else "off"),
            ("requests excluded", f"{w.get('excluded', 0):,} of {s['counts']['records']:,}"),
            *([("measured span (s)", f"{fmt(w['start_s'])} to {fmt(w['end_s'])}")]
              if w.get("start_s") is not None else []),
            ("duration D (s)", fmt(s["throughput"]["duration_s"])),
            *([("time-series window (s)", f"{fmt(ts['window_s'])} ({len(ts['t_s'])} windows)")]
              if ts.get("window_s") else [])]


# The terminal headline's labels (text.run_rows) with their units, for the HTML page.
HEADLINE_UNITS = {"ok / failed": "ok / failed (requests)", "requests/s": "throughput (req/s)",
                  "output tokens/s": "output throughput (tok/s)", "total tokens/s": "total throughput (tok/s)",
                  "goodput req/s": "goodput (req/s)", "token goodput/s": "token goodput (tok/s)"}


def headline_rows(s: dict) -> list[list[object]]:
    rows = []
    for k, v in run_rows(s):
        if k.startswith("attainment"):      # a fraction in text; a percentage with its unit here
            k, v = k.replace("attainment", "attainment (% of issued)", 1), (None if v is None else 100 * v)
        rows.append([HEADLINE_UNITS.get(k, k), v])
    return rows


def short_warning(w: str, limit: int = 200) -> str:
    """A warning as the page's opening shows it: whole when short, else its first clause (to the
    first ': ' when that says enough), cut at a word; the full text is further down."""
    if len(w) <= limit:
        return w
    head = w.split(": ", 1)[0]
    if not 40 <= len(head) <= limit:
        head = w[:limit].rsplit(" ", 1)[0]
    return head + " …"


def _charts(s: dict, plots: dict) -> list[str]:
    ts, out = s.get("timeseries") or {}, []
    for metric, name in (("ttft_ms", "TTFT"), ("ttfa_ms", "TTFA"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        curves = plots.get("cdf", {}).get(metric, {})
        if curves:
            out.append(chart([{"label": m, "x": xs, "y": ys} for m, (xs, ys) in curves.items()],
                             title=f"{name} CDF per model", xlabel=f"{name} (ms)", ylabel="fraction of requests"))
    if ts.get("t_s"):
        # Each window's value is drawn at its middle; the axis spans the run.
        widths = ts.get("width_s") or [ts["window_s"]] * len(ts["t_s"])
        t, xlim = [a + w / 2 for a, w in zip(ts["t_s"], widths)], (0.0, ts["t_s"][-1] + widths[-1])
        win = s.get("window") or {}
        band = None if win.get("start_s") is None else (win["start_s"] - ts["t0_s"], win["end_s"] - ts["t0_s"])
        common = {"xlabel": f"time (s), {fmt(ts['window_s'])} s windows", "band": band, "xlim": xlim}

        def lines(*pairs: tuple[str, str], src: dict = ts, **style) -> list[dict]:
            return [{"label": label, "x": t, "y": src[k], **style} for label, k in pairs]
        rate = lines(("offered req/s (right)", "offered_rps"), axis=2, color="#999", dash=1)
        for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            out.append(chart(lines(*[(f"{name} {q}", f"{metric}_{q}") for q in ("p50", "p99")]) + rate,
                             title=f"{name} over time (by send time) with the arrival rate",
                             ylabel=f"{name} (ms)", y2label="req/s", **common))
        out.append(chart(lines(("offered (by schedule)", "offered_rps"), ("completed ok", "achieved_rps"),
                               ("goodput", "goodput_rps"), ("errors", "errors_per_s")),
                         title="Request rates and goodput over time", ylabel="req/s", **common))
        out.append(chart(lines(("in flight (time-weighted mean)", "inflight")), title="In-flight concurrency",
                         ylabel="requests", **common))
        out.append(chart(lines(("lag p50", "lag_ms_p50"), ("lag p99", "lag_ms_p99")),
                         title="Dispatch lag (sent - scheduled)", ylabel="lag (ms)", **common))
        srv = ts.get("server") or {}
        if "kv_cache_usage" in srv:
            out.append(chart(lines(("KV cache usage", "kv_cache_usage"), src=srv), title="Server KV-cache usage",
                             ylabel="fraction of KV blocks", **common))
        queue = lines(*[(k, k) for k in ("running", "waiting") if k in srv], src=srv)
        if "preemptions" in srv:
            queue += lines(("preemptions per window (right)", "preemptions"), src=srv, axis=2)
        if queue:
            out.append(chart(queue, title="Server queue depth", ylabel="requests", y2label="preemptions", **common))
    imgs = (s.get("breakdowns") or {}).get("num_images") or []
    if len(imgs) > 1:
        x = [int(r["key"].rstrip("+")) for r in imgs]
        out.append(chart([{"label": f"TTFT {q}", "x": x, "y": [r["ttft_ms"][q] for r in imgs]} for q in ("p50", "p99")],
                         title="TTFT vs images per request", xlabel="images per request (the last: that many or more)",
                         ylabel="TTFT (ms)"))
    sc = plots.get("scatter") or {}
    if sc.get("input_len"):
        # One panel each: E2E is often 10-100x TTFT, and on a shared axis TTFT lies flat at zero.
        for metric, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
            out.append(chart([{"label": f"{name}, one dot a request", "x": sc["input_len"], "y": sc[metric]}],
                             kind="scatter", title=f"{name} vs input length (sample)",
                             xlabel="input tokens (log scale)", ylabel=f"{name} (ms)", logx=True))
    return out


def render_report(s: dict, plots: dict) -> str:
    lat_rows = [lat_row(k, s["latency"][k]) for k in latency_names(s) if s["latency"][k]["n"]]
    cfg = s["run"]["config"]
    started = next((cfg[k] for k in ("t0_wall", "started_wall") if cfg and _is_wall(k, cfg.get(k))), None)
    slo = s["goodput"]["slo"]
    from .servertime import charts as server_charts
    return _env().get_template("report.html.j2").render(
        s=s, headline=headline_rows(s), lat_columns=LAT_COLUMNS, lat_rows=lat_rows, charts=_charts(s, plots),
        server_charts=server_charts(s) if s.get("server_time") else [],
        reasoning_columns=REASONING_COLUMNS, reasoning_rows=reasoning_rows(s) if s["reasoning"]["requests"] else [],
        task_columns=TASK_COLUMNS, task_rows=task_rows(s) if s.get("tasks") else [],
        depth_columns=DEPTH_COLUMNS, depth_rows=depth_rows(s) if s.get("tasks") else [],
        config_rows=kv_rows(cfg) if cfg else None, started=iso_utc(started) if started else None,
        window_rows=window_rows(s), warnings=[(short_warning(w), w) for w in s["warnings"]],
        slo_rows=kv_rows({k: v for k, v in slo.items() if v not in (None, {}, [])}) if slo else None)


def render_compare(result, base, cand, base_name: str, cand_name: str) -> str:
    """Side-by-side page for `replay compare --html`: the table and overlaid CDFs."""
    import numpy as np
    rng, q, charts = np.random.default_rng(0), np.linspace(0, 100, 201), []
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        series = []
        for label, an in ((f"base: {base_name}", base), (f"cand: {cand_name}", cand)):
            x = an.values(metric)
            if len(x) > 200_000:
                x = rng.choice(x, 200_000, replace=False)
            if len(x):
                series.append({"label": label, "x": np.percentile(x, q).tolist(), "y": (q / 100).tolist()})
        if series:
            name = metric.removesuffix("_ms").upper()
            charts.append(chart(series, title=f"{name} CDF: base vs candidate", xlabel=f"{name} (ms)",
                                ylabel="fraction of requests"))
    return _env().get_template("compare.html.j2").render(
        r=result, columns=COMPARE_COLUMNS, rows=[[r[0], compare_unit(r[0]), *r[1:]] for r in result._rows()],
        charts=charts, base=base_name, cand=cand_name)
