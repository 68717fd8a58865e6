"""`generate(spec, seed)`: a synthetic trace from a generator spec, vectorised NumPy.

Each client draws from its own child of `SeedSequence(seed)` (one stream per aspect:
arrivals, sessions, models, lengths, failures, prefixes, images), so the output is
bit-for-bit a function of (spec, seed); a stream is read by one thread only, so the two
threads used here (arrival times beside the sizes; Parquet writes beside the next row group,
`generate_to`) change nothing in it. The spec and seed are embedded in the metadata key
`generator`, so `replay trace generate --spec T.parquet` re-creates T.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .agents import client_rows as task_rows
from .arrivals import arrival_times
from .blocks import _hash_ids, _pool_draws, _pool_tokens, _prefix_rows
from .pages import reused_pages
from .sampling import (arrival_order, client_px, discrete_mean, draw_labels, exact_scale, finish, image_rows, sample,
                       sample_from_normal, sample_pair, segmented_cumsum)
from .schema import MAX_TOKENS, schema_for
from .spec import parse_spec
from .spec_types import Client, Spec
from .trace import ROW_GROUP, Trace, is_text_path, parquet_writer, with_schema_version

GENERATOR_VERSION = 1


def _session_times(c: Client, starts: np.ndarray, k: np.ndarray, first: np.ndarray, sess: np.ndarray,
                   rng: np.random.Generator, rows: int | None = None, duration: float = 0.0) -> np.ndarray:
    """Each turn's arrival: its session's start plus the think times of the turns before it.

    `rows` (exact_count): the whole client's times are then scaled about 0 so that the
    rows-th row at or after 0 lands at duration (rows - 1) / rows, as `arrival_times` does for
    the starts: the starts' exact count alone leaves the rows' count to the sum of the turns
    per session and to how many turns of the warm-up sessions reach past 0 (~2 % on the
    Mooncake hour); one scale keeps every think time's share and the turns' order (the scale
    is within a few % of 1). `arrival_order(limit=rows)` then keeps exactly those rows."""
    think = sample(c.sessions.think_s, rng, len(sess), integer=False)
    think[first] = 0.0
    t = segmented_cumsum(think, first, k)
    del think
    t += starts[sess]
    t *= exact_scale(t, rows, duration)
    return t


def _session_starts(c: Client, T: float, r_arr: np.random.Generator,
                    r_sess: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Session starts (from before 0, so that conversations are already in progress at t=0),
    turns per session, and (exact_count) the rows to keep.

    exact_count: the turns per session are drawn first, and the sessions' count is the one
    whose turns add up to round(rate * (T + warm)) (the last session is cut to fit), so that
    the rows' count, not the starts', is the source's; `_session_times` then scales out
    what the warm-up leaves. The first turn counts are the ones earlier versions drew (one
    per start), so r_sess's think times stay those draws; any more come from a child stream.
    Without exact_count: the draws of earlier versions."""
    mean_turns = discrete_mean(c.sessions.turns)
    long_turns = finish(sample_from_normal(c.sessions.turns, np.array([2.33])), c.sessions.turns)[0]
    warm = min(T, (long_turns - 1) * discrete_mean(c.sessions.think_s))
    if not c.exact_count:
        starts = arrival_times(c.arrival, c.profile, c.rate / mean_turns, -warm, T, r_arr, c.modulation)
        return starts, sample(c.sessions.turns, r_sess, len(starts)).astype(np.int64), None
    total = max(int(round(c.rate * (T + warm))), 1)
    # as many turn counts from r_sess as earlier versions drew (one per start at rate / mean
    # turns), so that the think times that follow in it are the same draws; more, when
    # needed, from a stream of their own
    parts = [sample(c.sessions.turns, r_sess, int(round(c.rate / mean_turns * (T + warm)))).astype(np.int64)]
    have, extra = int(parts[0].sum()), None
    while have < total:
        extra = extra or np.random.default_rng(r_sess.bit_generator.seed_seq.spawn(1)[0])
        parts.append(sample(c.sessions.turns, extra, int((total - have) / mean_turns * 1.2) + 16).astype(np.int64))
        have += int(parts[-1].sum())
    k = np.concatenate(parts)
    m = int(np.searchsorted(np.cumsum(k), total)) + 1
    k = k[:m]
    k[-1] -= int(k.sum()) - total
    starts = arrival_times(c.arrival, c.profile, m / (T + warm), -warm, T, r_arr, c.modulation, True)
    if len(starts) != m:  # (rounding of m / (T + warm) * (T + warm)): keep the pairs aligned
        k = np.resize(k, len(starts))
    return starts, k, max(int(round(c.rate * T)), 1)


