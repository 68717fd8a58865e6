"""Exact percentiles (NumPy linear, type 7) with n, and bootstrap confidence intervals.

A sample's order statistics come from one SIMD np.sort (NaN sorts last, so n is where the first
NaN lies). Grouped ones are selected, not sorted (regrouped_percentiles): the IEEE-754 bits of a
float, negatives' flipped, order like signed integers, so their top bits (up to 256 bins per
octave) make an order-preserving histogram per group; its cumulative counts say which bins hold
the wanted ranks and only the values in those bins are sorted. Both are bit-identical to NumPy.

The bootstrap is exact and costs O(B) once the sample is sorted: the type-7 quantile of
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
MAX_BINS = 1 << 24   # (cell, bin) histogram size: wider ranges or more cells get coarser bins


def _draw_order_stats(n: int, q: float, n_boot: int, rng: np.random.Generator):
    h = (n - 1) * q / 100.0
    lo = int(math.floor(h))
    frac = h - lo
    a = lo + 1                                   # 1-based rank of the lower order statistic
    u1 = rng.beta(a, n - a + 1, size=n_boot)
    u2 = u1 + (1.0 - u1) * rng.beta(1, n - a, size=n_boot) if (frac > 0 and a < n) else u1
    j1, j2 = (np.minimum((u * n).astype(np.int64), n - 1) for u in (u1, u2))
    return j1, j2, frac


def order_statistics(x: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """sorted(x)[ranks] of a NaN-free sample, exactly."""
    return np.sort(x)[np.asarray(ranks, dtype=np.int64)]


def _bootstrap(xs: np.ndarray, qs: list[float], n_boot: int, seed: int) -> np.ndarray:
    """Replicates [len(qs), n_boot] of the type-7 quantiles of the ascending NaN-free xs."""
    rng = np.random.default_rng(seed)
    out = np.empty((len(qs), n_boot))
    for i, q in enumerate(qs):
        j1, j2, frac = _draw_order_stats(len(xs), q, n_boot, rng)
        v1, v2 = xs[j1].astype(np.float64), xs[j2].astype(np.float64)
        out[i] = v1 + frac * (v2 - v1)
    return out


def bootstrap_quantiles(x: np.ndarray, qs: list[float], *, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates (shape [len(qs), n_boot]) of the type-7 quantiles of x (no NaN)."""
    return _bootstrap(np.sort(x), qs, n_boot, seed)


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
    """Type-7 (NumPy 'linear') quantiles of an ascending, NaN-free, non-empty array, with
    NumPy's own rounding of (n-1) * q and its interpolation (so results match it bit for bit)."""
    n = len(xs)
    h = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100.0)
    lo = np.floor(h).astype(np.int64)
    a, b, t = xs[lo].astype(np.float64), xs[np.minimum(lo + 1, n - 1)].astype(np.float64), h - lo
    return np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)


def describe(values: np.ndarray, *, ci: tuple[str, ...] = CI_DEFAULT, seed: int = 0) -> dict:
    """n, mean, p50..p99.9, max, bootstrap CIs for the named percentiles, small-n warnings.
    NaN values are ignored."""
    xs = np.sort(values)
    # NaN sorts last. Searched for in the sample's own dtype: a float64 NaN would cast it whole.
    n = int(np.searchsorted(xs, xs.dtype.type(np.nan))) if xs.dtype.kind == "f" else len(xs)
    xs = xs[:n]
    out: dict = {"n": n}
    if n == 0:
        return out | dict.fromkeys(STATS) | {"ci": {}, "warnings": [], "thin": []}
    out["mean"] = float(np.sum(xs, dtype=np.float64)) / n
    out.update({k: float(v) for k, v in zip(PERCENTILES, sorted_quantiles(xs, list(PERCENTILES.values())))})
    out["max"] = float(xs[-1])
    qs = [PERCENTILES[k] for k in ci]
    cis = _intervals(_bootstrap(xs, qs, N_BOOT, seed), 0.95) if n >= 2 and qs else [None] * len(qs)
    out["ci"] = {k: (list(c) if c else None) for k, c in zip(ci, cis)}
    thin = [k for k, p in PERCENTILES.items() if n * (1 - p / 100) < MIN_TAIL]
    out["warnings"] = [f"n={n}: fewer than {MIN_TAIL} samples beyond {', '.join(thin)}; "
                       f"treat {'it' if len(thin) == 1 else 'them'} as indicative"] if thin else []
    out["thin"] = thin
    return out


