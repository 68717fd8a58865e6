"""ServeGen client data -> a generator spec (`replay trace import servegen DIR -o SPEC.yaml`).

A ServeGen model directory holds, per client i:
- `chunk-i-trace.csv`, no header: `t_start,rate,cv,pattern,shape,scale` per 600 s window
  (pattern Gamma/Weibull describes the gaps; an empty pattern is an idle window);
- `chunk-i-dataset.json`: {window start: {field: "<Python dict literal value -> probability>"}},
  each window's length PMFs valid until the next listed window.

Each client becomes a spec client: its windows a `table` profile of their rates (req/s) and
CVs (`profile.cv`: generate draws every window's count and gaps as ServeGen does), its arrival
family the rate-weighted majority pattern, its length PMFs `length_windows`, one exact
empirical table per dataset window (`replay trace generate --start T --duration D` cuts a
window of the profile with its own rates, client mix and lengths: traces.window).
Reasoning clients (data/reason): `reason_ratio`, the share of each output that is reasoning,
becomes the client's `reasoning_share` (mixed alike). Multimodal clients (data/multimodal):
`text_tokens` is the prompt, `image_count` the images per request, `image_tokens` (per image)
becomes image sizes that a Qwen2-VL server counts as about as many tokens (`_image_px`).
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TraceError
from .fit_dists import empirical
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
            raise TraceError(f"line {n}: expected 6 fields t_start,rate,cv,pattern,shape,scale, got {len(f)}", file=str(path))
        try:
            t, rate, cv = float(f[0]), float(f[1]), float(f[2])
        except ValueError:
            raise TraceError(f"line {n}: t_start, rate and cv must be numbers: {line.strip()[:80]!r}", file=str(path)) from None
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
                pmf = _literal(text) if isinstance(text, str) else text
            except (ValueError, SyntaxError):
                raise TraceError(f"window {ts}, field {name}: not a Python dict literal", file=str(path)) from None
            if isinstance(pmf, dict) and pmf:
                win[name] = {float(k): float(v) for k, v in pmf.items()}
        if win:
            out[float(ts)] = win
    return out


_NUM_KEY = re.compile(r"([{,]\s*)(-?[0-9][0-9.eE+-]*)\s*:")


def _literal(text: str) -> Any:
    """A `{224: 0.0003, ...}` literal: as JSON once its number keys are quoted (C speed: the
    ServeGen files hold millions of points), else through ast.literal_eval."""
    try:
        return {float(k): v for k, v in json.loads(_NUM_KEY.sub(r'\1"\2":', text)).items()}
    except (ValueError, AttributeError):
        return ast.literal_eval(text)


def _exact(pmf: dict[float, float]) -> dict[str, Any]:
    """A PMF as an empirical distribution with every support point; weights to 5 significant
    digits, a total-variation distance to the source below 5e-6."""
    vals = sorted(pmf)
    w = np.array([pmf[v] for v in vals])
    return {"dist": "empirical", "values": [int(v) if v == int(v) else v for v in vals],
            "weights": [float(f"{x:.5g}") for x in w / w.sum()]}


def _length_windows(pmfs: dict[float, dict[str, dict[float, float]]], field: str, t0: float) -> list[dict[str, Any]]:
    """One {from_s, input, output} per dataset window with both PMFs (rebased to the trace's
    first window t0). As ServeGen reads them, a window without both keeps the one before it,
    and the first serves from 0."""
    out: list[dict[str, Any]] = []
    for ts in sorted(pmfs):
        win = pmfs[ts]
        if field in win and "output_tokens" in win:
            if out and ts - t0 <= 0:
                out.pop()  # a later window from before t0 replaces it
            out.append({"from_s": float(max(ts - t0, 0.0)) if out else 0.0,
                        "input": _exact(win[field]), "output": _exact(win["output_tokens"])})
    return out


def _mixed_pmf(pmfs: dict[float, dict[str, dict[float, float]]], field: str, t: np.ndarray,
               served: np.ndarray, lo: float = 1.0) -> dict[str, Any] | None:
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
    vals = np.maximum(vals, lo)
    return empirical(vals, (wts / wts.sum()).round(8), lo, float(vals.max()))


def _image_px(tokens: dict[str, Any], points: int = 16) -> dict[str, float]:
    """Image sizes for a PMF of tokens per image: `points` weighted quantiles, each as a WxH of
    28-pixel cells (Qwen2-VL: one token per 28x28 cell) about as many as its tokens."""
    vals, wts = np.array(tokens["values"]), np.array(tokens["weights"])
    vals, wts = vals[vals > 0], wts[vals > 0]
    cdf = np.cumsum(wts) / wts.sum()
    px: dict[str, float] = {}
    for v in vals[np.minimum(np.searchsorted(cdf, (np.arange(points) + 0.5) / points), len(vals) - 1)]:
        a = int(np.ceil(np.sqrt(v)))
        size = f"{28 * a}x{28 * max(1, int(round(v / a)))}"
        px[size] = px.get(size, 0.0) + 1 / points
    return px


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
            raise TraceError(f"client {cid}: {dpath.name} is missing (its input_tokens/output_tokens PMFs give the lengths): "
                             "copy it from the same ServeGen model directory", file=str(src))
        pmfs = _read_pmfs(dpath)
        served = rate * window
        have = sorted({f for w in pmfs.values() for f in w})
        # multimodal clients give the prompt's text as text_tokens, its images apart
        in_field = "text_tokens" if "image_count" in have else "input_tokens"
        lengths = _length_windows(pmfs, in_field, w[0, 0])
        if not lengths:
            lack = [f for f in (in_field, "output_tokens") if f not in have] or [f"{in_field} and output_tokens in one"]
            raise TraceError(f"client {cid}: no {' or '.join(lack)} PMF in any window (fields with a PMF: "
                             f"{', '.join(have) or 'none'}); the lengths need both", file=str(dpath))
        extra = {}
        if "reason_ratio" in have:  # reasoning clients: the share of each output that is reasoning
            extra["reasoning_share"] = {**_mixed_pmf(pmfs, "reason_ratio", t, served, lo=0.0), "max": 1.0}
        if "image_count" in have:
            other = [f for f in ("audio_count", "video_count") if (_mixed_pmf(pmfs, f, t, served, 0.0) or {"max": 0})["max"] > 0]
            if other:
                raise TraceError(f"client {cid}: {other[0]} > 0 in some requests: a spec sends images only", file=str(dpath))
            count, tokens = (_mixed_pmf(pmfs, f, t, served, lo=0.0) for f in ("image_count", "image_tokens"))
            if count["max"] > 0 and tokens and tokens["max"] > 0:
                extra["images"] = {"count": {int(v): w for v, w in zip(count["values"], count["weights"]) if w > 0},
                                   "px": _image_px(tokens)}
        family = "weibull" if served[pat == 2].sum() > served[pat == 1].sum() else "gamma"
        win_cv = np.where(pat > 0, np.clip(cv, 0.05, MAX_CV), 1.0).round(4)
        # arrival.cv: the rate-weighted median window CV (profile.cv sets each window's)
        order = np.argsort(win_cv)
        mid = win_cv[order][np.searchsorted(np.cumsum(served[order]), served.sum() / 2)]
        clients.append({ "name": f"client-{cid}", "rate": float(served.sum() / (len(t) * window)),
            "arrival": {"process": family, "cv": float(mid)},
            "profile": {"kind": "table", "window": window, "values": [float(f"{x:.7g}") for x in rate],
                        "cv": win_cv.tolist()}, "models": model, "length_windows": lengths, **extra})
    if not clients:
        raise TraceError("every client is idle (all rates 0)", file=str(src))
    spec = {"name": f"servegen-{model}", "duration": duration, "seed": 0, "block_size": 16, "clients": clients}
    parse_spec(spec, file=str(src))  # what we write must generate
    return spec


def import_servegen(src: Path, out: Path) -> None:
    """Write the spec of ServeGen directory `src` to `out` (YAML, or JSON by suffix)."""
    from .fit import write_spec
    spec, out = servegen_spec(Path(src)), Path(out)
    points = sum(len(w[k]["values"]) for c in spec["clients"] for w in c["length_windows"] for k in ("input", "output"))
    if points > 200_000 and out.suffix.lower() != ".json":
        print(f"note: {points:,} exact PMF points: YAML loads in minutes, JSON in seconds (-o {out.with_suffix('.json')})", file=sys.stderr)
    write_spec(spec, out)
