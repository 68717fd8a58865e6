"""Per-request metrics (DESIGN section 4), vectorised over whole columns.

Every latency is in milliseconds, NaN where undefined (failed request, fewer than two output
tokens for TPOT, ...). List columns are handled through their flat values and offsets, never
row by row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import STATUSES

LATENCIES = ("ttft_ms", "tpot_ms", "icl_ms", "itl_ms", "e2e_ms", "ntpot_ms", "lag_ms")
# From schedule: TTFT/E2E/NTPOT include client-side queueing; TPOT/ICL/ITL do not depend on it.
SCHED_ALIAS = {"tpot_sched_ms": "tpot_ms", "icl_sched_ms": "icl_ms", "itl_sched_ms": "itl_ms",
               "lag_sched_ms": "lag_ms"}
POOLED = ("icl_ms", "itl_ms")


def _f64(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    return col.to_numpy().astype(np.float64, copy=False) if col.null_count == 0 else \
        pc.fill_null(col.cast(pa.float64()), np.nan).to_numpy()


def encode(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Integer codes and labels of a (possibly dictionary-encoded) string column; null becomes
    the label '(none)'."""
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    col = col.unify_dictionaries()
    labels = [str(x) for x in col.chunk(0).dictionary.to_pylist()] if col.num_chunks else []
    parts = [c.indices for c in col.chunks]
    codes = pa.chunked_array(parts, col.type.index_type) if parts else pa.chunked_array([], pa.int32())
    if codes.null_count:
        codes = pc.fill_null(codes, len(labels))
        labels.append("(none)")
    return codes.to_numpy().astype(np.int64, copy=False), labels


@dataclass
class RequestMetrics:
    """Column arrays, one entry per record (all rows of the run, measured or not)."""
    n: int
    status_codes: np.ndarray        # index into STATUSES
    ok: np.ndarray                  # bool
    scheduled: np.ndarray           # seconds (NaN if unknown)
    sent: np.ndarray
    end: np.ndarray                 # last token, else first token, else sent: when it left the system
    n_out: np.ndarray               # completion_tokens if reported, else content chunks
    n_out_from_usage: np.ndarray    # bool
    input_len: np.ndarray           # prompt_tokens if reported, else input_tokens
    columns: dict[str, np.ndarray]  # ttft_ms, tpot_ms, e2e_ms, ntpot_ms, *_sched_ms, lag_ms
    lengths: dict[str, np.ndarray]  # input_tokens, output_tokens, prompt_tokens, completion_tokens
    model: tuple[np.ndarray, list[str]]
    slo_class: tuple[np.ndarray, list[str]]

    def latency(self, name: str) -> np.ndarray:
        return self.columns[SCHED_ALIAS.get(name, name)]


