"""SLO gate (docs/reports.md, Gate): evaluate every objective of a spec on a run.

Each objective is judged at the spec's confidence (docs/verdicts.md): pass when the bound on its
bad side holds, fail when the bound on its good side does not, undecided between. Percentiles take
distribution-free bounds (order statistics, exact binomial), attainment and error_rate exact
(Clopper-Pearson) ones, means a one-sided t bound; max and the rates are judged as measured. A
replay behind its schedule widens each bound to both ends of its bias (validity.py). `as_measured`
judges point estimates (k6's semantics).

Exit codes: 0 every objective holds; 1 an objective failed; 2 nothing failed but something is
undecided or could not be evaluated (no samples, no objectives).
A failure outranks an undecided: one definite violation is the more useful signal. A run
that did not finish (killed, a full disk: `unfinished`) never passes: exit 2 whatever its rows say,
since its requests are a fragment of the trace; nor does one whose stimulus was not delivered
(certificate.py: the offered load was not sent; a failure still fails).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy import stats as sps

from .analysis import Analysis, analyze, good_requests, jain, plain_pages, prefix_hit, stat_value, with_column
from .breakdown import service_fairness
from .validity import RATES as BIAS_RATES, Bias, assess, bias_of, load_cpu
from .certificate import certificate, sentence
from .metrics import POOLED
from .records import ANALYSIS_COLUMNS, conform_records, load_run
from .schema import STATUSES
from .servertime import attach
from .sequential import judged, look_confidence
from .steady import judged_window, of_run
from .slo import (OPS, SPAN_METRICS, TASK_METRICS, TASK_SCALARS, TENANT_SCALARS, Objective, SloSpec, check_confidence,
                  load_slo)
from .stats import PERCENTILES, order_statistics
from .text import render_table

COLUMNS = ["objective", "scope", "measured", "limit", "n", "bounds", "verdict"]
BOUND_COLUMN = "bias bound"
FIRST_ERRORS = 3      # distinct (http status, message) pairs a failing gate shows, first sent first
ERROR_KEYS = pa.schema([("status", pa.string()), ("http_status", pa.int32()), ("error", pa.string())])


@dataclass
class GateRow:
    objective: str
    scope: str                      # "all" or the slo_class / model the objective applies to
    measured: float | None
    limit: float
    n: int
    ci: tuple[float, float] | None  # lower and upper confidence bounds, each one-sided at `confidence`
    verdict: str                    # pass, fail, undecided, cannot evaluate
    note: str = ""
    bound: tuple[float, float] | None = None   # the statistic at the best and worst end of its bias
    confidence: float | None = None            # None: judged as measured
    more: int | None = None         # undecided: the further requests that would most likely decide it

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
    stimulus: dict | None = None    # certificate.py: was the offered load delivered

    @property
    def undelivered(self) -> bool:
        return (self.stimulus or {}).get("delivered") is False

    @property
    def exit_code(self) -> int:
        if self.unfinished:
            return 2
        verdicts = {r.verdict for r in self.rows}
        if "fail" in verdicts:
            return 1
        return 2 if (verdicts - {"pass"} or not self.rows or self.undelivered) else 0

    def table(self) -> str:
        bounded = any(r.bound is not None for r in self.rows)   # the bias bound column, after `measured`
        confs = {r.confidence for r in self.rows} - {None}
        cols = [f"{confs.pop():.0%} bounds" if c == "bounds" and len(confs) == 1 else c for c in COLUMNS]
        rows = [[r.objective, r.scope, r.measured, *([r.bound] if bounded else []), r.limit, r.n, r.ci,
                 _verdict_text(r)] for r in self.rows]
        verdict = {0: "PASS", 1: "FAIL",
                   2: "UNDECIDED" if any(r.verdict == "undecided" for r in self.rows) else
                   "NOT DELIVERED" if self.undelivered and self.rows else "CANNOT EVALUATE"}[self.exit_code]
        caption = "; ".join([f"{self.unfinished}: not gated" if self.unfinished else "",
                             sentence(self.stimulus) or "",
                             f"attainment {self.attainment:.4f}" if self.attainment is not None else "",
                             *self.notes]).strip("; ") or None
        return render_table(f"SLO gate: {verdict} (exit {self.exit_code})", cols[:3] + [BOUND_COLUMN] * bounded
                            + cols[3:], rows, caption=caption) + self.errors_text()

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

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, **asdict(self)}


def _errors(an: Analysis) -> tuple[dict[str, int], list[dict]]:
    """Measured requests by status, and the first FIRST_ERRORS distinct (status, http status,
    message) of the failed ones in schedule order, each with its count."""
    counts = np.bincount(an.rm.status_codes[an.mask], minlength=len(STATUSES))
    statuses = {s: int(c) for s, c in zip(STATUSES, counts) if c}
    failed = np.flatnonzero(an.mask & ~an.rm.ok)
    if not len(failed):
        return statuses, []
    failed = failed[np.argsort(an.rm.scheduled[failed], kind="stable")]
    tb = an.table.select(["status", "http_status", "error"]).take(pa.array(failed)).cast(ERROR_KEYS)
    tb = tb.append_column("order", pa.array(np.arange(len(failed))))
    groups = tb.group_by(["status", "http_status", "error"]).aggregate([("order", "min"), ("order", "count")])
    groups = groups.sort_by("order_min").slice(0, FIRST_ERRORS).to_pylist()
    return statuses, [{"status": g["status"], "http_status": g["http_status"],
                       "message": (g["error"] or "")[:300], "count": g["order_count"]} for g in groups]


FINISHED = ("completed", "all_failed", "decided")   # run.json statuses of a run that finished (decided: until its
                                                     # gate was decided, the rest not sent on purpose)


def unfinished(config: dict | None, rm) -> str | None:
    """Why a run directory holds a fragment of its trace (run.json still `running` after a kill,
    `failed`, `interrupted`, `worker_lost`, or fewer records than the trace window has rows), with
    the rows it recorded or sent; None for a finished run or records without a run.json."""
    status = (config or {}).get("status")
    rows = ((config or {}).get("config") or {}).get("rows") or ((config or {}).get("trace") or {}).get("rows")
    if status is None or not rows or (status in FINISHED and rm.n >= rows):
        return None
    not_sent = int(np.count_nonzero(rm.status_codes == STATUSES.index("not_sent")))
    done = (f"{rm.n:,} of {rows:,} trace rows have records" if rm.n < rows else
            f"{rm.n - not_sent:,} of {rows:,} trace rows were sent")
    return f"the run did not finish (run.json status {status}): {done}"


def _verdict_text(r: GateRow) -> str:
    head = r.verdict + (f" ({r.confidence:.0%})" if r.confidence and r.verdict in ("pass", "fail") else
                        " (as measured)" if r.confidence is None and r.verdict in ("pass", "fail") else "")
    more = f"~{r.more:,} more requests" if r.more else ""
    return head + (": " if more and r.verdict == "undecided" else "") + more + (f" ({r.note})" if r.note else "")


def proportion_bounds(k: int, n: int, conf: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) lower and upper bounds of a proportion, each one-sided at `conf`."""
    lo = float(sps.beta.ppf(1 - conf, k, n - k + 1)) if k > 0 else 0.0
    hi = float(sps.beta.ppf(conf, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def quantile_bounds(x: np.ndarray, p: float, conf: float) -> tuple[float, float]:
    """Distribution-free lower and upper bounds of the p-quantile of x's distribution, each
    one-sided at `conf`: order statistics whose ranks come from Binomial(n, p), exact for any
    continuous distribution and conservative for independent, not identically distributed samples
    (Hoeffding 1956). -inf / inf where n is too small for that side."""
    n = len(x)
    up = int(sps.binom.ppf(conf, n, p))                       # P(Bin <= up) >= conf
    lo = int(sps.binom.ppf(1 - conf, n, p))
    lo -= sps.binom.cdf(lo, n, p) > 1 - conf                  # largest lo with P(Bin <= lo) <= 1 - conf
    ranks = np.array([r for r in (lo, up) if 0 <= r < n], dtype=np.int64)
    v = dict(zip(ranks.tolist(), order_statistics(x, ranks).tolist())) if len(ranks) else {}
    return v.get(lo, -np.inf), v.get(up, np.inf)


def judge(op: str, limit: float, lo: float, hi: float) -> str:
    """pass when the bound on the objective's bad side holds, fail when the one on its good side
    does not, undecided between: the verdict `replay gate` gives every objective."""
    holds = OPS[op]
    worst, best = (hi, lo) if op in ("<=", "<") else (lo, hi)
    return "pass" if holds(worst, limit) else "fail" if not holds(best, limit) else "undecided"


GROW = np.unique(np.geomspace(1, 1e8, 600).astype(np.int64))   # run lengths tried by _more


def _more(n: int, decided) -> int | None:
    """The further requests after which `decided(N)` (vectorised over run lengths N) first holds,
    the measured shares staying as they are; None beyond 1e8."""
    N = GROW[GROW > n]
    hit = np.flatnonzero(decided(N))
    return int(N[hit[0]] - n) if len(hit) else None


def _quantile_more(x: np.ndarray, p: float, op: str, limit: float, conf: float) -> int | None:
    g = float(np.mean(x <= limit if op in ("<=", "<") else x < limit))
    return _more(len(x), lambda N: (sps.binom.ppf(conf, N, p) < g * N) | (sps.binom.ppf(1 - conf, N, p) - 1 >= g * N))


def _proportion_more(k: int, n: int, op: str, limit: float, conf: float) -> int | None:
    def decided(N):
        kk = k / n * N
        lo = np.where(kk > 0, sps.beta.ppf(1 - conf, kk, N - kk + 1), 0.0)
        hi = np.where(kk < N, sps.beta.ppf(conf, kk + 1, N - kk), 1.0)
        return np.array([judge(op, limit, a, b) != "undecided" for a, b in zip(lo, hi)])
    return _more(n, decided)


@dataclass
class Ends:
    """A run seen at both ends of its bias (validity.py): analyses whose good requests are those of
    the worst and of the best case."""
    bias: Bias
    worst: Analysis
    best: Analysis


def _evaluate(an: Analysis, obj: Objective, rows: np.ndarray, scope: str, conf: float | None,
              ends: Ends | None = None) -> GateRow:
    """One objective's row; `conf` None judges the point estimate."""
    if obj.metric in TASK_METRICS + TASK_SCALARS + SPAN_METRICS:   # judged as measured: the bias bound is per
        ends = None                                                   # request; the server saw what it saw
    if obj.metric == "fairness":
        return _service_row(an, obj, rows, scope, conf)
    if obj.metric in TENANT_SCALARS:
        return _tenant_row(an, obj, rows, scope, conf, ends)
    if obj.metric == "prefix_hit":
        return _prefix_row(an, obj, rows, scope, conf)
    if obj.metric in SPAN_METRICS and obj.metric not in an.rm.columns:
        return GateRow(obj.text, scope, None, obj.limit, 0, None, "cannot evaluate",
                       "no server spans (run with --otlp)")
    if obj.stat is None:
        task = obj.metric in TASK_SCALARS
        sc = an.task_scalars(rows) if task else an.scalars(rows)
        value, n = sc.get(obj.metric), sc.get("tasks" if task else "issued", 0)
        if value is None:
            why = ("no tasks in the run (no task_id)" if task and an.tasks is None else
                   f"no {'tasks' if task else 'requests'} in the window" if not n else "run duration unknown")
            return GateRow(obj.text, scope, None, obj.limit, n, None, "cannot evaluate", why)
        bound = _scalar_bound(obj.metric, value, rows, ends) if ends else None
        counts = [round(value * n)] if obj.metric == "task_attainment" else None
        if obj.metric in ("attainment", "error_rate"):
            key = "good" if obj.metric == "attainment" else "failed"
            counts = [sc[key]] + ([e.scalars(rows)[key] for e in (ends.worst, ends.best)]
                                  if ends and key == "good" else [])
        return _row(obj, scope, value, n, conf, bound, counts=counts)
    x = an.task_values(rows) if obj.metric in TASK_METRICS else an.values(obj.metric, rows)
    if (n := len(x)) == 0:
        return GateRow(obj.text, scope, None, obj.limit, 0, None, "cannot evaluate",
                       "no tasks in the run (no task_id)" if obj.metric in TASK_METRICS and an.tasks is None
                       else "no server span joined a successful request" if obj.metric in SPAN_METRICS
                       else "no samples")
    ends_x = _sample_bounds(an, obj.metric, rows, ends) if ends else None
    bound = None if ends_x is None else (stat_value(ends_x[0], obj.stat), stat_value(ends_x[1], obj.stat))
    return _row(obj, scope, stat_value(x, obj.stat), n, conf, bound, samples=[x, *(ends_x or ())])


def tenant_box(good: np.ndarray, n: np.ndarray, conf: float, sides: int) -> tuple[np.ndarray, np.ndarray]:
    """Each tenant's Clopper-Pearson bounds at 1 - (1 - conf) / (sides x tenants) (Bonferroni): with
    probability >= conf every tenant's attainment lies within its bounds on the `sides` used."""
    c = 1 - (1 - conf) / (sides * len(n))
    with np.errstate(invalid="ignore"):
        return (np.where(good > 0, sps.beta.ppf(1 - c, good, n - good + 1), 0.0),
                np.where(good < n, sps.beta.ppf(c, good + 1, n - good), 1.0))


MAX_CORNERS = 12   # tenants up to which Jain's minimum over the box is searched over every corner


def jain_range(lo: np.ndarray, hi: np.ndarray) -> tuple[float, float]:
    """The least and greatest Jain's index over the box lo <= x <= hi. The index is quasi-concave
    (x's angle to the diagonal), so its minimum lies at a corner: every corner is tried up to
    MAX_CORNERS tenants, beyond that the looser (sum lo)^2 / (n sum hi^2). Its maximum lies on
    x = clip(t, lo, hi) (moving mass from a larger to a smaller x raises it): at a breakpoint of t,
    or where it is stationary between two, t = sum(x^2) / sum(x) over the clipped coordinates."""
    k = len(lo)
    if k <= MAX_CORNERS:
        corner = (np.arange(1 << k)[:, None] >> np.arange(k)) & 1
        least = float(jain(np.where(corner, hi, lo)).min())
    else:
        least = float(np.sum(lo) ** 2 / (k * np.sum(hi * hi))) if np.sum(hi) else 1.0
    ts = np.unique(np.concatenate([lo, hi]))
    mid = (ts[:-1] + ts[1:]) / 2
    x = np.clip(mid[:, None], lo, hi)
    fixed = (x <= lo) | (x >= hi)
    s1, s2 = (np.where(fixed, v, 0.0).sum(axis=1) for v in (x, x * x))
    stationary = np.clip(np.divide(s2, s1, out=mid.copy(), where=s1 > 0), ts[:-1], ts[1:])
    return least, float(jain(np.clip(np.concatenate([ts, stationary])[:, None], lo, hi)).max())


def _tenant_row(an: Analysis, obj: Objective, rows: np.ndarray, scope: str, conf: float | None,
                ends: Ends | None) -> GateRow:
    """attainment_fairness (Jain's index) or min_tenant_attainment over the tenants among `rows`, bounded by
    the Bonferroni box of their attainment (tenant_box) at the run and both ends of its bias."""
    column, codes, labels = an.tenants
    n = np.bincount(codes[rows], minlength=len(labels))
    have = n > 0
    if have.sum() < 2:
        return GateRow(obj.text, scope, None, obj.limit, int(n.sum()), None, "cannot evaluate",
                       f"fewer than two tenants ({column}) in the window")
    fair = obj.metric == "attainment_fairness"
    stat = (lambda x: float(jain(x))) if fair else (lambda x: float(np.min(x)))
    good = [np.bincount(codes[rows & a.good], minlength=len(labels))[have]
            for a in (an, *((ends.worst, ends.best) if ends else ()))]
    x = good[0] / n[have]
    value, lo, hi, ci = stat(x), stat(x), stat(x), None
    if conf is not None:
        boxes = [tenant_box(g, n[have], conf, 2 if fair else 1) for g in good]
        bs = [jain_range(*b) if fair else (float(b[0].min()), float(b[1].min())) for b in boxes]
        lo, hi = min(b[0] for b in bs), max(b[1] for b in bs)
        ci = (lo, hi)
    worst = np.asarray(labels, dtype=object)[have][int(np.argmin(x))]
    return GateRow(obj.text, scope, value, obj.limit, int(n.sum()), ci, judge(obj.op, obj.limit, lo, hi),
                   f"{int(have.sum())} tenants by {column}, worst {worst} {x.min():.4g}", confidence=conf)


def _service_row(an: Analysis, obj: Objective, rows: np.ndarray, scope: str, conf: float | None) -> GateRow:
    """fairness: the worst window's index of normalised service (breakdown.service_fairness), its
    bounds from a Poisson bootstrap over requests."""
    f = service_fairness(an, rows, conf)
    n = int((rows & an.rm.ok).sum())
    if f is None:
        return GateRow(obj.text, scope, None, obj.limit, n, None, "cannot evaluate",
                       f"fewer than two tenants ({an.tenants[0]}) with tokens in the window")
    lo, hi = f["ci"] or (f["value"], f["value"])
    where = "worst window {:.4g}-{:.4g} s".format(*f["window_s"]) if f["window_s"] else "never contended"
    return GateRow(obj.text, scope, f["value"], obj.limit, n, f["ci"], judge(obj.op, obj.limit, lo, hi),
                   f"{where} ({f['windows']} windows)" + ("; bootstrap bounds" if f["ci"] else ""), confidence=conf)


def _prefix_row(an: Analysis, obj: Objective, rows: np.ndarray, scope: str, conf: float | None) -> GateRow:
    """The achieved prefix-cache hit ratio (analysis.prefix_hit): per request, a one-sided normal
    bound on the ratio estimator (delta method); from the server's counters, as measured (a census)."""
    hit = prefix_hit(an, rows)
    if hit is None:
        return GateRow(obj.text, scope, None, obj.limit, 0, None, "cannot evaluate",
                       "no cached_tokens in the records and no scraped prefix-cache counters")
    r, census = hit["ratio"], hit["source"] != "cached_tokens"
    half = 0.0 if conf is None or census else float(sps.norm.ppf(conf)) * hit["se"]
    lo, hi = max(r - half, 0.0), min(r + half, 1.0)
    return GateRow(obj.text, scope, r, obj.limit, hit["requests"] or 0, None if conf is None or census else (lo, hi),
                   judge(obj.op, obj.limit, lo, hi), "server counters over the whole run: a census, judged as measured"
                   if census else "", confidence=None if census else conf)


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
    return (value, value * f) if metric in BIAS_RATES and f > 1 else None


def _mean_bounds(x: np.ndarray, conf: float) -> tuple[float, float]:
    """One-sided Student-t bounds of the mean, each at `conf`."""
    if len(x) < 2:
        return -np.inf, np.inf
    half = sps.t.ppf(conf, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x))
    m = float(np.mean(x, dtype=np.float64))
    return m - half, m + half


def _row(obj: Objective, scope: str, value: float, n: int, conf: float | None,
         bound: tuple[float, float] | None = None, samples: list[np.ndarray] | None = None,
         counts: list[int] | None = None) -> GateRow:
    """Judge one objective: at confidence bounds where its statistic has them (samples: the run's
    values then those of both ends of its bias; counts: the same for a proportion), else as
    measured, at both ends of the bias `bound` when there is one."""
    lo, hi = (value, value) if bound is None else (min(bound), max(bound))
    ci = more = None
    bounded = conf is not None and (counts is not None or (samples is not None and obj.stat != "max"))
    if bounded:
        if counts is not None:
            bs = [proportion_bounds(k, n, conf) for k in counts]
        elif obj.stat == "mean":
            bs = [_mean_bounds(s, conf) for s in samples]
        else:
            bs = [quantile_bounds(s, PERCENTILES[obj.stat] / 100, conf) for s in samples]
        lo, hi = min(b[0] for b in bs), max(b[1] for b in bs)
        ci = tuple(float(v) if np.isfinite(v) else None for v in (lo, hi))
    verdict = judge(obj.op, obj.limit, lo, hi)
    note = ""
    if verdict == "undecided" and bounded:
        if counts is not None:
            more = _proportion_more(counts[0], n, obj.op, obj.limit, conf)
        elif obj.stat == "mean" and n > 1 and value != obj.limit:
            s = float(np.std(samples[0], ddof=1))
            more = max(1, int(np.ceil((sps.t.ppf(conf, n - 1) * s / abs(value - obj.limit)) ** 2)) - n)
        elif obj.stat != "mean":
            more = _quantile_more(samples[0], PERCENTILES[obj.stat] / 100, obj.op, obj.limit, conf)
        note = "" if more else "the measured value sits at the limit"
    elif verdict == "undecided":
        note = "the bias bound straddles the limit"
    return GateRow(obj.text, scope, float(value), obj.limit, int(n), ci, verdict, note,
                   None if bound is None else (float(bound[0]), float(bound[1])),
                   conf if bounded else None, more)


def gate(an: Analysis, spec: SloSpec, as_measured: bool = False, config: dict | None = None,
         confidence: float | None = None, stimulus: dict | None = None, whole_run: bool = False) -> GateResult:
    """Evaluate every objective (run-wide, then per class) on an analysed run at `confidence`
    (default: the spec's). When the replay fell behind its schedule, each figure it may have moved
    is judged at both ends of its bias bound (validity.py). `as_measured`: point estimates, no bounds.
    `config` (run.json) tells whether the run finished; `stimulus` (certificate.py, computed here
    without CPU samples when not given) whether its load was delivered. A run with a warm-up or a
    level shift is judged on its steady window (steady.py) unless `whole_run`."""
    stimulus = stimulus or certificate(an, config, None)
    if an.slo is not spec:   # good requests depend on the spec's per-request thresholds
        an = replace(an, good=good_requests(an.rm, spec), slo=spec)
    conf = None if as_measured else spec.confidence if confidence is None else check_confidence(confidence)
    notes = ["judged as measured (--as-measured): point estimates, no confidence bounds"] if as_measured else []
    looked = judged(config)
    if looked is not None:   # a run until decided: the prefix its last look judged, at that look's confidence
        until, k = looked
        an = replace(an, mask=an.mask & (an.rm.scheduled <= until))
        if conf is not None:
            notes.append(f"run until decided: look {k} judged the {int(an.mask.sum()):,} rows scheduled by "
                         f"{until:.4g} s at {look_confidence(conf, k):.2%}, so that the error rates of all its "
                         f"looks sum to at most {1 - conf:.0%} (docs/verdicts.md#run-until-decided)")
            conf = look_confidence(conf, k)
    elif not whole_run:
        mask, note = judged_window(an, of_run(an))
        an = replace(an, mask=mask)
        notes += [note] if note else []
    bias = bias_of(an, an.bottleneck)
    ends = None
    if bias is not None and as_measured:
        notes.append("the replay fell behind its schedule; figures judged as measured")
    elif bias is not None:
        ends = Ends(bias, replace(an, good=good_requests(bias.shifted(an.rm, upper=True), spec)),
                    replace(an, good=good_requests(bias.shifted(an.rm, upper=False), spec)))
        cause = (an.bottleneck or {}).get("cause") or "cause unknown"
        notes.append(f"the replay fell behind its schedule ({cause}): {bias.affected(an.mask)} requests overlapped "
                     f"{len(bias.stalls)} stalls ({bias.stalled_s:.3g} s); each figure judged at both ends of its "
                     f"bias bound")
    rows = [_evaluate(an, o, an.mask, "all", conf, ends) for o in spec.objectives]
    for name, cls in spec.classes.items():
        if not cls.objectives:
            continue
        sel = np.zeros(an.rm.n, dtype=bool)
        for codes, labels in (an.rm.model, an.rm.slo_class):
            if name in labels:
                sel |= codes == labels.index(name)
        if not sel.any():
            notes.append(f"class {name!r} matches no model or slo_class in this run")
        rows += [_evaluate(an, o, an.mask & sel, name, conf, ends) for o in cls.objectives]
    if not rows:
        notes.append("the SLO spec has no objectives to gate on")
    empty = int(an.mask[an.rm.empty_ok].sum())
    if empty:
        notes.append(f"{empty} requests counted ok streamed no token although their rows asked for output")
    sc = an.scalars()
    return GateResult(rows, sc["attainment"], sc["goodput_rps"], notes, *_errors(an), unfinished(config, an.rm),
                      stimulus)


def evaluate_slo(run_dir_or_records: str | Path | pa.Table | Analysis, slo, *, warmup=None,
                 cooldown=None, steady_state: float | None = None, as_measured: bool = False,
                 confidence: float | None = None, judge_as_measured: bool = False,
                 allow_bottleneck: bool | None = None, whole_run: bool = False,
                 tenant_column: str | None = None) -> GateResult:
    """Gate a run (directory, records file, records table or Analysis) on an SLO spec. A run
    directory also tells whether the replay kept its schedule (run.json, cpu.parquet).
    `tenant_column`: the records column naming each request's tenant (Analysis.tenants).
    `judge_as_measured` and `allow_bottleneck`: old names of `as_measured`."""
    spec = load_slo(slo)
    as_measured = as_measured or judge_as_measured or bool(allow_bottleneck)
    if isinstance(run_dir_or_records, Analysis):
        return gate(run_dir_or_records, spec, as_measured, confidence=confidence, whole_run=whole_run)
    with plain_pages():
        run = None if isinstance(run_dir_or_records, pa.Table) else load_run(run_dir_or_records, columns=ANALYSIS_COLUMNS)
        an = analyze(with_column(run, tenant_column) if run else conform_records(run_dir_or_records), warmup=warmup,
                     cooldown=cooldown, steady_state=steady_state, slo=spec, tenant_column=tenant_column)
        if tenant_column:
            an.tenants    # noqa: B018 - an unknown column is an error before anything is judged
        config, cpu = (run.config, load_cpu(run.dir)) if run else (None, None)
        an.server_metrics = run.server_metrics if run else None
        an.bottleneck = assess(an, config, cpu)
        if run is not None:
            attach(an, run)
        return gate(an, spec, as_measured, config, confidence, certificate(an, config, cpu), whole_run)
