"""Exact percentiles (NumPy linear, type 7) with n, and bootstrap confidence intervals.

Order statistics are selected, not sorted: for values >= 0 the IEEE-754 bit pattern orders like
the value, so a histogram of its top bits (256 bins per octave) finds the bins that hold the
wanted ranks and only those are sorted: a few linear passes, exact, bit-identical to NumPy.

The bootstrap is exact and costs O(B) once those order statistics are known: the type-7 quantile of
a resample depends only on two of its order statistics, and the k-th order statistic of a
resample drawn with replacement from sorted x is x[floor(n * U_(k))] where U_(k) ~ Beta(k, n-k+1)
is the k-th order statistic of n uniforms (the next one is U_(k) + (1-U_(k)) * Beta(1, n-k)).
Drawing those Betas is the same in distribution as resampling n values B times, without the
B*n work, so 10M-sample p99 intervals cost milliseconds.
"""
from __future__ import annotations

import math

import numpy as np

from .select import BitHistogram

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
STATS = ("mean", *PERCENTILES, "max")
CI_DEFAULT = ("p95", "p99")
N_BOOT = 2000
MIN_TAIL = 10   # warn when fewer than this many samples lie beyond a reported percentile


def _draw_order_stats(n: int, q: float, n_boot: int, rng: np.random.Generator):
    h = (n - 1) * q / 100.0
    lo = int(math.floor(h))
    frac = h - lo
    a = lo + 1                                   # 1-based rank of the lower order statistic
    u1 = rng.beta(a, n - a + 1, size=n_boot)
    u2 = u1 + (1.0 - u1) * rng.beta(1, n - a, size=n_boot) if (frac > 0 and a < n) else u1
    j1 = np.minimum((u1 * n).astype(np.int64), n - 1)
    j2 = np.minimum((u2 * n).astype(np.int64), n - 1)
    return j1, j2, frac


SELECT_MIN = 200_000   # from this many samples on, order statistics are selected (select.py)


def order_statistics(x: np.ndarray, ranks: np.ndarray, *, select_min: int = SELECT_MIN) -> np.ndarray:
    """sorted(x)[ranks] of a NaN-free sample, exactly; selected without a full sort when large."""
    ranks = np.asarray(ranks, dtype=np.int64)
    bh = BitHistogram.of(x) if len(x) >= select_min else None
    if bh is not None:
        return bh.values_at(ranks[None, :])[0]
    return np.sort(x)[ranks]


def _draw_bootstrap(n: int, qs: list[float], n_boot: int, seed: int) -> tuple[list, np.ndarray]:
    """The order statistics each bootstrap replicate needs, and the distinct ranks among them."""
    rng = np.random.default_rng(seed)
    draws = [_draw_order_stats(n, q, n_boot, rng) for q in qs]
    ranks = np.unique(np.concatenate([j for d in draws for j in d[:2]])) if draws else np.empty(0, np.int64)
    return draws, ranks


