"""Per-request metrics (docs/metrics.md), vectorised over whole columns.

Every latency is in milliseconds, NaN where undefined (failed request, fewer than two output
tokens for TPOT, ...). List columns are handled through their flat values and offsets, never
row by row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import STATUSES

LATENCIES = ("ttft_ms", "ttfa_ms", "tpot_ms", "tpot_answer_ms", "icl_ms", "icl_answer_ms", "itl_ms",
             "itl_answer_ms", "e2e_ms", "ntpot_ms", "reasoning_ms", "answer_ms", "lag_ms")
# From schedule: TTFT/TTFA/E2E/NTPOT include client-side queueing; the others do not depend on it.
SCHED_ALIAS = {m.replace("_ms", "_sched_ms"): m for m in LATENCIES
               if m not in ("ttft_ms", "ttfa_ms", "e2e_ms", "ntpot_ms")}
POOLED = ("icl_ms", "itl_ms", "icl_answer_ms", "itl_answer_ms")


BATCH = 1 << 18   # rows per step: temporaries stay a few MB and are reused, never fresh pages


def as_f64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """float64 values, NaN where null (no copy for a float64 chunk without nulls)."""
    return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def encode(col: pa.ChunkedArray, dtype=np.int64) -> tuple[np.ndarray, list[str]]:
    """Integer codes and labels of a (possibly dictionary-encoded) string column; null becomes
    the label '(none)'. Labels in order of first appearance in the chunks' dictionaries (what
    unify_dictionaries gives); each chunk's indices are mapped through a small lookup table
    straight into the output, so no whole-column temporaries are made."""
    codes = np.empty(len(col), dtype=dtype)
    index: dict[str, int] = {}
    nulls, lo = False, 0
    for chunk in col.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        lut = np.array([index.setdefault(str(v), len(index)) for v in chunk.dictionary.to_pylist()] + [-1],
                       dtype=dtype)
        idx = chunk.indices
        if idx.null_count:
            nulls = True
            idx = pc.fill_null(idx, len(lut) - 1)   # -> -1, relabelled below
        np.take(lut, idx.to_numpy(), out=codes[lo:lo + len(chunk)])
        lo += len(chunk)
    labels = list(index)
    if nulls:
        codes[codes == -1] = len(labels)
        labels.append("(none)")
    return codes, labels


LENGTH_CHECKS = {"output": ("output_tokens", "completion_tokens"), "input": ("input_tokens", "prompt_tokens")}


@dataclass
class LengthCheck:
    """A requested length (the trace's) against the reported one (the server's usage)."""
    both: np.ndarray        # bool per request: both known
    bad_rows: np.ndarray    # ascending rows where they differ
    bad_diff: np.ndarray    # reported - requested at those rows


@dataclass
class RequestMetrics:
    """Column arrays, one entry per record (all rows of the run, measured or not)."""
    n: int
    status_codes: np.ndarray        # index into STATUSES
    ok: np.ndarray                  # bool
    scheduled: np.ndarray           # seconds (NaN if unknown)
    sent: np.ndarray
    end: np.ndarray                 # last token, else first token, else sent: when it left the system
    n_out: np.ndarray               # completion_tokens if reported, else token chunks
    n_out_from_usage: np.ndarray    # bool
    input_len: np.ndarray           # prompt_tokens if reported, else input_tokens
    chunk_kind: np.ndarray          # int8 CHUNK_KINDS: what each success's chunks carried, for ITL
    images: np.ndarray              # int16: images sent with the request (0: none)
    has_reasoning: bool             # some record streamed reasoning or reported reasoning tokens
    reasoning: np.ndarray           # reasoning tokens (NaN: none)
    reasoning_chunks: np.ndarray    # chunks before the first answer (0: no reasoning phase)
    columns: dict[str, np.ndarray]  # ttft_ms, ttfa_ms, tpot_ms, ..., *_sched_ms, lag_ms
    model: tuple[np.ndarray, list[str]]
    slo_class: tuple[np.ndarray, list[str]]
    length_checks: dict[str, LengthCheck]   # LENGTH_CHECKS
    target: tuple[np.ndarray, list[str]] | None = None   # the deployment each row went to
    # rows that succeeded with no token although the trace asked for some (an empty 200)
    empty_ok: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def latency(self, name: str) -> np.ndarray:
        return self.columns[SCHED_ALIAS.get(name, name)]

    @property
    def one_token(self) -> np.ndarray:
        """Successes whose chunks carried one token each: confirmed by the usage, or assumed."""
        return (self.chunk_kind == ONE_TOKEN) | (self.chunk_kind == ASSUMED)


# What a successful request's chunks carried, as far as the records tell (ITL needs tokens per
# chunk). ONE_TOKEN: the usage total is the chunk count, up to a few tokens that yield no text
# (EOS, a reasoning model's </think>); ASSUMED: no usage, so one token a chunk is assumed;
# SEVERAL: the usage counts more tokens than that (speculative decoding, stream intervals), or
# fewer than the chunks: tokens per chunk unknown.
NO_CHUNKS, ONE_TOKEN, ASSUMED, SEVERAL = range(4)
CHUNK_KINDS = ("none", "one_token_usage", "one_token_assumed", "several_tokens")
SILENT_TOKENS = 3       # tokens a stream may count without a chunk (EOS, think delimiters)


# Used only to compute the per-request arrays, so they can be streamed in (request_metrics).
STREAMED_COLUMNS = ("scheduled_s", "sent_s", "first_token_s", "last_token_s", "first_answer_s", "input_tokens",
                    "output_tokens", "prompt_tokens", "completion_tokens", "reasoning_tokens", "reasoning_chunks",
                    "num_images")
ARRAYS = ("scheduled", "sent", "end", "n_out", "input_len")
OUTPUTS = (*ARRAYS, "ttft_ms", "tpot_ms", "e2e_ms", "ntpot_ms", "answer_ms", "ttft_sched_ms", "e2e_sched_ms",
           "ntpot_sched_ms", "lag_ms")
# Allocated once a record shows reasoning; without any, each is its twin (the answer is all of
# the output) or, for reasoning_ms, NaN: no memory is spent on them.
REASONING_OUTPUTS = ("ttfa_ms", "ttfa_sched_ms", "tpot_answer_ms", "reasoning_ms", "reasoning", "reasoning_chunks")
TWINS = {"ttfa_ms": "ttft_ms", "ttfa_sched_ms": "ttft_sched_ms", "tpot_answer_ms": "tpot_ms"}


def request_metrics(table: pa.Table, stream=None) -> RequestMetrics:
    """Every per-request array, computed BATCH rows at a time into arrays allocated once: the
    float64 results are the only whole-size memory (at 10M records each temporary of a
    whole-column formula cost a fresh 80 MB; page faults were most of the time).

    `stream`: the STREAMED_COLUMNS as consecutive tables/batches covering the rows in order
    (say read from the records file as they are needed) when `table` does not hold them; they
    are needed only here, so they never have to be in memory whole."""
    n = table.num_rows
    scodes, slabels = encode(table.column("status"), np.int16)
    lut = np.array([STATUSES.index(s) if s in STATUSES else len(STATUSES) for s in slabels] or [0], np.int8)
    status_codes = lut[scodes]
    del scodes
    ok = status_codes == 0
    usage, chunk_kind, images = np.empty(n, dtype=bool), np.empty(n, dtype=np.int8), np.empty(n, dtype=np.int16)
    out = {k: np.empty(n) for k in OUTPUTS}
    rsn: dict | None = None
    no_rows = np.empty(0, np.int64)      # each list of rows starts with it: a run may have no batch
    checks = {k: (np.empty(n, dtype=bool), [no_rows], [np.empty(0)]) for k in LENGTH_CHECKS}
    empty = [no_rows]
    lo = 0
    if stream is None:
        stream = table.select(list(STREAMED_COLUMNS)).to_batches(max_chunksize=BATCH)
    token_times = table.column("token_times")
    for tb in stream:
        sl = slice(lo, lo + tb.num_rows)
        o = {k: v[sl] for k, v in out.items()}
        sched, sent = o["scheduled"], o["sent"]
        sched[:], sent[:] = as_f64(tb.column("scheduled_s")), as_f64(tb.column("sent_s"))
        first, last = as_f64(tb.column("first_token_s")), as_f64(tb.column("last_token_s"))
        lengths = {k: as_f64(tb.column(k)) for k in ("input_tokens", "output_tokens", "prompt_tokens",
                                                      "completion_tokens")}
        images[sl] = tb.column("num_images").fill_null(0).to_numpy()
        for kind, (want, got) in LENGTH_CHECKS.items():
            both, rows, diffs = checks[kind]
            a, b = lengths[want], lengths[got]
            np.logical_not(np.isnan(a) | np.isnan(b), out=both[sl])
            if kind == "input":     # the server counts image tokens in prompt_tokens; the trace does not
                both[sl] &= images[sl] == 0
            bad = np.flatnonzero(both[sl] & (a != b))
            rows.append(bad + sl.start)
            diffs.append(b[bad] - a[bad])
        completion = lengths["completion_tokens"]
        n_chunks = as_f64(pc.list_value_length(token_times.slice(lo, tb.num_rows)))   # NaN: no chunk list
        np.logical_not(np.isnan(completion), out=usage[sl])
        n_out = o["n_out"]
        np.copyto(n_out, np.where(usage[sl], completion, n_chunks))
        with np.errstate(invalid="ignore"):
            empty.append(np.flatnonzero(ok[sl] & ~(n_chunks >= 1) & ~(completion > 0)
                                        & (lengths["output_tokens"] > 0)) + sl.start)
            excess = completion - n_chunks
            one = (excess >= 0) & (excess <= np.maximum(SILENT_TOKENS, 0.02 * n_chunks))
        kind = np.where(usage[sl], np.where(one, ONE_TOKEN, SEVERAL), ASSUMED)
        chunk_kind[sl] = np.where(ok[sl] & (n_chunks >= 1), kind, NO_CHUNKS)
        prompt = lengths["prompt_tokens"]
        np.copyto(o["input_len"], np.where(np.isnan(prompt), lengths["input_tokens"], prompt))
        # Seconds to ms, NaN for failed requests: one multiply (x * 1e3 is what x * 1e3 * 1.0 was).
        ok_ms = np.where(ok[sl], 1e3, np.nan)

        def ms(a: np.ndarray, b: np.ndarray, dst: np.ndarray, blank: bool = True) -> np.ndarray:
            np.subtract(a, b, out=dst)
            dst *= ok_ms if blank else 1e3
            return dst

        def per_token(num: np.ndarray, den: np.ndarray, valid: np.ndarray, dst: np.ndarray) -> None:
            np.divide(num, den, out=dst)
            dst[~valid] = np.nan

        e2e, e2e_s = ms(last, sent, o["e2e_ms"]), ms(last, sched, o["e2e_sched_ms"])
        ms(first, sent, o["ttft_ms"])
        ms(first, sched, o["ttft_sched_ms"])
        with np.errstate(invalid="ignore", divide="ignore"):
            # one chunk (several tokens in one event, e.g. an invisible </think> counted by the
            # usage): no time between tokens was seen, so no TPOT (it was 0)
            per_token(ms(last, first, o["answer_ms"]), n_out - 1, (n_out >= 2) & ~(n_chunks < 2), o["tpot_ms"])
            per_token(e2e, n_out, n_out >= 1, o["ntpot_ms"])
            per_token(e2e_s, n_out, n_out >= 1, o["ntpot_sched_ms"])
        reasoning = as_f64(tb.column("reasoning_tokens"))
        rc = np.nan_to_num(as_f64(tb.column("reasoning_chunks")))   # null: no reasoning phase
        if rsn is None and ((rc > 0).any() or (reasoning > 0).any()):
            rsn = {k: np.empty(n) for k in REASONING_OUTPUTS}   # rows [0, lo) had none: filled from their twins
            for k, twin in TWINS.items():
                rsn[k][:lo] = out[twin][:lo]
            rsn["reasoning_ms"][:lo] = rsn["reasoning"][:lo] = np.nan
            rsn["reasoning_chunks"][:lo] = 0.0
        if rsn is not None:
            r = {k: v[sl] for k, v in rsn.items()}
            r["reasoning"][:], r["reasoning_chunks"][:] = reasoning, rc
            # without a reasoning phase the first token is the first answer
            answer = np.where(rc == 0, first, as_f64(tb.column("first_answer_s")))
            n_answer = np.where(usage[sl], completion - np.nan_to_num(reasoning), n_chunks - rc)
            ms(answer, sent, r["ttfa_ms"])
            ms(answer, sched, r["ttfa_sched_ms"])
            ms(np.where(np.isnan(answer), last, answer), first, r["reasoning_ms"])   # no answer: all of it
            r["reasoning_ms"][rc == 0] = np.nan
            with np.errstate(invalid="ignore", divide="ignore"):
                per_token(ms(last, answer, o["answer_ms"]), n_answer - 1, (n_answer >= 2) & ~(n_chunks - rc < 2),
                          r["tpot_answer_ms"])
        end = o["end"]                    # last token, else first token, else sent
        np.copyto(end, last)
        np.copyto(end, first, where=np.isnan(end))
        np.copyto(end, sent, where=np.isnan(end))
        ms(sent, sched, o["lag_ms"], blank=False)
        lo += tb.num_rows
    if lo != n:
        raise ValueError(f"the streamed columns cover {lo} rows, the records {n}")
    cols = {k: out[k] for k in OUTPUTS[len(ARRAYS):]}
    if rsn is None:
        nan = np.broadcast_to(np.float64(np.nan), (n,))      # read-only, no memory
        cols.update({k: cols[twin] for k, twin in TWINS.items()}, reasoning_ms=nan)
        reasoning, reasoning_chunks = nan, np.broadcast_to(np.float64(0.0), (n,))
    else:
        cols.update({k: rsn[k] for k in REASONING_OUTPUTS if k.endswith("_ms")})
        reasoning, reasoning_chunks = rsn["reasoning"], rsn["reasoning_chunks"]
    return RequestMetrics(n, status_codes, ok, out["scheduled"], out["sent"], out["end"], out["n_out"],
                          usage & ok, out["input_len"], chunk_kind, images, rsn is not None, reasoning,
                          reasoning_chunks, cols, encode(table.column("model"), np.int32),
                          encode(table.column("slo_class"), np.int32),
                          {k: LengthCheck(both, np.concatenate(rows), np.concatenate(diffs))
                           for k, (both, rows, diffs) in checks.items()},
                          encode(table.column("target"), np.int32) if "target" in table.column_names else None,
                          np.concatenate(empty))


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and per-row lengths of a list column (null lists are empty), chunk by chunk
    so the list column is never copied whole (it has a chunk: pooled_gaps asks only for one with rows)."""
    lens = np.concatenate([pc.fill_null(pc.list_value_length(c), 0).to_numpy() for c in col.chunks])
    values = np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in col.chunks])
    return values, lens.astype(np.int64)


