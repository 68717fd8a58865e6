"""`compare_runs`: is the candidate run better, worse or the same as the base run?

Per metric: the relative delta of each statistic with a bootstrap CI (percentiles: the exact
order-statistic bootstrap of stats.py; means: normal approximation), Bonferroni-adjusted over
all tested rows so that two runs from one distribution rarely show a false change; per
distribution a Mann-Whitney rank test (Holm-adjusted). A row changes only when its interval
excludes zero *and* the effect is at least `min_effect_pct`.

`non_inferiority` asks another question, with stated error rates: is the candidate not worse than
the base by more than a margin (docs/verdicts.md, A/B)? See its docstring for the bounds.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .analysis import Analysis, analyze, plain_pages, stat_value
from .errors import ReportError
from .metrics import LATENCIES, POOLED
from .records import ANALYSIS_COLUMNS, load_run
from .slo import load_slo
from .stats import PERCENTILES, bootstrap_quantiles
from .text import markdown_table, render_table

DISTS = ("ttft_ms", "tpot_ms", "itl_ms", "icl_ms", "e2e_ms")
# Server-side parts (servertime.py), compared when both runs joined server spans; no mean: the
# percentiles are what a tail regression shows in.
PARTS = ("net_ms", "queue_ms", "prefill_ms", "decode_ms", "server_ttft_ms")
STATS = ("p50", "p90", "p99", "mean")
N_BOOT = 10_000
RANK_MAX = 200_000          # rank test on at most this many samples per run (random subset)
RANK_MIN_SHIFT = 3.0        # P(cand > base) must differ from 0.5 by this many points to count
COLUMNS = ["metric", "base", "cand", "delta", "delta %", "CI of delta %", "p", "verdict"]


@dataclass
class CompareRow:
    metric: str
    base: float | None
    cand: float | None
    delta_pct: float | None
    ci_pct: tuple[float, float] | None
    p_value: float | None
    verdict: str            # improved, regressed, no significant change, not tested, cannot evaluate

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.cand is None else self.cand - self.base


@dataclass
class CompareResult:
    rows: list[CompareRow]
    verdict: str
    fail_on_regression_pct: float | None
    base_n: int
    cand_n: int
    notes: list[str] = field(default_factory=list)   # which server-side part grew, per TTFT/E2E regression

    @property
    def exit_code(self) -> int:
        if self.base_n == 0 or self.cand_n == 0:
            return 2
        limit = self.fail_on_regression_pct     # rank-test rows carry no magnitude
        return int(limit is not None and any(r.verdict == "regressed" and r.delta_pct is not None
                                             and abs(r.delta_pct) > limit for r in self.rows))

    def _rows(self) -> list[list[object]]:
        return [[r.metric, r.base, r.cand, r.delta, r.delta_pct, r.ci_pct, r.p_value, r.verdict] for r in self.rows]

    def table(self) -> str:
        gate = (f"; fail on regression > {self.fail_on_regression_pct:g}%: exit {self.exit_code}"
                if self.fail_on_regression_pct is not None else "")
        return render_table(f"compare: {self.verdict.upper()}{gate}", COLUMNS, self._rows(),
                            caption="; ".join([f"base n={self.base_n}, cand n={self.cand_n} successful requests; "
                                               f"CIs are simultaneous (Bonferroni) 99%", *self.notes]))

    def markdown(self) -> str:
        return markdown_table(COLUMNS, self._rows())

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "exit_code": self.exit_code,
                "fail_on_regression_pct": self.fail_on_regression_pct, "notes": self.notes,
                "rows": [asdict(r) | {"delta": r.delta} for r in self.rows]}


def _replicates(x: np.ndarray, stat: str, seed: int) -> np.ndarray:
    if stat == "mean":
        se = np.std(x) / math.sqrt(len(x)) if len(x) > 1 else 0.0
        return np.random.default_rng(seed).normal(np.mean(x), se, N_BOOT)
    return bootstrap_quantiles(x, [PERCENTILES[stat]], n_boot=N_BOOT, seed=seed)[0]


def _verdict(same: bool, worse: bool) -> str:
    return "no significant change" if same else "regressed" if worse else "improved"


def _rank_p(xb: np.ndarray, xc: np.ndarray, seed: int) -> tuple[float, float]:
    """Mann-Whitney U two-sided p-value and P(cand > base) (the common-language effect size)."""
    from scipy.stats import mannwhitneyu
    rng = np.random.default_rng(seed)
    xb, xc = (x if len(x) <= RANK_MAX else rng.choice(x, RANK_MAX, replace=False) for x in (xb, xc))
    res = mannwhitneyu(xc, xb, alternative="two-sided")
    return float(res.pvalue), float(res.statistic) / (len(xb) * len(xc))


def _holm(ps: list[float]) -> list[float]:
    order, adj = np.argsort(ps), np.empty(len(ps))
    adj[order] = np.maximum.accumulate(np.fmin(1.0, (len(ps) - np.arange(len(ps))) * np.asarray(ps)[order]))
    return adj.tolist()


def compare_analyses(base: Analysis, cand: Analysis, *, fail_on_regression_pct: float | None = None,
                     min_effect_pct: float = 1.0, conf: float = 0.99) -> CompareResult:
    from scipy.stats import norm
    reasoning = ("ttfa_ms", "tpot_answer_ms") if base.rm.has_reasoning or cand.rm.has_reasoning else ()
    spans = tuple(m for m in PARTS if m in base.rm.columns and m in cand.rm.columns)
    samples = {m: (base.values(m), cand.values(m)) for m in DISTS + reasoning + spans}
    samples = {m: v for m, v in samples.items() if len(v[0]) >= 2 and len(v[1]) >= 2}
    sb, sc = base.scalars(), cand.scalars()
    props = [k for k in ("error_rate", "attainment") if sb[k] is not None and sc[k] is not None]
    n_tests = sum(len(STATS) - (m in PARTS) for m in samples) + len(props)
    alpha = (1 - conf) / max(n_tests, 1)
    rows: list[CompareRow] = []
    seed = 0
    for metric, (xb, xc) in samples.items():
        for stat in STATS[:-1] if metric in PARTS else STATS:
            seed += 2
            b, c = stat_value(xb, stat), stat_value(xc, stat)
            if metric in PARTS and not b > 0:   # no queue at the base: a relative change is undefined
                rows.append(CompareRow(f"{metric}.{stat}", b, c, None, None, None, "not tested"))
                continue
            rb, rc = _replicates(xb, stat, seed), _replicates(xc, stat, seed + 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = (rc - rb) / rb * 100
            lo, hi = np.nanquantile(rel, [alpha / 2, 1 - alpha / 2])
            est = (c - b) / b * 100 if b else math.nan
            rows.append(CompareRow(f"{metric}.{stat}", b, c, est, (float(lo), float(hi)), None,
                                   _verdict(lo <= 0 <= hi or abs(est) < min_effect_pct, est > 0)))
    ranks = {m: _rank_p(xb, xc, 7) for m, (xb, xc) in samples.items() if m not in PARTS}
    for (metric, (p, auc)), pa in zip(ranks.items(), _holm([p for p, _ in ranks.values()])):
        shift = (auc - 0.5) * 100     # percentage points of P(cand > base) above a coin flip
        rows.append(CompareRow(f"{metric} rank test P(cand>base)", 0.5, auc, None, None, pa,
                               _verdict(pa >= 1 - conf or abs(shift) < RANK_MIN_SHIFT, shift > 0)))
    z = float(norm.ppf(1 - alpha / 2))
    for key in props:       # error_rate: lower is better; attainment: higher
        b, c, nb, nc = sb[key], sc[key], sb["issued"], sc["issued"]
        se = math.sqrt(b * (1 - b) / nb + c * (1 - c) / nc)
        lo, hi = (c - b) - z * se, (c - b) + z * se
        pct = (c - b) / b * 100 if b else (0.0 if c == b else math.inf)
        small = abs(c - b) / max(b, 0.01) * 100 < min_effect_pct   # relative, floored at 1%
        rows.append(CompareRow(key, b, c, pct, (lo * (100 / b), hi * (100 / b)) if b else None, None,
                               _verdict(lo <= 0 <= hi or small, (c > b) == (key == "error_rate"))))
    for key in ("requests_per_s", "output_tokens_per_s"):
        b, c = sb[key], sc[key]
        pct = (c - b) / b * 100 if b and c is not None else None
        rows.append(CompareRow(key, b, c, pct, None, None, "not tested"))
    changed = {r.verdict for r in rows}
    verdict = _verdict(not changed & {"regressed", "improved"}, "regressed" in changed)
    from .servertime import grown
    regressed = [r for r in rows if r.verdict == "regressed" and r.delta_pct is not None]
    notes = []     # per latency, the regressed row that grew most: one sentence each
    for m in ("ttft_ms", "e2e_ms"):
        grew = [r for r in regressed if r.metric.startswith(m + ".")]
        notes += [grown(base, cand, *max(grew, key=lambda r: r.delta_pct).metric.split("."))] if grew else []
    if (base.server is None) != (cand.server is None):
        notes.append("server-side parts need server spans in both runs (replay run --otlp)")
    return CompareResult(rows, verdict, fail_on_regression_pct, sb["ok"], sc["ok"], [n for n in notes if n])


def _analyses(runs, slo, **window) -> list[Analysis]:
    """Runs (directories, records files or Analyses) analysed alike."""
    from .servertime import attach
    slo, out = load_slo(slo) if slo is not None else None, []
    for run in runs:
        if not isinstance(run, Analysis):
            loaded = load_run(run, columns=ANALYSIS_COLUMNS)
            run = analyze(loaded.records, slo=slo, **window)
            attach(run, loaded)
        out.append(run)
    return out


def compare_runs(base, cand, *, fail_on_regression_pct: float | None = None, min_effect_pct: float = 1.0,
                 slo=None, warmup=None, cooldown=None, steady_state: float | None = None,
                 html: str | Path | None = None) -> CompareResult:
    """Compare two runs (directories, records files or Analyses); optionally write a
    side-by-side HTML page to `html`."""
    with plain_pages():
        a, b = _analyses((base, cand), slo, warmup=warmup, cooldown=cooldown, steady_state=steady_state)
        result = compare_analyses(a, b, fail_on_regression_pct=fail_on_regression_pct,
                                  min_effect_pct=min_effect_pct)
    if html:
        from .html import render_compare
        Path(html).write_text(render_compare(result, a, b, str(base), str(cand)))
    return result


# Non-inferiority (A/B with stated error rates)
NI_METRICS = ("ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p99", "error_rate")
# Per-request latencies only: the pooled chunk gaps (ITL, ICL) are not independent samples.
NI_LATENCIES = tuple(m for m in LATENCIES if m not in POOLED)
NI_STATS = ("p50", "p90", "p95", "p99", "p99.9")


def ratio_bounds(xb: np.ndarray, xc: np.ndarray, p: float, conf: float) -> tuple[float, float]:
    """Lower and upper bounds of q_c / q_b - 1, the relative change of the p-quantile (p in 0..1)
    from run xb to run xc, each one-sided at `conf`: the ratio of each run's exact order-statistic
    bound (gate.quantile_bounds) at 1 - (1 - conf) / 2 (Bonferroni over the two runs). The upper
    end misses only when q_c is above its upper bound or q_b below its lower bound, so it holds with
    at least `conf` for any continuous latency distributions (no bootstrap: a percentile bootstrap of
    a p99 under-covers on a few hundred requests, exactly where an A/B verdict must say "not yet").
    -1 / inf where a run is too short for that side. Latencies are >= 0: a lower bound below 0 is 0."""
    from .gate import quantile_bounds
    (lb, ub), (lc, uc) = (quantile_bounds(x, p, 1 - (1 - conf) / 2) for x in (xb, xc))
    hi = uc / lb - 1 if lb > 0 and math.isfinite(uc) else math.inf
    lo = max(lc, 0.0) / ub - 1 if math.isfinite(ub) and ub > 0 else -1.0
    return lo, hi


def difference_bounds(kb: int, nb: int, kc: int, nc: int, conf: float) -> tuple[float, float]:
    """Lower and upper bounds of p_c - p_b, the difference of two proportions (kb of nb, kc of nc),
    each one-sided at `conf`: exact Clopper-Pearson bounds of each run at 1 - (1 - conf) / 2,
    combined (upper: the candidate's upper minus the base's lower bound). Conservative for every n,
    unlike Wald (which misses on rare errors) or Newcombe's score interval (near, not at least, the
    stated confidence)."""
    from .gate import proportion_bounds
    (lb, ub), (lc, uc) = (proportion_bounds(k, n, 1 - (1 - conf) / 2) for k, n in ((kb, nb), (kc, nc)))
    return lc - ub, uc - lb


def not_worse(lo: float, hi: float, margin: float) -> str:
    """pass when even the worse end of the effect's bounds is within the margin, fail when even the
    better end is beyond it, inconclusive between (lower is better: latencies, error rate)."""
    return "pass" if hi <= margin else "fail" if lo > margin else "inconclusive"


@dataclass
class NonInferiorityRow:
    metric: str
    base: float | None
    cand: float | None
    effect: float | None        # quantiles: cand / base - 1; error_rate: cand - base (both as fractions)
    lower: float | None         # the effect's bounds, each one-sided at the result's per-metric confidence
    upper: float | None
    margin: float
    verdict: str                # pass, fail, inconclusive, cannot evaluate
    note: str | None = None

    def _fmt(self, v: float | None) -> str:     # quantiles: relative; error_rate: percentage points
        return "-" if v is None else f"{v * 100:+.3g}" + (" pt" if self.metric == "error_rate" else "%")

    @property
    def bounds_text(self) -> str:
        """'[-3.1%, +8.2%]'; '-' for an end the runs are too short for (a ratio of -100 % or inf)."""
        if self.lower is None:
            return "-"
        lo = self.lower if self.lower > -1 or self.metric == "error_rate" else None
        return f"[{self._fmt(lo)}, {self._fmt(self.upper if math.isfinite(self.upper) else None)}]"


@dataclass
class NonInferiorityResult:
    rows: list[NonInferiorityRow]
    confidence: float           # the family's: every row's bounds are at 1 - (1 - confidence) / len(rows)
    base_n: int
    cand_n: int

    @property
    def metric_confidence(self) -> float:
        return 1 - (1 - self.confidence) / max(len(self.rows), 1)

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict for r in self.rows}
        return "fail" if "fail" in verdicts else "pass" if verdicts == {"pass"} else "inconclusive"

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1}.get(self.verdict, 2)     # inconclusive and cannot evaluate: 2

    def _rows(self) -> list[list[object]]:
        return [[r.metric, r.base, r.cand, r._fmt(r.effect), r.bounds_text, "<= " + r._fmt(r.margin),
                 r.verdict + (f" ({r.note})" if r.note else "")] for r in self.rows]

    def _columns(self) -> list[str]:
        return ["metric", "base", "cand", "effect", f"{self.metric_confidence:.2%} bounds", "margin", "verdict"]

    def table(self) -> str:
        caption = (f"effect: cand / base - 1 (error_rate: cand - base, in percentage points); its bounds each "
                   f"one-sided at {self.metric_confidence:.2%}, {self.confidence:.0%} over the {len(self.rows)} "
                   f"metrics (Bonferroni); base n={self.base_n:,}, cand n={self.cand_n:,} requests")
        return render_table(f"A/B: candidate not worse? {self.verdict.upper()} (exit {self.exit_code})",
                            self._columns(), self._rows(), caption=caption)

    def markdown(self) -> str:
        return markdown_table(self._columns(), self._rows())

    def to_dict(self) -> dict:
        def finite(v):
            return v if v is None or math.isfinite(v) else None
        return {"verdict": self.verdict, "exit_code": self.exit_code, "confidence": self.confidence,
                "metric_confidence": self.metric_confidence, "base_n": self.base_n, "cand_n": self.cand_n,
                "rows": [asdict(r) | {"lower": finite(r.lower), "upper": finite(r.upper)} for r in self.rows]}


def check_metrics(metrics) -> tuple[str, ...]:
    """The metrics a non-inferiority comparison judges: `<latency>.<percentile>` or error_rate."""
    metrics = tuple(metrics)
    for m in metrics:
        name, _, stat = m.partition(".")
        if m != "error_rate" and (name not in NI_LATENCIES or stat not in NI_STATS):
            raise ReportError(f"--metrics: cannot judge {m!r}: use error_rate or <metric>.<percentile> with metric one of "
                              f"{', '.join(NI_LATENCIES)} and percentile one of {', '.join(NI_STATS)}")
    if not metrics:
        raise ReportError("--metrics: name at least one metric")
    return metrics


def non_inferiority(base: Analysis, cand: Analysis, margin: float, *, error_margin: float = 0.01,
                    metrics=NI_METRICS, conf: float = 0.95) -> NonInferiorityResult:
    """Is the candidate not worse than the base by more than `margin` (a fraction: 0.05 = 5 %) on
    each latency quantile, and by more than `error_margin` (a difference of proportions: 0.01 = 1
    percentage point) on error_rate? Per metric the effect's bounds (ratio_bounds,
    difference_bounds) at 1 - (1 - conf) / len(metrics) (Bonferroni over the metrics): if the
    candidate were truly worse than a margin, PASS would come out at most 1 - conf of the time; if
    it were truly within every margin, FAIL at most 1 - conf of the time."""
    metrics = check_metrics(metrics)
    mconf = 1 - (1 - conf) / len(metrics)
    sb, sc = base.scalars(), cand.scalars()
    rows = []
    for m in metrics:
        if m == "error_rate":
            b, c, nb, nc = sb[m], sc[m], sb["issued"], sc["issued"]
            if not nb or not nc:
                rows.append(NonInferiorityRow(m, b, c, None, None, None, error_margin, "cannot evaluate",
                                              "no requests"))
                continue
            lo, hi = difference_bounds(sb["failed"], nb, sc["failed"], nc, mconf)
            rows.append(NonInferiorityRow(m, b, c, c - b, lo, hi, error_margin, not_worse(lo, hi, error_margin)))
            continue
        name, _, stat = m.partition(".")
        xb, xc = base.values(name), cand.values(name)
        if len(xb) == 0 or len(xc) == 0:
            rows.append(NonInferiorityRow(m, None, None, None, None, None, margin, "cannot evaluate",
                                          "no samples in " + ("the base" if len(xb) == 0 else "the candidate")))
            continue
        b, c = stat_value(xb, stat), stat_value(xc, stat)
        lo, hi = ratio_bounds(xb, xc, PERCENTILES[stat] / 100, mconf)
        rows.append(NonInferiorityRow(m, b, c, c / b - 1 if b > 0 else None, lo, hi, margin,
                                      not_worse(lo, hi, margin)))
    return NonInferiorityResult(rows, conf, sb["issued"], sc["issued"])


def non_inferiority_runs(base, cand, margin: float, *, error_margin: float = 0.01, metrics=NI_METRICS,
                         conf: float = 0.95, slo=None, warmup=None, cooldown=None,
                         steady_state: float | None = None) -> NonInferiorityResult:
    """`non_inferiority` of two runs (directories, records files or Analyses)."""
    metrics = check_metrics(metrics)     # before loading the runs: bad input is said at once
    with plain_pages():
        a, b = _analyses((base, cand), slo, warmup=warmup, cooldown=cooldown, steady_state=steady_state)
        return non_inferiority(a, b, margin, error_margin=error_margin, metrics=metrics, conf=conf)
