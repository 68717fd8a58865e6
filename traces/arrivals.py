"""Arrival processes under a rate profile r(t), vectorised.

Every process is drawn at unit mean rate in *operational time* u = Lambda(t) = integral of
r, then mapped back to real time with Lambda^-1 (np.interp on a knot grid). Time rescaling
keeps a renewal process's CV wherever r(t) varies slowly against the gaps, which is what
"gamma CV 3 under a diurnal profile" means.

Two options reach the long-range structure of real traffic (`fit` chooses between them,
fit_dists.fit_arrivals):

- a `modulation` (doubly stochastic rate): r(t) is multiplied by a log-normal AR(1) path drawn
  per seed over windows of `window` seconds, then renormalised to the client's mean rate, so
  another seed makes new minute-scale swings with the same variance and correlation;
- `exact_count`: exactly n = round(rate * (duration - t0)) arrivals, the first at t0 and the
  last one mean gap before `duration` (the edges of a fitted source: fit re-bases the trace to
  its first arrival and sets duration = span * n / (n - 1), or span + the bucket width on a
  bucketed clock, whose last bucket then holds the last row), so the measured mean rate
  (n - 1) / (last - first) is `rate` on every seed. A heavy-tailed renewal process alone
  cannot hold its rate (its count variance is ~CV^2 times the mean). With sessions the
  count is the rows' (generate._session_starts / _session_times), not the starts'.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, signal

from .sampling import discrete_mean, sample, segmented_cumsum
from .spec_types import Arrival, Modulation, Profile, onoff_mean_rate, weibull_cv

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


def modulate(t: np.ndarray, lam: np.ndarray, m: Modulation, rate: float, duration: float,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Knots (t, Lambda) of `op_time_map` times a log-normal AR(1) rate multiplier on windows
    [jW, (j+1)W) (aligned at 0; warm-up windows before 0 included), renormalised so that
    Lambda(duration) - Lambda(0) = rate * duration again (the realised path keeps the mean)."""
    w = m.window
    j0 = int(math.floor(t[0] / w))
    nw = int(math.ceil(duration / w)) - j0
    e = rng.standard_normal(max(nw, 1))
    e[1:] *= math.sqrt(1 - m.corr ** 2)          # X_0 ~ N(0, 1): the AR(1) starts stationary
    x = signal.lfilter([1.0], [1.0, -m.corr], e)
    mult = np.exp(m.sigma * x - m.sigma ** 2 / 2)
    edges = (j0 + np.arange(1, nw)) * w
    knots = np.union1d(t, edges[(edges > t[0]) & (edges < t[-1])])
    lam0 = np.interp(knots, t, lam)
    mid = (knots[1:] + knots[:-1]) / 2
    inc = np.diff(lam0) * mult[np.clip(np.floor(mid / w).astype(np.int64) - j0, 0, len(mult) - 1)]
    lam1 = np.concatenate([[0.0], np.cumsum(inc)])
    at0 = np.interp(0.0, knots, lam1)
    span = lam1[-1] - at0
    if span <= 0:
        return t, lam
    lam1 = (lam1 - at0) * (rate * duration / span)
    lam1 += np.linspace(0.0, 1e-9 * rate * duration, len(lam1))  # strictly increasing
    return knots, lam1