def _replicates(draws: list, ranks: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Replicates [len(qs), n_boot] from `values` = sorted sample at `ranks`."""
    out = np.empty((len(draws), len(draws[0][0]) if draws else 0))
    for i, (j1, j2, frac) in enumerate(draws):
        v1, v2 = values[np.searchsorted(ranks, j1)], values[np.searchsorted(ranks, j2)]
        out[i] = v1 + frac * (v2 - v1)
    return out


def _bootstrap(n: int, lookup, qs: list[float], n_boot: int, seed: int) -> np.ndarray:
    draws, ranks = _draw_bootstrap(n, qs, n_boot, seed)
    return _replicates(draws, ranks, lookup(ranks))


def bootstrap_quantiles(x: np.ndarray, qs: list[float], *, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates (shape [len(qs), n_boot]) of the type-7 quantiles of x (no NaN)."""
    return _bootstrap(len(x), lambda r: order_statistics(x, r), qs, n_boot, seed)


def _intervals(reps: np.ndarray, conf: float) -> list[tuple[float, float]]:
    lo, hi = np.quantile(reps, [(1 - conf) / 2, (1 + conf) / 2], axis=1)
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


def quantile_cis(x: np.ndarray, qs: list[float], *, conf: float = 0.95, n_boot: int = N_BOOT,
                 seed: int = 0) -> list[tuple[float, float] | None]:
    """Percentile-bootstrap intervals for the quantiles qs of a NaN-free x (None where n < 2)."""
    if len(x) < 2 or not qs:
        return [None] * len(qs)
    return _intervals(bootstrap_quantiles(x, qs, n_boot=n_boot, seed=seed), conf)


def sorted_quantiles(xs: np.ndarray, qs) -> np.ndarray:
    """Type-7 (NumPy 'linear') quantiles of an ascending NaN-free array. A full SIMD sort is
    faster than np.percentile's multi-kth partition for the 5+ quantiles reported."""
    n = len(xs)
    if n == 0:
        return np.full(len(qs), np.nan)
    h = _virtual_index(n, qs)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    return _lerp(xs[lo].astype(np.float64), xs[hi].astype(np.float64), h - lo)


def clean(values: np.ndarray) -> np.ndarray:
    """Without NaN (no copy when there is none)."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return values
    nan = np.isnan(values)
    return values[~nan] if nan.any() else values


def _virtual_index(n, qs):
    """(n-1) * q, rounded the way NumPy's 'linear' method rounds it."""
    return (n - 1) * (np.asarray(qs, dtype=np.float64) / 100.0)


def _lerp(a, b, t):
    """NumPy's own interpolation for method='linear' (so results match it bit for bit)."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def describe(values: np.ndarray, *, ci: tuple[str, ...] = CI_DEFAULT, seed: int = 0) -> dict:
    """n, mean, p50..p99.9, max, bootstrap CIs for the named percentiles, small-n warnings.
    NaN values are ignored. Large samples are never sorted whole (select.py)."""
    x = np.asarray(values)
    bh = BitHistogram.of(x) if len(x) >= SELECT_MIN else None
    if bh is not None:
        n, total = int(bh.counts[0]), bh.nansum()
        lookup = lambda r: bh.values_at(np.asarray(r)[None, :])[0]  # noqa: E731
    else:
        xs = np.sort(clean(x))
        n, total = len(xs), float(np.sum(xs, dtype=np.float64))
        lookup = lambda r: xs[r].astype(np.float64)  # noqa: E731
    out: dict = {"n": n}
    if n == 0:
        out.update({k: None for k in STATS})
        out["ci"], out["warnings"], out["thin"] = {}, [], []
        return out
    h = _virtual_index(n, list(PERCENTILES.values()))
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    qs = [PERCENTILES[k] for k in ci]
    draws, boot_ranks = _draw_bootstrap(n, qs, N_BOOT, seed) if n >= 2 and qs else ([], np.empty(0, np.int64))
    # One lookup for the reported percentiles and every bootstrap replicate: one selection pass.
    ranks = np.unique(np.concatenate([lo, hi, [n - 1], boot_ranks]))
    vals = lookup(ranks)
    at = lambda r: vals[np.searchsorted(ranks, r)]  # noqa: E731
    out["mean"] = total / n
    out.update({k: float(v) for k, v in zip(PERCENTILES, _lerp(at(lo), at(hi), h - lo))})
    out["max"] = float(at(n - 1))
    cis = _intervals(_replicates(draws, boot_ranks, at(boot_ranks)), 0.95) if draws else [None] * len(qs)
    out["ci"] = {k: (list(c) if c else None) for k, c in zip(ci, cis)}
    thin = [k for k, p in PERCENTILES.items() if n * (1 - p / 100) < MIN_TAIL]
    out["warnings"] = [f"n={n}: fewer than {MIN_TAIL} samples beyond {', '.join(thin)}; "
                       f"treat {'it' if len(thin) == 1 else 'them'} as indicative"] if thin else []
    out["thin"] = thin
    return out


def grouped_percentiles(values: np.ndarray, codes: np.ndarray, ngroups: int, qs: list[float], *,
                        select_min: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sample counts and type-7 percentiles (NaN values ignored; empty group = NaN).
    From `select_min` samples on, order statistics are selected per group (select.py)."""
    bh = BitHistogram.of(values, codes.astype(np.int64, copy=False), ngroups) if len(values) >= select_min else None
    if bh is not None:
        h = np.maximum(_virtual_index(bh.counts[:, None], np.asarray(qs)[None, :]), 0)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(bh.counts[:, None] - 1, 0))
        vals = bh.values_at(np.concatenate([lo, hi], axis=1))
        return bh.counts, _lerp(vals[:, :len(qs)], vals[:, len(qs):], h - lo)
    keep = ~np.isnan(values)
    v, c = values[keep], codes[keep]
    counts = np.bincount(c, minlength=ngroups)[:ngroups]
    res = np.full((ngroups, len(qs)), np.nan)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    v = v[np.argsort(c, kind="stable")]
    for g in np.flatnonzero(counts):   # loops over groups, never over requests
        res[g] = sorted_quantiles(np.sort(v[bounds[g]:bounds[g + 1]]), qs)
    return counts, res


def regrouped_percentiles(values: np.ndarray, cells: np.ndarray, ncells: int, groupings: list, qs: list[float], *,
                          select_min: int = 100_000) -> list[tuple[np.ndarray, np.ndarray]]:
    """grouped_percentiles for several groupings at once: `cells` are fine codes and each
    grouping is (to, ngroups) with `to` mapping a cell to its group. Large samples take one
    histogram pass and one collection pass for all of them (not one of each per grouping)."""
    bh = BitHistogram.of(values, cells.astype(np.int64, copy=False), ncells) if len(values) >= select_min else None
    if bh is None:
        return [grouped_percentiles(values, to[cells], ngroups, qs, select_min=select_min)
                for to, ngroups in groupings]
    plans, hs = [], []
    for to, ngroups in groupings:
        counts = bh.regrouped_hist(to, ngroups)[:, :-1].sum(axis=1)
        h = np.maximum(_virtual_index(counts[:, None], np.asarray(qs)[None, :]), 0)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(counts[:, None] - 1, 0))
        plans.append((to, ngroups, np.concatenate([lo, hi], axis=1)))
        hs.append((counts, h, lo))
    vals = bh.values_at_regrouped(plans)
    return [(counts, _lerp(v[:, :len(qs)], v[:, len(qs):], h - lo)) for (counts, h, lo), v in zip(hs, vals)]
