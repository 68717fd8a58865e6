"""Exact order statistics by selection instead of sorting, per group, in bounded memory.

For values >= 0 the IEEE-754 bit pattern orders like the value, so its top bits (256 bins per
octave) make an order-preserving histogram. One pass counts values per (group, bin); the
cumulative counts say which bins hold the wanted ranks; a second pass collects only those
bins, which are then sorted. NaN gets its own bin past every number, so NaN never needs to be
filtered out first. Both passes walk the data in 1M-element chunks: their temporaries are
reused heap memory, never fresh multi-megabyte pages (which this kind of VM faults in slowly).
"""
from __future__ import annotations

import numpy as np

BITS = {np.dtype(np.float64): (np.int64, 44), np.dtype(np.float32): (np.int32, 15)}
CHUNK = 1 << 20
MAX_BINS = 20_000_000


def _bounds(values: np.ndarray) -> tuple[float, float]:
    """nanmin and nanmax (NaN when every value is NaN)."""
    return np.fmin.reduce(values), np.fmax.reduce(values)


class BitHistogram:
    """Per-group histogram of `values` (float32/float64, NaN allowed) over integer `codes`."""

    def __init__(self, values: np.ndarray, codes: np.ndarray | None = None, ngroups: int = 1, *,
                 chunk: int = CHUNK, bounds: tuple[float, float] | None = None) -> None:
        self.x, self.codes, self.ngroups, self.chunk = values, codes, ngroups, chunk
        ibits, shift = BITS[values.dtype]
        lo, hi = _bounds(values) if bounds is None else bounds
        lo, hi = lo + 0.0, hi + 0.0                            # + 0.0 turns -0.0 into 0.0
        self._ibits, self._shift = ibits, shift
        self._lo = int(np.array([lo], values.dtype).view(ibits)[0] >> shift)
        self.nb = int(np.array([hi], values.dtype).view(ibits)[0] >> shift) - self._lo + 2  # + NaN bin
        hist = np.zeros(ngroups * self.nb, dtype=np.int64)
        for idx, _ in self._chunks():
            hist += np.bincount(idx, minlength=len(hist))
        self.hist = hist.reshape(ngroups, self.nb)
        self.counts = self.hist[:, :-1].sum(axis=1)      # non-NaN values per group

    @classmethod
    def of(cls, values: np.ndarray, codes: np.ndarray | None = None, ngroups: int = 1):
        """The histogram, or None where it does not apply (see applies); the value range is
        computed once for both."""
        if values.dtype not in BITS or len(values) == 0:
            return None
        bounds = _bounds(values)
        return cls(values, codes, ngroups, bounds=bounds) if cls.applies(values, ngroups, bounds) else None

    @staticmethod
    def applies(values: np.ndarray, ngroups: int = 1, bounds: tuple[float, float] | None = None) -> bool:
        """Float values, none negative, not all NaN, and a histogram of a sane size."""
        if values.dtype not in BITS or len(values) == 0:
            return False
        lo, hi = _bounds(values) if bounds is None else bounds
        if not (lo >= 0 and np.isfinite(hi)):
            return False
        ibits, shift = BITS[values.dtype]
        b = np.array([lo + 0.0, hi], values.dtype).view(ibits) >> shift
        return ngroups * (int(b[1] - b[0]) + 2) <= MAX_BINS

    def _chunks(self):
        # Clearing the sign bit maps -0.0 to 0.0 and -NaN to NaN; every NaN bit pattern then lies
        # above every finite value's, so clipping to the last bin puts NaN there (no isnan pass).
        sign_off, top = np.iinfo(self._ibits).max, self.nb - 1
        for s in range(0, len(self.x), self.chunk):
            xc = self.x[s:s + self.chunk]
            b = xc.view(self._ibits) & sign_off
            b >>= self._shift
            if b.dtype != np.int64:
                b = b.astype(np.int64)
            b -= self._lo
            np.minimum(b, top, out=b)
            if self.codes is not None:
                b += self.codes[s:s + self.chunk] * self.nb
            yield b, xc

    def values_at(self, ranks: np.ndarray) -> np.ndarray:
        """ranks: (ngroups, R) 0-based ranks among each group's non-NaN values; groups without
        values get NaN. Returns sorted(group values)[ranks] exactly, shape (ngroups, R)."""
        return self.values_at_regrouped([(np.arange(self.ngroups), self.ngroups, ranks)])[0]

    def regrouped_hist(self, to: np.ndarray, ngroups: int) -> np.ndarray:
        """The histogram of coarser groups: group `to[g]` holds this histogram's group g."""
        if ngroups == self.ngroups and np.array_equal(to, np.arange(ngroups)):
            return self.hist
        hist = np.zeros((ngroups, self.nb), dtype=np.int64)
        np.add.at(hist, to, self.hist)
        return hist

    def values_at_regrouped(self, plans: list) -> list[np.ndarray]:
        """Order statistics of several coarser groupings in one collection pass. plans: (to,
        ngroups, ranks) with `to` mapping this histogram's groups to a grouping's groups and
        ranks (ngroups, R) as in values_at. So one histogram over fine cells (say model x
        class x length bucket) serves every breakdown of a metric."""
        nb, prepared = self.nb, []
        need = np.zeros((self.ngroups, nb), dtype=bool)
        for to, ngroups, ranks in plans:
            ranks = np.asarray(ranks, dtype=np.int64)
            hist = self.regrouped_hist(to, ngroups)
            live = hist[:, :-1].sum(axis=1) > 0
            cum = np.cumsum(hist, axis=1)
            bins = np.zeros_like(ranks)
            for g in np.flatnonzero(live):                # loops over groups, never values
                bins[g] = np.searchsorted(cum[g], ranks[g], side="right")
            want = np.zeros((ngroups, nb), dtype=bool)
            want[np.nonzero(live)[0][:, None], bins[live]] = True
            need |= want[to]
            prepared.append((to, ngroups, ranks, hist, cum, bins, want, live))
        lut = need.ravel()
        picked = [(xc[sel], idx[sel]) for idx, xc in self._chunks() for sel in (lut[idx],)]
        sv = np.concatenate([p[0] for p in picked]) + 0.0         # + 0.0: -0.0 reads as 0.0
        si = np.concatenate([p[1] for p in picked])
        cell, b = np.divmod(si, nb)
        out = []
        for to, ngroups, ranks, hist, cum, bins, want, live in prepared:
            g = to[cell]
            keep = want[g, b]
            v, key = sv[keep], g[keep] * nb + b[keep]
            order = np.lexsort((v, key))                  # by (group, bin), then value
            v, key = v[order], key[order]
            flat = np.arange(ngroups)[:, None] * nb + bins
            before = np.take_along_axis(cum, bins, 1) - np.take_along_axis(hist, bins, 1)
            pos = np.searchsorted(key, flat, side="left") + (ranks - before)
            vals = v[np.clip(pos, 0, max(len(v) - 1, 0))].astype(np.float64) if len(v) else \
                np.zeros(ranks.shape)
            out.append(np.where(live[:, None], vals, np.nan))
        return out

    def nansum(self) -> float:
        # Without NaN, np.sum is what np.nansum computes (same pairwise sums), minus its copy.
        total = np.sum if not self.hist[:, -1].any() else np.nansum
        return float(sum(total(self.x[s:s + self.chunk], dtype=np.float64)
                         for s in range(0, len(self.x), self.chunk)))
