"""report.html: one self-contained offline file (inline SVG and CSS, no script, no network)."""
from __future__ import annotations

import json
from pathlib import Path

from .svg import chart
from .text import LAT_COLUMNS, REASONING_COLUMNS, _headline, _reasoning_rows, fmt, latency_names

TEMPLATES = Path(__file__).parent / "templates"


def _env():
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    return env


def _charts(s: dict, plots: dict) -> list[str]:
    ts, out = s.get("timeseries") or {}, []
    for metric, name in (("ttft_ms", "TTFT"), ("ttfa_ms", "TTFA"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        curves = plots.get("cdf", {}).get(metric, {})
        if curves:
            out.append(chart([{"label": m, "x": xs, "y": ys} for m, (xs, ys) in curves.items()],
                             title=f"{name} CDF per model", xlabel=f"{name} (ms)", ylabel="fraction of requests"))
    if ts.get("t_s"):
        t = ts["t_s"]
        win = s.get("window") or {}
        band = None
        if win.get("start_s") is not None:
            band = (win["start_s"] - ts["t0_s"], win["end_s"] - ts["t0_s"])
        rate = {"label": "offered req/s", "x": t, "y": ts["offered_rps"], "axis": 2, "color": "#999", "dash": 1}
        for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            out.append(chart([{"label": f"{name} p50", "x": t, "y": ts[f"{metric}_p50"]},
                              {"label": f"{name} p99", "x": t, "y": ts[f"{metric}_p99"]}, rate],
                             title=f"{name} over time (by send time) with the arrival rate", xlabel="time (s)",
                             ylabel=f"{name} (ms)", y2label="req/s", band=band))
        out.append(chart([{"label": "offered", "x": t, "y": ts["offered_rps"]},
                          {"label": "completed ok", "x": t, "y": ts["achieved_rps"]},
                          {"label": "goodput", "x": t, "y": ts["goodput_rps"]},
                          {"label": "errors", "x": t, "y": ts["errors_per_s"]}],
                         title="Request rates and goodput over time", xlabel="time (s)", ylabel="req/s", band=band))
        out.append(chart([{"label": "in flight (time-weighted mean)", "x": t, "y": ts["inflight"]}],
                         title="In-flight concurrency", xlabel="time (s)", ylabel="requests", band=band))
        out.append(chart([{"label": "lag p50", "x": t, "y": ts["lag_ms_p50"]},
                          {"label": "lag p99", "x": t, "y": ts["lag_ms_p99"]}],
                         title="Dispatch lag (sent - scheduled)", xlabel="time (s)", ylabel="ms", band=band))
        srv = ts.get("server") or {}
        if "kv_cache_usage" in srv:
            out.append(chart([{"label": "KV cache usage", "x": t, "y": srv["kv_cache_usage"]}],
                             title="Server KV-cache usage", xlabel="time (s)", ylabel="fraction", band=band))
        queue = [{"label": k, "x": t, "y": srv[k]} for k in ("running", "waiting") if k in srv]
        if "preemptions" in srv:
            queue.append({"label": "preemptions / window", "x": t, "y": srv["preemptions"], "axis": 2})
        if queue:
            out.append(chart(queue, title="Server queue depth", xlabel="time (s)", ylabel="requests",
                             y2label="preemptions", band=band))
    imgs = (s.get("breakdowns") or {}).get("num_images") or []
    if len(imgs) > 1:
        x = [int(r["key"].rstrip("+")) for r in imgs]
        out.append(chart([{"label": f"TTFT {q}", "x": x, "y": [r["ttft_ms"][q] for r in imgs]} for q in ("p50", "p99")],
                         title="TTFT vs images per request", xlabel="images per request (the last: that many or more)",
                         ylabel="TTFT (ms)"))
    sc = plots.get("scatter") or {}
    if sc.get("input_len"):
        out.append(chart([{"label": "TTFT", "x": sc["input_len"], "y": sc["ttft_ms"]},
                          {"label": "E2E", "x": sc["input_len"], "y": sc["e2e_ms"]}], kind="scatter",
                         title="Latency vs input length (sample)", xlabel="input tokens (log scale)",
                         ylabel="ms", logx=True))
    return out


def render_report(summary: dict, plots: dict) -> str:
    s = summary
    lat_rows = [[k, d["n"], d["mean"], d["p50"], d["p90"], d["p95"], d["p99"], d["p99.9"], d["max"],
                 (d.get("ci") or {}).get("p99")] for k, d in ((k, s["latency"][k]) for k in latency_names(s)) if d["n"]]
    return _env().get_template("report.html.j2").render(
        s=s, headline=_headline(s), lat_columns=LAT_COLUMNS, lat_rows=lat_rows, charts=_charts(s, plots),
        reasoning_columns=REASONING_COLUMNS, reasoning_rows=_reasoning_rows(s) if s["reasoning"]["requests"] else [],
        config_json=json.dumps(s["run"]["config"], indent=2, default=str) if s["run"]["config"] else None,
        window_json=json.dumps(s["window"], indent=2),
        slo_json=json.dumps(s["goodput"]["slo"], indent=2) if s["goodput"]["slo"] else None)


def render_compare(result, base, cand, base_name: str, cand_name: str) -> str:
    """Side-by-side page for `replay compare --html`: the table and overlaid CDFs."""
    import numpy as np
    from .compare import COLUMNS
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
            charts.append(chart(series, title=f"{metric} CDF: base vs candidate", xlabel=metric,
                                ylabel="fraction"))
    return _env().get_template("compare.html.j2").render(
        r=result, columns=COLUMNS, rows=result._rows(), charts=charts, base=base_name, cand=cand_name)
