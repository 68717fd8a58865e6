"""`replay trace generate --start T --duration D`: the window [T, T + D) of a spec, in the
spec's own time and at its own rates.

A table profile gives each window an absolute rate: the client's `rate` is the mean over the
spec's duration, so window j runs at rate * values[j] / mean(values over the duration) (the
table repeating past its end). The window keeps those rates: each client's new `rate` is its
mean over [T, T + D) (a client idle there is left out), its table (and per-window CVs and
model weights) the entries from T on, its length_windows those in force from T on. A constant
profile is the same in every window; ramps and sinusoids are defined over the duration only,
so they cannot be cut at T > 0. The result is an ordinary spec: `generate` embeds it, small
however long the profile it came from.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import TraceError
from .spec import parse_spec

def _cut(values: list[Any], j0: int, n: int, repeat: bool) -> list[Any]:
    """Entries j0 .. j0 + n - 1 of a per-window list, repeating it (a table) or holding its
    last entry (model weights, as generate reads them)."""
    idx = np.arange(j0, j0 + n)
    idx = idx % len(values) if repeat else np.minimum(idx, len(values) - 1)
    return [values[i] for i in idx]


def _windows(start: float, D: float, w: float, where: str) -> tuple[int, int]:
    """The first window of [start, start + D) and how many windows of `w` seconds it spans."""
    j = round(start / w)
    if abs(j * w - start) > 1e-6 * max(w, 1.0):
        raise TraceError(f"--start {start:g} s is not on a window edge of {where} ({w:g} s windows); "
                         f"use a multiple of {w:g} s, e.g. {math.floor(start / w) * w:g}")
    return j, math.ceil(D / w - 1e-9)


def slice_spec(spec: dict[str, Any], start: float = 0.0, duration: float | None = None) -> dict[str, Any]:
    """The spec of the window [start, start + duration) of `spec` (module docstring); duration
    None: to the spec's end."""
    parsed = parse_spec(spec)
    T0 = parsed.duration
    D = T0 - start if duration is None else duration
    if not D > 0:
        raise TraceError(f"--start {start:g} s is at or past the end of the spec ({T0:g} s); nothing to generate")
    if start == 0 and D == T0:
        return spec
    kept = []
    for i, (d, c) in enumerate(zip(spec["clients"], parsed.clients)):
        d = dict(d)
        p, where = c.profile, f"clients[{i}]"
        if p.kind == "table":
            w, v = p.window, np.asarray(p.values)
            j0, n = _windows(start, D, w, f"{where}.profile")
            own = np.append(np.arange(0.0, T0, w), T0)     # the rates' normalisation: over the spec's duration
            per_s = c.rate * T0 / float((v[np.arange(len(own) - 1) % len(v)] * np.diff(own)).sum())
            cut = v[np.arange(j0, j0 + n) % len(v)]
            span = np.minimum(w, D - np.arange(n) * w)
            rate = per_s * float((cut * span).sum()) / D
            if rate <= 0:
                continue  # idle in the window
            d["rate"] = rate
            d["profile"] = {"kind": "table", "window": w, "values": cut.tolist(),
                            **({"cv": _cut(p.cv, j0, n, True)} if p.cv else {})}
        elif p.kind in ("ramp", "sinusoid") and start > 0:
            raise TraceError(f"{where}.profile: a {p.kind} is drawn relative to the spec's duration, it has no "
                             "own time to cut at --start; --start cuts table and constant profiles")
        models = d.get("models")
        if isinstance(models, list) and len(c.models[0].weight) > 1:  # per-mix-window model weights
            j0, n = _windows(start, D, c.mix_window, f"{where}.mix_window")
            d["models"] = [{**m, "weight": _cut(pm.weight, j0, n, False)} for m, pm in zip(models, c.models)]
        if c.length_windows:
            froms = [f for f, _, _ in c.length_windows]
            lo = int(np.searchsorted(froms, start, side="right")) - 1
            d["length_windows"] = [{**x, "from_s": max(f - start, 0.0)}
                                   for x, f in zip(d["length_windows"], froms) if f < start + D][lo:]
        kept.append(d)
    if not kept:
        raise TraceError(f"every client is idle in [{start:g} s, {start + D:g} s); nothing to generate")
    out = {**spec, "duration": D, "clients": kept}   # (copies of what changes only: PMFs can be millions of points)
    parse_spec(out)
    return out
