"""The field readers of a generator spec and its distribution-shaped parts: lengths, the
arrival process, the rate profile and its modulation, images, reasoning shares and length
windows, each parsed into `spec_types` with a `SpecError` naming the field path.

`traces.spec` parses the rest (clients, models, sessions, agents, prefixes, the top level)
with these.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import TraceError
from .schema import DEFAULT_IMAGE_PX, MAX_IMAGES, MAX_TOKENS, image_px_problem
from .spec_types import (LENGTH_FAMILIES, MAX_CV, MIN_SHAPE, MODULATIONS, PROCESSES, PROFILES, Arrival, Dist, Images,
                         Modulation, Profile, weibull_cv)


class SpecError(TraceError):
    """An invalid generator spec; `path` is the offending field (`clients[1].arrival.cv`)."""

    def __init__(self, path: str, rule: str, file: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {rule}" if path else rule, file=file)


# ---------------------------------------------------------------- field readers
REQUIRED = object()


class _Reader:
    """Reads one mapping at `path`; every problem raises SpecError naming the field."""

    def __init__(self, d: Any, path: str, file: str | None) -> None:
        if not isinstance(d, dict):
            raise SpecError(path or "spec", f"must be a mapping, got {type(d).__name__}", file)
        self.d, self.path, self.file = d, path, file

    def at(self, key: str | int) -> str:
        return f"{self.path}[{key}]" if isinstance(key, int) else f"{self.path}.{key}" if self.path else key

    def err(self, key: str, rule: str) -> SpecError:
        return SpecError(self.at(key), rule, self.file)

    def num(self, key: str, default: Any = REQUIRED, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, integer: bool = False) -> Any:
        v = self.d.get(key, default)
        if v is REQUIRED:
            raise self.err(key, "is required")
        if v is None and key not in self.d:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(key, f"must be a finite number, got {v!r}")
        if integer and v != int(v):
            raise self.err(key, f"must be a whole number, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise self.err(key, f"must be {'>' if lo_open else '>='} {lo:g}, got {v!r}")
        if hi is not None and v > hi:
            raise self.err(key, f"must be <= {hi:g}, got {v!r}")
        return int(v) if integer else float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.d.get(key, default)
        if not isinstance(v, bool):
            raise self.err(key, f"must be true or false, got {v!r}")
        return v

    def choice(self, key: str, options: tuple[str, ...], default: str | None = None) -> str:
        v = self.d.get(key, default)
        if v not in options:
            raise self.err(key, f"unknown {key} {v!r}; expected one of {', '.join(options)}")
        return v

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.d[key], self.at(key), self.file)

    def opt(self, key: str, parse: Any, *args: Any) -> Any:
        """`parse(self.sub(key), *args)`, or None without `key`."""
        return parse(self.sub(key), *args) if key in self.d else None

    def nums(self, key: str, **bounds: Any) -> list[Any]:
        """A number or a list of them, as a list, each checked as `num` (errors name `key[i]`)."""
        v = self.d[key]
        r = _Reader(dict(enumerate(v if isinstance(v, list) else [v])), self.at(key), self.file)
        return [r.num(i, **bounds) for i in r.d]

    def need(self, *keys: str, rule: str = "is required") -> None:
        for key in keys:
            if key not in self.d:
                raise self.err(key, rule)

    def check_keys(self, allowed: set[str]) -> None:
        extra = sorted(set(self.d) - allowed)
        if extra:
            raise self.err(extra[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


_POS, _NONNEG = {"lo": 0, "lo_open": True}, {"lo": 0}
DIST_PARAMS = {"lognormal": {"median": _POS, "sigma": _NONNEG}, "gamma": {"shape": _POS, "scale": _POS},
               "weibull": {"shape": _POS, "scale": _POS}, "zipf": {"a": _POS},
               "uniform": {"low": _NONNEG, "high": _NONNEG}, "constant": {"value": _NONNEG}}


def parse_dist(r: _Reader, lo: float = 1.0, hi: float = 1_000_000.0) -> Dist:
    fam = r.choice("dist", LENGTH_FAMILIES)
    lo, hi = r.num("min", lo, lo=0), r.num("max", hi, lo=0)
    if lo > hi:
        raise r.err("max", f"caps inverted: min {lo:g} > max {hi:g}")
    if fam == "empirical":
        r.check_keys({"dist", "min", "max", "values", "weights", "pmf", "file", "column"})
        return Dist(fam, _empirical(r), lo, hi)
    r.check_keys({"dist", "min", "max", *DIST_PARAMS[fam]})
    p = {key: r.num(key, **bounds) for key, bounds in DIST_PARAMS[fam].items()}
    if fam == "zipf":
        r.need("max", rule="zipf needs a max (support is min..max)")
        if hi - lo > MAX_TOKENS:  # its support is a table in memory
            raise r.err("max", f"a zipf support min..max holds at most {MAX_TOKENS:,} values, got {hi - lo + 1:,.0f}")
    if fam == "uniform" and p["low"] > p["high"]:
        raise r.err("high", f"low {p['low']:g} > high {p['high']:g}")
    return Dist(fam, p, lo, hi)


def _empirical(r: _Reader) -> dict[str, Any]:
    if "file" in r.d:
        return {"file": str(r.d["file"]), "column": str(r.d.get("column", "input_tokens"))}
    if "pmf" in r.d:
        pmf = r.d["pmf"]
        if not isinstance(pmf, dict) or not pmf:
            raise r.err("pmf", "must be a non-empty mapping value -> probability")
        try:
            values, weights = [float(k) for k in pmf], [float(v) for v in pmf.values()]
        except (TypeError, ValueError):
            raise r.err("pmf", "keys and values must be numbers") from None
    else:
        values, weights = r.d.get("values"), r.d.get("weights")
        if not isinstance(values, list) or not values:
            raise r.err("values", "empirical needs values (with optional weights), a pmf or a file")
        weights = weights if weights is not None else [1.0] * len(values)
        if not isinstance(weights, list) or len(weights) != len(values):
            raise r.err("weights", f"must be a list as long as values ({len(values)})")
    if any(not isinstance(x, (int, float)) or x < 0 for x in [*values, *weights]) or sum(weights) <= 0:
        raise r.err("weights", "values and weights must be numbers >= 0 with a positive sum")
    return {"values": [float(v) for v in values], "weights": [float(w) for w in weights]}


def parse_arrival(r: _Reader) -> Arrival:
    proc = r.choice("process", PROCESSES, "poisson")
    a = Arrival(proc)
    if proc == "poisson":
        r.check_keys({"process", "cv"})
        if r.num("cv", 1.0) != 1.0:
            raise r.err("cv", "poisson arrivals have CV 1; use process gamma or weibull for another CV")
    elif proc in ("gamma", "weibull"):
        r.check_keys({"process", "cv", "shape"})
        if "shape" in r.d:
            shape = r.num("shape", lo=MIN_SHAPE if proc == "weibull" else 1 / MAX_CV**2)
            a.cv = 1 / math.sqrt(shape) if proc == "gamma" else weibull_cv(shape)
        else:
            a.cv = r.num("cv", lo=0.01)
            if a.cv > MAX_CV:
                raise r.err("cv", f"CV {a.cv:g} is impossible for {proc} here (must be <= {MAX_CV:g})")
    elif proc == "onoff":
        r.check_keys({"process", "burst_rate", "idle_rate", "on_s", "off_s"})
        a.burst_rate, a.idle_rate = r.num("burst_rate", lo=0, lo_open=True), r.num("idle_rate", 0.0, lo=0)
        a.on_s, a.off_s = r.num("on_s", lo=0, lo_open=True), r.num("off_s", lo=0, lo_open=True)
        if a.idle_rate > a.burst_rate:
            raise r.err("idle_rate", f"idle_rate {a.idle_rate:g} exceeds burst_rate {a.burst_rate:g}")
    else:
        r.check_keys({"process", "cv", "size"})
        a.cv = r.num("cv", 1.0, lo=0, lo_open=True, hi=MAX_CV)
        r.need("size", rule="batch needs a size distribution, e.g. {dist: uniform, low: 1, high: 8}")
        a.batch_size = parse_dist(r.sub("size"), 1, 100_000)
    return a


def parse_profile(r: _Reader) -> Profile:
    kind = r.choice("kind", PROFILES, "constant")
    p = Profile(kind)
    if kind == "ramp":
        r.check_keys({"kind", "start", "end"})
        p.start, p.end = r.num("start", lo=0), r.num("end", lo=0)
        if p.start + p.end <= 0:
            raise r.err("end", "a ramp from 0 to 0 has no arrivals")
    elif kind in ("table", "diurnal"):
        key = "values" if kind == "table" else "hourly"
        r.check_keys({"kind", key, "window", "cv"} if kind == "table" else {"kind", key, "period"})
        vals = r.d.get(key)
        if not isinstance(vals, list) or not vals or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in vals) or sum(vals) <= 0:
            raise r.err(key, "must be a non-empty list of numbers >= 0 with a positive sum")
        if kind == "diurnal" and len(vals) not in (24, 168):
            raise r.err(key, f"needs 24 (a day) or 168 (a week) hourly multipliers, got {len(vals)}")
        p.values = [float(v) for v in vals]
        p.window = (r.num("window", lo=0, lo_open=True) if kind == "table"
                    else r.num("period", 3600.0 * len(vals), lo=0, lo_open=True) / len(vals))
        p.kind = "table"  # a diurnal profile is a table of hourly windows
        if "cv" in r.d:  # a renewal CV per window (arrivals.window_points)
            if not isinstance(r.d["cv"], list) or len(r.d["cv"]) != len(vals):
                raise r.err("cv", f"must be a list of {len(vals)} CVs (one per value), each in 0.01..{MAX_CV:g}")
            p.cv = r.nums("cv", lo=0.01, hi=MAX_CV)
    elif kind == "sinusoid":
        r.check_keys({"kind", "period", "peak_to_trough", "peak_at"})
        p.period = r.num("period", 86400.0, lo=0, lo_open=True)
        p.peak_to_trough = r.num("peak_to_trough", lo=1)
        p.peak_at = r.num("peak_at", 0.5, lo=0, hi=1)
    else:
        r.check_keys({"kind"})
    return p


MAX_SIGMA = 4.0     # log-normal modulation: exp(4^2) - 1 ~ 9e6 is already beyond any trace


def parse_modulation(r: _Reader) -> Modulation:
    """`modulation: {kind: lognormal, window: 10, sigma: 1.1, corr: 0.6}` (spec_types.Modulation)."""
    kind = r.choice("kind", MODULATIONS, "lognormal")
    r.check_keys({"kind", "window", "sigma", "corr"})
    m = Modulation(kind, r.num("window", lo=0, lo_open=True), r.num("sigma", lo=0, hi=MAX_SIGMA),
                   r.num("corr", 0.0, lo=0))
    if m.corr >= 1:
        raise r.err("corr", f"must be < 1 (a stationary AR(1)), got {m.corr:g}")
    return m


def _weights(r: _Reader, key: str, value: Any, name: str = "name", one: str = "a name") -> dict[str, float]:
    """One `name` (weight 1) or a mapping name -> weight (keys sorted)."""
    if isinstance(value, str):
        return {value: 1.0}
    if not isinstance(value, dict) or not value:
        raise r.err(key, f"must be {one} or a mapping {name} -> weight")
    sub = _Reader(value, r.at(key), r.file)
    # sorted: a mapping's key order (YAML vs JSON vs sorted metadata) must not change the draws
    weights = {str(k): sub.num(k, lo=0) for k in sorted(value, key=str)}
    if sum(weights.values()) <= 0:
        raise r.err(key, "weights must have a positive sum")
    return weights


def _count_pmf(r: _Reader) -> dict[str, Any]:
    """`{0: 0.7, 1: 0.2, 4: 0.1}`: image count -> probability (keys are numbers in YAML and
    strings once embedded as JSON: both read the same)."""
    if not r.d:
        raise SpecError(r.path, "must not be empty: image count -> probability", r.file)
    if len({isinstance(k, str) for k in r.d}) > 1:  # JSON embedding would have to sort them
        raise SpecError(r.path, "keys must be all numbers or all strings", r.file)
    pairs = []
    for k, w in r.d.items():
        try:
            c = float(k) if not isinstance(k, bool) else math.nan
        except (TypeError, ValueError):
            c = math.nan
        if not (math.isfinite(c) and c == int(c) and 0 <= c <= MAX_IMAGES):
            raise SpecError(f"{r.path}.{k}", f"an image count must be a whole number in 0..{MAX_IMAGES}", r.file)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise SpecError(f"{r.path}.{k}", f"must be a probability (weight) >= 0, got {w!r}", r.file)
        pairs.append((c, float(w)))
    pairs.sort()  # the key order (YAML, JSON, sorted metadata) never changes the draws
    if sum(w for _, w in pairs) <= 0:
        raise SpecError(r.path, "weights must have a positive sum", r.file)
    return {"values": [c for c, _ in pairs], "weights": [w for _, w in pairs]}


def parse_images(r: _Reader) -> Images:
    """`images: {count: {0: 0.7, 1: 0.2, 4: 0.1}, px: 512x512}`. `count`: a pmf (count ->
    probability), one whole number, or any length distribution (`{dist: zipf, a: 2, max: 8}`),
    within 0..MAX_IMAGES; `px`: one size `WxH` or a mapping `WxH` -> weight (default 512x512)."""
    r.check_keys({"count", "px"})
    r.need("count", rule="is required: images per request, e.g. {0: 0.7, 1: 0.2, 4: 0.1} (count -> probability)")
    v = r.d["count"]
    if isinstance(v, dict) and "dist" in v:
        cr = r.sub("count")
        count = parse_dist(cr, 0, MAX_IMAGES)
        if count.hi > MAX_IMAGES:
            raise cr.err("max", f"must be <= {MAX_IMAGES} images per request, got {count.hi:g}")
        bad = [x for x in count.params.get("values", []) if x != int(x) or x > MAX_IMAGES]
        if bad:
            raise cr.err("values", f"image counts must be whole numbers in 0..{MAX_IMAGES}, got {bad[0]:g}")
    elif isinstance(v, dict):
        count = Dist("empirical", _count_pmf(r.sub("count")), 0, MAX_IMAGES)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        count = Dist("constant", {"value": float(r.num("count", lo=0, hi=MAX_IMAGES, integer=True))}, 0, MAX_IMAGES)
    else:
        raise r.err("count", "must be a mapping count -> probability, a whole number or a distribution")
    sizes = _weights(r, "px", r.d.get("px", DEFAULT_IMAGE_PX), "WxH", "an image size WxH (e.g. 512x512)")
    problem = next(filter(None, map(image_px_problem, sizes)), None)
    if problem:
        raise r.err("px", problem)
    return Images(count, sizes)


def parse_share(r: _Reader, key: str) -> Dist | None:
    """`reasoning_share`: a share of the output tokens in 0..1, one number or a distribution
    (`{dist: empirical, values: [0.2, 0.9], weights: [0.5, 0.5]}`, `{dist: uniform, low: 0.3, high: 0.7}`);
    None without it."""
    if key not in r.d:
        return None
    if isinstance(r.d[key], dict):
        d = parse_dist(r.sub(key), 0.0, 1.0)
        if d.hi > 1 or any(x > 1 for x in d.params.get("values", [])):
            raise r.err(key, "a share of the output tokens must lie in 0..1")
        return d
    return Dist("constant", {"value": r.num(key, lo=0, hi=1)}, 0.0, 1.0)


def parse_length_windows(r: _Reader) -> list[tuple[float, Dist, Dist]]:
    """`length_windows: [{from_s: 0, input: D, output: D}, ...]`: the lengths of the requests
    arriving from `from_s` until the next window's (the first from 0, the last to the end)."""
    v = r.d["length_windows"]
    if not isinstance(v, list) or not v:
        raise r.err("length_windows", "must be a non-empty list of {from_s, input, output}")
    out: list[tuple[float, Dist, Dist]] = []
    for i, w in enumerate(v):
        wr = _Reader(w, f"{r.at('length_windows')}[{i}]", r.file)
        wr.check_keys({"from_s", "input", "output"})
        t = wr.num("from_s", lo=out[-1][0] if out else 0.0, lo_open=bool(out))
        if not out and t != 0:
            raise wr.err("from_s", f"the first window starts at 0 (it holds the lengths until the next), got {t:g}")
        wr.need("input", "output", rule="is required (a length distribution)")
        out.append((t, parse_dist(wr.sub("input")), parse_dist(wr.sub("output"))))
    return out
