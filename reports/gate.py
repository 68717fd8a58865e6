"""SLO gate (docs/reports.md, Gate): evaluate every objective of a spec on a run.

Exit codes: 0 every objective holds; 1 an objective failed; 2 nothing failed but something
could not be evaluated (no samples, too few samples for the percentile asked, no objectives,
or a replay behind its schedule whose bias bound straddles the limit: bias.py).
A failure outranks a cannot-evaluate: one definite violation is the more useful signal. A run
that did not finish (killed, a full disk: `unfinished`) never passes: exit 2 whatever its rows say,
since its requests are a fragment of the trace.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .analysis import Analysis, analyze, good_requests, plain_pages, stat_value
from .bias import RATES as BIAS_RATES, Bias, bias_of
from .metrics import POOLED
from .schema import STATUSES
from .slo import SPAN_METRICS, TASK_METRICS, TASK_SCALARS, Objective, SloSpec, load_slo
from .stats import MIN_TAIL, PERCENTILES, quantile_cis
from .text import markdown_table, render_table

COLUMNS = ["objective", "scope", "measured", "limit", "n", "95% CI", "verdict"]
BOUND_COLUMN = "bias bound"
FIRST_ERRORS = 3      # distinct (http status, message) pairs a failing gate shows, first sent first


@dataclass
class GateRow:
    objective: str
    scope: str                      # "all" or the slo_class / model the objective applies to
    measured: float | None
    limit: float
    n: int
    ci: tuple[float, float] | None
    verdict: str                    # pass, fail, cannot evaluate
    note: str = ""
    bound: tuple[float, float] | None = None   # the statistic at the best and worst end of its bias

@dataclass
class GateResult:
    rows: list[GateRow]
    attainment: float | None
    goodput_rps: float | None
    notes: list[str] = field(default_factory=list)
    # the measured requests by status and the first distinct errors ({"http_status", "message",
    # "count"}): a gate that fails when requests failed says so
    statuses: dict[str, int] = field(default_factory=dict)
    first_errors: list[dict] = field(default_factory=list)
    unfinished: str | None = None   # the run did not finish: why, and how many rows it recorded

    @property
    def exit_code(self) -> int:
        if self.unfinished:
            return 2
        verdicts = {r.verdict for r in self.rows}
        if "fail" in verdicts:
            return 1
        return 2 if ("cannot evaluate" in verdicts or not self.rows) else 0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def columns(self) -> list[str]:
        bounded = any(r.bound is not None for r in self.rows)
        return COLUMNS[:3] + [BOUND_COLUMN] + COLUMNS[3:] if bounded else COLUMNS

    def _rows(self) -> list[list[object]]:
        bounded = any(r.bound is not None for r in self.rows)
        return [[r.objective, r.scope, r.measured, *([r.bound] if bounded else []), r.limit, r.n, r.ci,
                 r.verdict + (f" ({r.note})" if r.note else "")] for r in self.rows]

    def table(self) -> str:
        verdict = {0: "PASS", 1: "FAIL", 2: "CANNOT EVALUATE"}[self.exit_code]
        caption = "; ".join([f"{self.unfinished}: not gated" if self.unfinished else "",
                             f"attainment {self.attainment:.4f}" if self.attainment is not None else "",
                             *self.notes]).strip("; ") or None
        return render_table(f"SLO gate: {verdict} (exit {self.exit_code})", self.columns, self._rows(),
                            caption=caption) + self.errors_text()

    def errors_text(self) -> str:
        """The requests by status and the first distinct errors, when the gate did not pass and
        some requests failed ('' otherwise)."""
        if self.exit_code == 0 or set(self.statuses) <= {"ok"}:
            return ""
        lines = ["requests: " + ", ".join(f"{k} {v}" for k, v in self.statuses.items())]
        if self.first_errors:
            lines.append("first errors:")
        for e in self.first_errors:
            msg, http = e["message"] or "(no message)", f"HTTP {e['http_status']}"
            if e["http_status"] is not None and not msg.startswith(http):
                msg = f"{http}: {msg}"
            lines.append(f"  {e['status']} x{e['count']}: {msg}")
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        return markdown_table(self.columns, self._rows())

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "attainment": self.attainment,
                "goodput_rps": self.goodput_rps, "notes": self.notes,
                "rows": [asdict(r) for r in self.rows], "statuses": self.statuses,
                "first_errors": self.first_errors, "unfinished": self.unfinished}


def _errors(an: Analysis) -> tuple[dict[str, int], list[dict]]:
    """Measured requests by status, and the first FIRST_ERRORS distinct (status, http status,
    message) of the failed ones in schedule order, each with its count."""
    counts = np.bincount(an.rm.status_codes[an.mask], minlength=len(STATUSES))
    statuses = {s: int(c) for s, c in zip(STATUSES, counts) if c}
    failed = np.flatnonzero(an.mask & ~an.rm.ok)
    if not len(failed):
        return statuses, []
    failed = failed[np.argsort(an.rm.scheduled[failed], kind="stable")]
    tb = an.table.select(["status", "http_status", "error"]).take(pa.array(failed))
    tb = pa.table({k: pc.cast(tb.column(k), t) for k, t in
                   (("status", pa.string()), ("http_status", pa.int32()), ("error", pa.string()))})
    tb = tb.append_column("order", pa.array(np.arange(len(failed))))
    groups = tb.group_by(["status", "http_status", "error"]).aggregate([("order", "min"), ("order", "count")])
    groups = groups.sort_by("order_min").slice(0, FIRST_ERRORS).to_pylist()
    return statuses, [{"status": g["status"], "http_status": g["http_status"],
                       "message": (g["error"] or "")[:300], "count": g["order_count"]} for g in groups]


FINISHED = ("completed", "all_failed")   # run.json statuses of a run that sent its whole trace


def unfinished(config: dict | None, records: int, not_sent: int) -> str | None:
    """Why a run directory holds a fragment of its trace (run.json still `running` after a kill,
    `failed`, `interrupted`, `worker_lost`, or fewer records than the trace window has rows), with
    the rows it recorded or sent; None for a finished run or records without a run.json."""
    status = (config or {}).get("status")
    rows = ((config or {}).get("config") or {}).get("rows") or ((config or {}).get("trace") or {}).get("rows")
    if status is None or not rows or (status in FINISHED and records >= rows):
        return None
    if records < rows:
        return f"the run did not finish (run.json status {status}): {records:,} of {rows:,} trace rows have records"
    return (f"the run did not finish (run.json status {status}): {records - not_sent:,} of {rows:,} trace rows "
            "were sent")


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


@dataclass
class Ends:
    """A run seen at both ends of its bias (bias.py): analyses whose good requests are those of
    the worst and of the best case."""
    bias: Bias
    worst: Analysis
    best: Analysis


def _evaluate(an: Analysis, obj: Objective, rows: np.ndarray, scope: str, spec: SloSpec,
              ends: Ends | None = None) -> GateRow:
    if obj.metric in TASK_METRICS + TASK_SCALARS + SPAN_METRICS:   # judged as measured: the bias bound is per
        ends = None                                                   # request; the server saw what it saw
    if obj.metric in SPAN_METRICS and obj.metric not in an.rm.columns:
        return GateRow(obj.text, scope, None, obj.limit, 0, None, "cannot evaluate",
                       "no server spans (run with --otlp)")
    if obj.stat is None and obj.metric in TASK_SCALARS:
        sc = an.task_scalars(rows)
        value, n = sc.get(obj.metric), sc.get("tasks", 0)
        if value is None:
            why = "no tasks in the run (no task_id)" if an.tasks is None else "no tasks in the window" if not n \
                else "run duration unknown"
            return GateRow(obj.text, scope, None, obj.limit, n, None, "cannot evaluate", why)
        ci = _wilson(round(value * n), n) if obj.metric == "task_attainment" and n else None
        return _row(obj, scope, value, n, ci)
    if obj.stat is None:
        sc = an.scalars(rows)
        value, n = sc.get(obj.metric), sc["issued"]
        ci = None
        if obj.metric in ("attainment", "error_rate") and n:
            k = sc["good"] if obj.metric == "attainment" else sc["failed"]
            ci = _wilson(k, n)
        if value is None:
            why = "no requests in the window" if not n else "run duration unknown"
            return GateRow(obj.text, scope, None, obj.limit, n, None, "cannot evaluate", why)
        bound = _scalar_bound(obj.metric, value, rows, ends) if ends else None
        return _row(obj, scope, value, n, ci, bound=bound)
    x = an.task_values(rows) if obj.metric in TASK_METRICS else an.values(obj.metric, rows)
    n = len(x)
    if n == 0:
        return GateRow(obj.text, scope, None, obj.limit, 0, None, "cannot evaluate",
                       "no tasks in the run (no task_id)" if obj.metric in TASK_METRICS and an.tasks is None
                       else "no server span joined a successful request" if obj.metric in SPAN_METRICS
                       else "no samples")
    ci, note = None, ""
    samples = _sample_bounds(an, obj.metric, rows, ends) if ends else None
    if obj.stat in PERCENTILES:
        p = PERCENTILES[obj.stat] / 100
        if n * (1 - p) < spec.min_tail_samples - 1e-9:
            need = math.ceil(spec.min_tail_samples / (1 - p) - 1e-9)
            return GateRow(obj.text, scope, stat_value(x, obj.stat), obj.limit, n, None,
                           "cannot evaluate", f"{obj.stat} needs n >= {need}")
        q = [PERCENTILES[obj.stat]]
        ci = quantile_cis(x, q)[0]
        if samples is not None and ci is not None:   # the interval of both ends: widened by the bias
            lo, hi = quantile_cis(samples[0], q)[0], quantile_cis(samples[1], q)[0]
            ci = (min(ci[0], lo[0]), max(ci[1], hi[1])) if lo and hi else ci
        if n * (1 - p) < MIN_TAIL:
            note = f"only {n * (1 - p):.1f} samples beyond {obj.stat}"
    bound = None if samples is None else (stat_value(samples[0], obj.stat), stat_value(samples[1], obj.stat))
    return _row(obj, scope, stat_value(x, obj.stat), n, ci, note, bound)


def _sample_bounds(an: Analysis, metric: str, rows: np.ndarray, ends: Ends):
    if metric.replace("_sched_ms", "_ms") in POOLED:
        return ends.bias.pooled_bounds(an, metric, rows)
    return ends.bias.sample_bounds(metric, an.rm, rows)


def _scalar_bound(metric: str, value: float, rows: np.ndarray, ends: Ends) -> tuple[float, float] | None:
    """Attainment and goodput from the good requests of both ends; rates up to what the trace
    offered when fewer requests went out."""
    f = ends.bias.rate_factor
    if metric in ("attainment", "goodput_rps", "token_goodput_per_s"):
        worst, best = ends.worst.scalars(rows)[metric], ends.best.scalars(rows)[metric]
        if metric != "attainment":
            best *= f
        return None if worst == best == value else (min(worst, best), max(worst, best))
    if metric in BIAS_RATES and f > 1:
        return (value, value * f)
    return None


def _row(obj: Objective, scope: str, value: float, n: int, ci, note: str = "",
         bound: tuple[float, float] | None = None) -> GateRow:
    ok = obj.holds(value)
    verdict = "pass" if ok else "fail"
    if bound is not None:
        lo, hi = bound
        worst, best = (hi, lo) if obj.op in ("<=", "<") else (lo, hi)
        if obj.holds(worst):
            verdict = "pass"
        elif not obj.holds(best):
            verdict = "fail"
        else:
            verdict = "cannot evaluate"
            note = "; ".join(filter(None, [note, "the bias bound straddles the limit"]))
    elif ci is not None and ci[0] <= obj.limit <= ci[1]:
        note = "; ".join(filter(None, [note, "limit inside the CI"]))
    return GateRow(obj.text, scope, float(value), obj.limit, int(n), ci, verdict, note,
                   None if bound is None else (float(bound[0]), float(bound[1])))


def gate(an: Analysis, spec: SloSpec, judge_as_measured: bool = False, config: dict | None = None) -> GateResult:
    """Evaluate every objective (run-wide, then per class) on an analysed run. When the replay
    fell behind its schedule, each figure it may have moved is judged at both ends of its bias
    bound (bias.py), unless `judge_as_measured`. `config` (run.json) tells whether the run finished."""
    if an.slo is not spec:   # good requests depend on the spec's per-request thresholds
        an = replace(an, good=good_requests(an.rm, spec), slo=spec)
    bias = bias_of(an, an.bottleneck)
    ends = None
    notes = []
    if bias is not None and judge_as_measured:
        notes.append("the replay fell behind its schedule; figures judged as measured (--judge-as-measured)")
    elif bias is not None:
        ends = Ends(bias, replace(an, good=good_requests(bias.shifted(an.rm, upper=True), spec)),
                    replace(an, good=good_requests(bias.shifted(an.rm, upper=False), spec)))
        cause = (an.bottleneck or {}).get("cause") or "cause unknown"
        notes.append(f"the replay fell behind its schedule ({cause}): {bias.affected(an.mask)} requests overlapped "
                     f"{len(bias.stalls)} stalls ({bias.stalled_s:.3g} s); each figure judged at both ends of its "
                     f"bias bound")
    rows = [_evaluate(an, o, an.mask, "all", spec, ends) for o in spec.objectives]
    for name, cls in spec.classes.items():
        if not cls.objectives:
            continue
        sel = np.zeros(an.rm.n, dtype=bool)
        for codes, labels in (an.rm.model, an.rm.slo_class):
            if name in labels:
                sel |= codes == labels.index(name)
        if not sel.any():
            notes.append(f"class {name!r} matches no model or slo_class in this run")
        rows += [_evaluate(an, o, an.mask & sel, name, spec, ends) for o in cls.objectives]
    if not rows:
        notes.append("the SLO spec has no objectives to gate on")
    empty = int(an.mask[an.rm.empty_ok].sum())
    if empty:
        notes.append(f"{empty} requests counted ok streamed no token although their rows asked for output")
    sc = an.scalars()
    not_sent = int(np.count_nonzero(an.rm.status_codes == STATUSES.index("not_sent")))
    return GateResult(rows, sc["attainment"], sc["goodput_rps"], notes, *_errors(an),
                      unfinished(config, an.rm.n, not_sent))


def evaluate_slo(run_dir_or_records: str | Path | pa.Table | Analysis, slo, *, warmup=None,
                 cooldown=None, steady_state: float | None = None, judge_as_measured: bool = False,
                 allow_bottleneck: bool | None = None) -> GateResult:
    """Gate a run (directory, records file, records table or Analysis) on an SLO spec. A run
    directory also tells whether the replay kept its schedule (run.json, cpu.parquet).
    `allow_bottleneck`: the old name of `judge_as_measured`."""
    spec = load_slo(slo)
    judge_as_measured = judge_as_measured or bool(allow_bottleneck)
    if isinstance(run_dir_or_records, Analysis):
        return gate(run_dir_or_records, spec, judge_as_measured)
    with plain_pages():
        run = None
        if isinstance(run_dir_or_records, pa.Table):
            from .records import conform_records
            table = conform_records(run_dir_or_records)
        else:
            from .records import ANALYSIS_COLUMNS, load_run
            run = load_run(run_dir_or_records, columns=ANALYSIS_COLUMNS)
            table = run.records
        an = analyze(table, warmup=warmup, cooldown=cooldown, steady_state=steady_state, slo=spec)
        from .bottleneck import assess, load_cpu
        an.bottleneck = assess(an, run.config if run else None, load_cpu(run.dir) if run else None)
        if run is not None:
            from .servertime import attach
            attach(an, run)
        return gate(an, spec, judge_as_measured, run.config if run else None)
