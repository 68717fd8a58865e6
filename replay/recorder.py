"""Records: one per trace row, in `reports.schema.RECORD_SCHEMA`, written incrementally.

A `Recorder` buffers records column-wise and hands a RecordBatch to its sink at least
every second (the runner's flusher calls `flush`). On the process that owns the run
directory the sink appends to an Arrow IPC stream (`records.arrows`), which survives a
killed runner up to the last complete batch; `finalize` turns it into `records.parquet`.
On a distributed worker the sink ships the batch to the master instead.
"""
from __future__ import annotations

import os
from array import array
from collections import deque, namedtuple
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llm_replay.reports.schema import RECORD_LAYOUT, RECORD_SCHEMA

from . import plan

FIELDS = RECORD_SCHEMA.names
TOKEN_TIMES, CHUNK_TOKENS = FIELDS.index("token_times"), FIELDS.index("chunk_tokens")
ERROR_MAX = 400
RECORDS_STREAM = "records.arrows"
RECORDS_FILE = "records.parquet"


# A record: a tuple in the layout's order, filled by field name (the keywords cost ~2 us a request:
# 0.2 % of the runner's CPU at 40 tokens a request); a field record() misses fails its first call.
Record = namedtuple("Record", FIELDS)
FROM_ROW = {f.name: col for f, col in RECORD_LAYOUT if col}   # not-sent record field -> its row column
_ROW_AT = [plan.ROW_FIELDS.index(col) if col else None for _, col in RECORD_LAYOUT]


def record(row: tuple, target_model: str | None, worker: int, t0: float, res, target: str | None = None,
           trace_id: str | None = None) -> Record:
    """A record from a `replay.client.StreamResult` (perf_counter times) and its row, sent to `target`
    with W3C trace id `trace_id` (kept only if the request was sent).
    token_times stays (perf_counter stamps, sent) until `to_batch` turns a whole batch into
    offsets from sent at once: this runs in the hub once per request, the batch once a flush."""
    sent = res.sent
    return Record(
        request_id=row[plan.RID], model=row[plan.MODEL], target_model=target_model, target=target,
        slo_class=row[plan.SLO], session_id=row[plan.SESSION], worker=worker, scheduled_s=row[plan.SCHED],
        sent_s=None if sent is None else sent - t0, connect_s=res.connect_s,
        first_token_s=None if res.first_token is None else res.first_token - t0,
        last_token_s=None if res.last_token is None else res.last_token - t0,
        end_s=None if res.end is None else res.end - t0,
        first_answer_s=None if res.first_answer is None else res.first_answer - t0,
        token_times=None if sent is None else (res.token_times, sent), chunk_tokens=res.chunk_tokens,
        input_tokens=row[plan.IN], output_tokens=row[plan.OUT], num_images=row[plan.IMAGES],
        prompt_tokens=res.prompt_tokens, completion_tokens=res.completion_tokens,
        reasoning_tokens=res.reasoning_tokens, reasoning_chunks=res.reasoning_chunks or None,
        status=res.status, http_status=res.http_status, error=None if res.error is None else str(res.error)[:ERROR_MAX],
        task_id=row[plan.TASK], depends_on=row[plan.DEPS], delay_s=row[plan.DELAY], cached_tokens=res.cached_tokens,
        asked_reasoning_tokens=row[plan.REASON], trace_id=None if sent is None else trace_id,
        client_id=row[plan.CLIENT])


def unsent(row: tuple, target_model: str | None, worker: int, status: str = "not_sent",
           error: str | None = None, target: str | None = None) -> Record:
    """The record of a row that never completed (not_sent, or cancelled without a result): its
    `FROM_ROW` fields from the row, the rest null."""
    rec = Record._make(None if i is None else row[i] for i in _ROW_AT)
    return rec._replace(target_model=target_model, target=target, worker=worker, status=status, error=error)


