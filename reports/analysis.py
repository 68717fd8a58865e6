"""A measured run: per-request metrics, the measured window, duration D and good requests.

Summary, gate and compare all read a run through `analyze`, so they agree on every number.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ReportError
from .metrics import POOLED, RequestMetrics, as_f64, encode, pooled_gaps, request_metrics
from .schema import RECORD_SCHEMA
from .slo import SloSpec
from .stats import PERCENTILES
from .window import select


M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8   # glibc mallopt parameters (malloc.h)
# (the analysis's value, glibc's default); an arena limit of 0 is glibc's own (8 per core)
MALLOPT = {M_MMAP_MAX: (0, 65536), M_TRIM_THRESHOLD: (2**30, 128 * 1024), M_ARENA_MAX: (1, 0)}


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:                                   # not glibc (musl, macOS): leave it alone
        return None


@contextmanager
def plain_pages():
    """Allocation settings for the analysis, restored afterwards. The analysis makes many
    short-lived multi-megabyte buffers; on VMs that fault memory in slowly three defaults cost
    more kernel time than the work itself (measured, 10M records): NumPy's transparent-huge-page
    advice (THP defrag=madvise: ~2.4x the system time), pyarrow's mimalloc pool under its
    reader threads (Parquet read 10 s -> 3.7 s wall, system time 6.9 s -> 1.1 s with the
    system allocator), and glibc returning every freed block over 32 MB to the kernel, so that
    the next 80 MB column faults its pages in again (kept in the heap here: summary
    24 s -> 21 s wall). Threads started meanwhile (pyarrow's readers) share the main heap
    rather than each getting an arena of its own, so what one frees the next read reuses (10M
    records: 0.15 GiB fewer page faults, peak RSS 2.80 -> 2.71 GiB). traces/pages.py does the
    same for the generator (no shared module: reports and traces do not import each other)."""
    core = np._core if hasattr(np, "_core") else np.core      # NumPy 2 / NumPy 1
    toggle = getattr(core.multiarray, "_set_madvise_hugepage", None)
    previous = toggle(False) if toggle else None
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    libc = _glibc()
    for param, (value, _) in MALLOPT.items() if libc else ():
        libc.mallopt(param, value)
    try:
        yield
    finally:
        pa.set_memory_pool(pool)
        if toggle:
            toggle(previous)
        if libc:
            for param, (_, default) in MALLOPT.items():
                libc.mallopt(param, default)
            libc.malloc_trim(0)                       # give the kept memory back now


def stat_value(x: np.ndarray, stat: str) -> float:
    """One statistic of a NaN-free sample (NaN when empty)."""
    if len(x) == 0:
        return float("nan")
    if stat == "mean":
        return float(np.mean(x, dtype=np.float64))
    if stat == "max":
        return float(np.max(x))
    return float(np.percentile(x, PERCENTILES[stat]))


def good_requests(rm: RequestMetrics, slo: SloSpec | None) -> np.ndarray:
    """Succeeded and met every per-request threshold that applies to it. Model overrides apply
    first, then slo_class overrides (the more specific). No thresholds: every success is good."""
    if slo is None or not slo.has_per_request:
        return rm.ok.copy()
    thr: dict[str, float | np.ndarray] = {k: float(slo.per_request.get(k, np.inf))
                                          for k in ("ttft_ms", "ttfa_ms", "tpot_ms", "e2e_ms")}
    for codes, labels in (rm.model, rm.slo_class):
        for name, cls in slo.classes.items():
            if name in labels and cls.per_request:
                rows = codes == labels.index(name)
                for key, value in cls.per_request.items():   # per-row thresholds only where overridden
                    thr[key] = np.where(rows, value, thr[key])
    good = rm.ok.copy()
    with np.errstate(invalid="ignore"):
        for key, t in thr.items():
            if np.ndim(t) == 0 and np.isinf(t):
                continue
            v = rm.columns[key]
            met = np.isinf(t) | (v <= t)
            if key == "tpot_ms":          # fewer than two tokens: no TPOT to violate
                met |= np.isnan(v)
            good &= met
    return good


@dataclass
class Analysis:
    table: pa.Table
    rm: RequestMetrics
    mask: np.ndarray                 # measured rows (bool over all rows)
    window: dict
    duration_s: float | None         # D = max(end) - min(sent) over measured requests (metrics.py: end)
    good: np.ndarray                 # bool over all rows
    slo: SloSpec | None
    bottleneck: dict | None = None   # validity.assess: whether the replay kept its schedule, and why not
    server: object | None = None     # servertime.ServerTime: the run's server spans joined to its records
    tenant_column: str | None = None  # --tenant-column; None: client_id when it names several, else slo_class
    server_metrics: pa.Table | None = None   # the run's scraped counters (prefix_hit's fallback)
    _pooled: dict = field(default_factory=dict)

    @property
    def tenants(self) -> tuple[str, np.ndarray, list[str]]:
        """The tenant column's name, each row's tenant code and the labels; computed once."""
        if "tenants" not in self._pooled:
            self._pooled["tenants"] = tenant_codes(self.table, self.rm, self.tenant_column)
        return self._pooled["tenants"]

    @property
    def tasks(self):
        """Agentic tasks of the run (reports/tasks.py), or None; computed once (shared by replace() copies)."""
        if "tasks" not in self._pooled:
            from .tasks import task_metrics
            self._pooled["tasks"] = task_metrics(self.table, self.rm)
        return self._pooled["tasks"]

    def task_scalars(self, rows: np.ndarray | None = None) -> dict:
        """Task counts, attainment and goodput over tasks whose first record is among `rows`."""
        tk = self.tasks
        if tk is None:
            return {}
        sel = (self.mask if rows is None else rows)[tk.first_row]
        good = tk.good((self.slo.per_task if self.slo else {}).get("task_s")) & sel
        n, d = int(sel.sum()), self.duration_s
        return {"tasks": n, "task_attainment": good.sum() / n if n else None,
                "task_goodput_per_s": good.sum() / d if d else None, "tasks_per_s": n / d if d else None}

    def task_values(self, rows: np.ndarray | None = None) -> np.ndarray:
        tk = self.tasks
        if tk is None:
            return np.zeros(0)
        x = tk.task_s[(self.mask if rows is None else rows)[tk.first_row]]
        return x[~np.isnan(x)]

    @property
    def measured_ok(self) -> np.ndarray:
        return self.mask & self.rm.ok

    def pooled(self, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """ICL/ITL pooled over the successful requests among `rows` (default: all measured)."""
        if rows is None:       # computed once
            if "measured" not in self._pooled:
                self._pooled["measured"] = self.pooled(self.mask)
            return self._pooled["measured"]
        rm = self.rm
        return pooled_gaps(self.table, rows & rm.ok, rm.one_token, rm.reasoning_chunks if rm.has_reasoning else None)

    def column(self, metric: str) -> np.ndarray:
        """A metric over the measured rows with NaN where undefined; no copy when every row is
        measured (describe() ignores NaN itself)."""
        if metric.replace("_sched_ms", "_ms") in POOLED:
            return self.values(metric)
        col = self.rm.latency(metric)
        return col if self.mask.all() else col[self.mask]

    def values(self, metric: str, rows: np.ndarray | None = None) -> np.ndarray:
        """NaN-free sample of a distribution metric over `rows` (default: measured)."""
        base = metric.replace("_sched_ms", "_ms")
        if base in POOLED:
            return self.pooled(rows)[base]
        x = self.rm.latency(metric)[self.mask if rows is None else rows]
        return x[~np.isnan(x)]

    def scalars(self, rows: np.ndarray | None = None) -> dict[str, float | None]:
        """Counts, rates over D, error rate, attainment and goodput for `rows` (default: measured)."""
        rows = self.mask if rows is None else rows
        rm, d = self.rm, self.duration_s
        ok, good = rows & rm.ok, rows & self.good
        issued, n_ok, n_good = int(rows.sum()), int(ok.sum()), int(good.sum())
        # Token counts are whole numbers: their float sums are exact in any order (no copies).
        have_out = ~np.isnan(rm.n_out)
        out_tok = float(np.sum(rm.n_out, where=ok & have_out))
        in_tok = float(np.sum(rm.input_len, where=ok & ~np.isnan(rm.input_len)))
        rate = (lambda x: x / d) if d else (lambda x: None)
        return {"issued": issued, "ok": n_ok, "failed": issued - n_ok, "good": n_good,
                "requests_per_s": rate(n_ok), "input_tokens_per_s": rate(in_tok),
                "output_tokens_per_s": rate(out_tok), "total_tokens_per_s": rate(in_tok + out_tok),
                "error_rate": (issued - n_ok) / issued if issued else None,
                "attainment": n_good / issued if issued else None,
                "goodput_rps": rate(n_good),
                "token_goodput_per_s": rate(float(np.sum(rm.n_out, where=good & have_out)))}


def tenant_codes(table: pa.Table, rm: RequestMetrics, column: str | None) -> tuple[str, np.ndarray, list[str]]:
    """Who each request was sent for: the named string column, else client_id when the records
    carry more than one, else slo_class."""
    if column is None:
        if "client_id" in table.column_names:
            codes, labels = encode(table.column("client_id"))
            if len(set(labels) - {"(none)"}) > 1:
                return "client_id", codes, labels
        return "slo_class", *rm.slo_class
    strings = [f.name for f in RECORD_SCHEMA if f.type == pa.string()]
    if column not in strings or column not in table.column_names:
        raise ReportError(f"--tenant-column {column!r}: no such string column in the records "
                          f"(string columns: {', '.join(strings)})")
    return column, *encode(table.column(column))


def with_column(run, column: str | None) -> pa.Table:
    """run.records with `column` too, read from the file when the analysis columns leave it out."""
    if column is None or column in run.records.column_names or column not in RECORD_SCHEMA.names:
        return run.records
    return run.records.append_column(column, run.column(column))


def jain(x) -> np.ndarray:
    """Jain's fairness index (sum x)^2 / (n sum x^2) along the last axis: 1 when all are equal,
    1/n when one has everything (all zero: equal, 1)."""
    x = np.asarray(x, dtype=np.float64)
    s2 = (x * x).sum(axis=-1)
    return np.divide(x.sum(axis=-1) ** 2, x.shape[-1] * s2, out=np.ones_like(s2), where=s2 > 0)


def counter_increase(server: pa.Table | None, suffix: str) -> float | None:
    """Increase of a scraped counter over the run, summed over its label sets (resets skipped)."""
    if server is None:
        return None
    df = server.filter(pc.ends_with(server.column("name"), suffix)).to_pandas().sort_values("time_s")
    return float(df.groupby(df["labels"].fillna(""))["value"].diff().clip(lower=0).sum()) if len(df) else None


def prefix_hit(an: Analysis, rows: np.ndarray | None = None) -> dict | None:
    """The prefix-cache hit ratio the server achieved: sum(cached_tokens) / sum(prompt tokens) over
    the successes among `rows` (default: measured) once any reported cached_tokens, with the ratio
    estimator's delta-method standard error; else the scraped counters over the whole run (a
    census: no error); None without either."""
    c = as_f64(an.table.column("cached_tokens")) if "cached_tokens" in an.table.column_names else None
    sel = None if c is None else (an.mask if rows is None else rows) & an.rm.ok & (an.rm.input_len > 0)
    if sel is not None and (sel & ~np.isnan(c)).any():
        # vLLM and engine-stub leave prompt_tokens_details out when nothing hit: a server that
        # reported cached_tokens for some requests hit 0 tokens of the others
        c, p = np.nan_to_num(c[sel]), an.rm.input_len[sel]
        n, r = len(c), float(c.sum() / p.sum())
        se = float(np.sqrt(np.sum((c - r * p) ** 2) / (n - 1) / n) / p.mean()) if n > 1 else np.inf
        return {"ratio": r, "source": "cached_tokens", "requests": n, "se": se}
    hits, queries = (counter_increase(an.server_metrics, f"prefix_cache_{k}_total") for k in ("hits", "queries"))
    if not queries or hits is None:
        return None
    return {"ratio": hits / queries, "source": "server counters", "requests": None, "se": 0.0}


def analyze(table: pa.Table, *, warmup=None, cooldown=None, steady_state: float | None = None,
            slo: SloSpec | None = None, bin_s: float = 1.0, rm: RequestMetrics | None = None,
            tenant_column: str | None = None) -> Analysis:
    """`rm`: the request metrics of `table` when already computed (summary.py streams the time
    columns into them, so `table` need not hold those)."""
    rm = request_metrics(table) if rm is None else rm
    mask, window = select(rm, warmup=warmup, cooldown=cooldown, steady_state=steady_state, bin_s=bin_s)
    duration = None
    if mask.any() and not np.isnan(rm.sent[mask]).all():
        start = float(np.nanmin(rm.sent[mask]))
        d = float(np.nanmax(rm.end[mask])) - start
        duration = d if d > 0 else None
        window.update(start_s=start, end_s=start + d)
    window["duration_s"] = duration
    return Analysis(table, rm, mask, window, duration, good_requests(rm, slo), slo, tenant_column=tenant_column)