def grouped_percentiles(values: np.ndarray, codes: np.ndarray, ngroups: int,
                        qs: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sample counts and type-7 percentiles (NaN values ignored; empty group = NaN)."""
    return regrouped_percentiles(values, codes, ngroups, [(np.arange(ngroups), ngroups)], qs)[0]


def regrouped_percentiles(values: np.ndarray, cells: np.ndarray, ncells: int, groupings: list,
                          qs: list[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    """grouped_percentiles for several groupings of fine `cells` at once: each grouping is (to,
    ngroups) with `to` mapping a cell to its group. The histogram is counted once per (cell,
    bin); a grouping's is the sum of its cells'. So one pass over the values serves every
    breakdown of a metric (model x class x length bucket)."""
    nan = np.isnan(values)
    if nan.any():
        values, cells = values[~nan], cells[~nan]
    if len(values) == 0:
        return [(np.zeros(ng, dtype=np.int64), np.full((ng, len(qs)), np.nan)) for _, ng in groupings]
    ibits = np.dtype(f"i{values.dtype.itemsize}")
    bits = values.view(ibits)
    key = (bits >> (8 * ibits.itemsize - 1)) & np.iinfo(ibits).max
    key ^= bits                                            # negatives flipped: ordered like the value
    lo, hi, shift = key.min(), key.max(), np.finfo(values.dtype).nmant - 8
    while ncells * (int(hi >> shift) - int(lo >> shift) + 1) > MAX_BINS:   # coarser bins
        shift += 1
    nb = int(hi >> shift) - int(lo >> shift) + 1
    key >>= shift
    key -= lo >> shift
    flat = cells.astype(np.int64, copy=False) * nb       # in place: no more full-size temporaries
    flat += key                                           # (cell, bin)
    del key
    cell_hist = np.bincount(flat, minlength=ncells * nb)[:ncells * nb].reshape(ncells, nb)
    return [_select(values, flat, cell_hist, to, ngroups, np.asarray(qs, dtype=np.float64))
            for to, ngroups in groupings]


def _select(values, flat, cell_hist, to, ngroups, qs) -> tuple[np.ndarray, np.ndarray]:
    """One grouping's counts and percentiles from the (cell, bin) histogram: a pass over
    `flat` picks the values in the bins that hold the wanted ranks, and only those are sorted."""
    nb = cell_hist.shape[1]
    hist = np.zeros((ngroups, nb), dtype=np.int64)
    np.add.at(hist, to, cell_hist)
    counts, cum = hist.sum(axis=1), hist.cumsum(axis=1)
    h = np.maximum((counts[:, None] - 1) * (qs / 100.0), 0)
    below = np.floor(h).astype(np.int64)
    ranks = np.concatenate([below, np.minimum(below + 1, np.maximum(counts[:, None] - 1, 0))], axis=1)
    # Each row of cum offset past the one before: one searchsorted finds every rank's bin.
    off = np.arange(ngroups)[:, None] * (len(values) + 1)
    bins = np.searchsorted((cum + off).ravel(), ranks + off, side="right") % nb
    want = np.zeros((ngroups, nb), dtype=bool)
    np.put_along_axis(want, bins, True, axis=1)
    pick = want[to].ravel()[flat]
    cell, bin_ = np.divmod(flat[pick], nb)
    v, key = values[pick] + 0.0, to[cell] * nb + bin_     # + 0.0: -0.0 reads as 0.0
    order = np.lexsort((v, key))                           # by (group, bin), then value
    v, key = v[order].astype(np.float64), key[order]
    first = np.searchsorted(key, np.arange(ngroups)[:, None] * nb + bins)
    at = v[np.clip(first + ranks - np.take_along_axis(cum - hist, bins, 1), 0, len(v) - 1)]
    a, b, t = at[:, :len(qs)], at[:, len(qs):], h - below
    pct = np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)   # NumPy's lerp
    return counts, np.where(counts[:, None] > 0, pct, np.nan)