def request_metrics(table: pa.Table) -> RequestMetrics:
    n = table.num_rows
    scodes, slabels = encode(table.column("status"))
    lut = np.array([STATUSES.index(s) if s in STATUSES else len(STATUSES) for s in slabels] or [0])
    status_codes = lut[scodes].astype(np.int8)
    ok = status_codes == 0
    sched, sent = _f64(table, "scheduled_s"), _f64(table, "sent_s")
    first, last = _f64(table, "first_token_s"), _f64(table, "last_token_s")
    lengths = {k: _f64(table, k) for k in ("input_tokens", "output_tokens", "prompt_tokens",
                                           "completion_tokens")}
    n_chunks = pc.fill_null(pc.list_value_length(table.column("token_times")), -1).to_numpy()
    n_chunks = np.where(n_chunks < 0, np.nan, n_chunks.astype(np.float64))
    usage = ~np.isnan(lengths["completion_tokens"])
    n_out = np.where(usage, lengths["completion_tokens"], n_chunks)
    input_len = np.where(np.isnan(lengths["prompt_tokens"]), lengths["input_tokens"],
                         lengths["prompt_tokens"])
    okf = np.where(ok, 1.0, np.nan)     # multiplying by it blanks failed requests

    def ms(a: np.ndarray, b: np.ndarray, blank: bool = True) -> np.ndarray:
        out = np.subtract(a, b)         # in place from here: one allocation per column
        out *= 1e3
        if blank:
            out *= okf
        return out

    def per_token(num: np.ndarray, den: np.ndarray, valid: np.ndarray) -> np.ndarray:
        out = np.divide(num, den)
        out[~valid] = np.nan
        return out

    ttft, e2e, ttft_s, e2e_s = ms(first, sent), ms(last, sent), ms(first, sched), ms(last, sched)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = per_token(ms(last, first), n_out - 1, n_out >= 2)
        ntpot = per_token(e2e, n_out, n_out >= 1)
        ntpot_s = per_token(e2e_s, n_out, n_out >= 1)
    end = last.copy()                   # last token, else first token, else sent
    gap = np.isnan(end)
    end[gap] = first[gap]
    gap = np.isnan(end)
    end[gap] = sent[gap]
    cols = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "ntpot_ms": ntpot,
            "ttft_sched_ms": ttft_s, "e2e_sched_ms": e2e_s, "ntpot_sched_ms": ntpot_s,
            "lag_ms": ms(sent, sched, blank=False)}
    return RequestMetrics(n, status_codes, ok, sched, sent, end, n_out, usage & ok, input_len,
                          cols, lengths, encode(table.column("model")),
                          encode(table.column("slo_class")))


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and per-row lengths of a list column (null lists are empty), chunk by chunk
    so the list column is never copied whole."""
    if col.num_chunks == 0:
        return np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
    lens = np.concatenate([pc.fill_null(pc.list_value_length(c), 0).to_numpy() for c in col.chunks])
    values = np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in col.chunks])
    return values, lens.astype(np.int64)


def _gaps(values: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.diff(values) and a mask of the gaps whose two chunks belong to the same request."""
    offsets = np.concatenate([[0], np.cumsum(lens)])
    total = int(offsets[-1])
    mask = np.ones(max(total - 1, 0), dtype=bool)
    starts = offsets[1:-1]
    starts = starts[(starts > 0) & (starts < total)]
    mask[starts - 1] = False
    return np.diff(values), mask


def pooled_gaps(table: pa.Table, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """ICL (every gap between consecutive content chunks, pooled over requests, ms) and ITL per
    token (a gap divided by the tokens of the chunk that ends it, once per token) where the
    records carry chunk_tokens of the same length as token_times. `rows` selects the requests."""
    tt = table.column("token_times")
    parts, lo = [], 0
    for chunk in tt.chunks:  # chunk by chunk (rows never span chunks): one whole-size copy, the result
        tv, tl = _flat(pa.chunked_array([chunk], tt.type))
        gaps, keep = _gaps(tv, tl)
        r = None if rows is None else rows[lo:lo + len(chunk)]
        if r is not None and (~r & (tl > 1)).any():   # failed requests usually have no chunks
            keep &= np.repeat(r, tl)[1:]      # gap i ends at chunk i+1, owned by that request
        parts.append(gaps[keep])
        lo += len(chunk)
    icl = np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)
    icl *= np.float32(1e3)
    itl = np.empty(0, dtype=np.float32)
    ct = table.column("chunk_tokens")
    if ct.null_count < len(ct):
        tv, tl = _flat(tt)
        kv, kl = _flat(ct)
        have = (kl == tl) & (kl > 0) & (True if rows is None else rows)
        if have.any():
            tv_h, kv_h = tv[np.repeat(have, tl)], kv[np.repeat(have, kl)].astype(np.int64)
            g, m = _gaps(tv_h, tl[have])
            g, k = g[m], kv_h[1:][m]
            pos = k > 0
            itl = np.repeat(g[pos] * np.float32(1e3) / k[pos], k[pos])
    return {"icl_ms": icl, "itl_ms": itl}