def token_gaps(values: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.diff(values) and a mask of the gaps whose two chunks belong to the same request."""
    offsets = np.concatenate([[0], np.cumsum(lens)])
    total = int(offsets[-1])
    mask = np.ones(max(total - 1, 0), dtype=bool)
    starts = offsets[1:-1]
    starts = starts[(starts > 0) & (starts < total)]
    mask[starts - 1] = False
    return np.diff(values), mask


def chunk_token_rows(table: pa.Table, rows: np.ndarray | None = None) -> np.ndarray:
    """Requests (among `rows`) whose records carry chunk_tokens as long as token_times."""
    tt, ct = table.column("token_times"), table.column("chunk_tokens")
    have = np.zeros(len(tt), bool)
    if ct.null_count < len(ct):
        tl = pc.fill_null(pc.list_value_length(tt), 0).to_numpy(zero_copy_only=False)
        kl = pc.fill_null(pc.list_value_length(ct), 0).to_numpy(zero_copy_only=False)
        have = (kl == tl) & (kl > 0)
    return have if rows is None else have & rows


def pooled_gaps(table: pa.Table, rows: np.ndarray | None = None, one_token: np.ndarray | None = None,
                reasoning_chunks: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Gaps between consecutive token chunks of a request, pooled over requests (ms):
    - `icl_ms`: every gap;
    - `itl_ms`, per token: a gap divided by the tokens of the chunk that ends it, once per token,
      where the records carry chunk_tokens of the same length as token_times; and each gap as it
      is where `one_token` says every chunk carried one token (RequestMetrics.one_token);
    - `icl_answer_ms`, `itl_answer_ms`: the same over the answer phase only, the gaps between
      chunks from index `reasoning_chunks` on (without it they are icl_ms and itl_ms).
    `rows` selects the requests."""
    tt = table.column("token_times")
    sel = np.ones(len(tt), bool) if rows is None else rows
    phase = reasoning_chunks is not None
    have = chunk_token_rows(table, sel)
    if have.any():
        tv_all, tl_all = _flat(tt)
        kv_all, kl_all = _flat(table.column("chunk_tokens"))
    one = np.zeros(len(tt), bool) if one_token is None else one_token & sel & ~have
    # Two passes over the chunks (rows never span chunks): the list lengths say how many gaps
    # there are, so each chunk's gaps go straight into one array allocated once (no per-chunk
    # parts and no concatenation: at 10M records that was 2 x 280 MB of fresh pages).
    per_chunk, lo, n_icl = [], 0, 0
    for chunk in tt.chunks:
        tl = pc.fill_null(pc.list_value_length(chunk), 0).to_numpy().astype(np.int64)
        sl = slice(lo, lo + len(chunk))
        n_icl += int(np.maximum(tl - 1, 0)[sel[sl]].sum())
        per_chunk.append((chunk, tl, sl))
        lo += len(chunk)
    # ITL is ICL itself when every selected request with a gap carried one token per chunk
    itl_is_icl = not have.any() and not any((sel[sl] & ~one[sl] & (tl > 1)).any() for _, tl, sl in per_chunk)
    icl, at = np.empty(n_icl, dtype=np.float32), 0
    parts: dict[str, list] = {"icl_answer_ms": [], "itl_ms": [], "itl_answer_ms": []}
    for chunk, tl, sl in per_chunk:
        tv = chunk.flatten().to_numpy(zero_copy_only=False)
        gaps, keep = token_gaps(tv, tl)
        if (~sel[sl] & (tl > 1)).any():   # failed requests usually have no chunks
            keep &= np.repeat(sel[sl], tl)[1:]      # gap i ends at chunk i+1, owned by that request
        out = icl[at:at + np.count_nonzero(keep)]
        np.compress(keep, gaps, out=out)
        out *= np.float32(1e3)
        at += len(out)
        answer = keep & _in_answer(tl, reasoning_chunks[sl]) if phase else None
        if phase:
            parts["icl_answer_ms"].append(gaps[answer] * np.float32(1e3))
        if not itl_is_icl and one[sl].any():
            owner = np.repeat(one[sl], tl)[1:]
            parts["itl_ms"].append(gaps[keep & owner] * np.float32(1e3))
            if phase:
                parts["itl_answer_ms"].append(gaps[answer & owner] * np.float32(1e3))
    if have.any():
        tv_h, kv_h = tv_all[np.repeat(have, tl_all)], kv_all[np.repeat(have, kl_all)].astype(np.int64)
        g, m = token_gaps(tv_h, tl_all[have])
        masks = {"itl_ms": m}
        if phase:
            masks["itl_answer_ms"] = m & _in_answer(tl_all[have], reasoning_chunks[have])
        for key, mask in masks.items():
            gk, k = g[mask], kv_h[1:][mask]
            pos = k > 0
            parts[key].append(np.repeat(gk[pos] * np.float32(1e3) / k[pos], k[pos]))
    itl = icl if itl_is_icl else _cat(parts["itl_ms"])
    answer = _cat(parts["icl_answer_ms"]) if phase else icl
    return {"icl_ms": icl, "itl_ms": itl, "icl_answer_ms": answer,
            "itl_answer_ms": itl if not phase else answer if itl_is_icl else _cat(parts["itl_answer_ms"])}


def _in_answer(lens: np.ndarray, reasoning_chunks: np.ndarray) -> np.ndarray:
    """Per gap of the flattened chunks (as `token_gaps`): True when it starts at or after the request's
    first answer chunk (index `reasoning_chunks`), so both of its chunks are answer chunks."""
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) + reasoning_chunks.astype(np.int64)
    return (np.arange(int(lens.sum())) >= np.repeat(starts, lens))[:-1]


def _cat(parts: list) -> np.ndarray:
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.empty(0, dtype=np.float32)
