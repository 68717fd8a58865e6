"""Arrival processes under a rate profile r(t), vectorised.

Every process is drawn at unit mean rate in *operational time* u = Lambda(t) = integral of
r, then mapped back to real time with Lambda^-1 (np.interp on a knot grid). Time rescaling
keeps a renewal process's CV wherever r(t) varies slowly against the gaps, which is what
"gamma CV 3 under a diurnal profile" means.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from .lengths import discrete_mean, sample
from .spec_types import Arrival, Profile, onoff_mean_rate, weibull_cv

SMOOTH_KNOTS = 200_000   # grid for ramp/sinusoid profiles (trapezoid; a ramp is exact)


def multiplier(p: Profile, t: np.ndarray, duration: float) -> np.ndarray:
    """Unnormalised rate shape s(t) at times t (t < 0 takes s(0))."""
    t = np.maximum(t, 0.0)
    if p.kind == "ramp":
        return p.start + (p.end - p.start) * np.clip(t / duration, 0, 1)
    if p.kind == "table":
        v = np.asarray(p.values)
        return v[(t // p.window).astype(np.int64) % len(v)]
    if p.kind == "sinusoid":
        a = (p.peak_to_trough - 1) / (p.peak_to_trough + 1)
        return 1 + a * np.cos(2 * math.pi * (t / p.period - p.peak_at))
    return np.ones_like(t)


def op_time_map(p: Profile, rate: float, t0: float, duration: float) -> tuple[np.ndarray, np.ndarray]:
    """Knots (t, Lambda(t)) on [t0, duration], normalised so that Lambda(duration) -
    Lambda(0) = rate * duration: `rate` is the mean rate over the trace."""
    if p.kind == "table":
        t = np.append(np.arange(0.0, duration, p.window), duration)
        s = multiplier(p, t[:-1], duration)
        lam = np.concatenate([[0.0], np.cumsum(s * np.diff(t))])
    elif p.kind == "constant":
        t, lam = np.array([0.0, duration]), np.array([0.0, duration])
    else:
        t = np.linspace(0.0, duration, SMOOTH_KNOTS)
        s = multiplier(p, t, duration)
        lam = np.concatenate([[0.0], np.cumsum((s[1:] + s[:-1]) / 2 * np.diff(t))])
    if lam[-1] <= 0:
        lam, t = np.array([0.0, duration]), np.array([0.0, duration])
    lam *= rate * duration / lam[-1]
    # a floor keeps Lambda strictly increasing (zero-rate windows), so np.interp inverts it
    lam += np.linspace(0.0, 1e-9 * rate * duration, len(lam))
    if t0 < 0:
        r0 = (lam[1] - lam[0]) / (t[1] - t[0])
        t, lam = np.concatenate([[t0], t]), np.concatenate([[t0 * r0], lam])
    return t, lam


def _renewal(cv: float, family: str, length: float, rng: np.random.Generator) -> np.ndarray:
    """Points of a unit-rate renewal process on [0, length): gamma, weibull or exponential gaps
    with the given CV, drawn in chunks until the cumulative sum passes `length`."""
    if family == "weibull":
        k = optimize.brentq(lambda s: weibull_cv(s) - cv, 0.05, 500.0) if abs(cv - 1) > 1e-12 else 1.0
        draw = lambda n: rng.weibull(k, n) / math.gamma(1 + 1 / k)  # noqa: E731
    elif family == "gamma" and abs(cv - 1) > 1e-12:
        draw = lambda n: rng.gamma(1 / cv**2, cv**2, n)  # noqa: E731
    else:
        draw = lambda n: rng.exponential(1.0, n)  # noqa: E731
    chunks, total = [], 0.0
    # stationary-ish start: the first point falls a uniform fraction into a gap
    start = rng.random() * draw(1)[0]
    while True:
        n = int(length - total + 6 * cv * math.sqrt(length - total + 1) + 64)
        g = draw(n)
        g[0] += start if not chunks else 0.0
        c = total + np.cumsum(g)
        chunks.append(c)
        total = float(c[-1])
        if total >= length:
            break
    pts = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    return pts[: np.searchsorted(pts, length)]


def _onoff(a: Arrival, rate: float, length: float, rng: np.random.Generator) -> np.ndarray:
    """Two-state Markov-modulated Poisson process at unit mean rate in operational time."""
    m = onoff_mean_rate(a)
    on, off = a.on_s * rate, a.off_s * rate            # sojourns in operational units
    b, i = a.burst_rate / m, a.idle_rate / m           # rates per operational unit (mean 1)
    cycles = int(length / (on + off) * 1.2 + 10)
    dur = np.empty(2 * cycles)
    seg_start = 0.0
    starts, lens, rates = [], [], []
    first_on = rng.random() < on / (on + off)
    while seg_start < length:
        dur[0::2] = rng.exponential(on if first_on else off, cycles)
        dur[1::2] = rng.exponential(off if first_on else on, cycles)
        ends = seg_start + np.cumsum(dur)
        starts.append(ends - dur)
        lens.append(dur.copy())
        r = np.empty(2 * cycles)
        r[0::2], r[1::2] = (b, i) if first_on else (i, b)
        rates.append(r)
        seg_start = float(ends[-1])
    s, ln, r = np.concatenate(starts), np.concatenate(lens), np.concatenate(rates)
    counts = rng.poisson(r * ln)
    pts = np.repeat(s, counts) + rng.random(int(counts.sum())) * np.repeat(ln, counts)
    pts.sort()
    return pts[: np.searchsorted(pts, length)]


def unit_points(a: Arrival, rate: float, length: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival points in operational time on [0, length) at mean rate 1."""
    if a.process == "onoff":
        return _onoff(a, rate, length, rng)
    if a.process == "batch":
        size = a.batch_size
        mean_k = discrete_mean(size)
        events = _renewal(a.cv, "gamma", length / mean_k, rng) * mean_k
        k = sample(size, rng, len(events)).astype(np.int64)
        return np.repeat(events, k)
    return _renewal(a.cv, a.process, length, rng)


def arrival_times(a: Arrival, p: Profile, rate: float, t0: float, duration: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Arrival times in seconds in [t0, duration), sorted, at mean rate `rate` over [0, duration)."""
    t, lam = op_time_map(p, rate, t0, duration)
    u = unit_points(a, rate, float(lam[-1] - lam[0]), rng)
    return np.interp(u + lam[0], lam, t)
