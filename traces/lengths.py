"""Length (and count, and think-time) distributions: sampled by inverse CDF from standard
normal draws, so that a Gaussian copula gives any target Spearman rho between two of them.

Vectorised over whole arrays; lognormal skips the CDF round trip (exp(mu + sigma z) is its
inverse CDF), the others use scipy.stats' ppf on Phi(z).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special, stats

from .spec_types import Dist


def _uniform(z: np.ndarray) -> np.ndarray:
    # Phi(z) kept strictly inside (0, 1) so that no ppf returns inf
    return np.clip(special.ndtr(z), 1e-15, 1 - 1e-15)


@lru_cache(maxsize=64)
def _file_values(file: str, column: str) -> np.ndarray:
    from .trace import Trace
    col = Trace.read(file).table.column(column).drop_null()
    return np.sort(col.to_numpy().astype(np.float64))


def _table(d: Dist) -> tuple[np.ndarray, np.ndarray]:
    """Support and CDF of a discrete family (empirical, zipf)."""
    if d.family == "zipf":
        k = np.arange(max(d.lo, 1), d.hi + 1)
        w = k ** -d.params["a"]
    elif "file" in d.params:
        k = _file_values(d.params["file"], d.params["column"])
        w = np.ones_like(k)
    else:
        k, w = np.asarray(d.params["values"]), np.asarray(d.params["weights"])
        order = np.argsort(k, kind="stable")
        k, w = k[order], w[order]
    return k, np.cumsum(w) / w.sum()


def sample_from_normal(d: Dist, z: np.ndarray) -> np.ndarray:
    """Values of `d` (float64, uncapped, unrounded) at the standard-normal scores `z`."""
    p, f = d.params, d.family
    if f == "lognormal":
        x = np.multiply(z, p["sigma"])
        np.exp(x, out=x)
        x *= p["median"]
        return x
    if f == "constant":
        return np.full(len(z), p["value"], dtype=np.float64)
    u = _uniform(z)
    if f == "uniform":
        return p["low"] + u * (p["high"] - p["low"])
    if f == "gamma":
        return stats.gamma.ppf(u, p["shape"], scale=p["scale"])
    if f == "weibull":
        return stats.weibull_min.ppf(u, p["shape"], scale=p["scale"])
    k, cdf = _table(d)
    return k[np.minimum(np.searchsorted(cdf, u, side="left"), len(k) - 1)].astype(np.float64)


def finish(x: np.ndarray, d: Dist, scale: float = 1.0, cap: int | None = None,
           integer: bool = True) -> np.ndarray:
    """Scale, round and clip to the dist's [min, max] and the global cap, in place on the
    float64 array `x` (always a fresh sample here: 10M-row traces avoid the copies)."""
    hi = d.hi if cap is None else min(d.hi, cap)
    if scale != 1.0:
        x *= scale
    if integer:
        np.rint(x, out=x)
    return np.clip(x, d.lo, hi, out=x)


def sample(d: Dist, rng: np.random.Generator, n: int, integer: bool = True) -> np.ndarray:
    return finish(sample_from_normal(d, rng.standard_normal(n)), d, integer=integer)


def sample_pair(a: Dist, b: Dist, rho: float, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two dependent samples with Spearman rank correlation `rho` (Gaussian copula).

    For a bivariate normal, Spearman = (6/pi) asin(r/2), so r = 2 sin(pi rho / 6)."""
    za = rng.standard_normal(n)
    zb = rng.standard_normal(n)
    if rho:
        r = 2 * math.sin(math.pi * rho / 6)
        zb = r * za + math.sqrt(1 - r * r) * zb
    return sample_from_normal(a, za), sample_from_normal(b, zb)


def discrete_mean(d: Dist) -> float:
    """Mean of the rounded, capped distribution (e.g. turns per session), from a dense
    deterministic quantile grid: exact enough to set a session start rate."""
    z = special.ndtri((np.arange(20000) + 0.5) / 20000)
    return float(finish(sample_from_normal(d, z), d).mean())
