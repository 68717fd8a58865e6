"""Conversations and shared prefixes of a trace, from its `hash_ids` blocks (or `session_id`).

Which earlier request a request continues (its parent turn), the conversations those links
make, how far back a prefix-cache hit reaches, and the application prefixes that many
conversations open with; vectorised like `traces.stats`, whose helpers it uses.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .stats import _lengths, _tbl, arrivals_ns, count_quantile, quantiles


def _blocks(table: Any) -> dict[str, np.ndarray] | None:
    """The flattened `hash_ids` of a table or Trace (rows in arrival order): `ids`, `row` per block, `lens`
    and `offsets` per row, `prev` (per block: the latest earlier row holding the same id, -1
    when none; a repeat inside one row does not count) and `reused` (the leading run of
    cached blocks of each row, as `prefix_cache_hits` counts it). None without blocks."""
    t = _tbl(table)
    if "hash_ids" not in t.column_names or t.column("hash_ids").null_count == t.num_rows:
        return None
    col = t.column("hash_ids").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    ids = col.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if len(ids) == 0:
        return None
    lens = np.diff(offsets)
    row = np.repeat(np.arange(len(lens)), lens)
    order = np.lexsort((row, ids))            # by id, then row (then position)
    s_id, s_row = ids[order], row[order]
    run = np.ones(len(ids), bool)             # a run: one id within one row
    run[1:] = (s_id[1:] != s_id[:-1]) | (s_row[1:] != s_row[:-1])
    starts = np.flatnonzero(run)
    before = np.maximum(starts - 1, 0)
    prev_run = np.where((starts > 0) & (s_id[before] == s_id[starts]), s_row[before], -1)
    prev = np.empty(len(ids), np.int64)
    prev[order] = prev_run[np.cumsum(run) - 1]
    miss_cum = np.cumsum(prev < 0)
    start = offsets[:-1][row]
    base = np.where(start > 0, miss_cum[np.maximum(start - 1, 0)], 0)
    return {"ids": ids, "row": row, "lens": lens, "offsets": offsets, "prev": prev, "reused": (miss_cum - base) == 0}


def reuse_distances(table: Any) -> dict[str, Any] | None:
    """Reuse distance of every prefix-cache hit (the blocks `prefix_cache_hits` counts as
    reused): how many **requests** arrived since the block was last used (1 = the previous
    request used it), and how many seconds. A hit survives an LRU cache that holds the blocks
    of the last d requests when its distance is <= d. Quantiles p50/p90/p99 and mean of each;
    None without hash_ids or hits."""
    b = _blocks(table)
    if b is None or not b["reused"].any():
        return None
    r, p, a = b["row"][b["reused"]], b["prev"][b["reused"]], arrivals_ns(table)
    return {"unit": "requests", "hits": int(len(r)), "requests": quantiles(r - p),
            "seconds": quantiles((a[r] - a[p]) / 1e9)}


MAX_FANOUT = 3   # a block followed by more distinct blocks than this is a shared prefix, not a turn


def prefix_parents(table: Any) -> np.ndarray | None:
    """Conversation turns inferred from `hash_ids` (for traces without `session_id`, e.g.
    Mooncake): row r continues row p when the last block of r's reused leading run was last
    used by p and is conversation-private: followed, over the whole trace, by at most
    MAX_FANOUT distinct blocks (a system prompt or document shared by many conversations is
    followed by many). A row may so branch off its parent's history (an edited or restarted
    conversation: ~15 % of the Mooncake conversation trace's continuations) -- it stays in the
    conversation (its arrivals cluster with it), and `turn_stats` counts no negative new
    tokens for it; prefixes shared across conversations are `shared_prefixes`. Returns the
    parent row per row (-1 = opens a conversation); None without hash_ids."""
    b = _blocks(table)
    if b is None:
        return None
    row, lens, offsets = b["row"], b["lens"], b["offsets"]
    n_reused = np.bincount(row, weights=b["reused"], minlength=len(lens)).astype(np.int64)
    has = n_reused > 0
    last = offsets[:-1][has] + n_reused[has] - 1        # the last reused block of each row
    parent = np.full(len(lens), -1, np.int64)
    ok = _fanout(b)[last] <= MAX_FANOUT
    parent[np.flatnonzero(has)[ok]] = b["prev"][last[ok]]
    return parent


def _fanout(b: dict[str, np.ndarray]) -> np.ndarray:
    """Per block occurrence: how many distinct blocks follow its id anywhere in the trace."""
    ids, row = b["ids"], b["row"]
    same = row[1:] == row[:-1]
    a, c = ids[:-1][same], ids[1:][same]
    if not len(a):
        return np.zeros(len(ids), np.int64)
    o = np.lexsort((c, a))       # (np.unique(axis=1) sorts void rows: 20x slower)
    a, c = a[o], c[o]
    distinct = np.ones(len(a), bool)
    distinct[1:] = (a[1:] != a[:-1]) | (c[1:] != c[:-1])
    succ_id, succ_n = np.unique(a[distinct], return_counts=True)
    k = np.minimum(np.searchsorted(succ_id, ids), len(succ_id) - 1)
    return np.where(succ_id[k] == ids, succ_n[k], 0)


def private_blocks(table: Any) -> np.ndarray | None:
    """Per row: whether a block before its last one is conversation-private (followed by at
    most MAX_FANOUT distinct blocks): only such a row can be found as the parent of a later
    turn by `prefix_parents` (the last block is usually a partial one, unique to the row).
    None without hash_ids."""
    b = _blocks(table)
    if b is None:
        return None
    not_last = np.ones(len(b["ids"]), bool)
    not_last[b["offsets"][1:][b["lens"] > 0] - 1] = False
    return np.bincount(b["row"], weights=not_last & (_fanout(b) <= MAX_FANOUT), minlength=len(b["lens"])) > 0


def has_sessions(table: Any) -> bool:
    """Whether the trace has a (not all-null) `session_id` column."""
    t = _tbl(table)
    return "session_id" in t.column_names and t.column("session_id").null_count < t.num_rows


def _turn_links(t: pa.Table, source: str | None = None) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(conversation id per row, parent row per row or -1, source): from `session_id`
    (consecutive requests of a session, by arrival) or else (or when `source` is
    "hash_ids") inferred from `hash_ids`."""
    if source != "hash_ids" and has_sessions(t):
        col = pc.dictionary_encode(t.column("session_id").cast(pa.string())).combine_chunks()
        sid = col.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        sid = np.where(sid >= 0, sid, -1 - np.arange(len(sid)))  # no session: its own
        order = np.argsort(sid, kind="stable")                      # rows are in arrival order
        parent = np.full(len(sid), -1, np.int64)
        cont = np.flatnonzero(sid[order][1:] == sid[order][:-1]) + 1
        parent[order[cont]] = order[cont - 1]
        return sid, parent, "session_id"
    parent = prefix_parents(t)
    if parent is None:
        return None
    root = np.where(parent >= 0, parent, np.arange(len(parent)))
    while (root[root] != root).any():  # pointer jumping: each round doubles the reach (log2(longest chain) rounds)
        root = root[root]
    # (a row's parent is earlier, so every chain ends at a row without one)
    return root, parent, "hash_ids"


