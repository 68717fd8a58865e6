"""Row draws shared by the session generator (generate.py) and the task-graph generator
(agents.py): categorical picks, per-segment sums, arrival order and images per row."""
from __future__ import annotations

import numpy as np

from .lengths import sample
from .spec_types import Client, Images

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
        rows["keep"] = keep
        rows["order"] = order
    return rows


def model_images(c: Client) -> list[Images | None]:
    """Each model's images: its own, else the client's, else none."""
    return [m.images or c.images for m in c.models]


def client_px(c: Client) -> list[str]:
    """The image sizes a client can draw, sorted (its local dictionary for `px` codes)."""
    return sorted({s for img in model_images(c) if img is not None for s in img.px})


def image_rows(c: Client, model: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Images per row, independent of the lengths: `nimg` from the model's count distribution
    (0 for a model without images), `px` a size index into `client_px(c)`. Models sharing
    one images spec are drawn together."""
    sizes = client_px(c)
    nimg, px = np.zeros(len(model), np.int16), np.zeros(len(model), np.int32)
    groups: dict[int, tuple[Images, list[int]]] = {}
    for mi, img in enumerate(model_images(c)):
        if img is not None:
            groups.setdefault(id(img), (img, []))[1].append(mi)
    for img, mis in groups.values():
        rows = slice(None) if len(mis) == len(c.models) else np.flatnonzero(np.isin(model, mis))
        k = len(model) if isinstance(rows, slice) else len(rows)
        nimg[rows] = sample(img.count, rng, k)
        codes = np.array([sizes.index(s) for s in img.px], np.int32)
        px[rows] = codes[pick(np.array(list(img.px.values())), rng.random(k))] if len(codes) > 1 else codes[0]
    return {"nimg": nimg, "px": px}
