"""What to replay: the run configuration and the trace window as a stream of rows.

The runner never holds the trace: `TraceWindow` walks the Parquet file in small record
batches and yields rows (plain tuples, so they travel in Locust messages unchanged) with
their schedule already computed; after a stop, `rest` hands over the unread part as Arrow tables
(not_sent records are built from them column-wise). `scan` validates the window once before the run.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llm_replay.reports.schema import RECORD_LAYOUT
from llm_replay.traces.errors import TraceError
from llm_replay.traces.graph import check_graph, parse_depends_on
from llm_replay.traces.schema import BY_NAME
from llm_replay.traces.trace import Trace, conform

# A row is a tuple (msgpack-friendly) of these fields: the trace's columns of that name, its file row
# (index), scheduled_s, ndep (rows of the window that wait for it, and its session's next call in a
# task) and conv (the previous call of its session in its task). Below, the constants that name them.
ROW_FIELDS = ("index", "request_id", "scheduled_s", "input_tokens", "output_tokens", "model", "session_id",
              "turn", "slo_class", "api", "prompt", "hash_ids", "num_images", "image_px", "task_id",
              "depends_on", "delay_s", "ndep", "conv", "reasoning_tokens", "client_id")
IDX, RID, SCHED, IN, OUT, MODEL, SESSION, TURN, SLO, API, PROMPT, HASH, IMAGES, IMAGE_PX, \
    TASK, DEPS, DELAY, NDEP, CONV, REASON, CLIENT = range(len(ROW_FIELDS))
ROW_LEN = len(ROW_FIELDS)
RECORD_COLUMNS = {c for _, c in RECORD_LAYOUT if c}   # those a record of a row never sent takes
ROW_COLUMNS = ["arrival_ns", *(n for n in ROW_FIELDS if n in BY_NAME)]   # what it reads of the trace


@dataclass
class RunConfig:
    """Everything a runner process needs; written (minus nothing secret) into run.json."""
    trace: str
    target: str                              # default target: rows whose label `targets` does not name
    run_dir: str
    api: str = "completions"                 # default API for rows without an `api` value
    model_map: dict = field(default_factory=dict)   # trace label -> served name
    default_model: str | None = None         # for labels not in model_map (and null labels)
    targets: dict = field(default_factory=dict)     # trace label -> its own deployment's base URL
    api_key_envs: dict = field(default_factory=dict)  # trace label -> NAME of its key's env var
    served_defaults: dict = field(default_factory=dict)  # target URL -> its first served model
    speed: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    max_requests: int | None = None
    warmup: int = 0
    preconnect: int = 0                      # keep-alive connections opened before T0 (split across workers)
    cache_resets: dict = field(default_factory=dict)  # --reset-cache: target URL -> the path that reset its cache
    timeout_s: float = 300.0
    grace_s: float = 5.0
    api_key_env: str | None = None           # the NAME of the env var; the key itself is never stored
    workers: int = 1
    remote_workers: int = 0
    master_host: str = "127.0.0.1"
    master_port: int = 0
    seed: int = 0
    salt: int | None = None                  # mixed into the prompt seed per run (replay run draws one)
    image_url_base: str | None = None        # images by URL ({base}/{W}x{H}.png) instead of inline data
    sessions: str = "off"                    # off | timestamps | closed
    graph: bool = False                      # the window has rows with depends_on (from scan)
    max_delay_s: float | None = None         # cap on a dependant's delay_s (idle gaps); None: as recorded
    prompt_mode: str = "ids"                 # ids | text
    tokenizer: str | None = None
    calibration: dict | None = None          # text mode: tokens = a + b * words (per api)
    template_tokens: dict = field(default_factory=dict)   # --tokenizer: chat template tokens per api@target
    force_output_len: bool = True            # send min_tokens + ignore_eos
    ask_reasoning: bool = True               # send a chat row's reasoning_tokens (engine-stub's field)
    block_size: int = 16
    scrape_url: str | None = None
    scrapes: dict = field(default_factory=dict)      # trace label -> its deployment's metrics URL
    scrape_interval_s: float = 1.0
    run_id: str | None = None                # this run's id (trace ids derive from it and the request id)
    otlp: str | None = None                  # --otlp: HOST:PORT receiving the server's spans, or "send"
                                             # (headers only: a collector gets them); None: untraced
    otlp_wait_s: float = 10.0                # after the last response, wait this long for stragglers
    lead_s: float = 0.5                      # T0 = now + lead
    spin_s: float = 0.0                      # busy-wait (yielding) this long before each due time
    rows: int = 0                            # rows in the window (from scan)
    window_s: float = 0.0                    # schedule length of the window (from scan)
    progress: bool = True

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RunConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def target_of(self, label: str | None) -> str:
        """The base URL a row with trace model `label` is sent to."""
        return self.targets.get(label, self.target) if label is not None else self.target

    def describe_targets(self) -> str:
        routed = ", ".join(f"{label} -> {url}" for label, url in self.targets.items())
        return ", ".join(x for x in (self.target and (f"{self.target} (default)" if routed else self.target),
                                       routed) if x)

    def key_env_of(self, label: str | None) -> str | None:
        return self.api_key_envs.get(label, self.api_key_env) if label is not None else self.api_key_env

    @property
    def prompt_seed(self) -> int:
        """The seed of the prompt and image bytes: `seed`, salted per run so that a second run
        does not hit the first one's prefix cache (equal blocks within a run stay equal)."""
        return self.seed if self.salt is None else \
            int.from_bytes(hashlib.blake2b(f"{self.seed}:{self.salt}".encode(), digest_size=4).digest(), "little")

    def target_model(self, label: str | None) -> str | None:
        """The served model name for `label`: --model-map, else its target's first served model
        (per-model deployments each serve their own), else the run's default."""
        if label is not None and label in self.model_map:
            return self.model_map[label]
        return self.served_defaults.get(self.target_of(label), self.default_model)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _origin(path: str) -> int:
    for b in Trace.iter_batches(path, batch_size=1, columns=["arrival_ns"]):
        try:
            return int(b.column(0)[0].as_py()) if b.num_rows else 0
        except (TypeError, ValueError):   # not a number: the batch checks name the rule and the row
            return 0
    raise TraceError("the trace is empty (0 rows)", file=path)