def by_value(col: pa.ChunkedArray | pa.Array | None, n: int, fn: Callable, typ: pa.DataType) -> pa.Array:
    """`fn(value)` for each of `col`'s values (None where `col` is absent or null), called once per
    distinct value."""
    if col is None:
        return pa.array([fn(None)] * n, typ)
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    codes = enc.indices.fill_null(len(enc.dictionary)).to_numpy(zero_copy_only=False)
    return pa.array([fn(v) for v in enc.dictionary.to_pylist()] + [fn(None)], typ).take(codes)


def unsent_batch(rows: pa.Table, config, worker: int | pa.Array | None, status: str = "not_sent",
                 error: str | None = None) -> pa.RecordBatch:
    """The records of rows that never completed, column-wise: `rows` is what `TraceWindow.rest`
    yields; each record equals `unsent`'s of the same row."""
    n, have = rows.num_rows, set(rows.column_names)
    model = rows.column("model") if "model" in have else None
    cols = {"target_model": by_value(model, n, config.target_model, pa.string()),
            "target": by_value(model, n, config.target_of, pa.string()),
            "worker": worker if isinstance(worker, pa.Array) else pa.array([worker] * n, pa.int32()),
            "status": pa.array([status] * n, pa.string()), "error": pa.array([error] * n, pa.string())}
    for f, col in FROM_ROW.items():
        if col in have:
            cols[f] = rows.column(col).combine_chunks()
    return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
                                       for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)


def _lists(items: tuple, typ: pa.DataType, relative: bool) -> pa.Array:
    """One list column from per-record sequences (None = null) through one flat NumPy array.
    `relative`: items are (stamps, base) and the values become stamps - base; else token
    counts per chunk, clamped to int16."""
    n = len(items)
    counts, bases, flat = np.zeros(n, np.int32), np.zeros(n), array("d")
    for i, x in enumerate(items):
        if x is not None:
            if relative:
                x, bases[i] = x
            counts[i] = len(x)
            flat.extend(x)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = np.frombuffer(flat, np.float64) if flat else np.zeros(0)
    if relative:
        values = values - np.repeat(bases, counts)
    else:
        values = np.minimum(values, 32767)   # chunk_tokens is int16
    mask = np.array([x is None for x in items] + [False])
    return pa.ListArray.from_arrays(pa.array(offsets, mask=mask), pa.array(values, type=typ.value_type, safe=False))


def to_batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows)) if rows else [() for _ in FIELDS]
    arrays = [_lists(c, f.type, relative=i == TOKEN_TIMES) if i in (TOKEN_TIMES, CHUNK_TOKENS)
              else pa.array(c, type=f.type) for i, (c, f) in enumerate(zip(cols, RECORD_SCHEMA))]
    return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA)


class Recorder:
    """Buffers records and hands them to `sink` as RecordBatches, oldest first.

    Building a batch holds the hub for ~10 us a record, so the dispatcher writes small batches
    in its quiet moments (`flush(n)` when the next send is a few ms away) and a periodic
    flusher (`flush_stale`) writes only what waited a whole period: every record reaches the
    sink within two periods even when no quiet moment comes. `lock` (a native lock): another
    thread flushes too (`flush_to`), so each batch is taken and handed over under it."""

    def __init__(self, sink: Callable[[pa.RecordBatch], None], lock=None) -> None:
        self.sink = sink
        self.buf: deque[tuple] = deque()   # append and popleft are atomic between threads
        self.count = 0      # records added
        self.flushed = 0    # records handed to the sink
        self._mark = 0      # `count` at the previous flush_stale
        self.bulk = [0, 0]  # batches and records handed over by `write`
        self.lock = lock or nullcontext()

    def add(self, rec: tuple) -> None:
        self.buf.append(rec)
        self.count += 1

    def flush(self, n: int | None = None, max_rows: int | None = None) -> None:
        """The oldest `n` buffered records (all when None), as batches of at most `max_rows`."""
        self.flush_to(self.count if n is None else self.flushed + n, max_rows)

    def flush_to(self, upto: int, max_rows: int | None = None, pause=None) -> None:
        """Every record up to the `upto`-th added that is still buffered."""
        while True:
            with self.lock:
                k = min(upto - self.flushed, len(self.buf), max_rows or len(self.buf))
                if k <= 0:
                    return
                batch = [self.buf.popleft() for _ in range(k)]
                self.flushed += k
                self.sink(to_batch(batch))
            if pause is not None and upto > self.flushed and self.buf:
                pause()

    def write(self, batch: pa.RecordBatch) -> None:
        """Hand records built column-wise (`unsent_batch`) to the sink now, counted in `bulk`."""
        with self.lock:
            self.sink(batch)
        self.bulk[0] += 1
        self.bulk[1] += batch.num_rows

    def flush_stale(self, max_rows: int | None = None, pause=None) -> None:
        """Flush the records that were buffered already at the previous call."""
        upto, self._mark = self._mark, self.count
        self.flush_to(upto, max_rows, pause)