def _timeline(spec: Spec, c: Client, r_arr: np.random.Generator, r_sess: np.random.Generator,
              phase: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Callable[[], dict]]:
    """Starts (of sessions, else of requests), rows per start `k`, each start's first row, each
    row's start, and a function that draws the rows' times (think times from r_sess, after the
    turns) and returns their `arrival_order`. `phase`: exact_count beside other exact_count
    clients puts the first arrival a random phase (under one mean gap) after 0, not all at 0."""
    T, q = spec.duration, spec.timestamp_quantum_s
    if c.sessions:
        starts, k, keep = _session_starts(c, T, r_arr, r_sess)
        first = np.cumsum(k) - k
        sess = np.repeat(np.arange(len(starts)), k)
        return starts, k, first, sess, lambda: arrival_order(
            _session_times(c, starts, k, first, sess, r_sess, keep, T), T, q, keep)
    starts = arrival_times(c.arrival, c.profile, c.rate, 0.0, T, r_arr, c.modulation, c.exact_count)
    if phase and c.exact_count and len(starts) and sum(x.exact_count for x in spec.clients) > 1:
        starts += r_arr.random() * T / len(starts)
    n = len(starts)
    return starts, np.ones(n, np.int64), np.arange(n), np.arange(n), lambda: arrival_order(starts, T, q)


def client_arrivals(spec: Spec, c: Client, ss: np.random.SeedSequence) -> np.ndarray:
    """The arrival seconds (sorted) of the rows `_client_rows` keeps for client c with seed
    sequence ss -- the same streams and code, without the sizes: what `fit` simulates when it
    scores an arrival model on the whole client (session starts and their turns)."""
    rows = _timeline(spec, c, *(np.random.default_rng(s) for s in ss.spawn(2)), phase=False)[-1]()
    a, q = rows["arrival_ns"][rows["order"]], spec.timestamp_quantum_s
    return (_spread(a, q) if q and spec.timestamp_spread else a) / 1e9


def _spread(a: np.ndarray, quantum_s: float) -> np.ndarray:
    """The rows of each (floored) bucket spread evenly over it, in arrival order, as
    `transform.dequantize` spreads a bucketed source (timestamp_spread): monotone, so a turn
    still follows its parent; over all clients at once, like the source's."""
    from .transform import spread_buckets
    return spread_buckets(a, max(int(round(quantum_s * 1e9)), 1))