def turn_stats(table: Any, block_size: int | None = None, source: str | None = None) -> dict[str, Any] | None:
    """Session structure: turns (requests) per conversation, the gap between consecutive
    turns' arrivals (s), and context growth per turn: `growth` = input_tokens(k+1) -
    input_tokens(k), `new_tokens` = input_tokens(k+1) - input_tokens(k) - output_tokens(k)
    (the user's new text when the prompt carries the whole history; at least 0: a prompt that
    dropped part of the answer adds none). Conversations come from
    `session_id` or, without it, from the `hash_ids` chains (`prefix_parents`); `source` says
    which (`source="hash_ids"` infers them even when `session_id` is there, so that a trace
    without sessions compares with one that has them). None when neither column is there.
    (`block_size` is not used: conversations are found from the ids alone.)"""
    t = _tbl(table)
    links = _turn_links(t, source)
    if links is None:
        return None
    sid, parent, source = links
    _, turns = np.unique(sid, return_counts=True)
    child = np.flatnonzero(parent >= 0)
    p = parent[child]
    a, inp, out = arrivals_ns(t), _lengths(t, "input_tokens"), np.nan_to_num(_lengths(t, "output_tokens"))
    q = quantiles(turns.astype(np.float64))
    q = {"mean": q["mean"], "p50": count_quantile(turns, 0.5), "p90": count_quantile(turns, 0.9), "max": q["max"]}
    return {"source": source, "sessions": int(len(turns)), "turns": q,
            "multi_turn_share": float(turns[turns > 1].sum() / max(t.num_rows, 1)),
            "gap_s": quantiles((a[child] - a[p]) / 1e9), "growth": quantiles(inp[child] - inp[p]),
            "new_tokens": quantiles(np.maximum(inp[child] - inp[p] - out[p], 0))}


