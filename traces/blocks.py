"""The `hash_ids` of generated rows: each row's block layout (system prompt, application
prefix from the client's pool, the session's own content, a branch's fresh range) and the
list<int64> column built from it, for `generate`.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .sampling import NS_BITS, pick, sample
from .spec_types import Client, Spec


def _pool_draws(c: Client, n_sess: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per session: whether it opens with the system prompt (0/1) and with which pool prefix
    (-1: none); and each pool prefix's length in blocks. One uniform per session decides
    both, so that they overlap as little as their shares allow: a system prompt on every
    session carries the pool's prefixes after it, one on some sessions (one application's
    own) none of them."""
    u, pool = rng.random(n_sess), c.prefix.pool
    has_sys = (u < c.prefix.system_share).astype(np.int32)
    if pool is None:
        return has_sys, np.full(n_sess, -1, np.int64), np.zeros(0, np.int64)
    lens = (np.asarray(pool.blocks, np.int64) if isinstance(pool.blocks, list)
            else sample(pool.blocks, rng, pool.size).astype(np.int64))
    w = np.asarray(pool.popularity, float) if pool.popularity else np.arange(1.0, pool.size + 1) ** -pool.zipf
    entry = np.where(u >= 1 - pool.share, pick(w, rng.random(n_sess)), -1)
    return has_sys, entry, lens


def _pool_tokens(spec: Spec, c: Client, pre: tuple, sess: np.ndarray, first: np.ndarray) -> np.ndarray | None:
    """Per row, the shared prefix's tokens (system prompt and pool prefix) that a pool
    session's first turn starts with (0 elsewhere); None when the pool has no tail (the
    prefix is then cut from the drawn input)."""
    if c.prefix.pool is None or c.prefix.pool.tail is None:
        return None
    has_sys, entry, lens = pre
    blocks = has_sys * c.prefix.system_blocks + lens[np.maximum(entry, 0)]
    tok = np.zeros(len(sess), np.int64)
    tok[first] = np.where(entry >= 0, blocks * spec.block_size, 0)
    return tok


def _prefix_rows(spec: Spec, c: Client, ci: int, inp: np.ndarray, sess: np.ndarray, first: np.ndarray,
                 pre: tuple, cut: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-row block layout: [system prompt][application prefix][session content][partial].

    Full blocks only are shared; pool prefix i holds ids after those of prefixes 0..i-1; a
    session's content blocks are one contiguous id range, so turn k+1 (which extends turn
    k's prompt) repeats turn k's content ids. A branch (`cut` >= 0, sessions.branch) keeps
    the first max(1, cut x first-turn content) content blocks and continues in a fresh
    range, which its later turns repeat: `shift` is added to its ids from position `cut`."""
    p, bs = c.prefix, spec.block_size
    has_sys, entry, lens = pre
    # int32 per row (a block count is below the int32 token count): half the memory traffic
    full = inp // np.int32(bs)
    n_sys = np.minimum(full, has_sys[sess] * np.int32(p.system_blocks))
    e = np.maximum(entry, 0)[sess]
    content = full - n_sys
    n_app = np.zeros_like(content) if not len(lens) else np.minimum(
        content, np.where(entry[sess] >= 0, lens[e], 0).astype(np.int32))
    content -= n_app
    ns = np.int64(ci + 1) << NS_BITS
    partial = inp % np.int32(bs) > 0
    app_base = ns + p.system_blocks + (np.cumsum(lens) - lens)[e] if len(lens) else np.zeros(len(inp), np.int64)
    out = {"n_sys": n_sys, "n_app": n_app, "partial": partial, "app_base": app_base}
    starts = first
    if cut is not None:  # a branch opens a segment of its own
        opens = cut >= 0
        opens[first] = True
        starts = np.flatnonzero(opens)
        keep = np.where(cut >= 0, np.maximum(cut * content[first][sess], 1), 0).astype(np.int64)[starts]
    span = np.maximum.reduceat(content, starts).astype(np.int64) if len(starts) else np.zeros(0, np.int64)
    if cut is not None:
        span = np.maximum(span - keep, 0)
    base = ns + p.system_blocks + lens.sum() + np.cumsum(span) - span
    if cut is not None:
        segment = np.cumsum(opens) - 1
        base_a = base[segment[first]][sess]   # the session's first range
        out.update(cut=(n_sys + n_app + keep[segment]).astype(np.int64), shift=base[segment] - base_a - keep[segment])
        base = base_a
    else:
        base = base[sess]
    full += partial  # (in place: full blocks plus the unfinished one)
    out.update(nb=full, content_base=base - (n_sys + n_app))
    return out


def _hash_ids(r: dict[str, np.ndarray], has: np.ndarray, client: np.ndarray, row0: int) -> pa.Array:
    """Build the list<int64> column from the per-row layout of trace rows row0.. (rows already
    in final order).

    Content blocks are a per-row base plus the position; the few system and application
    positions are then overwritten one position index at a time. Rows go in slices of 1M so
    that the temporaries stay small next to the 10M-row columns."""
    nb = np.where(has, r["nb"], 0)
    offsets = np.zeros(len(nb) + 1, np.int64)
    np.cumsum(nb, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), np.int64)
    step = 1 << 20
    for lo in range(0, len(nb), step):
        hi = min(lo + step, len(nb))
        off, n = offsets[lo:hi + 1], nb[lo:hi].astype(np.int64)
        seg = ids[off[0]:off[-1]]
        seg[:] = np.repeat(r["content_base"][lo:hi] - off[:-1], n)
        seg += np.arange(off[0], off[-1], dtype=np.int64)
        start = off[:-1] - off[0]
        if "shift" in r:  # branches: their blocks from `cut` on lie in a range of their own
            rows = np.flatnonzero(r["shift"][lo:hi] != 0)
            c, m = r["cut"][lo:hi][rows], n[rows]
            m = np.maximum(m - c, 0)
            seg[np.repeat(start[rows] + c - np.cumsum(m) + m, m) + np.arange(m.sum())] += np.repeat(
                r["shift"][lo:hi][rows], m)
        ns = (client[lo:hi].astype(np.int64) + 1) << NS_BITS
        n_sys, n_app = r["n_sys"][lo:hi], r["n_app"][lo:hi]
        for j in range(int(n_sys.max(initial=0))):
            rows = np.flatnonzero(n_sys > j)
            seg[start[rows] + j] = ns[rows] + j
        for j in range(int(n_app.max(initial=0))):
            rows = np.flatnonzero(n_app > j)
            seg[start[rows] + n_sys[rows] + j] = r["app_base"][lo:hi][rows] + j
        last = np.flatnonzero(r["partial"][lo:hi] & has[lo:hi] & (n > 0))  # unfinished last block: unique
        seg[start[last] + n[last] - 1] = (ns[last] | (np.int64(1) << (NS_BITS - 1))) + row0 + lo + last
    mask = None if has.all() else pa.array(~has)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids), mask=mask)
