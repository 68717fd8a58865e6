"""Benchmark: realism of fit -> generate on the public traces (issue 14).

For each public fixture in tests/traces/fixtures/public/ (see its README.md for the source,
commit, license and trim): import it with the real importer, fit a spec, generate a new trace
from the spec with another seed, and compare the two on the issue's targets:

    mean rate                       rel 2 %
    IDC (index of dispersion) 1/10/60 s   rel 20 %
    input / output p50 / p90 / p99  rel 10 %
    Spearman(input, output)         abs 0.1
    prefix-cache block hit ratio    abs 0.05   (traces with hash_ids)
    model mix, max share diff       abs 0.02   (2 points)

and, for information (not targets): inter-arrival CV (rel 10 %), IDC at 600 s (rel 20 %; only
5 windows in an hour), requests per session (rel 10 %, traces with sessions). The statistics
are `llm_replay.traces.stats` / `compare` (what `replay trace compare --json` prints), so
the same numbers come from the CLI:

    replay trace import azure AzureLLMInferenceTrace_code.csv -o T.parquet
    replay trace fit T.parquet -o S.yaml
    replay trace generate --spec S.yaml --seed 1 -o G.parquet
    replay trace compare T.parquet G.parquet --json

`bucketed_burst` has no file: its source is generated here from BUCKETED_BURST and seed 7
(known parameters: 5 min at 24 req/s in 1-s buckets, gamma CV 0.65, a 1-min burst at 1.5x).

The ServeGen fixtures (synthetic clients in ServeGen's format, tests/traces/fixtures/synth/
servegen/) have no trace to fit: their import -> generate is judged against what their PMFs
give (`servegen_truth`), on reasoning share (abs 0.05), image-count shares (abs 0.02, the
largest difference over counts) and lengths (rel 10 %).

    python3 benchmarks/realism.py                          # every fixture, seeds 1,2,3 (seconds)
    python3 benchmarks/realism.py --fixtures azure_code --seeds 1
    python3 benchmarks/realism.py --json out.json          # rows for machines
    python3 benchmarks/realism.py --markdown               # the README table
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm_replay.traces import stats  # noqa: E402
from llm_replay.traces.compare import compare_traces  # noqa: E402
from llm_replay.traces.fit import fit_trace  # noqa: E402
from llm_replay.traces.generate import generate  # noqa: E402
from llm_replay.traces.importers import import_trace  # noqa: E402
from llm_replay.traces.trace import Trace  # noqa: E402

PUBLIC = ROOT / "tests" / "traces" / "fixtures" / "public"


@dataclass(frozen=True)
class Fixture:
    name: str
    fmt: str
    file: str
    options: dict[str, Any] = field(default_factory=dict)
    note: str = ""


# issue 25 item 4: a short window of traffic written by a clock with 1-s buckets (generated
# here from this spec and seed: 5 min at 24 req/s, gamma CV 0.65, a 1-min burst at 1.5x)
BUCKETED_BURST = {"duration": 300, "exact_count": True, "timestamp_quantum_s": 1.0, "clients": [{
    "name": "burst", "rate": 24, "arrival": {"process": "gamma", "cv": 0.65},
    "profile": {"kind": "table", "window": 60, "values": [1, 1, 1.5, 1, 1]},
    "input": {"dist": "lognormal", "median": 800, "sigma": 0.7, "max": 8192},
    "output": {"dist": "lognormal", "median": 200, "sigma": 0.6, "max": 2048}, "rho": 0.3}]}

# Smallest first. BurstGPT and Qwen-Bailian are not here: see the fixtures' README.md.
FIXTURES = {f.name: f for f in [
    Fixture("azure_code", "azure", "AzureLLMInferenceTrace_code.csv", note="Azure LLM inference 2023, code"),
    Fixture("azure_conv", "azure", "AzureLLMInferenceTrace_conv.csv", note="Azure LLM inference 2023, conversation"),
    Fixture("mooncake_conv", "mooncake", "mooncake_conversation_trace.jsonl",
            note="Mooncake FAST'25 conversation, as imported (timestamps in ~3 s buckets)"),
    Fixture("mooncake_conv_dq", "mooncake", "mooncake_conversation_trace.jsonl", {"dequantize": "uniform"},
            note="the same, imported with --dequantize uniform"),
    Fixture("bucketed_burst", "synthetic", "", {"spec": BUCKETED_BURST, "seed": 7},
            note="a short bucketed burst window (BUCKETED_BURST, seed 7: 1-s buckets, 5 min)"),
    Fixture("servegen_reason", "servegen", "r1-test", note="synthetic ServeGen reasoning clients (DeepSeek-R1 "
            "format; make_reason_mm.py): source = what its PMFs give"),
    Fixture("servegen_mm", "servegen", "mm-test", note="synthetic ServeGen multimodal clients (mm-image format; "
            "make_reason_mm.py): source = what its PMFs give"),
    Fixture("servegen_window", "servegen-window", "m-days", {"start": "1d14h", "duration": 3600},
            note="synthetic 3-day ServeGen language clients (make_days.py), the hour from day 1 14:00 "
                 "(`generate --start 1d14h --duration 1h`): source = that hour's windows and PMFs"),
    Fixture("mooncake_apps", "mooncake", "mooncake_arxiv_window.jsonl",
            note="Mooncake arXiv trace, 150 s window: conversations + shared application prompts"),
]}
DEFAULT = ("azure_code", "azure_conv", "mooncake_conv", "mooncake_conv_dq", "bucketed_burst")
SYNTH_DEFAULT = ("servegen_reason", "servegen_mm", "servegen_window")   # tests/traces/test_servegen_reason_mm.py
SERVEGEN = ROOT / "tests" / "traces" / "fixtures" / "synth" / "servegen"
SERVEGEN_REPEAT = 3       # the clients' rate tables, repeated: ~30k requests

# metric -> (kind, tolerance, is an issue-14 target)
TOL = {
    "rate": ("rel", 0.02, True),
    "interarrival_cv": ("rel", 0.10, False),
    "idc_1s": ("rel", 0.20, True), "idc_10s": ("rel", 0.20, True), "idc_60s": ("rel", 0.20, True),
    "idc_600s": ("rel", 0.20, False),
    **{f"{c}.{q}": ("rel", 0.10, True) for c in ("input", "output") for q in ("p50", "p90", "p99")},
    "spearman": ("abs", 0.10, True),
    "prefix_hit": ("abs", 0.05, True),
    "model_mix_max_diff": ("abs", 0.02, True),
    "requests_per_session": ("rel", 0.10, False),
    "reasoning_share": ("abs", 0.05, True),
    "image_count_max_diff": ("abs", 0.02, True),
}
WINDOWS = (1.0, 10.0, 60.0, 600.0)


def metrics(t: Trace) -> dict[str, Any]:
    """The realism statistics compared (None where undefined for this trace)."""
    idc = stats.index_of_dispersion(t, WINDOWS)
    lq = stats.length_quantiles(t)
    m: dict[str, Any] = {"rate": stats.mean_rate(t), "interarrival_cv": stats.interarrival_cv(t),
                         **{f"idc_{k}": v for k, v in idc.items()}}
    for col, short in (("input_tokens", "input"), ("output_tokens", "output")):
        for q in ("p50", "p90", "p99"):
            m[f"{short}.{q}"] = lq[col][q]
    m["spearman"] = stats.spearman_io(t)
    bs = t.metadata.get("block_size")
    p = stats.prefix_cache_hits(t, int(bs) if isinstance(bs, (int, float)) else None)
    m["prefix_hit"] = p["block_hit_ratio"] if p else None
    m["model_mix"] = stats.model_mix(t)
    s = stats.session_stats(t)
    m["requests_per_session"] = s["requests_per_session"]["mean"] if s["sessions"] else None
    m["reasoning_share"] = (stats.reasoning_stats(t) or {}).get("share")
    im = stats.image_stats(t)
    m["image_counts"] = {k: v / t.num_rows for k, v in im["count_histogram"].items()} if im else None
    return m


def servegen_truth(d: Path) -> dict[str, Any]:
    """The statistics of a ServeGen model directory's own PMFs, read here apart from the importer:
    as ServeGen generates, each 600 s window's requests (rate x 600) draw from the dataset
    window listed at or before it. Length quantiles (input: text_tokens where given), the
    reasoning share (E[reason_ratio] E[output] per window, summed) and the image-count shares."""
    acc: dict[str, dict[float, float]] = {}
    reason, served, end = [0.0, 0.0], 0.0, 0.0
    for path in d.glob("chunk-*-trace.csv"):
        data = json.loads(path.with_name(path.name.replace("trace.csv", "dataset.json")).read_text())
        for line in path.read_text().split():
            t, rate = (float(x) for x in line.split(",")[:2])
            served, end = served + rate * 600, max(end, t + 600)
            if rate:
                window = data[max((s for s in data if float(s) <= t), key=float)]
                f = {k: ast.literal_eval(v) for k, v in window.items()}
                for name, pmf in f.items():
                    for k, w in pmf.items():
                        acc.setdefault(name, {})[k] = acc.get(name, {}).get(k, 0.0) + rate * 600 * w
                if "reason_ratio" in f:
                    mean_out = sum(k * w for k, w in f["output_tokens"].items())
                    reason[0] += rate * mean_out * sum(k * w for k, w in f["reason_ratio"].items())
                    reason[1] += rate * mean_out

    def quantile(name: str, q: float) -> float:
        k = np.array(sorted(acc[name]))
        cdf = np.cumsum([acc[name][x] for x in k])
        return float(k[np.searchsorted(cdf, q * cdf[-1])])
    m: dict[str, Any] = {f"{short}.{q}": quantile(name, int(q[1:]) / 100) for q in ("p50", "p90", "p99")
                         for short, name in (("input", "text_tokens" if "text_tokens" in acc else "input_tokens"),
                                             ("output", "output_tokens"))}
    m["rate"] = served / end
    m["reasoning_share"] = reason[0] / reason[1] if reason[1] else None
    n = sum(acc.get("image_count", {}).values())
    m["image_counts"] = {str(int(k)): w / n for k, w in acc["image_count"].items() if w} if n else None
    m["model_mix"] = {}
    return m


def _mix_diff(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Largest |share difference| over models; a trace without a model column is one model,
    matching a single label on the other side (as `compare` does)."""
    if not a and not b:
        return None
    if not a and len(b) == 1:
        a = dict(b)
    if not b and len(a) == 1:
        b = dict(a)
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {**a, **b})