class IpcFile:
    """Append-only Arrow IPC stream: every batch reaches the kernel when written."""

    def __init__(self, path: str | Path, schema: pa.Schema = RECORD_SCHEMA) -> None:
        self.path = Path(path)
        self.file = pa.OSFile(str(self.path), "wb")
        self.writer = pa.ipc.new_stream(self.file, schema)

    def __call__(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)

    def close(self) -> None:
        if not self.file.closed:
            self.writer.close()
            self.file.close()


def read_stream(path: str | Path) -> Iterator[pa.RecordBatch]:
    """Every complete batch of an IPC stream, also of one cut short by a killed writer."""
    try:
        reader = pa.ipc.open_stream(pa.OSFile(str(path), "rb"))
    except (pa.ArrowInvalid, OSError):
        return
    while True:
        try:
            yield reader.read_next_batch()
        except (StopIteration, pa.ArrowInvalid, OSError):
            return


def finalize(stream: str | Path, out: str | Path, schema: pa.Schema = RECORD_SCHEMA,
             row_group: int = 65536) -> int:
    """Convert an IPC stream into a Parquet file (bounded memory); remove the stream.
    Returns the number of rows written."""
    stream, out = Path(stream), Path(out)
    tmp = out.with_suffix(".parquet.tmp")
    n, pending, size = 0, [], 0
    with pq.ParquetWriter(str(tmp), schema, compression="zstd") as w:
        for b in read_stream(stream):
            pending.append(b)
            size += b.num_rows
            if size >= row_group:
                w.write_table(pa.Table.from_batches(pending, schema))
                n, pending, size = n + size, [], 0
        if pending or n == 0:
            w.write_table(pa.Table.from_batches(pending, schema))
            n += size
    os.replace(tmp, out)
    stream.unlink(missing_ok=True)
    return n


def salvage(run_dir: str | Path, config, died_at_s: float) -> tuple[int, int]:
    """After the runner died: keep every flushed record and give each trace row of the window
    that has none a record too (`cancelled` if it was due before the death, else `not_sent`;
    error "runner died"), so the run still has exactly one record per row.
    Returns (records kept, records added)."""
    run_dir = Path(run_dir)
    stream, out = run_dir / RECORDS_STREAM, run_dir / RECORDS_FILE
    # a runner that died after finalize (the stream became records.parquet) had recorded every row
    kept = list(read_stream(stream)) if stream.exists() else pq.read_table(out).to_batches() if out.exists() else []
    seen = pa.chunked_array([b.column("request_id") for b in kept], pa.string()).combine_chunks()
    file = IpcFile(stream)
    for b in kept:
        file(b)
    added = 0
    for rows in plan.TraceWindow(config).rest():
        rows = rows.filter(pc.invert(pc.is_in(rows.column("request_id"), value_set=seen)))
        due = pc.less_equal(rows.column("scheduled_s"), died_at_s)
        for status, which in (("cancelled", due), ("not_sent", pc.invert(due))):
            part = rows.filter(which)
            if part.num_rows:
                file(unsent_batch(part, config, None, status, "runner died"))
                added += part.num_rows
    file.close()
    finalize(stream, out)
    return len(seen), added
