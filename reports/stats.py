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


BITS = {np.dtype(np.float64): (np.int64, 44), np.dtype(np.float32): (np.int32, 15)}  # 256 bins/octave


def order_statistics(x: np.ndarray, ranks: np.ndarray, *, select_min: int = 200_000) -> np.ndarray:
    """sorted(x)[ranks], exactly, without sorting x. For x >= 0 the IEEE-754 bit pattern orders
    like the value, so its top bits make an order-preserving histogram: it says which bins hold
    the wanted ranks, and only those bins are sorted. Small or negative inputs are sorted."""
    ranks = np.asarray(ranks, dtype=np.int64)
    spec = BITS.get(x.dtype)
    if len(x) < select_min or spec is None or x.min() < 0:
        return np.sort(x)[ranks]
    bins = x.view(spec[0]) >> spec[1]
    bins -= bins.min()
    nb = int(bins.max()) + 1
    if nb > 50_000_000:
        return np.sort(x)[ranks]
    hist = np.bincount(bins, minlength=nb)
    cum = np.cumsum(hist)
    rank_bin = np.searchsorted(cum, ranks, side="right")
    wanted = np.unique(rank_bin)
    lut = np.zeros(nb, dtype=bool)
    lut[wanted] = True
    sel = np.sort(x[lut[bins]])            # the wanted bins, in value order
    starts = np.cumsum(hist[wanted]) - hist[wanted]
    return sel[starts[np.searchsorted(wanted, rank_bin)] + ranks - (cum[rank_bin] - hist[rank_bin])]


def bootstrap_quantiles(x: np.ndarray, qs: list[float], *, n_boot: int = N_BOOT, seed: int = 0,
                        is_sorted: bool = False) -> np.ndarray:
    """Bootstrap replicates (shape [len(qs), n_boot]) of the type-7 quantiles of x (no NaN)."""
    n = len(x)
    rng = np.random.default_rng(seed)
    draws = [_draw_order_stats(n, q, n_boot, rng) for q in qs]
    ranks = np.unique(np.concatenate([j for d in draws for j in d[:2]]))
    values = x[ranks] if is_sorted else order_statistics(x, ranks)
    out = np.empty((len(qs), n_boot))
    for i, (j1, j2, frac) in enumerate(draws):
        v1, v2 = values[np.searchsorted(ranks, j1)], values[np.searchsorted(ranks, j2)]
        out[i] = v1 + frac * (v2 - v1)
    return out