def judge(src: dict[str, Any], gen: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric: source value, generated value, diff, tolerance, verdict."""
    rows = []
    for name, (kind, tol, target) in TOL.items():
        if name == "model_mix_max_diff":
            a, b = None, None
            d = _mix_diff(src["model_mix"], gen["model_mix"])
            if d is None:
                continue
            a, b = (f"{len(m) or 1} model{'s' * (len(m) > 1)}" for m in (src["model_mix"], gen["model_mix"]))
        elif name == "image_count_max_diff":  # the largest |share difference| over image counts
            a, b = src.get("image_counts"), gen.get("image_counts")
            if a is None and b is None:
                continue
            d = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {**a, **b}) if a and b else None
            a, b = (x and f"mean {sum(int(k) * v for k, v in x.items()):.3g} images" for x in (a, b))
        else:
            a, b = src.get(name), gen.get(name)
            if a is None and b is None:
                continue
            d = None if a is None or b is None else (abs(b - a) / abs(a) if kind == "rel" and a else abs(b - a))
        verdict = "n/a" if d is None else "pass" if d <= tol + 1e-12 else "fail"
        rows.append({"metric": name, "source": a, "generated": b, "diff": d, "kind": kind,
                     "tolerance": tol, "target": target, "verdict": verdict})
    return rows


def run_fixture(fx: Fixture, seeds: tuple[int, ...] = (1,), workdir: Path | None = None) -> dict[str, Any]:
    """import -> fit -> generate(seed) for each seed -> compare. Returns the measured rows and
    wall times (s) per step."""
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        t0 = time.perf_counter()
        out = Path(tmp) / f"{fx.name}.parquet"
        if fx.fmt == "synthetic":  # a known spec, generated here from a fixed seed
            src = generate(fx.options["spec"], seed=fx.options["seed"])
        else:
            import_trace(fx.fmt, PUBLIC / fx.file, out, **fx.options)
            src = Trace.read(out)
        times["import"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        spec = fit_trace(src)
        times["fit"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sm = metrics(src)
        times["stats_source"] = time.perf_counter() - t0
        per_seed, compare_fails, times["generate"], times["compare"] = {}, {}, 0.0, 0.0
        for seed in seeds:
            t0 = time.perf_counter()
            g = generate(spec, seed=seed)
            times["generate"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            per_seed[seed] = {"rows": g.num_rows, "rows_judged": judge(sm, metrics(g))}
            compare_fails[seed] = [r["metric"] for r in compare_traces(src, g) if r["verdict"] == "fail"]
            times["compare"] += time.perf_counter() - t0
    times["total"] = sum(times.values())
    arrival = [{"client": c["name"], **c["arrival"], "profile": c.get("profile", {}).get("kind", "constant"),
                "sessions": "sessions" in c, "prefix": "prefix" in c} for c in spec["clients"]]
    return {"fixture": fx.name, "format": fx.fmt, "file": fx.file, "options": fx.options, "note": fx.note,
            "rows": src.num_rows, "duration_s": stats.duration_s(src), "seeds": list(seeds),
            "fitted": arrival, "per_seed": per_seed, "compare_fails": compare_fails, "wall_s": times}


def run_servegen(fx: Fixture, seeds: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """A ServeGen directory: import -> generate(seed) judged against what its PMFs give
    (`servegen_truth`); `compare_fails`: `compare` of that trace with a fit of it regenerated."""
    from llm_replay.traces.servegen import servegen_spec
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    spec = servegen_spec(SERVEGEN / fx.file)
    spec["duration"] *= SERVEGEN_REPEAT
    sm = servegen_truth(SERVEGEN / fx.file)
    times["import"], times["fit"], times["stats_source"] = time.perf_counter() - t0, 0.0, 0.0
    per_seed, compare_fails, times["generate"], times["compare"] = {}, {}, 0.0, 0.0
    for seed in seeds:
        t0 = time.perf_counter()
        g = generate(spec, seed=seed)
        times["generate"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        per_seed[seed] = {"rows": g.num_rows, "rows_judged": judge(sm, metrics(g))}
        compare_fails[seed] = [r["metric"] for r in compare_traces(g, generate(fit_trace(g), seed=seed + 100))
                               if r["verdict"] == "fail"]
        times["compare"] += time.perf_counter() - t0
    times["total"] = sum(times.values())
    arrival = [{"client": c["name"], **c["arrival"], "profile": "table", "sessions": False, "prefix": False}
               for c in spec["clients"]]
    return {"fixture": fx.name, "format": fx.fmt, "file": fx.file, "options": fx.options, "note": fx.note,
            "rows": per_seed[seeds[0]]["rows"], "duration_s": spec["duration"], "seeds": list(seeds),
            "fitted": arrival, "per_seed": per_seed, "compare_fails": compare_fails, "wall_s": times}


def servegen_window_truth(d: Path, start: float, duration: float) -> dict[str, Any]:
    """The hour (any aligned window) [start, start + duration) of a ServeGen directory, read here
    apart from the importer: each client's rate (its 600 s windows' requests / duration), the
    length quantiles of the PMFs in force in each 600 s window (the dataset window at or before
    it with both PMFs: ServeGen's loader skips an empty one) weighted by its requests, and the
    median window CV."""
    acc: dict[str, dict[float, float]] = {"input_tokens": {}, "output_tokens": {}}
    m: dict[str, Any] = {}
    cvs = []
    for path in sorted(d.glob("chunk-*-trace.csv"), key=lambda p: int(p.name.split("-")[1])):
        cid = path.name.split("-")[1]
        data = json.loads(path.with_name(f"chunk-{cid}-dataset.json").read_text())
        full = {float(ts): f for ts, f in ((ts, {k: ast.literal_eval(v) for k, v in f.items()})
                                           for ts, f in data.items()) if all(f.values())}
        n = 0.0
        for line in path.read_text().split():
            t, rate, cv = (float(x) for x in line.split(",")[:3])
            if start <= t < start + duration and rate:
                n, f = n + rate * 600, full[max(ts for ts in full if ts <= t)]
                cvs.append(cv)
                for name, pmf in acc.items():
                    for k, w in f[name].items():
                        pmf[k] = pmf.get(k, 0.0) + rate * 600 * w
        if n:
            m[f"rate.client-{cid}"] = n / duration
    m["rate"] = sum(m.values())
    for short, name in (("input", "input_tokens"), ("output", "output_tokens")):
        k = np.array(sorted(acc[name]))
        cdf = np.cumsum([acc[name][x] for x in k])
        for q in ("p50", "p90", "p99"):
            m[f"{short}.{q}"] = float(k[np.searchsorted(cdf, int(q[1:]) / 100 * cdf[-1])])
    m["window_cv_median"] = float(np.median(cvs))
    return m


def run_servegen_window(fx: Fixture, seeds: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """A window of a long ServeGen profile (issue 25 item 1): import -> `generate --start
    --duration` (traces.window.slice_spec) -> per-client and total rates and length p50/p90/p99
    within 10 % of `servegen_window_truth` on every seed; the median 600 s window CV for
    information."""
    from llm_replay.traces.servegen import servegen_spec
    from llm_replay.traces.cli import parse_span
    from llm_replay.traces.window import slice_spec
    start, dur = parse_span(fx.options["start"]), float(fx.options["duration"])
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    spec = slice_spec(servegen_spec(SERVEGEN / fx.file), start, dur)
    sm = servegen_window_truth(SERVEGEN / fx.file, start, dur)
    times["import"], times["fit"], times["stats_source"] = time.perf_counter() - t0, 0.0, 0.0
    per_seed, times["generate"], times["compare"] = {}, 0.0, 0.0
    for seed in seeds:
        t0 = time.perf_counter()
        g = generate(spec, seed=seed)
        times["generate"] += time.perf_counter() - t0
        t = g.table.select(["arrival_ns", "client_id", "input_tokens", "output_tokens"]).to_pandas()
        gm = {f"rate.{c}": n / dur for c, n in t.groupby("client_id").size().items()}
        gm["rate"] = len(t) / dur
        lq = stats.length_quantiles(g)
        gm.update({f"{s}.{q}": lq[f"{s}_tokens"][q] for s in ("input", "output") for q in ("p50", "p90", "p99")})
        win_cv = []
        for (_, _), a in t.groupby(["client_id", t.arrival_ns // int(600e9)]).arrival_ns:
            gaps = np.diff(a.to_numpy()) / 1e9
            if len(gaps) > 10:
                win_cv.append(gaps.std() / gaps.mean())
        gm["window_cv_median"] = float(np.median(win_cv))
        rows = []
        for name in sorted(set(sm) | set(gm), key=lambda k: (not k.startswith("rate"), k)):
            a, b = sm.get(name), gm.get(name)
            d = abs(b - a) / a if a and b is not None else None
            target = name != "window_cv_median"
            rows.append({"metric": name, "source": a, "generated": b, "diff": d, "kind": "rel", "tolerance": 0.10,
                         "target": target, "verdict": "n/a" if d is None and target is False else
                         "pass" if d is not None and d <= 0.10 + 1e-12 else "fail"})
        per_seed[seed] = {"rows": len(t), "rows_judged": rows}
    times["total"] = sum(times.values())
    fitted = [{"client": c["name"], **c["arrival"], "profile": "table", "sessions": False, "prefix": False}
              for c in spec["clients"]]
    return {"fixture": fx.name, "format": fx.fmt, "file": fx.file, "options": fx.options, "note": fx.note,
            "rows": per_seed[seeds[0]]["rows"], "duration_s": dur, "seeds": list(seeds), "fitted": fitted,
            "per_seed": per_seed, "compare_fails": {s: [] for s in seeds}, "wall_s": times}


def _f(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def _tol(r: dict[str, Any]) -> str:
    return f"{r['tolerance'] * 100:g}%" if r["kind"] == "rel" else f"±{r['tolerance']:g}"


def format_result(res: dict[str, Any]) -> str:
    seeds = res["seeds"]
    first = res["per_seed"][seeds[0]]["rows_judged"]
    head = ["metric", "source", f"gen (seed {seeds[0]})", "diff", "tol", "pass"]
    if len(seeds) > 1:
        head += ["worst diff", f"seeds ok/{len(seeds)}"]
    body = []
    for i, r in enumerate(first):
        name = r["metric"] + ("" if r["target"] else " (info)")
        line = [name, _f(r["source"]), _f(r["generated"]), _f(r["diff"]), _tol(r), r["verdict"]]
        if len(seeds) > 1:
            rs = [res["per_seed"][s]["rows_judged"][i] for s in seeds]
            ds = [x["diff"] for x in rs if x["diff"] is not None]
            line += [_f(max(ds)) if ds else "-", str(sum(x["verdict"] == "pass" for x in rs))]
        body.append(line)
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head, *body]]
    tg = [r for r in first if r["target"] and r["verdict"] != "n/a"]
    ok = sum(r["verdict"] == "pass" for r in tg)
    w = res["wall_s"]
    fitted = "; ".join(f"client {a['client']!r}: {a['process']}"
                       + "".join(f" {k} {v:.3g}" for k, v in a.items() if k not in ("client", "process")
                                 and isinstance(v, (int, float)) and not isinstance(v, bool))
                       + f", profile {a['profile']}" + (", sessions" if a["sessions"] else "")
                       + (", prefix" if a["prefix"] else "") for a in res["fitted"])
    return "\n".join([
        f"== {res['fixture']}: {res['note']}",
        f"   {res['rows']:,} rows over {res['duration_s']:,.0f} s; generated {res['per_seed'][seeds[0]]['rows']:,} "
        f"rows (seed {seeds[0]}); spec: {fitted}",
        *lines,
        f"   targets within tolerance: {ok} of {len(tg)} (seed {seeds[0]}); `compare` fails: "
        + (", ".join(res["compare_fails"][seeds[0]]) or "none"),
        f"   wall: import {w['import']:.2f} s, fit {w['fit']:.2f} s, generate {w['generate']:.2f} s, "
        f"stats+compare {w['stats_source'] + w['compare']:.2f} s, total {w['total']:.2f} s"])


def markdown(results: list[dict[str, Any]]) -> str:
    """One README table: a row per metric, a column per fixture: source -> generated (first
    seed), then ✓ when every seed is within tolerance, ✗ when none is, k/N when k of N are."""
    names = [r["fixture"] for r in results]
    out = ["| metric | tolerance | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names),
           "| rows, duration | | " + " | ".join(f"{r['rows']:,}, {r['duration_s'] / 60:.0f} min" for r in results) + " |"]
    by = [[{x["metric"]: x for x in r["per_seed"][s]["rows_judged"]} for s in r["seeds"]] for r in results]
    for name, (kind, tol, target) in TOL.items():
        if not any(name in b[0] for b in by):
            continue
        cells = []
        for b in by:
            xs = [d[name] for d in b if name in d]
            if not xs:
                cells.append("-")
                continue
            ok = sum(x["verdict"] == "pass" for x in xs)
            judged = sum(x["verdict"] != "n/a" for x in xs)
            mark = "" if not judged else "✓" if ok == judged else "✗" if ok == 0 else f"{ok}/{judged}"
            if name == "model_mix_max_diff":
                cells.append(f"{_f(max(x['diff'] for x in xs))} {mark}")
            else:
                cells.append(f"{_f(xs[0]['source'])} → {_f(xs[0]['generated'])} {mark}")
        t = f"{tol * 100:g} %" if kind == "rel" else f"± {tol:g}"
        out.append(f"| {name}{'' if target else ' (info)'} | {t} | " + " | ".join(cells) + " |")
    out.append(f"| wall (import, fit, {len(results[0]['seeds'])} x generate + compare) | | "
               + " | ".join(f"{r['wall_s']['total']:.1f} s" for r in results) + " |")
    return "\n".join(out)


def misses(results: list[dict[str, Any]]) -> str:
    """The targets some seed misses, per fixture, with the measured values as the reason."""
    out = ["MISSES = {"]
    for r in results:
        out.append(f"    {r['fixture']!r}: {{")
        first = r["per_seed"][r["seeds"][0]]["rows_judged"]
        for i, x in enumerate(first):
            xs = [r["per_seed"][s]["rows_judged"][i] for s in r["seeds"]]
            if not x["target"] or all(y["verdict"] == "pass" for y in xs):
                continue
            ds = [y["diff"] for y in xs if y["diff"] is not None]
            why = (f"{_f(x['source'])} -> {_f(x['generated'])} (seed {r['seeds'][0]}); worst diff "
                   f"{_f(max(ds)) if ds else '-'} vs {_tol(x)}")
            out.append(f"        {x['metric']!r}: {why!r},")
        out.append("    },")
    out.append("}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", default=",".join(DEFAULT + SYNTH_DEFAULT),
                    help=f"comma-separated, of {', '.join(FIXTURES)}")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated generation seeds (default 1,2,3; "
                    "the table shows the first, the worst diff and how many seeds pass)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--markdown", action="store_true", help="also print the README table")
    ap.add_argument("--misses", action="store_true",
                    help="also print the targets missed on some seed, as tests/traces/test_public_realism.py's MISSES")
    args = ap.parse_args(argv)
    names = [n for n in args.fixtures.split(",") if n]
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {', '.join(unknown)}; known: {', '.join(FIXTURES)}")
    seeds = tuple(int(s) for s in args.seeds.split(","))
    results, t0 = [], time.perf_counter()
    for n in names:
        res = {"servegen": run_servegen, "servegen-window": run_servegen_window}.get(
            FIXTURES[n].fmt, run_fixture)(FIXTURES[n], seeds)
        print(format_result(res), flush=True)
        print()
        results.append(res)
    print(f"total wall {time.perf_counter() - t0:.1f} s for {len(names)} fixture(s), seeds {args.seeds}")
    if args.markdown:
        print()
        print(markdown(results))
    if args.misses:
        print()
        print(misses(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