class TraceWindow:
    """Rows of `config.trace` inside the window, in order, with `scheduled_s` = trace time
    since the window start divided by `speed`."""

    def __init__(self, config: RunConfig, batch_size: int = 2048) -> None:
        self.config, self.batch_size = config, batch_size
        self.origin = _origin(config.trace)
        self.lo = self.origin + int(config.start_s * 1e9)
        self.hi = None if config.duration_s is None else self.lo + int(config.duration_s * 1e9)
        self._ndep: np.ndarray | None = None
        self.conv: dict[int, str] = {}
        self._src = self.batches(use_threads=False)   # the window's batches, shared by rows() and rest()
        self._ahead: list = []              # a batch read before it was asked for (prefetch)
        self._left = config.max_requests

    def dependants(self) -> np.ndarray | None:
        """Per window row, how many rows of the window wait for it; None: no row waits for any.
        Reads request_id/task_id/depends_on/session_id of the file up to the window's end and
        checks the graph (unknown ids, cycles, other tasks): one pass, arrays only. A dependant
        with a session_id continues the conversation of its session's previous call in the task
        (`conv`, window row -> request_id), which is kept for it like a dependency."""
        if self._ndep is None:
            self._ndep = self._graph()
        return self._ndep if len(self._ndep) else None

    def _graph(self) -> np.ndarray:
        path, cols = self.config.trace, ["arrival_ns", "request_id", "task_id", "depends_on", "session_id"]
        parts, first, n = [], None, 0
        for b in Trace.iter_batches(path, batch_size=65536, columns=cols):
            if "depends_on" not in b.schema.names:
                return np.zeros(0, np.int32)
            arr = b.column("arrival_ns").to_numpy()
            if self.hi is not None and arr[0] >= self.hi:
                break
            if first is None and (arr >= self.lo).any():
                first = n + int(np.argmax(arr >= self.lo))
            end = len(arr) if self.hi is None else int(np.searchsorted(arr, self.hi))
            parts.append(b.slice(0, end))
            n += end
        if first is None:
            return np.zeros(0, np.int32)
        t = pa.Table.from_batches(parts)
        if self.config.max_requests is not None:
            t = t.slice(0, first + self.config.max_requests)
        # cast as conform does (scan has checked each batch's rows)
        col = {n: t.column(n).cast(pa.string()) for n in ("request_id", "task_id", "session_id") if n in t.column_names}
        ids = col["request_id"] if "request_id" in col else pa.array(np.arange(t.num_rows)).cast(pa.string())
        deps = parse_depends_on(t.column("depends_on")).cast(pa.list_(pa.string()))
        counts = check_graph(ids, col.get("task_id"), deps, file=path, count_from=first)
        has = pc.list_value_length(deps.slice(first)).fill_null(0).to_numpy(zero_copy_only=False) > 0
        if not (counts[first:].any() or has.any()):
            return np.zeros(0, np.int32)
        if "session_id" in col and "task_id" in col:
            # a dependant with a session_id: the previous row of its (task, session) in the window
            key = pc.binary_join_element_wise(col["task_id"].slice(first), col["session_id"].slice(first), "\x00")
            codes = pc.dictionary_encode(key.combine_chunks()).indices.fill_null(-1).to_numpy(zero_copy_only=False)
            order = np.lexsort((np.arange(len(codes)), codes))
            c = codes[order]
            same = (c[1:] == c[:-1]) & (c[1:] >= 0) & has[order[1:]]
            rows, prev = order[1:][same], order[:-1][same]
            np.add.at(counts, prev + first, 1)
            self.conv = dict(zip(rows.tolist(), ids.slice(first).take(pa.array(prev)).to_pylist()))
        return counts[first:]

    def batches(self, validate: bool = False, use_threads: bool = True) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(file row offset, batch) restricted to the window's time range."""
        offset, last, cast = 0, None, ...   # cast: the schema to cast to (None: none; ...: not known yet)
        path = self.config.trace
        for b in Trace.iter_batches(path, batch_size=self.batch_size, columns=ROW_COLUMNS, use_threads=use_threads):
            if validate:
                _validate(b, path, offset, last)
                last = int(b.column("arrival_ns")[-1].as_py())
            if cast is ...:
                cast = _canonical_schema(b.schema)
            if cast is not None:
                b = pa.Table.from_batches([b]).cast(cast).combine_chunks().to_batches()[0]
            arr = b.column("arrival_ns").to_numpy()
            if self.hi is not None and arr[0] >= self.hi:
                return
            keep = (arr >= self.lo) & (arr < self.hi if self.hi is not None else True)
            if keep.all():
                yield offset, b
            elif keep.any():
                first = int(np.argmax(keep))
                yield offset + first, b.slice(first, int(keep.sum()))
            offset += b.num_rows

    def _next(self) -> tuple[int, pa.RecordBatch] | None:
        """The next unread (file row offset, batch) of the window (bounded by `max_requests`)."""
        if self._ahead:
            return self._ahead.pop()
        nxt = next(self._src, None) if self._left is None or self._left > 0 else None
        if nxt is not None and self._left is not None:
            nxt = nxt[0], nxt[1].slice(0, self._left)
            self._left -= nxt[1].num_rows
        return nxt

    def prefetch(self) -> "TraceWindow":
        """Read the graph and the first batch now (before T0), not when the first row is due."""
        self.dependants()
        nxt = self._next()
        if nxt is not None:
            self._ahead.append(nxt)
        return self

    def __iter__(self) -> Iterator[list[tuple]]:
        return self.rows()

    def rows(self) -> Iterator[list[tuple]]:
        """Lists of row tuples. Decoded in the calling thread: this feeds a dispatcher mid-run,
        where waking an Arrow pool thread on the dispatcher's CPU let it run (and fault in fresh
        huge pages) for ~6 ms while a send was due."""
        speed = self.config.speed
        deps, done = self.dependants(), 0
        while (nxt := self._next()) is not None:
            offset, b = nxt
            cols = {n: b.column(n).to_pylist() if n in b.schema.names else None for n in ROW_COLUMNS}
            n = b.num_rows
            sched = ((b.column("arrival_ns").to_numpy() - self.lo) / 1e9 / speed).tolist()
            none = [None] * n
            rid = cols["request_id"] or [str(offset + i) for i in range(n)]
            ndep = conv = none
            if deps is not None:
                ndep = deps[done:done + n].tolist()
                conv = [self.conv.pop(done + i, None) for i in range(n)] if self.conv else none
                done += n
            cols.update(index=range(offset, offset + n), request_id=rid, scheduled_s=sched, ndep=ndep, conv=conv)
            yield list(zip(*(cols[f] or none for f in ROW_FIELDS)))

    def rest(self, min_rows: int = 16384) -> Iterator[pa.Table]:
        """The window's unread rows (those `rows()` has not yielded yet) as tables of at least
        `min_rows` rows (but the last), with `request_id` filled in and `scheduled_s` added: the
        columns a not_sent record takes from its row, without a Python object per row."""
        parts, n = [], 0
        for offset, b in iter(self._next, None):
            if "request_id" not in b.schema.names:
                b = b.append_column("request_id", pa.array(np.arange(offset, offset + b.num_rows)).cast(pa.string()))
            sched = (b.column("arrival_ns").to_numpy() - self.lo) / 1e9 / self.config.speed
            parts.append(b.append_column("scheduled_s", pa.array(sched)))
            if (n := n + b.num_rows) >= min_rows:
                yield pa.Table.from_batches(parts).combine_chunks()
                parts, n = [], 0
        if parts:
            yield pa.Table.from_batches(parts).combine_chunks()