def _client_rows(spec: Spec, c: Client, ci: int, ss: np.random.SeedSequence,
                 pool: ThreadPoolExecutor) -> dict[str, np.ndarray]:
    """One client's rows as NumPy columns, session-major (a session's turns are adjacent),
    including the turns that fall outside [0, duration); `order` lists the others by arrival.
    The arrival times and their sort run on `pool` while this thread draws the sizes."""
    # spawn(8)[:6] are the same streams as spawn(6): adding the image and reasoning streams
    # changed no draw
    streams = ss.spawn(8)
    if c.agent:  # task graphs (traces.agents): the same streams, another expansion
        return _extra_rows(c, task_rows(spec, c, ci, streams[:6]), streams)
    r_arr, r_sess, r_model, r_len, r_fail, r_pre = (np.random.default_rng(s) for s in streams[:6])
    starts, k, first, sess, draw_times = _timeline(spec, c, r_arr, r_sess)
    n, times = int(k.sum()), pool.submit(draw_times)  # (the times and the sizes use separate streams: two cores)
    turn = (np.arange(n) - first[sess]).astype(np.int32)
    model, failed, slo = draw_labels(c, starts, sess, r_model, r_fail)
    pre = _pool_draws(c, len(starts), r_pre) if c.prefix else None
    # branch points (sessions.branch): drawn after the pool's, and only when asked for
    cut = (np.where((turn > 0) & (r_pre.random(n) < c.sessions.branch), r_pre.random(n), -1.0)
           if c.prefix and c.sessions and c.sessions.branch else None)
    inp, out = _lengths(spec, c, model, turn, first, k, failed, r_len, starts[sess] if c.length_windows else None,
                        _pool_tokens(spec, c, pre, sess, first) if pre else None, cut)

    rows = {"input": inp, "output": out, "model": model, "failed": failed, "turn": turn,
            "sess": sess, "parent_ok": turn > 0, "slo": slo}
    if c.prefix:
        rows.update(_prefix_rows(spec, c, ci, inp, sess, first, pre, cut))
    rows.update(times.result())
    rows = {key: v for key, v in rows.items() if v is not None}
    if "keep" in rows:  # a turn whose parent fell before t=0 has no parent row in the trace
        rows["parent_ok"][1:] &= rows.pop("keep")[:-1]
    return _extra_rows(c, rows, streams)


def _extra_rows(c: Client, rows: dict[str, np.ndarray], streams: list) -> dict[str, np.ndarray]:
    """Images per row (`image_rows`, stream 6) and `reason`: each row's reasoning tokens, its
    drawn share of its output tokens (rounded, so never more than the output), independent of
    the lengths (stream 7); -1 for a model without a share (null in the trace). No stream is
    read, no column added, without images or shares: the common path stays as fast."""
    if client_px(c):
        rows.update(image_rows(c, rows["model"], np.random.default_rng(streams[6])))
    shares = [m.reasoning_share or c.reasoning_share for m in c.models]
    if not any(shares):
        return rows
    rng, reason = np.random.default_rng(streams[7]), np.full(len(rows["output"]), -1, np.int32)
    for mi, d in enumerate(shares):
        if d is not None:
            idx = np.flatnonzero(rows["model"] == mi)
            reason[idx] = np.rint(sample(d, rng, len(idx), integer=False) * rows["output"][idx])
    rows["reason"] = reason
    return rows


