"""ServeGen client data -> a generator spec (`replay trace import servegen DIR -o SPEC.yaml`).

A ServeGen model directory holds, per client i:
- `chunk-i-trace.csv`, no header: `t_start,rate,cv,pattern,shape,scale` per 600 s window
  (pattern Gamma/Weibull describes the gaps; an empty pattern is an idle window);
- `chunk-i-dataset.json`: {window start: {field: "<Python dict literal value -> probability>"}},
  each window's length PMFs valid until the next listed window.

Each client becomes a spec client: its windowed rates a `table` profile, its arrival family the
rate-weighted majority pattern with the rate-weighted mean CV (the spec has one CV per
client), its length PMFs one empirical table mixed over time by the requests they served.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TraceError
from .spec import parse_spec
from .spec_types import MAX_CV

MAX_POINTS = 1000   # larger PMFs are compressed to this many weighted quantile points


def _read_windows(path: Path) -> np.ndarray:
    """Rows (t_start, rate, cv, pattern code 0 idle / 1 gamma / 2 weibull)."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        f = line.strip().split(",")
        if len(f) != 6:
            raise TraceError(f"line {n}: expected 6 fields t_start,rate,cv,pattern,shape,scale, got {len(f)}",
                             file=str(path))
        try:
            t, rate, cv = float(f[0]), float(f[1]), float(f[2])
        except ValueError:
            raise TraceError(f"line {n}: t_start, rate and cv must be numbers: {line.strip()[:80]!r}",
                             file=str(path)) from None
        pat = {"": 0, "gamma": 1, "weibull": 2}.get(f[3].strip().lower())
        if pat is None:
            raise TraceError(f"line {n}: unknown pattern {f[3]!r} (expected Gamma, Weibull or empty)", file=str(path))
        if rate < 0 or cv < 0:
            raise TraceError(f"line {n}: rate and cv must be >= 0", file=str(path))
        rows.append((t, rate, cv, pat))
    if not rows:
        raise TraceError("no windows", file=str(path))
    return np.array(rows)


def _read_pmfs(path: Path) -> dict[float, dict[str, dict[float, float]]]:
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise TraceError(f"not valid JSON: {e}", file=str(path)) from None
    out: dict[float, dict[str, dict[float, float]]] = {}
    for ts, fields in raw.items():
        win = {}
        for name, text in fields.items():
            try:  # Python-literal dicts: parsed as literals, never evaluated as code
                pmf = ast.literal_eval(text) if isinstance(text, str) else text
            except (ValueError, SyntaxError):
                raise TraceError(f"window {ts}, field {name}: not a Python dict literal", file=str(path)) from None
            if isinstance(pmf, dict) and pmf:
                win[name] = {float(k): float(v) for k, v in pmf.items()}
        if win:
            out[float(ts)] = win
    return out


def _mixed_pmf(pmfs: dict[float, dict[str, dict[float, float]]], field: str, t: np.ndarray,
               served: np.ndarray) -> dict[str, Any] | None:
    """One empirical distribution: each window's PMF weighted by the requests it served."""
    starts = np.array(sorted(k for k, v in pmfs.items() if field in v))
    if not len(starts):
        return None
    owner = np.searchsorted(starts, t, side="right") - 1
    acc: dict[float, float] = {}
    for i, s in enumerate(starts):
        w = served[owner == i].sum() or (1e-9 if i == 0 else 0.0)
        for k, p in pmfs[s][field].items():
            acc[k] = acc.get(k, 0.0) + w * p
    vals = np.array(sorted(acc))
    wts = np.array([acc[v] for v in vals])
    if len(vals) > MAX_POINTS:
        cdf = np.cumsum(wts) / wts.sum()
        vals = vals[np.minimum(np.searchsorted(cdf, (np.arange(MAX_POINTS) + 0.5) / MAX_POINTS), len(vals) - 1)]
        wts = np.ones(len(vals))
    vals = np.maximum(vals, 1.0)
    return {"dist": "empirical", "values": vals.tolist(), "weights": (wts / wts.sum()).round(8).tolist(),
            "min": 1.0, "max": float(vals.max())}


def servegen_spec(src: Path) -> dict[str, Any]:
    """The spec dict for a ServeGen model directory (one client per chunk)."""
    if not src.is_dir():
        raise TraceError("expected a ServeGen model directory with chunk-<i>-trace.csv files", file=str(src))
    traces = sorted(src.glob("chunk-*-trace.csv"), key=lambda p: int(p.name.split("-")[1]))
    if not traces:
        raise TraceError("no chunk-<i>-trace.csv files found", file=str(src))
    model, clients, duration = src.name, [], 0.0
    for tpath in traces:
        cid = tpath.name.split("-")[1]
        w = _read_windows(tpath)
        t, rate, cv, pat = w[:, 0] - w[0, 0], w[:, 1], w[:, 2], w[:, 3]
        window = float(np.median(np.diff(t))) if len(t) > 1 else 600.0
        duration = max(duration, float(t[-1] + window))
        if rate.sum() <= 0:
            continue
        dpath = tpath.with_name(f"chunk-{cid}-dataset.json")
        if not dpath.exists():
            raise TraceError(f"client {cid}: {dpath.name} is missing: {tpath.name} gives the rates, the lengths "
                             "need that file's per-window input_tokens/output_tokens PMFs (copy it from the same "
                             "ServeGen model directory)", file=str(src))
        pmfs = _read_pmfs(dpath)
        served = rate * window
        inp, out = _mixed_pmf(pmfs, "input_tokens", t, served), _mixed_pmf(pmfs, "output_tokens", t, served)
        if inp is None or out is None:
            have = sorted({f for w in pmfs.values() for f in w})
            lack = [f for f, d in (("input_tokens", inp), ("output_tokens", out)) if d is None]
            raise TraceError(f"client {cid}: no {' or '.join(lack)} PMF in any window (fields with a PMF: "
                             f"{', '.join(have) or 'none'}); the lengths need both", file=str(dpath))
        busy = pat > 0
        family = "weibull" if served[pat == 2].sum() > served[pat == 1].sum() else "gamma"
        mean_cv = float(np.average(cv[busy], weights=served[busy])) if busy.any() else 1.0
        clients.append({
            "name": f"client-{cid}", "rate": float(served.sum() / (len(t) * window)),
            "arrival": {"process": family, "cv": round(min(max(mean_cv, 0.05), MAX_CV), 4)},
            "profile": {"kind": "table", "window": window,
                        "values": (rate / rate.mean()).round(6).tolist()},
            "models": model, "input": inp, "output": out})
    if not clients:
        raise TraceError("every client is idle (all rates 0)", file=str(src))
    spec = {"name": f"servegen-{model}", "duration": duration, "seed": 0, "block_size": 16, "clients": clients}
    parse_spec(spec, file=str(src))  # what we write must generate
    return spec


def import_servegen(src: Path, out: Path) -> None:
    """Write the spec of ServeGen directory `src` to `out` (YAML, or JSON by suffix)."""
    from .fit import write_spec
    write_spec(servegen_spec(Path(src)), Path(out))
