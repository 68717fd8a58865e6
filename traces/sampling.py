"""Row draws shared by the session generator (generate.py) and the task-graph generator
(agents.py): length (and count, and think-time) distributions, categorical picks,
per-segment sums, arrival order and images per row.

Distributions are sampled by inverse CDF from standard normal draws, so that a Gaussian
copula gives any target Spearman rho between two of them; vectorised over whole arrays;
lognormal skips the CDF round trip (exp(mu + sigma z) is its inverse CDF), the others use
scipy.stats' ppf on Phi(z).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special, stats

from .spec_types import Client, Dist, Images



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
    u = np.clip(special.ndtr(z), 1e-15, 1 - 1e-15)  # strictly inside (0, 1): no ppf returns inf
    if f == "uniform":
        return p["low"] + u * (p["high"] - p["low"])
    if f == "gamma":
        return stats.gamma.ppf(u, p["shape"], scale=p["scale"])
    if f == "weibull":
        return stats.weibull_min.ppf(u, p["shape"], scale=p["scale"])
    k, cdf = _table(d)
    return k[np.minimum(np.searchsorted(cdf, u, side="left"), len(k) - 1)].astype(np.float64)


def finish(x: np.ndarray, d: Dist, scale: float = 1.0, cap: int | None = None, integer: bool = True) -> np.ndarray:
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
    za, zb = rng.standard_normal(n), rng.standard_normal(n)
    if rho:
        r = 2 * math.sin(math.pi * rho / 6)
        zb = r * za + math.sqrt(1 - r * r) * zb
    return sample_from_normal(a, za), sample_from_normal(b, zb)


def discrete_mean(d: Dist) -> float:
    """Mean of the rounded, capped distribution (e.g. turns per session), from a dense
    deterministic quantile grid: exact enough to set a session start rate."""
    z = special.ndtri((np.arange(20000) + 0.5) / 20000)
    return float(finish(sample_from_normal(d, z), d).mean())


NS_BITS = 40          # hash ids: client namespace in the high bits, (1 << 39) marks partial blocks


def segmented_cumsum(x: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cumulative sum restarting at each segment start (rows are segment-major)."""
    cs = np.cumsum(x)
    cs -= np.repeat(cs[first] - x[first], counts)
    return cs


def pick(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Categorical draws: row i picks from weights[i] (or from `weights` if 1-D) with uniform u."""
    cum = np.cumsum(weights, axis=-1)
    cum = cum / cum[..., -1:]
    if cum.ndim == 1:
        return np.minimum(np.searchsorted(cum, u, side="right"), len(cum) - 1)
    return np.minimum((u[:, None] >= cum).sum(axis=1), cum.shape[1] - 1)


def draw_labels(c: Client, starts: np.ndarray, seg: np.ndarray, r_model: np.random.Generator,
                r_fail: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per row (`seg`: its session's or task's start): the model, drawn per start from the weights
    of the mix window it falls in; whether it failed; its SLO class index (None without classes).
    No failure draws when nothing uses them (a stream is only ever read from its start)."""
    w = np.array([m.weight for m in c.models], dtype=np.float64)       # models x windows
    win = np.minimum((np.maximum(starts, 0) // c.mix_window).astype(np.int64), w.shape[1] - 1)
    model = pick(w.T[win] if w.shape[1] > 1 else w[:, 0], r_model.random(len(starts)))[seg]
    n = len(seg)
    failed = r_fail.random(n) < c.failures if c.failures or c.slo_class else np.zeros(n, bool)
    return model, failed, pick(np.array(list(c.slo_class.values())), r_fail.random(n)) if c.slo_class else None


def exact_scale(t: np.ndarray, keep: int | None, duration: float) -> float:
    """exact_count: the factor that moves the keep-th time at or after 0 to duration (keep - 1) /
    keep, as `arrival_times` places the last start (1 without enough such times)."""
    if keep is None or keep < 2 or (t >= 0).sum() < keep:
        return 1.0
    nth = float(np.partition(t[t >= 0], keep - 1)[keep - 1])
    return duration * (keep - 1) / keep / nth if nth > 0 else 1.0


def arrival_order(t: np.ndarray, duration: float, quantum_s: float | None = None,
                   limit: int | None = None) -> dict[str, np.ndarray]:
    """Arrival in ns, and `order`: the indices of the rows in [0, duration) by arrival (a
    stable sort: equal arrivals keep their draw order); `keep` marks those rows if not all.

    `quantum_s` (the spec's timestamp_quantum_s): each arrival is floored to a multiple of it
    (in whole ns, from t = 0), as the source's bucketed clock wrote them; flooring is monotone
    and the sort stable, so a turn (drawn after its parent, never earlier) still follows it.
    `limit`: only the first `limit` rows by arrival are kept (exact_count with sessions)."""
    rows = {"arrival_ns": np.rint(t * 1e9).astype(np.int64)}
    if quantum_s:
        q = max(int(round(quantum_s * 1e9)), 1)
        rows["arrival_ns"] //= q
        rows["arrival_ns"] *= q
    keep = (t >= 0) & (t < duration)
    if keep.all() and (limit is None or limit >= len(t)):
        rows["order"] = np.argsort(rows["arrival_ns"], kind="stable")
    else:
        idx = np.flatnonzero(keep)
        order = idx[np.argsort(rows["arrival_ns"][idx], kind="stable")]
        if limit is not None and len(order) > limit:
            order = order[:limit]
            keep = np.zeros(len(t), bool)
            keep[order] = True
        rows["keep"], rows["order"] = keep, order
    return rows


def client_px(c: Client) -> list[str]:
    """The image sizes a client can draw, sorted (its local dictionary for `px` codes)."""
    return sorted({s for img in (m.images or c.images for m in c.models) if img for s in img.px})


def image_rows(c: Client, model: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Images per row, independent of the lengths: `nimg` from the model's count distribution
    (0 for a model without images), `px` a size index into `client_px(c)`. Models sharing
    one images spec are drawn together."""
    sizes = client_px(c)
    nimg, px = np.zeros(len(model), np.int16), np.zeros(len(model), np.int32)
    groups: dict[int, tuple[Images, list[int]]] = {}
    for mi, img in enumerate([m.images or c.images for m in c.models]):  # a model's own, else the client's
        if img is not None:
            groups.setdefault(id(img), (img, []))[1].append(mi)
    for img, mis in groups.values():
        rows = slice(None) if len(mis) == len(c.models) else np.flatnonzero(np.isin(model, mis))
        k = len(model) if isinstance(rows, slice) else len(rows)
        nimg[rows] = sample(img.count, rng, k)
        codes = np.array([sizes.index(s) for s in img.px], np.int32)
        px[rows] = codes[pick(np.array(list(img.px.values())), rng.random(k))] if len(codes) > 1 else codes[0]
    return {"nimg": nimg, "px": px}
