"""`replay trace fit T -o SPEC.yaml`: learn a generator spec that reproduces a trace.

Per client (the trace's `client_id` when it has at most 64 of them, else one client): the
rate profile and arrival process (`fit_dists`), per model the input and output lengths and
their Spearman rho, the model mix (per window when it drifts), SLO classes, failures,
sessions (turns, think time, new user tokens per turn, branches), the prefix structure of
hash_ids (a system prompt and a pool of application prefixes shared across sessions), and
per model the images per request (the exact count PMF) and the most common image size, and
the reasoning share of the output (`reasoning_tokens`: a PMF of the per-request share).
A client with task graphs (`depends_on`) gets an `agent` section instead of sessions and
prefix (`_fit_agent`); its arrivals are then the roots (task starts).
A bucketed clock (`stats.timestamp_buckets`, or a `dequantize` op in the source's metadata) is
written as the top-level `timestamp_quantum_s` (+ `timestamp_spread`), which generate applies
to every row; the arrival model is fitted under it and judged on all rows (`_fit_client`), its
renewal CV read off the bucket counts (`fit_dists._bucket_cv`), and the duration is the span
plus one bucket.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import optimize as sst_opt
from scipy import stats as sst

from . import prefixes, stats
from .errors import TraceError
from .fit_dists import empirical, fit_arrivals, fit_length
from .spec import MAX_DURATION_S

MAX_CLIENTS = 64          # more distinct client_ids than this: one aggregate client
MAX_WINDOWS = 1_000_000   # rate-profile / model-mix windows of --window (the default makes ~48)


def _has(t: pa.Table, name: str) -> bool:
    return name in t.column_names and t.column(name).null_count < t.num_rows


def _col(t: pa.Table, name: str) -> np.ndarray | None:
    return t.column(name).to_numpy(zero_copy_only=False) if _has(t, name) else None


def _codes(t: pa.Table, name: str) -> tuple[np.ndarray, list[str]] | None:
    if not _has(t, name):
        return None
    col = pc.dictionary_encode(t.column(name).cast(pa.string())).combine_chunks()
    return col.indices.fill_null(-1).to_numpy(zero_copy_only=False), [str(v) for v in col.dictionary.to_pylist()]


MIN_IMPLICIT_TURNS = 0.05   # share of rows that must continue a hash_ids chain to fit sessions from them


def _implicit_sessions(t: pa.Table) -> np.ndarray | None:
    """Without `session_id`: conversations inferred from `hash_ids` chains
    (`prefixes.prefix_parents`: a row continues the last row that used its last reused,
    conversation-private block), as the root row of each row's chain; None when no hash_ids
    or fewer than MIN_IMPLICIT_TURNS of the rows continue one (e.g. only a shared system prompt)."""
    links = None if _has(t, "session_id") else prefixes._turn_links(t, "hash_ids")
    if links is None or (links[1] >= 0).mean() < MIN_IMPLICIT_TURNS:
        return None
    return links[0]


def _fit_sessions(t: pa.Table) -> tuple[dict[str, Any], np.ndarray]:
    """Turns per session, think time, new user tokens; the mask of rows that open a session.
    Sessions are `session_id` (a row without one is its own), or (without it) the conversations
    of `_implicit_sessions`."""
    implicit = not _has(t, "session_id")
    sid = prefixes._turn_links(t)[0]
    order = np.lexsort((_col(t, "arrival_ns"), sid))
    s, a = sid[order], _col(t, "arrival_ns")[order].astype(np.int64)
    same = np.concatenate([[False], s[1:] == s[:-1]])
    starts = np.flatnonzero(~same)
    turn = None if implicit else _col(t, "turn")  # turn numbers also count the turns before the trace began
    last_turn = (np.diff(np.append(starts, len(s))) - 1.0 if turn is None
                 else np.maximum.reduceat(np.nan_to_num(turn[order].astype(float)), starts))
    inp = _col(t, "input_tokens")[order].astype(float)
    outs = _col(t, "output_tokens")
    out = np.zeros(len(s)) if outs is None else np.nan_to_num(outs[order].astype(float))
    think = (a[1:] - a[:-1])[same[1:]] / 1e9
    user = (inp[1:] - inp[:-1] - out[:-1])[same[1:]]
    opens = np.zeros(len(s), bool)
    opens[order[~same]] = True
    turns = _undo_splits(t, last_turn + 1, order[starts]) if implicit else fit_length(last_turn + 1)
    spec = {"turns": turns, "think_s": fit_length(think, integer=False) if len(think) > 10
            else {"dist": "constant", "value": 30.0}}
    b = prefixes._blocks(t) if "hash_ids" in t.column_names else None
    if b is not None and same.sum() > 10:  # a turn that keeps only part of the previous one's blocks: a branch
        reused = np.bincount(b["row"], weights=b["reused"], minlength=t.num_rows)
        ext = reused[order[1:][same[1:]]] >= b["lens"][order[:-1][same[1:]]] - 1
        user = user[ext]   # (the user's new tokens are a growth; a branch's prompt is no growth)
        if (~ext).mean() >= 0.01:
            spec["branch"] = round(float((~ext).mean()), 4)
    if len(user) > 10:
        spec["user_tokens"] = fit_length(np.maximum(user, 1))
    return spec, opens


def _undo_splits(t: pa.Table, seen: np.ndarray, roots: np.ndarray) -> dict[str, Any]:
    """Turns per session for `_implicit_sessions`, as an exact PMF, corrected for the turns
    that chains cannot find. A turn is found only from a parent with a private full block, so
    a generated session whose first turn has none (share q, the share of observed roots
    without one) shows up as two chains, of 1 and K-1 turns. Observed chain counts d(k) =
    (1 - q) g(k) + q g(k + 1) for k >= 2 (and the rest at k = 1) are solved for the sessions
    to generate, g, from the longest down; the total of turns is unchanged."""
    seen = seen.astype(np.int64)
    d = np.bincount(seen).astype(float)
    private = prefixes.private_blocks(t)
    q = float(1 - private[roots].mean()) if private is not None and len(roots) else 0.0
    g = np.zeros(len(d) + 1)
    if q < 0.9:
        for k in range(len(d) - 1, 1, -1):
            g[k] = max((d[k] - q * g[k + 1]) / (1 - q), 0.0)
        g[1] = max(d[1] - q * g[2:].sum() - q * g[2], 0.0) if len(d) > 1 else 0.0
    if g[1:].sum() <= 0:
        g[:len(d)] = d
    g *= (np.arange(len(d)) * d).sum() / (np.arange(len(g)) * g).sum()  # the same number of requests
    k = np.flatnonzero(np.rint(g) > 0)
    if len(k) == 1:
        return {"dist": "constant", "value": float(k[0])}
    return empirical(k, np.rint(g[k]).astype(np.int64), float(k[0]), float(k[-1]))


def _fit_prefix(t: pa.Table, opens: np.ndarray | None = None,
                block_size: int = 16) -> tuple[dict[str, Any] | None, np.ndarray]:
    """System prompt (modal first block) and, with `opens` (the rows that open a session),
    the pool of application prefixes after it (`_fit_pool`); and the mask of the rows that
    open a session with one of them."""
    col = t.column("hash_ids").combine_chunks()
    lens = np.diff(col.offsets.to_numpy().astype(np.int64))
    pooled = np.zeros(len(lens), bool)
    if lens.sum() == 0:
        return None, pooled
    m = int(min(lens.max(), 256))
    ids = np.full((len(lens), m), -1, np.int64)
    row = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(len(row)) - np.repeat(np.cumsum(lens) - lens, lens)
    flat = col.flatten().to_numpy(zero_copy_only=False)
    keep = pos < m
    ids[row[keep], pos[keep]] = flat[keep]

    out: dict[str, Any] = {}
    vals, cnt = np.unique(ids[:, 0][ids[:, 0] >= 0], return_counts=True)
    sys_rows = np.zeros(len(lens), bool)
    if len(vals) and cnt.max() >= max(10, 0.05 * len(lens)):
        sys_rows = ids[:, 0] == vals[cnt.argmax()]
        rows, n = np.flatnonzero(sys_rows), 0
        while n < m:  # the leading blocks that at least 90 % of the rows with a full block there share
            v = ids[rows, n]
            v = v[v >= 0]  # rows with a full block here (short prompts truncate their prefix)
            if len(v) < max(0.1 * len(rows), 3) or np.unique(v, return_counts=True)[1].max() < 0.9 * len(v):
                break
            n += 1
        out["system_blocks"], out["system_share"] = n, round(float(sys_rows.mean()), 4)
    start = np.where(sys_rows, out.get("system_blocks", 0), 0)
    sp = prefixes.shared_prefixes(t, start, opens) if opens is not None else None
    if sp is not None:
        pooled = sp["key"] >= 0
        if pooled.sum() >= MIN_POOL_SHARE * opens.sum():
            inp = _col(t, "input_tokens").astype(float)
            out["pool"] = _fit_pool(sp["key"][pooled], sp["blocks"][pooled], pooled.sum() / opens.sum(),
                                    np.maximum(inp[pooled] - (start[pooled] + sp["blocks"][pooled]) * block_size, 1))
        else:
            pooled[:] = False
    return out, pooled


MIN_POOL_SHARE = 0.01     # sessions that open with a shared application prefix, for a pool
MAX_POOL_LISTED = 1000    # prefixes listed one by one; a larger pool: a length distribution and Zipf


def _fit_pool(key: np.ndarray, blocks: np.ndarray, share: float, tail: np.ndarray) -> dict[str, Any]:
    """The pool of application prefixes from the sessions that open with one (`key`: the
    prefix, `blocks`: its length, `tail`: the first turn's tokens after it): the share of
    sessions, each prefix's length and popularity (sessions), most popular first, and the
    tail's distribution. More than MAX_POOL_LISTED prefixes: their lengths' distribution and
    the Zipf exponent of their popularity (maximum likelihood over the sessions' ranks)."""
    keys, idx, cnt = np.unique(key, return_index=True, return_counts=True)
    order = np.lexsort((keys, -cnt))
    cnt, blocks = cnt[order], blocks[idx][order]
    pool: dict[str, Any] = {"share": round(float(share), 4)}
    if len(cnt) <= MAX_POOL_LISTED:
        pool.update(blocks=[int(b) for b in blocks], popularity=[int(c) for c in cnt])
    else:
        lr = np.log(np.arange(1.0, len(cnt) + 1))
        nll = lambda a: a * (cnt * lr).sum() + cnt.sum() * np.log(np.exp(-a * lr).sum())  # noqa: E731
        a = sst_opt.minimize_scalar(nll, bounds=(0.0, 5.0), method="bounded").x
        pool.update(size=int(len(cnt)), blocks=fit_length(blocks.astype(float)), zipf=round(float(a), 4))
    pool["tail"] = fit_length(tail)
    return pool


def _fit_images(t: pa.Table, counts: np.ndarray, rows: np.ndarray) -> dict[str, Any] | None:
    """Images of the requests in `rows` (a mask): the count's exact PMF (counts are 0..64, so
    no family is needed) and the most common size; None when none of them has an image (the
    generator then writes 0 for them)."""
    k = counts[rows]
    if not (k > 0).any():
        return None
    hist = np.bincount(k)
    return {"count": {int(c): round(float(hist[c] / len(k)), 6) for c in np.flatnonzero(hist)},
            "px": next(iter(stats.image_px_shares(t, rows, top=1)[0]))}


def _fit_reasoning(reason: np.ndarray, out: np.ndarray, rows: np.ndarray) -> dict[str, Any] | None:
    """The reasoning share (reasoning / output tokens) of the requests in `rows` (a mask) that
    say, as an exact PMF on a 0.01 grid (ServeGen's reason_ratio has 0.002 bins); None when
    none says. Drawn per request independently of the lengths, as generate does."""
    ok = rows & ~np.isnan(reason) & (np.nan_to_num(out) > 0)
    if not ok.any():
        return None
    vals, cnt = np.unique(np.round(np.minimum(reason[ok] / out[ok], 1.0), 2), return_counts=True)
    return empirical(vals, (cnt / cnt.sum()).round(8), 0.0, 1.0)


def _fit_agent(g: dict[str, Any], shared: int, block_size: int) -> dict[str, Any]:
    """The agent section from `stats.agent_samples` (tasks wholly inside the trace): steps per
    task, delay_s, context growth per step, the fan-out share, width and subagent prompt (its
    new tokens after the shared prefix), the context when histories are cut at one. The shared
    prefix (the leading blocks of `_fit_prefix`) goes into system_blocks: tools_blocks, the same
    kind of blocks, cannot be told apart from it."""
    ag: dict[str, Any] = {"steps": fit_length(g["steps"], empty=1.0),
                          "tool_delay_s": fit_length(g["delay_s"], integer=False),
                          "growth": fit_length(np.maximum(g["growth"], 0)), "system_blocks": shared, "tools_blocks": 0}
    if g["context"]:
        ag["context"] = int(g["context"])
    if len(g["width"]):
        ag["fanout"] = {"p": round(float((g["fanned"] > 0).mean()), 4), "width": fit_length(g["width"]),
                        "input": fit_length(np.maximum(g["sub_input"] - shared * block_size, 1))}
    return ag


def _mix(model: np.ndarray, names: list[str], t: np.ndarray, window: float) -> tuple[list[dict], bool]:
    """Model weights, one per `window` when a chi-square test says the mix drifts."""
    nb = max(int(t.max() // window) + 1, 1)
    table = np.zeros((nb, len(names)))
    np.add.at(table, ((t // window).astype(np.int64), model), 1)
    total = table.sum(0)
    drift = nb > 1 and len(names) > 1 and (table.sum(1) > 0).sum() > 1 and \
        sst.chi2_contingency(table[table.sum(1) > 0][:, total > 0])[1] < 1e-3
    if not drift:
        return [{"name": n, "weight": round(float(total[i] / total.sum()), 6)} for i, n in enumerate(names)], False
    rows = table.sum(1, keepdims=True)
    share = np.where(rows > 0, table / np.maximum(rows, 1), total / total.sum())  # empty windows: overall mix
    return [{"name": n, "weight": [round(float(v), 4) for v in share[:, i]]} for i, n in enumerate(names)], True


def _fit_client(t: pa.Table, name: str, duration: float, window: float,
                fixed_window: bool = False, buckets: dict[str, Any] | None = None,
                block_size: int = 16) -> dict[str, Any]:
    """One client's spec. `buckets` (`stats.timestamp_buckets` of the whole trace): the
    timestamps are a bucketed clock's, so the arrival model and think times are fitted on the
    times spread evenly over their buckets (`transform.spread_buckets`, what `dequantize`
    does: the process under the clock) and judged, simulated and floored to the buckets as
    `generate` will with the spec's timestamp_quantum_s, against the source as written."""
    a = _col(t, "arrival_ns").astype(np.int64)  # already relative to the trace's first arrival
    written = a / 1e9
    if buckets and not buckets.get("spread"):
        from .transform import spread_buckets
        a = spread_buckets(a, buckets["quantum_ns"], buckets["jitter_ns"])
        t = t.set_column(t.column_names.index("arrival_ns"), "arrival_ns", pa.array(a))
    times = a / 1e9
    opens = np.ones(len(a), bool)
    rate = len(a) / duration  # 6 decimals, and 6 digits below 0.1 req/s (a trace over years: ~1e-6)
    c: dict[str, Any] = {"name": name, "rate": round(rate, 6) if rate >= 0.1 else float(f"{rate:.6g}")}
    graph = stats.agent_samples(t)  # task graphs: arrivals are the roots (task starts)
    if graph is not None:
        opens = pc.list_value_length(t.column("depends_on")).fill_null(0).to_numpy(zero_copy_only=False) == 0
    elif _has(t, "session_id") or _implicit_sessions(t) is not None:
        c["sessions"], opens = _fit_sessions(t)
    starts = times[opens]
    # profile + arrival process (+ modulation), chosen by the IDC they reproduce on the whole
    # client (starts and turns, on the source's clock); `why` says so
    whole = {"sessions": c.get("sessions"), "timestamp_quantum_s": buckets["quantum_ns"] / 1e9 if buckets else None,
             "timestamp_spread": bool(buckets and buckets.get("spread"))}
    if graph is not None:  # tasks in flight at the start show a root each within gap_s: left out
        g = min(graph["gap_s"], duration / 2)
        c.update(fit_arrivals(starts[starts >= g] - g, duration - g, window, fixed_window))
    else:
        c.update(fit_arrivals(starts, duration, window, fixed_window, rows=times, target=written, client=whole))
    failed = _col(t, "failed_in_source")
    failed = failed.astype(bool) if failed is not None else np.zeros(len(a), bool)
    if failed.any():
        c["failures"] = round(float(failed.mean()), 6)
    inp, out = _col(t, "input_tokens").astype(float), _col(t, "output_tokens")
    out = np.full(len(a), np.nan) if out is None else out.astype(float)  # all null: server decides
    models, names = _codes(t, "model") or (np.zeros(len(a), np.int64), ["default"])
    models = np.where(models < 0, len(names), models)
    names = names + ["default"] if (models == len(names)).any() else names
    turn = _col(t, "turn")
    new = opens & (np.nan_to_num(turn.astype(float)) == 0) if "sessions" in c and turn is not None else opens
    if graph is not None:  # a task's own request: its first step's prompt after the shared prefix
        prefix = _fit_prefix(t)[0] if "hash_ids" in t.column_names else None
        shared = int(prefix.get("system_blocks", 0)) if prefix and prefix.get("system_share", 0) >= 0.9 else 0
        new = graph["roots"]
        inp = np.where(new, np.maximum(inp - shared * block_size, 1), inp)
        c["agent"] = _fit_agent(graph, shared, block_size)
    elif _has(t, "hash_ids"):
        prefix, pooled = _fit_prefix(t, opens, block_size)
        if prefix:
            c["prefix"] = prefix
        new = new & ~pooled  # a pool session's first prompt is its prefix and the pool's tail
    c["models"], drift = _mix(models[opens], names, starts, window)
    if drift:
        c["mix_window"] = window
    counts, reason = stats.image_counts(t), _col(t, "reasoning_tokens")
    for i, m in enumerate(c["models"]):
        sel = (models == i) & ~failed & ~np.isnan(out)
        x, y = inp[sel & new], out[sel & new]
        if len(x) < 2:
            x, y = inp[models == i], np.nan_to_num(out[models == i])
        m["input"], m["output"] = fit_length(x), fit_length(out[sel] if sel.any() else y)
        if len(x) > 2 and x.std() > 0 and y.std() > 0:
            m["rho"] = round(float(sst.spearmanr(x, y)[0]), 4)
        extra = (("images", counts is not None and _fit_images(t, counts, models == i)),
                 ("reasoning_share", reason is not None and _fit_reasoning(reason.astype(float), out, models == i)))
        m.update((k, v) for k, v in extra if v)
    sc = _codes(t, "slo_class")
    if sc is not None:
        cnt = np.bincount(sc[0][sc[0] >= 0], minlength=len(sc[1]))
        c["slo_class"] = {n: int(k) for n, k in zip(sc[1], cnt) if k}
    if len(c["models"]) == 1:  # one model: its lengths are the client's
        m = c["models"][0]
        c.update({k: m.pop(k) for k in ("input", "output", "rho", "images", "reasoning_share") if k in m})
        c["models"] = {m["name"]: 1.0}
    return c


def _dequantized(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A source whose bucketed timestamps `dequantize` spread over their detected buckets (its
    last such op in metadata['transforms']): the same clock, spread -- {"quantum_ns",
    "jitter_ns", "spread": True}, so the spec asks generate to floor and spread alike (the
    spread's regular 1-s counts are the dequantizer's, not the traffic's); None otherwise."""
    ops = [op for op in meta.get("transforms") or [] if isinstance(op, dict) and op.get("op") == "dequantize"]
    if not ops or ops[-1].get("quantum_from") != "buckets" or not ops[-1].get("quantum_ns"):
        return None
    return {"quantum_ns": int(ops[-1]["quantum_ns"]), "jitter_ns": int(ops[-1].get("jitter_ns", 0)), "spread": True}


def fit_trace(trace: Any, window: float | None = None) -> dict[str, Any]:
    """A generator spec (dict) that reproduces `trace`'s statistics."""
    t = trace.table if hasattr(trace, "table") else trace
    if t.num_rows < 10:
        raise TraceError(f"too few requests to fit ({t.num_rows}; need at least 10)")
    a = _col(t, "arrival_ns").astype(np.int64)
    t = t.set_column(t.column_names.index("arrival_ns"), "arrival_ns", pa.array(a - a[0]))
    span = (a[-1] - a[0]) / 1e9
    if span <= 0:
        raise TraceError("all arrivals share one timestamp: no rate to fit")
    meta = getattr(trace, "metadata", {}) or {}
    # a bucketed clock (Mooncake: ~3 s) is a property of the source: generate floors to it
    buckets = stats.timestamp_buckets(t) or _dequantized(meta)
    # the last arrival opens its bucket: the trace covers it whole (span + one mean gap would
    # end it a bucket early once floored: 120 rows in 1-s buckets over 5 s measured +33 %)
    duration = span + buckets["quantum_ns"] / 1e9 if buckets and not buckets.get("spread") \
        else span * len(a) / (len(a) - 1)
    if duration > MAX_DURATION_S:
        raise TraceError(f"the trace spans {span:,.0f} s: a spec holds at most {MAX_DURATION_S:g} s (292 years of int64 ns)")
    fixed_window = window is not None  # --window: the renewal model at that window, no search
    window = float(window or max(60.0, round(duration / 48 / 60) * 60))
    if not 0 < window < float("inf"):
        raise TraceError(f"--window must be > 0 seconds, got {window:g}")
    if duration / window > MAX_WINDOWS:  # the rate table and the mix hold one entry per window
        raise TraceError(f"--window {window:g} s cuts the {duration:,.0f} s trace into {duration / window:,.0f} windows; "
                         f"at most {MAX_WINDOWS:,} (a window of at least {duration / MAX_WINDOWS:.3g} s)")
    groups = [(t, "fitted")]
    cc = _codes(t, "client_id")
    if cc is not None and len(cc[1]) <= MAX_CLIENTS and (cc[0] >= 0).all():
        groups = [(t.filter(pa.array(cc[0] == i)), n) for i, n in enumerate(cc[1])]
    spec: dict[str, Any] = {"duration": round(duration, 6), "seed": 0, "block_size": int(meta.get("block_size") or 16),
                            "exact_count": True, "clients": []}  # fitted: the count is the source's
    if buckets:
        spec["timestamp_quantum_s"] = buckets["quantum_ns"] / 1e9
        if buckets.get("spread"):
            spec["timestamp_spread"] = True
    # a client seen once has no rate to fit
    spec["clients"] = [_fit_client(g, name, duration, window, fixed_window, buckets, spec["block_size"])
                       for g, name in groups if g.num_rows >= 2]
    # plain Python numbers only: the spec is written as YAML and embedded as JSON
    spec = json.loads(json.dumps(spec, default=lambda v: v.item()))
    for c in spec["clients"]:  # image counts stay numbers (`0: 0.7` in YAML, not '0': 0.7)
        for holder in [c, *(c["models"] if isinstance(c["models"], list) else [])]:
            if "images" in holder:
                holder["images"]["count"] = {int(k): v for k, v in holder["images"]["count"].items()}
    return spec


def write_spec(spec: dict[str, Any], path: Path) -> None:
    """YAML (default) or JSON (by suffix)."""
    import yaml
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=2) if path.suffix.lower() == ".json" else
                    yaml.safe_dump(spec, sort_keys=False, width=120))