def quantile_cis(x: np.ndarray, qs: list[float], *, conf: float = 0.95, n_boot: int = N_BOOT,
                 seed: int = 0, is_sorted: bool = False) -> list[tuple[float, float] | None]:
    """Percentile-bootstrap intervals for the quantiles qs (None where n < 2)."""
    if len(x) < 2 or not qs:
        return [None] * len(qs)
    reps = bootstrap_quantiles(x, qs, n_boot=n_boot, seed=seed, is_sorted=is_sorted)
    lo, hi = np.quantile(reps, [(1 - conf) / 2, (1 + conf) / 2], axis=1)
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


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
    Only the order statistics these need are selected (order_statistics); nothing is sorted
    whole."""
    x = clean(values)
    n = int(len(x))
    out: dict = {"n": n}
    if n == 0:
        out.update({k: None for k in STATS})
        out["ci"], out["warnings"], out["thin"] = {}, [], []
        return out
    h = _virtual_index(n, list(PERCENTILES.values()))
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    ranks = np.unique(np.concatenate([lo, hi, [n - 1]]))
    vals = order_statistics(x, ranks).astype(np.float64)
    at = lambda r: vals[np.searchsorted(ranks, r)]  # noqa: E731
    pv = _lerp(at(lo), at(hi), h - lo)
    out["mean"] = float(np.mean(x, dtype=np.float64))
    out.update({k: float(v) for k, v in zip(PERCENTILES, pv)})
    out["max"] = float(at(n - 1))
    cis = quantile_cis(x, [PERCENTILES[k] for k in ci], seed=seed)
    out["ci"] = {k: (list(c) if c else None) for k, c in zip(ci, cis)}
    thin = [k for k, p in PERCENTILES.items() if n * (1 - p / 100) < MIN_TAIL]
    out["warnings"] = [f"n={n}: fewer than {MIN_TAIL} samples beyond {', '.join(thin)}; "
                       f"treat {'it' if len(thin) == 1 else 'them'} as indicative"] if thin else []
    out["thin"] = thin
    return out


def _select_by_bits(v: np.ndarray, c: np.ndarray, counts: np.ndarray, qs: list[float],
                    max_bins: int = 20_000_000) -> np.ndarray | None:
    """Exact type-7 percentiles per group in a few linear passes, no full sort. For values >= 0
    the IEEE-754 bit pattern orders like the value, so its top bits (256 bins per octave) make
    an order-preserving histogram per group: it locates the bin of every order statistic
    needed, and only the values in those bins are sorted. None when it does not apply."""
    if v.dtype != np.float64 or v.min() < 0:
        return None
    g_n = len(counts)
    bits = v.view(np.int64) >> 44
    bits -= bits.min()
    nb = int(bits.max()) + 1
    if g_n * nb > max_bins:
        return None
    idx = c.astype(np.int64, copy=False) * nb + bits
    hist = np.bincount(idx, minlength=g_n * nb).reshape(g_n, nb)
    cum = np.cumsum(hist, axis=1)                                   # inclusive counts per bin
    h = np.maximum(_virtual_index(counts[:, None], np.asarray(qs)[None, :]), 0)
    r_lo = np.floor(h).astype(np.int64)
    r_hi = np.minimum(r_lo + 1, np.maximum(counts[:, None] - 1, 0))
    ranks = np.concatenate([r_lo, r_hi], axis=1)                    # G x 2Q order statistics
    live = counts > 0
    bins = np.zeros_like(ranks)
    for g in np.flatnonzero(live):                                  # loops over groups only
        bins[g] = np.searchsorted(cum[g], ranks[g], side="right")
    flat = np.arange(g_n)[:, None] * nb + bins
    lut = np.zeros(g_n * nb, dtype=bool)
    lut[flat[live].ravel()] = True
    sel = lut[idx]
    sv, sidx = v[sel], idx[sel]
    order = np.lexsort((sv, sidx))
    sv, sidx = sv[order], sidx[order]
    before = np.take_along_axis(cum, bins, 1) - np.take_along_axis(hist, bins, 1)
    pos = np.searchsorted(sidx, flat, side="left") + (ranks - before)
    vals = np.where(live[:, None], sv[np.clip(pos, 0, max(len(sv) - 1, 0))] if len(sv) else 0.0, np.nan)
    return _lerp(vals[:, :len(qs)], vals[:, len(qs):], h - r_lo)


def grouped_percentiles(values: np.ndarray, codes: np.ndarray, ngroups: int, qs: list[float], *,
                        select_min: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sample counts and type-7 percentiles (NaN values ignored; empty group = NaN).
    From `select_min` samples on, the bit-histogram selection replaces sorting."""
    keep = ~np.isnan(values)
    v, c = (values, codes) if keep.all() else (values[keep], codes[keep])
    counts = np.bincount(c, minlength=ngroups)[:ngroups]
    res = _select_by_bits(v, c, counts, qs) if len(v) >= select_min else None
    if res is not None:
        return counts, np.where(counts[:, None] > 0, res, np.nan)
    res = np.full((ngroups, len(qs)), np.nan)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    v = v[np.argsort(c, kind="stable")]
    for g in np.flatnonzero(counts):
        res[g] = sorted_quantiles(np.sort(v[bounds[g]:bounds[g + 1]]), qs)
    return counts, res
