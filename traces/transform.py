"""Trace transforms: each takes a `Trace` and returns a new one, recording itself in
`metadata['transforms']` so the output says how it was made. They compose in any order.

Times stay exact integers: a speed factor is applied as a rational number p/q (q <= 10^6),
rounding each arrival to the nearest ns once.
"""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceError
from .pages import reused_pages
from .trace import Trace


INT64_MAX = int(np.iinfo(np.int64).max)


def _new(trace: Trace, table: pa.Table, op: dict[str, Any], sort: bool = False, **meta: Any) -> Trace:
    meta = {**trace.metadata, **meta, "transforms": [*trace.metadata.get("transforms", []), op]}
    if table.num_rows == 0:
        raise TraceError(f"transform {op} left no requests")
    return Trace(table, meta, sort=sort)


def _set(table: pa.Table, name: str, col: Any) -> pa.Table:
    """`table` with column `name` replaced (a numpy array: int64 arrivals)."""
    col = pa.array(col, pa.int64()) if isinstance(col, np.ndarray) else col
    return table.set_column(table.schema.get_field_index(name), name, col)


def _arr(trace: Trace) -> np.ndarray:
    return trace.table.column("arrival_ns").to_numpy().astype(np.int64)


def speed(trace: Trace, factor: float) -> Trace:
    """Replay `factor` times faster: arrival / factor (exact rational, nearest ns)."""
    if not factor > 0:
        raise TraceError(f"speed factor must be > 0, got {factor}")
    a, (num, den) = _arr(trace), Fraction(factor).limit_denominator(10**6).as_integer_ratio()
    if len(a) and int(a.max()) * den // num > INT64_MAX:
        raise TraceError(f"speed {factor:g} moves the last arrival past 2^63 ns (292 years)")
    out = (a // num) * den + ((a % num) * den + num // 2) // num
    return _new(trace, _set(trace.table, "arrival_ns", out), {"op": "speed", "factor": factor})


def rate(trace: Trace, target: float) -> Trace:
    """Rescale time so the mean rate ((n-1)/duration) becomes `target` req/s."""
    from .stats import mean_rate
    current = mean_rate(trace.table)
    if current is None or not target > 0:
        raise TraceError("rescaling to a rate needs >= 2 requests over a non-zero duration and a rate > 0")
    t = speed(trace, target / current)
    t.metadata["transforms"][-1] = {"op": "rate", "target": target, "factor": target / current}
    return t


def time_slice(trace: Trace, start_s: float, end_s: float | None) -> Trace:
    """Keep requests with start <= arrival < end (seconds from the origin); the new origin is start."""
    a, lo = _arr(trace), int(round(start_s * 1e9))
    keep = (a >= lo) & (a < (int(round(end_s * 1e9)) if end_s is not None else INT64_MAX))
    table = trace.table.filter(pa.array(keep))
    table = _set(table, "arrival_ns", table.column("arrival_ns").to_numpy() - lo)
    return _new(trace, table, {"op": "slice", "start_s": start_s, "end_s": end_s})


def head(trace: Trace, n: int) -> Trace:
    """The first n requests."""
    return _new(trace, trace.table.slice(0, n), {"op": "head", "n": n})


def sample(trace: Trace, fraction: float, seed: int = 0) -> Trace:
    """Keep each request independently with probability `fraction` (seeded, reproducible)."""
    if not 0 < fraction <= 1:
        raise TraceError(f"sample fraction must be in (0, 1], got {fraction}")
    keep = np.random.default_rng(seed).random(trace.num_rows) < fraction
    return _new(trace, trace.table.filter(pa.array(keep)), {"op": "sample", "fraction": fraction, "seed": seed})


def filter_values(trace: Trace, column: str, values: list[str]) -> Trace:
    """Keep requests whose `column` (model or client_id) is one of `values`."""
    if column not in trace.table.column_names:
        raise TraceError(f"cannot filter on {column}: the trace has no such column")
    col = trace.table.column(column).cast(pa.string())
    keep = pc.fill_null(pc.is_in(col, value_set=pa.array(values, pa.string())), False)
    return _new(trace, trace.table.filter(keep), {"op": f"filter_{column}", "values": values})


def map_model(trace: Trace, mapping: dict[str, str]) -> Trace:
    """Rename model labels (unlisted labels are kept)."""
    if "model" not in trace.table.column_names:
        raise TraceError("cannot map models: the trace has no model column")
    labels = trace.table.column("model").cast(pa.string()).to_numpy(zero_copy_only=False)
    new = np.array([mapping.get(x, x) if x is not None else None for x in labels], dtype=object)
    return _new(trace, _set(trace.table, "model", pa.array(new, pa.string())), {"op": "map_model", "mapping": mapping})


def merge(trace: Trace, other: Trace, name: str = "other") -> Trace:
    """Superpose two traces on one time axis (both from their own origin); ids that collide
    are prefixed with `name:`. Columns missing on one side are null there."""
    a, b = trace.table, other.table
    if "request_id" in a.column_names and "request_id" in b.column_names:
        if pc.any(pc.is_in(b.column("request_id"), value_set=a.column("request_id").combine_chunks())).as_py():
            b = _set(b, "request_id", pc.binary_join_element_wise(f"{name}:", b.column("request_id"), ""))
    a, b = (_set(t, "model", t.column("model").cast(pa.string())) if "model" in t.column_names else t
            for t in (a, b))  # dictionaries differ: merge as strings
    table = pa.concat_tables([a, b], promote_options="permissive")
    return _new(trace, table, {"op": "merge", "other": name, "rows": other.num_rows}, sort=True)


def shift(trace: Trace, seconds: float) -> Trace:
    """Add `seconds` to every arrival (negative allowed while no arrival goes below 0)."""
    a, ns = _arr(trace), int(round(seconds * 1e9))
    if int(a.max()) + ns > INT64_MAX:
        raise TraceError(f"shift by {seconds} s moves the last arrival past 2^63 ns (292 years)")
    a = a + ns
    if (a < 0).any():
        raise TraceError(f"shift by {seconds} s would make arrivals negative (first arrival {a.min() / 1e9:.3f} s)")
    return _new(trace, _set(trace.table, "arrival_ns", a), {"op": "shift", "seconds": seconds})


def clip(trace: Trace, column: str, lo: int | None, hi: int | None) -> Trace:
    """Clamp `input_tokens` or `output_tokens` into [lo, hi]; clipped inputs also drop the
    `hash_ids` blocks past the new length (block_size from the metadata)."""
    t = trace.table
    col = pc.max_element_wise(t.column(column), lo) if lo is not None else t.column(column)
    col = pc.min_element_wise(col, hi) if hi is not None else col
    t = _set(t, column, col.cast(pa.int32()))
    if column == "output_tokens" and "reasoning_tokens" in t.column_names:  # still a part of the output
        t = _set(t, "reasoning_tokens", pc.min_element_wise(t.column("reasoning_tokens"), col).cast(pa.int32()))
    bs = trace.metadata.get("block_size")
    if column == "input_tokens" and bs and "hash_ids" in t.column_names and hi is not None:
        h = t.column("hash_ids").combine_chunks()
        lens = pc.list_value_length(h).fill_null(0).to_numpy().astype(np.int64)
        allowed = np.minimum(lens, -(-t.column("input_tokens").to_numpy().astype(np.int64) // bs))
        pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        flat = h.flatten().to_numpy()[pos < np.repeat(allowed, lens)]
        offsets = np.concatenate([[0], np.cumsum(allowed)])
        new = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int64()), mask=h.is_null())
        t = _set(t, "hash_ids", new)
    return _new(trace, t, {"op": f"clip_{column}", "min": lo, "max": hi})


def spread_buckets(a: np.ndarray, q: int, jitter: int = 0) -> np.ndarray:
    """Sorted int64 ns arrivals with each run of ties (gaps <= jitter) spread evenly over a
    bucket of q ns from its first arrival, never past the next run's start (`dequantize`;
    `fit` fits arrival models on these times of a bucketed trace)."""
    starts = np.flatnonzero(np.concatenate([[True], np.diff(a) > jitter]))
    sizes = np.diff(np.concatenate([starts, [len(a)]]))
    j = np.arange(len(a)) - np.repeat(starts, sizes)
    m = np.repeat(sizes, sizes)
    off = j * (q // m) + j * (q % m) // m  # = j q // m without overflowing int64 (j < m)
    room = np.repeat(np.append(a[starts[1:]], INT64_MAX) - a[starts], sizes)
    return np.repeat(a[starts], sizes) + np.minimum(off, room)


def dequantize(trace: Trace, quantum_ns: int | None = None) -> Trace:
    """Spread the requests of each timestamp bucket evenly over it: the j-th of m requests of a
    bucket that starts at t moves to t + j * quantum // m (never past the next bucket's start).
    A bucket is a run of ties: equal timestamps, or gaps within the jitter that
    `stats.timestamp_buckets` finds (Mooncake: ~3 s buckets whose ms timestamps differ by a few
    ms). The quantum defaults to the detected bucket width, else to the greatest common divisor
    of the arrival times (the timestamp resolution, e.g. 1 ms). The op records where the quantum
    came from and how many requests moved (`dequantize_message` says it in words)."""
    from .stats import timestamp_buckets
    a, b = _arr(trace), timestamp_buckets(trace.table)
    jitter = b["jitter_ns"] if b else 0
    if quantum_ns:
        q, source = int(quantum_ns), "given"
    elif b:
        q, source = b["quantum_ns"], "buckets"
    else:
        q, source = (int(np.gcd.reduce(a[a > 0])) if (a > 0).any() else 1), "resolution"
    out = spread_buckets(a, q, jitter)
    op = {"op": "dequantize", "quantum_ns": q, "quantum_from": source, **({"jitter_ns": jitter} if jitter else {}),
          "spread": int((out != a).sum())}
    return _new(trace, _set(trace.table, "arrival_ns", out), op)

def _top(full: np.ndarray, pick: np.ndarray, inp: np.ndarray, bs: int) -> float:
    """The largest hit ratio with these prefixes: each request reuses its full blocks up to
    the longest earlier request of its prefix."""
    order = np.argsort(pick, kind="stable")
    g, f = pick[order], full[order]
    big = int(f.max(initial=0)) + 1  # groups apart: one running max over all of them
    run = np.maximum.accumulate(g * big + f) - g * big
    prev = np.zeros_like(run)
    prev[1:] = np.where(g[1:] == g[:-1], run[:-1], 0)
    return float((np.minimum(f, prev) * bs).sum() / max(int(inp.sum()), 1))


def _reuse_plan(full: list[int], inp: list[int], pick: list[int], ratio: float, bs: int) -> tuple[list[int], float]:
    """Per row, how many leading blocks lie on its prefix's chain; and the tokens still short
    of ratio x all input tokens at the end (>= -bs/2)."""
    seen, chain, short = [0] * (max(pick, default=0) + 1), [0] * len(full), 0.0
    for i, (f, n, p) in enumerate(zip(full, inp, pick)):
        short += ratio * n
        want = min(f, max(0, int(short / bs + 0.5)))
        hit = min(want, seen[p])
        chain[i] = want if hit == want else f  # a chain too short for the row: grow it by all its blocks
        seen[p] = max(seen[p], chain[i])
        short -= hit * bs
    return chain, short


@reused_pages()  # its 10-300 MB flat block arrays: 3-4x faster on VMs that fault fresh memory in slowly
def prefix_reuse(trace: Trace, ratio: float, block_size: int | None = None, seed: int = 0,
                 name: str = "--prefix-reuse") -> Trace:
    """Rewrite `hash_ids` so that the prefix-cache token hit ratio (`stats.prefix_cache_hits`)
    is `ratio`, to within one block's tokens over the whole trace.

    Requests draw one of P shared prefixes (Zipf popularity, seeded); a prefix is a chain of
    block ids that grows as longer requests use it. In arrival order each request asks for
    ratio x its input tokens plus what earlier ones fell short of (a prefix's first request
    always misses) and reuses that many leading blocks of its prefix; a request whose prefix
    is still shorter takes what there is and extends the chain by all its full blocks. Every
    other block, the last partial one included (a server caches full blocks only), is fresh.
    P starts at sqrt(n) and halves while the ratio is out of reach (each prefix's first
    requests cost its length). The trace's own hash_ids (sessions' shared history too) are
    replaced; block_size: the trace's, else 16; errors call the ratio `name`."""
    bs = int(block_size if block_size is not None else trace.metadata.get("block_size") or 16)
    if not 0 <= ratio < 1:
        raise TraceError(f"{name} must be in [0, 1) (a prefix's first request always misses), got {ratio:g}")
    if bs < 1:
        raise TraceError(f"--block-size must be >= 1, got {bs}")
    inp = trace.table.column("input_tokens").to_numpy().astype(np.int64)
    full, rng, n_pre = inp // bs, np.random.default_rng(seed), max(1, math.isqrt(len(inp)))
    while True:
        w = 1 / np.arange(1, n_pre + 1)
        pick = rng.choice(n_pre, len(inp), p=w / w.sum())
        reach = _top(full, pick, inp, bs)
        if reach >= ratio:
            chain, short = _reuse_plan(full.tolist(), inp.tolist(), pick.tolist(), ratio, bs)
            if short <= bs:
                break
            reach = ratio - short / inp.sum()
        if n_pre == 1:
            raise TraceError(f"{name} {ratio:g} is out of reach for this trace: at most {reach:.4f} "
                             "(a request's last partial block and a prefix's first use miss)")
        n_pre //= 2
    nb, chain = -(-inp // bs), np.asarray(chain, np.int64)
    ends = np.cumsum(nb)
    # a row's chain blocks (prefix p's block j is p * width + j), then fresh ids above every chain's: flat
    # block i's id is i plus its segment's base
    width = int(full.max(initial=0)) + 1
    base = np.stack([pick * width - (ends - nb), np.full(len(nb), n_pre * width)], 1).ravel()
    ids = np.repeat(base, np.stack([chain, nb - chain], 1).ravel())
    ids += np.arange(len(ids))
    offsets = pa.array(np.concatenate([[0], ends]), pa.int32())
    col = pa.ListArray.from_arrays(offsets, pa.array(ids, pa.int64()))
    table = (_set(trace.table, "hash_ids", col) if "hash_ids" in trace.table.column_names
             else trace.table.append_column("hash_ids", col))
    op = {"op": "prefix_reuse", "ratio": ratio, "block_size": bs, "seed": seed, "prefixes": n_pre}
    return _new(trace, table, op, block_size=bs)


def dequantize_message(op: dict[str, Any]) -> str:
    """What a dequantize op did, for the CLI."""
    q = f"{op['quantum_ns'] / 1e6:g} ms"
    if op["quantum_from"] == "resolution":
        return (f"dequantize: no bucketed timestamps found (fewer than half the gaps are ties); spread "
                f"{op['spread']:,} requests sharing a timestamp over the {q} resolution")
    jitter = f" (ties within {op['jitter_ns'] / 1e6:g} ms)" if op.get("jitter_ns") else ""
    return f"dequantize: spread {op['spread']:,} requests evenly over their {q} buckets{jitter}"


def _range(s: str, num: Any = int, empty_lo: Any = None) -> tuple[Any, Any]:
    lo, _, hi = s.partition(":")
    return (num(lo) if lo else empty_lo, num(hi) if hi else None)


# CLI transforms: option name without dashes -> (trace, value as given, {seed, block_size}) -> Trace
OPS = {"speed": lambda t, v, _: speed(t, float(v)), "rate": lambda t, v, _: rate(t, float(v)),
       "slice": lambda t, v, _: time_slice(t, *_range(v, float, 0.0)),
       "head": lambda t, v, _: head(t, int(v)), "sample": lambda t, v, o: sample(t, float(v), o["seed"]),
       "model": lambda t, v, _: filter_values(t, "model", v.split(",")),
       "client_id": lambda t, v, _: filter_values(t, "client_id", v.split(",")),
       "map_model": lambda t, v, _: map_model(t, dict(kv.split("=", 1) for kv in v.split(","))),
       "merge": lambda t, v, _: merge(t, Trace.read(v), Path(v).stem), "shift": lambda t, v, _: shift(t, float(v)),
       "clip_input": lambda t, v, _: clip(t, "input_tokens", *_range(v)),
       "clip_output": lambda t, v, _: clip(t, "output_tokens", *_range(v)),
       "dequantize": lambda t, v, _: dequantize(t, int(float(v) * 1e6) if v else None),
       "prefix_reuse": lambda t, v, o: prefix_reuse(t, float(v), o["block_size"], o["seed"])}


def apply(trace: Trace, op: str, value: str, seed: int = 0, block_size: int | None = None) -> Trace:
    """Apply one CLI transform (`op`: a key of OPS, the option name without dashes; `value` as given)."""
    try:
        return OPS[op](trace, value, {"seed": seed, "block_size": block_size})
    except (ValueError, ArithmeticError) as e:  # ArithmeticError: out of int64 ns (--slice 1e10:, --speed 1e-300)
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"--{op.replace('_', '-')} {value!r}: {e}") from None