def window_points(a: Arrival, p: Profile, t: np.ndarray, lam: np.ndarray, t0: float, duration: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Arrival times under a table with a CV per window, drawn as ServeGen draws its windows:
    each window [jW, (j+1)W) holds its expected count Lambda((j+1)W) - Lambda(jW) (rounded
    up or down at random, so the mean stays exact), spaced by gamma or weibull gaps at that
    window's CV, scaled so that count + 1 gaps span the window. Windows before 0 (a session
    warm-up) take window 0's CV."""
    w = p.window
    starts = np.arange(math.floor(t0 / w), math.ceil(duration / w)) * w
    starts = starts[starts < duration]
    edges = np.append(np.maximum(starts, t0), duration)
    u = np.interp(edges, t, lam)
    span = np.diff(u)
    n = np.floor(span).astype(np.int64)
    n += rng.random(len(n)) < span - n
    cv = np.asarray(p.cv)[(np.maximum(starts, 0) // w).astype(np.int64) % len(p.cv)]
    k = n + 1                                   # gaps per window
    gcv = np.repeat(cv, k)
    if a.process == "weibull":                  # the shape of each CV (weibull_cv falls with the shape)
        g = rng.weibull(np.interp(gcv, _WEIBULL_CV[::-1], _WEIBULL_SHAPES[::-1]))
    else:
        g = rng.gamma(1 / gcv**2, gcv**2)
    first = np.cumsum(k) - k
    cs = segmented_cumsum(g, first, k)          # within each window
    win = np.repeat(np.arange(len(k)), k)
    pts = u[:-1][win] + cs / cs[first + k - 1][win] * span[win]
    last = np.zeros(len(g), bool)
    last[first + k - 1] = True                  # the (count + 1)-th point closes the window
    return np.interp(pts[~last], lam, t)


_WEIBULL_SHAPES = np.geomspace(0.05, 500.0, 4000)
_WEIBULL_CV = np.array([weibull_cv(s) for s in _WEIBULL_SHAPES])


def _gap_sampler(cv: float, family: str, rng: np.random.Generator):
    if family == "weibull":
        k = optimize.brentq(lambda s: weibull_cv(s) - cv, 0.05, 500.0) if abs(cv - 1) > 1e-12 else 1.0
        return lambda n: rng.weibull(k, n) / math.gamma(1 + 1 / k)  # noqa: E731
    if family == "gamma" and abs(cv - 1) > 1e-12:
        return lambda n: rng.gamma(1 / cv**2, cv**2, n)  # noqa: E731
    return lambda n: rng.exponential(1.0, n)  # noqa: E731


def exact_unit_points(a: Arrival, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly n points in operational time, the first at 0 and the last at n - 1 (mean gap 1).

    Renewal processes draw n - 1 gaps and divide them by their sum: for Poisson and gamma gaps
    that is exactly the process conditioned on the n-th point (normalised gamma gaps are
    Dirichlet), for Weibull a close approximation. On/off and batch draw until n points exist
    and map the first n affinely onto [0, n - 1]."""
    if n <= 1:
        return np.zeros(max(n, 0))
    if a.process in ("poisson", "gamma", "weibull"):
        pts = np.zeros(n)
        np.cumsum(_gap_sampler(a.cv, a.process, rng)(n - 1), out=pts[1:])
    else:
        length, parts, have = n * 1.1 + 10, [], 0
        while have < n:  # a continuation restarts the process: rare (only when the first is short)
            parts.append(unit_points(a, rate, length, rng) + (parts[-1][-1] if parts else 0.0))
            have += len(parts[-1])
        pts = np.concatenate(parts)[:n]
        pts -= pts[0]
    if pts[-1] > 0:
        pts *= (n - 1) / pts[-1]
    return pts


def _renewal(cv: float, family: str, length: float, rng: np.random.Generator) -> np.ndarray:
    """Points of a unit-rate renewal process on [0, length): gamma, weibull or exponential gaps
    with the given CV, drawn in chunks until the cumulative sum passes `length`."""
    draw = _gap_sampler(cv, family, rng)
    chunks, total = [], 0.0
    # stationary-ish start: the first point falls a uniform fraction into a gap
    start = rng.random() * draw(1)[0]
    while not chunks or total < length:
        g = draw(int(length - total + 6 * cv * math.sqrt(length - total + 1) + 64))
        if not chunks:
            g[0] += start
        chunks.append(total + np.cumsum(g))
        total = float(chunks[-1][-1])
    pts = np.concatenate(chunks)
    return pts[: np.searchsorted(pts, length)]


def _onoff(a: Arrival, rate: float, length: float, rng: np.random.Generator) -> np.ndarray:
    """Two-state Markov-modulated Poisson process at unit mean rate in operational time."""
    m = onoff_mean_rate(a)
    on, off = a.on_s * rate, a.off_s * rate            # sojourns in operational units
    b, i = a.burst_rate / m, a.idle_rate / m           # rates per operational unit (mean 1)
    cycles = int(length / (on + off) * 1.2 + 10)
    seg_start, starts, lens = 0.0, [], []
    first_on = rng.random() < on / (on + off)
    while seg_start < length:
        dur = np.empty(2 * cycles)
        dur[0::2] = rng.exponential(on if first_on else off, cycles)
        dur[1::2] = rng.exponential(off if first_on else on, cycles)
        ends = seg_start + np.cumsum(dur)
        starts.append(ends - dur)
        lens.append(dur)
        seg_start = float(ends[-1])
    s, ln = np.concatenate(starts), np.concatenate(lens)
    r = np.tile((b, i) if first_on else (i, b), len(ln) // 2)  # each segment's rate (they alternate)
    counts = rng.poisson(r * ln)
    pts = np.repeat(s, counts) + rng.random(int(counts.sum())) * np.repeat(ln, counts)
    pts.sort()
    return pts[: np.searchsorted(pts, length)]


def unit_points(a: Arrival, rate: float, length: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival points in operational time on [0, length) at mean rate 1."""
    if a.process == "onoff":
        return _onoff(a, rate, length, rng)
    if a.process == "batch":
        mean_k = discrete_mean(a.batch_size)
        events = _renewal(a.cv, "gamma", length / mean_k, rng) * mean_k
        return np.repeat(events, sample(a.batch_size, rng, len(events)).astype(np.int64))
    return _renewal(a.cv, a.process, length, rng)


def arrival_times(a: Arrival, p: Profile, rate: float, t0: float, duration: float,
                  rng: np.random.Generator, modulation: Modulation | None = None, exact: bool = False) -> np.ndarray:
    """Arrival times in seconds in [t0, duration), sorted, at mean rate `rate` over [0, duration).

    `modulation`: the rate path is multiplied by a fresh log-normal AR(1) draw (from `rng`,
    before the points). `exact`: exactly round(rate * (duration - t0)) points, the first at
    t0 and the last at t0 + (duration - t0) (n - 1) / n (then (n - 1) / (last - first) = rate):
    the points are drawn conditioned on their count in operational time (exact_unit_points),
    mapped to real time, and stretched affinely about t0 so that the last one lands there
    (a correction of about one mean gap: the profile's windows move by that fraction).
    Without either option the draws are those of earlier versions (same bytes)."""
    t, lam = op_time_map(p, rate, t0, duration)
    if modulation is not None and modulation.sigma > 0:
        t, lam = modulate(t, lam, modulation, rate, duration, rng)
    if p.kind == "table" and p.cv is not None:
        return window_points(a, p, t, lam, t0, duration, rng)
    span = float(lam[-1] - lam[0])
    if not exact:
        return np.interp(unit_points(a, rate, span, rng) + lam[0], lam, t)
    n = int(round(span))
    u = exact_unit_points(a, rate, n, rng) * (span / max(n, 1))
    times = np.interp(u + lam[0], lam, t)
    if n >= 2 and times[-1] > t0:
        last = t0 + (duration - t0) * (n - 1) / n
        times = t0 + (times - t0) * ((last - t0) / (times[-1] - t0))
        times[0] = t0
    return times