def _lengths(spec: Spec, c: Client, model: np.ndarray, turn: np.ndarray, first: np.ndarray,
             k: np.ndarray, failed: np.ndarray, rng: np.random.Generator,
             when: np.ndarray | None = None, prefix: np.ndarray | None = None,
             cut: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Input and output tokens per row: new tokens and output drawn per model through the
    copula, then (sessions) the prompt grows by each previous answer and new user tokens.
    With length_windows, a row's client-level lengths are those of the window its time
    `when` (its arrival; a turn: its session's start) falls in. `prefix` (`blocks._pool_tokens`): a
    pool session's first turn is its shared prefix plus the pool's tail, not the input. A
    branch (`cut` >= 0) replaces the history: its prompt is as long as the previous one."""
    n = len(model)
    if c.bootstrap:  # whole (input, output) pairs resampled from a real trace's rows with a known output
        tbl = Trace.read(c.bootstrap).table
        src_in = tbl.column("input_tokens").to_numpy().astype(np.float64)
        src_out = tbl.column("output_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
        ok = ~np.isnan(src_out)
        idx = rng.integers(0, int(ok.sum()), n)
        new, out = src_in[ok][idx], src_out[ok][idx]
        new = np.maximum(np.rint(new * spec.length_scale), 1)
        out = np.minimum(np.rint(out * spec.length_scale), spec.max_output_tokens or np.inf)
    else:
        new, out = np.empty(n), np.empty(n)
    # models sharing their length distributions are drawn together (one pass, not one per model)
    by_dists: dict[tuple, list[int]] = {}
    for mi, m in enumerate([] if c.bootstrap else c.models):
        key = (id(m.input or c.input), id(m.output or c.output), c.rho if m.rho is None else m.rho)
        by_dists.setdefault(key, []).append(mi)
    windows = c.length_windows or [(0.0, c.input, c.output)]
    phase = None if len(windows) == 1 else np.maximum(
        np.searchsorted([w[0] for w in windows], when, side="right") - 1, 0)
    for wi, mis in ((wi, mis) for wi in range(len(windows)) for mis in by_dists.values()):
        m = c.models[mis[0]]
        in_d, out_d = m.input or windows[wi][1], m.output or windows[wi][2]
        rho = c.rho if m.rho is None else m.rho
        sel = None if len(mis) == len(c.models) else np.isin(model, mis)
        if phase is not None:
            sel = phase == wi if sel is None else sel & (phase == wi)
        rows = slice(None) if sel is None else np.flatnonzero(sel)
        groups = [(rows, in_d)]
        if c.sessions and c.sessions.user_tokens is not None:
            idx = np.arange(n) if sel is None else rows
            later = turn[idx] > 0
            groups = [(idx[~later], in_d), (idx[later], c.sessions.user_tokens)]
        if prefix is not None:  # (turns > 0 have no prefix of their own: they only repeat it)
            groups = [(g[sel], x) for idx, d in groups for g in [np.arange(n)[idx]]
                      for sel, x in ((prefix[g] == 0, d), (prefix[g] > 0, c.prefix.pool.tail))]
        for idx, d in groups:
            x, o = sample_pair(d, out_d, rho, rng, n if isinstance(idx, slice) else len(idx))
            new[idx] = finish(x, d, spec.length_scale)
            out[idx] = finish(o, out_d, spec.length_scale, spec.max_output_tokens)
    if prefix is not None:
        new += prefix
    out[failed] = 0  # a failed request produced nothing (and added nothing to the conversation)
    np.minimum(out, MAX_TOKENS, out=out)  # the trace schema's ceiling per request
    if c.sessions:  # turn k's prompt = turn k-1's prompt + its answer + the new user tokens
        if cut is not None:  # a branch: as long as the prompt it branches off (the source's median)
            b = np.flatnonzero(cut >= 0)
            new[b] = -out[b - 1]
        new = segmented_cumsum(new + out, first, k) - out
    new = np.minimum(new, min(spec.max_input_tokens or MAX_TOKENS, MAX_TOKENS))
    return new.astype(np.int32), out.astype(np.int32)


def _id_strings(values: np.ndarray, prefix_of: np.ndarray | None = None, prefixes: list[str] | None = None,
                valid: np.ndarray | None = None) -> pa.Array:
    """Decimal strings of ints, each optionally after `prefixes[prefix_of[i]] + '-'`; null where not `valid`."""
    ids = pc.cast(pa.array(values), pa.string())
    if prefixes and len(prefixes) == 1:  # one client: insert its name (half the work of a join)
        ids = pc.binary_replace_slice(ids, 0, 0, prefixes[0] + "-")
    elif prefixes:
        ids = pc.binary_join_element_wise(pc.take(pa.array(prefixes), pa.array(prefix_of)), ids, "-")
    return ids if valid is None or valid.all() else pc.if_else(pa.array(valid), ids, None)


def _concat_sorted(parts: list[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
    """Concatenate the clients' rows (one column at a time, dropping each client's copy; no
    copy at all for one client); also returns the sort order, the indices of the trace's rows
    by arrival, and each client's count of them. Rows are gathered in that order only when a
    table is built."""
    lens = [len(p["arrival_ns"]) for p in parts]
    orders = [p.pop("order") for p in parts]
    col: dict[str, np.ndarray] = {"client": np.repeat(np.arange(len(parts), dtype=np.int32), lens)}
    for key in sorted(set().union(*parts)):
        arrs = [p.pop(key, None) for p in parts]
        dtype = next(a.dtype for a in arrs if a is not None)
        arrs = [np.zeros(m, dtype) if a is None else a for a, m in zip(arrs, lens)]
        col[key] = arrs[0] if len(arrs) == 1 else np.concatenate(arrs)
        del arrs
    kept = [len(o) for o in orders]
    if len(parts) == 1:
        return col, orders[0], kept
    # merge the clients' sorted runs; a stable sort breaks ties by client, then draw order
    rows = np.concatenate([o + start for o, start in zip(orders, np.cumsum([0] + lens[:-1]))])
    return col, rows[np.argsort(col["arrival_ns"][rows], kind="stable")], kept


def generate(spec: dict[str, Any], seed: int | None = None) -> Trace:
    """Generate a trace from a spec dict (validated here; SpecError names the bad field)."""
    with reused_pages():  # pages.py: 10M rows fault far less memory in
        rows = _sorted_rows(spec, seed)
        trace = Trace(_rows_table(rows, rows.take(0, len(rows.order), consume=True), 0), rows.meta, validate=False)
    if spec.get("prefix_reuse") is None or not trace.num_rows:  # (validated by parse_spec)
        return trace
    from .transform import prefix_reuse
    return prefix_reuse(trace, spec["prefix_reuse"], rows.meta["block_size"], rows.meta["generator"]["seed"],
                        name="prefix_reuse")


def generate_to(spec: dict[str, Any], path: str | Path, seed: int | None = None) -> tuple[int, int]:
    """Generate a trace straight into a file; returns (rows, seed). The same file as
    `generate(spec, seed).write(path)`, but Parquet is written one row group at a time on a
    second thread while the next row group is gathered and built (pyarrow releases the GIL
    while it encodes), and only two row groups of Arrow columns exist at any moment."""
    path = Path(path)
    if is_text_path(path) or spec.get("prefix_reuse") is not None:  # prefix_reuse sees the whole trace
        trace = generate(spec, seed)
        trace.write(path)
        return trace.num_rows, trace.metadata["generator"]["seed"]
    with reused_pages(), ThreadPoolExecutor(1) as pool:
        # pyarrow imports pandas (if installed) on its first pa.array, ~0.35 s: the writer
        # thread pays that while the rows are drawn, not the first row group
        pending = pool.submit(pa.array, np.zeros(1))
        rows = _sorted_rows(spec, seed)
        n, writer = len(rows.order), None
        try:
            for lo in range(0, max(n, 1), ROW_GROUP):  # an empty trace still gets its schema
                chunk = _rows_table(rows, rows.take(lo, min(lo + ROW_GROUP, n)), lo)
                if writer is None:
                    writer = parquet_writer(path, chunk.schema, with_schema_version(rows.meta))
                pending.result()
                pending = pool.submit(writer.write_table, chunk, ROW_GROUP)
                del chunk
            pending.result()
        finally:
            pending.exception()  # never close the file under a running write
            if writer is not None:
                writer.close()
    return n, rows.meta["generator"]["seed"]


@dataclass
class _Rows:
    """Every row the clients drew, as NumPy columns in draw order (session-major), and the
    order of the trace's rows by arrival: `take` gathers a range of trace rows."""
    col: dict[str, np.ndarray]
    order: np.ndarray
    new_index: np.ndarray | None     # draw index -> trace row (parents)
    clients: list[Client]
    codes: dict[str, list[str]]      # the dictionaries of `model`, `slo` (SLO classes), `px` (image sizes)
    sessions: bool                   # whether session_id / turn / parent_id are columns
    agents: bool                     # whether task_id / depends_on / delay_s are columns
    meta: dict[str, Any]

    def take(self, lo: int, hi: int, consume: bool = False) -> dict[str, np.ndarray]:
        """NumPy columns of trace rows lo..hi-1 (with sessions: `parent` and `no_parent` in
        place of `parent_ok`). consume=True pops each column of `col` once gathered, so
        that a whole-trace take holds a single extra copy at any moment. With agents: `ndep`
        and `deps`, the trace rows of every row's dependencies, flat."""
        src = self.order[lo:hi]
        get = self.col.pop if consume else self.col.__getitem__
        out = {}
        if self.sessions:
            # a turn's parent is the row drawn just before it (rows are session-major)
            in_session = np.array([c.sessions is not None for c in self.clients])[self.col["client"][src]]
            out["no_parent"] = ~(in_session & get("parent_ok")[src])
            out["parent"] = np.where(out["no_parent"], 0, self.new_index[np.maximum(src - 1, 0)])
        if self.agents:  # a row's dependencies are the draw indices dep .. dep + ndep - 1
            nd, d0 = get("ndep")[src], get("dep")[src]
            out["ndep"] = nd
            out["deps"] = self.new_index[np.repeat(d0 - (np.cumsum(nd) - nd), nd) + np.arange(int(nd.sum()))]
        if consume:
            self.new_index = None
        out.update((key, get(key)[src]) for key in [key for key in self.col if key not in ("parent_ok", "dep")])
        return out


def _whole_counts(clients: list[Client], T: float) -> list[Client]:
    """exact_count clients share round(T x their total rate) rows by largest remainder, so that
    the trace's count is exact too, not only each client's to the nearest row (16 clients at
    2 req/s for 60 s: up to 8 rows off): each such client's rate becomes its count / T."""
    ex = [i for i, c in enumerate(clients) if c.exact_count]
    if len(ex) < 2:
        return clients
    want = np.array([clients[i].rate * T for i in ex])
    n = np.floor(want)
    n[np.argsort(n - want, kind="stable")[:int(round(want.sum())) - int(n.sum())]] += 1
    out = list(clients)
    for i, k in zip(ex, n):  # (a client left with no row keeps a rate that rounds to none)
        out[i] = replace(clients[i], rate=max(float(k), 1e-9) / T)
    return out


def _sorted_rows(spec: dict[str, Any], seed: int | None) -> _Rows:
    parsed = parse_spec(spec)
    seed = parsed.seed if seed is None else int(seed)
    clients = parsed.clients = _whole_counts(parsed.clients, parsed.duration)
    children = np.random.SeedSequence(seed).spawn(len(clients))
    with ThreadPoolExecutor(1) as pool:
        parts = [_client_rows(parsed, c, i, children[i], pool) for i, c in enumerate(clients)]
    # one dictionary over every client's model labels, SLO classes, image sizes: each client's codes into it
    local = [{"model": [m.name for m in c.models], "slo": list(c.slo_class), "px": client_px(c)} for c in clients]
    codes = {key: sorted({s for d in local for s in d[key]}) for key in ("model", "slo", "px")}
    for d, p in zip(local, parts):
        for key in [key for key in codes if key in p]:
            p[key] = np.array([codes[key].index(s) for s in d[key]], np.int32)[p[key]]
    col, order, kept = _concat_sorted(parts)
    if parsed.timestamp_quantum_s and parsed.timestamp_spread:
        col["arrival_ns"][order] = _spread(col["arrival_ns"][order], parsed.timestamp_quantum_s)
    sessions = any(c.sessions is not None and m > 0 for c, m in zip(clients, kept))
    agents = any(c.agent is not None and m > 0 for c, m in zip(clients, kept))
    if agents:  # dependencies as draw indices over all clients
        lens = np.bincount(col["client"], minlength=len(clients))
        col["dep"] += np.repeat(np.cumsum(lens) - lens, lens)
    new_index = None
    if sessions or agents:
        new_index = np.empty(len(col["client"]), np.int64)
        new_index[order] = np.arange(len(order))
    # canonical key order: the same spec from YAML, JSON or a preset embeds the same bytes
    embedded = json.loads(json.dumps({**spec, "seed": seed}, sort_keys=True))
    meta = {"source": {"format": "synthetic", "file": spec.get("name", "generator spec"),
                       "license": "synthetic (llm-replay generator)"}, "time_origin_kind": "relative",
            "block_size": parsed.block_size,
            "generator": {"version": GENERATOR_VERSION, "seed": seed, "spec": embedded}}
    return _Rows(col, order, new_index, clients, codes, sessions, agents, meta)


def _rows_table(rows: _Rows, col: dict[str, np.ndarray], row0: int) -> pa.Table:
    """The trace rows row0.. (NumPy columns `col`) as a table in the canonical schema. Pops
    each array from `col` once used, so that a whole-trace call frees them as it goes."""
    clients = rows.clients
    client, n = col.pop("client"), len(col["arrival_ns"])
    per_client = lambda values: np.array(values)[client]  # noqa: E731
    cols: dict[str, Any] = {
        "arrival_ns": col.pop("arrival_ns"), "input_tokens": col.pop("input"), "output_tokens": col.pop("output"),
        "model": pa.DictionaryArray.from_arrays(pa.array(col.pop("model")), pa.array(rows.codes["model"]))}
    if rows.sessions:
        in_session = per_client([c.sessions is not None for c in clients])
        cols["turn"] = pa.array(col.pop("turn"), mask=~in_session)
    if "nb" in col:  # the list column first, while few other big arrays are alive
        cols["hash_ids"] = _hash_ids(col, per_client([c.prefix is not None or c.agent is not None for c in clients]),
                                     client, row0)
        for key in ("nb", "n_sys", "n_app", "partial", "app_base", "content_base", "cut", "shift"):
            col.pop(key, None)
    if rows.codes["slo"]:
        cols["slo_class"] = pa.DictionaryArray.from_arrays(
            pa.array(col.pop("slo").astype(np.int32), mask=per_client([not c.slo_class for c in clients])),
            pa.array(rows.codes["slo"])).cast(pa.string())
    if any(c.failures > 0 for c in clients):
        cols["failed_in_source"] = col.pop("failed").astype(bool)
    cols["request_id"] = _id_strings(np.arange(row0, row0 + n))
    names = [c.name for c in clients]
    cols["client_id"] = pc.take(pa.array(names), pa.array(client))
    if rows.sessions:
        cols["session_id"] = _id_strings(col.pop("sess"), client, names, in_session)
        cols["parent_id"] = _id_strings(col.pop("parent"), valid=~col.pop("no_parent"))
    if rows.agents:
        cols["task_id"] = _id_strings(col.pop("task"), client, names, per_client([bool(c.agent) for c in clients]))
        nd = col.pop("ndep")
        offsets = np.concatenate([[0], np.cumsum(nd)]).astype(np.int32)
        cols["depends_on"] = pa.ListArray.from_arrays(pa.array(offsets), _id_strings(col.pop("deps")),
                                                      mask=pa.array(nd == 0))
        cols["delay_s"] = pa.array(col.pop("delay"), mask=nd == 0)
    if "reason" in col:  # a client without a share: null (_concat_sorted filled 0)
        reason = col.pop("reason")
        cols["reasoning_tokens"] = pa.array(reason, mask=(reason < 0) | per_client(
            [c.reasoning_share is None and not any(m.reasoning_share for m in c.models) for c in clients]))
    if "nimg" in col:  # a client without images has 0 of them (filled by _concat_sorted)
        nimg = col.pop("nimg")
        cols["num_images"] = pa.array(nimg)
        cols["image_px"] = pa.DictionaryArray.from_arrays(  # no size where there is no image
            pa.array(col.pop("px"), mask=nimg == 0), pa.array(rows.codes["px"], pa.string())).cast(pa.string())
    schema = schema_for(list(cols))
    return pa.table([cols.pop(name) for name in schema.names], names=schema.names).cast(schema)