def shared_prefixes(table: Any, start: np.ndarray | None = None, opens: np.ndarray | None = None,
                    source: str | None = None) -> dict[str, np.ndarray] | None:
    """The application prefix each session opens with. A row's shared run: its leading blocks,
    from `start` (per row, default 0), whose ids other conversations use too (a conversation's
    own history recurs only within it; conversations as `turn_stats`, `source` alike). A
    session's prefix: the longest one inside its first row's run (`opens`, default the first
    row of each conversation) that at least MIN_SHARED_USES sessions open with (fewer: a
    branched conversation, a document pasted twice). Per row: `key`, the prefix's last block
    id (ids are chained: it names the whole prefix; -1: none, or not an opening row),
    `blocks`, its length, and `root`, the row's conversation. None without hash_ids."""
    t = _tbl(table)
    b, links = _blocks(t), _turn_links(t, source)
    if b is None or links is None:
        return None
    ids, row, root, base = b["ids"], b["row"], links[0], b["offsets"][:-1]
    o = np.lexsort((root[row], ids))
    si, sr = ids[o], root[row][o]
    first = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
    convs = np.add.reduceat(np.r_[True, (si[1:] != si[:-1]) | (sr[1:] != sr[:-1])], first)  # per id
    shared = np.empty(len(ids), bool)
    shared[o] = np.repeat(convs >= 2, np.diff(np.r_[first, len(si)]))
    s = np.zeros(len(b["lens"]), np.int64) if start is None else np.asarray(start, np.int64)
    if opens is None:
        opens = np.zeros(len(s), bool)
        opens[np.unique(root, return_index=True)[1]] = True
    pos = np.arange(len(ids)) - base[row]
    stop = b["lens"].copy()                 # the first block from `start` that is not shared
    cut = ~shared & (pos >= s[row])
    np.minimum.at(stop, row[cut], pos[cut])
    run = opens & (stop > s)
    keys, cnt = np.unique(ids[base[run] + stop[run] - 1], return_counts=True)
    inside = opens[row] & (pos >= s[row]) & (pos < stop[row]) & np.isin(ids, keys[cnt >= MIN_SHARED_USES])
    depth = np.full(len(s), -1, np.int64)
    np.maximum.at(depth, row[inside], pos[inside])
    has = depth >= 0
    key = np.full(len(s), -1, np.int64)
    key[has] = ids[base[has] + depth[has]]
    return {"key": key, "blocks": np.where(has, depth - s + 1, 0), "root": root}


MIN_SHARED_USES = 3   # conversations that open with one prefix, for it to be an application's


def prefix_pool_stats(table: Any, source: str | None = None, block_size: int | None = None) -> dict[str, Any] | None:
    """`shared_prefixes` from the first block (a system prompt counts as one), per conversation:
    the distinct prefixes, the share of conversations that open with one, its length in blocks
    (quantiles over them) and the most used one's share of them. None without hash_ids. (`block_size`: unused.)"""
    sp = shared_prefixes(table, source=source)
    if sp is None:
        return None
    app = sp["key"] >= 0
    _, cnt = np.unique(sp["key"][app], return_counts=True)
    conversations = len(np.unique(sp["root"]))
    return {"prefixes": int(len(cnt)), "share": float(app.sum() / conversations), "conversations": conversations,
            "blocks": quantiles(sp["blocks"][app]), "top_share": float(cnt.max() / app.sum()) if len(cnt) else None}
