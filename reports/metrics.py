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
    """Integer codes and labels of a string column; null becomes the label '(none)'."""
    enc = col.dictionary_encode().combine_chunks()
    labels = [str(x) for x in enc.dictionary.to_pylist()]
    codes = enc.indices
    if codes.null_count:
        codes = pc.fill_null(codes, len(labels))
        labels.append("(none)")
    return codes.to_numpy().astype(np.int32, copy=False), labels


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
    ttft = (first - sent) * 1e3 * okf
    e2e = (last - sent) * 1e3 * okf
    ttft_s = (first - sched) * 1e3 * okf
    e2e_s = (last - sched) * 1e3 * okf
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out >= 2, (last - first) * 1e3 / (n_out - 1), np.nan) * okf
        ntpot = np.where(n_out >= 1, e2e / n_out, np.nan)
        ntpot_s = np.where(n_out >= 1, e2e_s / n_out, np.nan)
    end = np.where(np.isnan(last), np.where(np.isnan(first), sent, first), last)
    cols = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "ntpot_ms": ntpot,
            "ttft_sched_ms": ttft_s, "e2e_sched_ms": e2e_s, "ntpot_sched_ms": ntpot_s,
            "lag_ms": (sent - sched) * 1e3}
    return RequestMetrics(n, status_codes, ok, sched, sent, end, n_out, usage & ok, input_len,
                          cols, lengths, encode(table.column("model")),
                          encode(table.column("slo_class")))


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and 0-based offsets of a list column (null lists are empty)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return arr.flatten().to_numpy(), offsets


def _gap_mask(offsets: np.ndarray) -> np.ndarray:
    """Over np.diff(values): True where both chunks belong to the same request."""
    total = int(offsets[-1])
    mask = np.ones(max(total - 1, 0), dtype=bool)
    starts = offsets[1:-1]
    starts = starts[(starts > 0) & (starts < total)]
    mask[starts - 1] = False
    return mask


def pooled_gaps(table: pa.Table) -> dict[str, np.ndarray]:
    """ICL (every gap between consecutive content chunks, pooled over requests, ms) and ITL per
    token (a gap divided by the tokens of the chunk that ends it, once per token) where the
    records carry chunk_tokens of the same length as token_times. `table` holds the rows to pool."""
    values, offsets = _flat(table.column("token_times"))
    icl = np.diff(values)[_gap_mask(offsets)] * np.float32(1e3)
    itl = np.empty(0, dtype=np.float32)
    ct = table.column("chunk_tokens")
    if ct.null_count < len(ct):
        same = pc.equal(pc.list_value_length(ct), pc.list_value_length(table.column("token_times")))
        sub = table.filter(pc.fill_null(same, False))
        if sub.num_rows:
            tv, toff = _flat(sub.column("token_times"))
            kv, _ = _flat(sub.column("chunk_tokens"))
            m = _gap_mask(toff)
            gaps, k = np.diff(tv)[m], kv[1:][m].astype(np.int64)
            pos = k > 0
            itl = np.repeat(gaps[pos] * np.float32(1e3) / k[pos], k[pos])
    return {"icl_ms": icl, "itl_ms": itl}