def table_of(rows: list[tuple]) -> pa.Table:
    """Row tuples (at least one) as the columns `TraceWindow.rest` yields."""
    return pa.table({n: pa.array([r[i] for r in rows]) for i, n in enumerate(ROW_FIELDS) if n in RECORD_COLUMNS})


def _canonical_schema(schema: pa.Schema) -> pa.Schema | None:
    """The trace schema's types for a file's columns, or None when the file has them already (a
    file that `validate` accepts may store them otherwise: arrival_ns as strings, int64 token
    counts, which conform casts). Once per file: every batch has the file's schema."""
    want = pa.schema([pa.field(n, BY_NAME[n].type if n in BY_NAME else t) for n, t in zip(schema.names, schema.types)])
    return None if schema.equals(want) else want


def _validate(b: pa.RecordBatch, path: str, offset: int, last: int | None) -> None:
    try:
        conform(pa.Table.from_batches([b]), file=path, fill_request_id=False)
    except TraceError as e:  # rows are batch-relative: report them as file rows
        rows = None if e.rows is None else [r + offset for r in e.rows]
        raise TraceError(e.rule, file=path, column=e.column, rows=rows) from None
    first = int(b.column("arrival_ns")[0].as_py())
    if last is not None and first < last:
        raise TraceError("arrival_ns must be non-decreasing (sort the trace first)",
                         file=path, column="arrival_ns", rows=[offset])


def scan(config: RunConfig) -> tuple[int, float]:
    """Validate the window of the trace batch by batch: (row count, schedule length in s)."""
    if not Path(config.trace).exists():
        raise TraceError("file not found", file=config.trace)
    window, n, last = TraceWindow(config, batch_size=65536), 0, None
    window._src = window.batches(validate=True)   # read as rows() reads, max_requests included
    for _, b in iter(window._next, None):
        n, last = n + b.num_rows, int(b.column("arrival_ns")[-1].as_py())
    if n == 0:
        raise TraceError("no trace rows in the selected window (check --start/--duration)", file=config.trace)
    config.graph = window.dependants() is not None
    return n, (last - window.lo) / 1e9 / config.speed


def trace_block_size(path: str, default: int = 16) -> int:
    try:
        return int(Trace.read_metadata(path).get("block_size") or default)
    except (TypeError, ValueError):
        return default


def shard_of(row: tuple, n: int, counter: int) -> int:
    """Worker for a row: all rows of a task, all turns of a session together, other rows round-robin."""
    if n == 1:
        return 0
    s = row[TASK] if row[TASK] is not None else row[SESSION]
    return zlib.crc32(s.encode()) % n if s is not None else counter % n


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
