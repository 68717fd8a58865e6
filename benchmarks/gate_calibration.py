"""Gate calibration: how often `replay gate` is wrong about a p99, from distributions whose truth is known.

    python3 benchmarks/gate_calibration.py [--reps 25] [--seed 0] [--confidence 0.95] [--seq-reps 200] [--budget 8192]

(about a minute on two cores; --seq-reps 20 for a quick look)

Four latency distributions (lognormal, a Pareto tail, bimodal, a warm-up ramp: the first requests
up to 3x slower, its truth the p99 of the whole run's mixture), each with `p99 <= limit` at the
true p99 -20/-5/-2/+2/+5/+20 %. A limit below the truth makes the objective truly fail, so a pass is
a false pass; above, a fail is a false fail; undecided is neither. Each gate is one run of n requests
(n = 150, 1,000, 10,000 shown) judged once by the gate's own verdict (reports/gate.py: quantile_bounds,
judge), beside fixed-n point-estimate rules (the sample p99 of the first 100, 368 or 662 requests,
as k6 would with a minimum-sample rule). "n to decide": per stream, the shortest run on a grid
(50 * 1.25^k, up to 20,000) that a single gate decides; the median over streams (">" when most
never decide within the grid).

Run until decided (`replay run --until-decided`, reports/sequential.py): per distribution and limit
(the offsets above and 0, the limit at the truth, where a pass is a false pass for a limit a hair
lower and a fail a false fail), --seq-reps streams of --budget requests, looked at on 16, 32, 64, ...
requests and at the budget's end and stopped at the first verdict; each look at look_confidence
(spending), or at the plain confidence (naive: why spending is needed), beside one look at the
budget's end. The limit is the budget's truth x (1 + offset); a verdict is scored against the truth
of the requests it judged, for the warm-up ramp also against the budget's. The same for
`error_rate <= limit` on Bernoulli errors (proportion_bounds). Tables: the rules side by side (false
pass, false fail, undecided, median requests of the decided), then by offset and by distribution.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_replay.reports.gate import judge, proportion_bounds, quantile_bounds  # noqa: E402
from llm_replay.reports.sequential import look_confidence, look_rows, looks_for  # noqa: E402

P = 0.99
OFFSETS = (-0.20, -0.05, -0.02, 0.02, 0.05, 0.20)
GRID = (50, 100, 150, 250, 400, 650, 1000, 1600, 2500, 4000, 6500, 10_000, 16_000)
SHOWN = (150, 1000, 10_000)
FIXED = (100, 368, 662)
RAMP = 3.0   # the first request's latency multiplier; it decays as exp(-i / 50)
BUDGET = 8192          # the sequential runs' request budget (its end is the 10th look)
STATIONARY = ("lognormal", "pareto", "bimodal")   # one truth for every prefix of a stream
SEQ_OFFSETS = OFFSETS + (0.0,)   # 0: the limit at the truth, where every fail is false
ERROR_RATE = 0.05      # the true error rate of the proportion objective's Bernoulli streams


def _ramp(n: int) -> np.ndarray:
    return 1 + (RAMP - 1) * np.exp(-np.arange(n) / 50)


def _mix_quantile(cdf, lo: float, hi: float) -> float:
    return float(optimize.brentq(lambda x: cdf(x) - P, lo, hi, xtol=1e-9))


LOGN = stats.lognorm(0.6, scale=100.0)
PARETO = stats.lomax(2.5, loc=50.0, scale=30.0)
BIMODAL = (0.9, stats.norm(80, 10), stats.norm(400, 60))
DISTS = {
    "lognormal": (lambda rng, n: LOGN.rvs(n, random_state=rng), lambda n: float(LOGN.ppf(P))),
    "pareto": (lambda rng, n: PARETO.rvs(n, random_state=rng), lambda n: float(PARETO.ppf(P))),
    "bimodal": (lambda rng, n: np.where(rng.random(n) < BIMODAL[0], BIMODAL[1].rvs(n, random_state=rng),
                                         BIMODAL[2].rvs(n, random_state=rng)),
                lambda n: _mix_quantile(lambda x: BIMODAL[0] * BIMODAL[1].cdf(x) + (1 - BIMODAL[0]) * BIMODAL[2].cdf(x),
                                        1, 2000)),
    # a run of n requests: its truth is the p99 of the mixture over the run's positions
    "warm-up ramp": (lambda rng, n: LOGN.rvs(n, random_state=rng) * _ramp(n),
                     lambda n: _mix_quantile(lambda x: float(np.mean(LOGN.cdf(x / _ramp(n)))), 1, 1e4)),
}


def verdict(x: np.ndarray, limit: float, conf: float) -> str:
    """The gate's verdict on `p99 <= limit` for the run x."""
    return judge("<=", limit, *quantile_bounds(x, P, conf))


def campaign(reps: int, seed: int, conf: float, grid=GRID, fixed=FIXED) -> dict:
    """{"gates": [(dist, offset, n, verdict, truth_holds)], "fixed": the same with the rule's n}:
    `reps` independent runs per distribution and run length, each gated once at every offset."""
    rng = np.random.default_rng(seed)
    out = {"gates": [], "fixed": []}
    for name, (draw, truth) in DISTS.items():
        for n in grid:
            q = truth(n)
            for _ in range(reps):
                bounds = quantile_bounds(draw(rng, n), P, conf)
                out["gates"] += [(name, off, n, judge("<=", q * (1 + off), *bounds), off > 0) for off in OFFSETS]
        for k in fixed:
            q = truth(k)
            for _ in range(reps):
                est = np.percentile(draw(rng, k), P * 100)
                out["fixed"] += [(name, off, k, "pass" if est <= q * (1 + off) else "fail", off > 0) for off in OFFSETS]
    return out


def until_decided(bounds, limit: float, conf: float, spend: bool, budget: int = BUDGET) -> tuple[str, int]:
    """(verdict, rows judged) of the first decided look at a run of `budget` requests, looked at on
    look_rows(1), look_rows(2), ... rows and at its end (reports/sequential.py); look k at
    look_confidence(conf, k) when `spend`, else at conf (the naive rule). bounds(n, c): the
    objective's bounds from the first n requests, each one-sided at c."""
    for k in range(1, looks_for(budget) + 1):
        n = min(look_rows(k), budget)
        v = judge("<=", limit, *bounds(n, look_confidence(conf, k) if spend else conf))
        if v != "undecided":
            return v, n
    return "undecided", budget


def sequential_campaign(reps: int, seed: int, conf: float, budget: int = BUDGET, offsets=SEQ_OFFSETS,
                        proportion: bool = True) -> list:
    """[(objective, dist, offset, rule, rows judged, verdict, truth_holds)]: per distribution and offset,
    `reps` streams of `budget` requests, each judged by three rules: until decided with spending,
    until decided at the plain confidence ("naive"), and one look at the budget's end. The limit is
    the whole budget's truth x (1 + offset); a verdict is scored against the truth of the rows it
    judged (for the warm-up ramp a prefix's p99 is higher than the budget's)."""
    rng = np.random.default_rng(seed)
    out = []

    def gate(obj, name, off, limit, bounds, truth):
        for rule, spend in (("spending", True), ("naive", False)):
            v, n = until_decided(bounds, limit, conf, spend, budget)
            out.append((obj, name, off, rule, n, v, limit >= truth(n)))
        out.append((obj, name, off, "one look", budget, judge("<=", limit, *bounds(budget, conf)),
                    limit >= truth(budget)))

    for name, (draw, truth) in DISTS.items():
        truth = functools.cache(truth)
        for off in offsets:
            for _ in range(reps):
                x = draw(rng, budget)
                gate("p99", name, off, truth(budget) * (1 + off), lambda n, c: quantile_bounds(x[:n], P, c), truth)
    if proportion:   # `error_rate <= limit` on Bernoulli errors at ERROR_RATE: exact bounds, discrete
        for off in offsets:
            for _ in range(reps):
                errors = np.cumsum(rng.random(budget) < ERROR_RATE)
                gate("error rate", "bernoulli", off, ERROR_RATE * (1 + off),
                     lambda n, c: proportion_bounds(int(errors[n - 1]), n, c), lambda n: ERROR_RATE)
    return out


def to_decide(gates, name: str | None, off: float) -> str:
    """The shortest run length whose gates most often (>= half) decide rightly."""
    for n in GRID:
        rows = [r for r in gates if r[1] == off and r[2] == n and name in (None, r[0])]
        if rows and np.mean([r[3] == ("pass" if r[4] else "fail") for r in rows]) >= 0.5:
            return f"{n:,}"
    return f">{GRID[-1]:,}"


def rates(rows) -> tuple[float, float, float]:
    """(false pass share of truly failing, false fail share of truly holding, undecided share)."""
    fp = [v == "pass" for *_, v, holds in rows if not holds]
    ff = [v == "fail" for *_, v, holds in rows if holds]
    und = [v == "undecided" for *_, v, _ in rows]
    return (float(np.mean(fp)) if fp else 0.0, float(np.mean(ff)) if ff else 0.0, float(np.mean(und)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seq-reps", type=int, default=200, help="sequential streams per distribution and offset")
    ap.add_argument("--budget", type=int, default=BUDGET, help="a sequential stream's request budget")
    a = ap.parse_args()
    res = campaign(a.reps, a.seed, a.confidence)
    g = res["gates"]
    print(f"{len(g):,} gates of p99 <= limit (one run each), confidence {a.confidence:.0%}, {a.reps} runs per "
          f"distribution and length\n")
    fp, ff, und = rates(g)
    print(f"bound verdicts, all gates:   false pass {fp:.1%}  false fail {ff:.1%}  undecided {und:.1%}")
    for k in FIXED:
        fpk, ffk, _ = rates([r for r in res["fixed"] if r[2] == k])
        print(f"point estimate at n = {k:>3}:  false pass {fpk:.1%}  false fail {ffk:.1%}  undecided 0.0%")
    print("\nby limit (the true p99 x (1 + offset)): the bound's wrong / undecided share at run lengths "
          f"{', '.join(map(str, SHOWN))}; the run length at which most gates decide rightly; the fixed-n rules' "
          "wrong share")
    head = ["offset"] + [f"n={n} wrong/undec" for n in SHOWN] + ["n to decide"] + [f"fixed {k} wrong" for k in FIXED]
    print("  ".join(f"{h:>17}" for h in head))
    for off in OFFSETS:
        cells = [f"{off:+.0%}"]
        for n in SHOWN:
            rows = [r for r in g if r[1] == off and r[2] == n]
            cells.append(f"{np.mean([r[3] == ('fail' if r[4] else 'pass') for r in rows]):.1%} / "
                         f"{np.mean([r[3] == 'undecided' for r in rows]):.0%}")
        cells.append(to_decide(g, None, off))
        for k in FIXED:
            rows = [r for r in res["fixed"] if r[2] == k and r[1] == off]
            cells.append(f"{np.mean([r[3] == ('fail' if r[4] else 'pass') for r in rows]):.1%}")
        print("  ".join(f"{c:>17}" for c in cells))
    print("\nn to decide by distribution (offsets " + " / ".join(f"{o:+.0%}" for o in OFFSETS) + "):")
    for name in DISTS:
        print(f"  {name:>13}: " + "  ".join(f"{to_decide(g, name, o):>8}" for o in OFFSETS))
    sequential_report(res, sequential_campaign(a.seq_reps, a.seed, a.confidence, a.budget), a)


def summary(rows) -> str:
    """false pass, false fail, undecided and the median requests of the decided rows, as table cells."""
    fp, ff, und = rates(rows)
    n = [r[-3] for r in rows if r[-2] != "undecided"]
    return f"{fp:>10.1%}  {ff:>10.1%}  {und:>9.1%}  {(f'{np.median(n):,.0f}' if n else '-'):>16}"


def sequential_report(res: dict, seq: list, a) -> None:
    """The rules side by side on the stationary distributions and the fixed-n campaign's offsets, then
    the sequential rules by offset (the limit at the truth too) and by distribution."""
    print(f"\nrun until decided: {a.seq_reps} streams of up to {a.budget:,} requests per distribution and offset, "
          f"looked at on {look_rows(1)}, {look_rows(2)}, {look_rows(3)}, ... requests and at the budget's end "
          f"({looks_for(a.budget)} looks)")
    head = f"{'rule':<44}  {'false pass':>10}  {'false fail':>10}  {'undecided':>9}  {'median requests':>16}"

    def line(label: str, rows) -> None:
        print(f"{label:<44}  {summary(rows)}")

    steady = [r for r in seq if r[0] == "p99" and r[1] in STATIONARY]
    print(f"\np99 <= limit on {', '.join(STATIONARY)}, offsets {' / '.join(f'{o:+.0%}' for o in OFFSETS)}"
          f" (median requests: of the decided)\n{head}")
    for n in SHOWN:
        line(f"one look at n = {n:,} (fixed-n campaign)", [r for r in res["gates"] if r[2] == n and r[0] in STATIONARY])
    for rule, label in (("one look", f"one look at n = {a.budget:,} (the streams below)"),
                        ("spending", "until decided, spending (look_confidence)"),
                        ("naive", f"until decided, naive ({a.confidence:.0%} every look)")):
        line(label, [r for r in steady if r[2] in OFFSETS and r[3] == rule])
    for k in FIXED:
        line(f"point estimate at n = {k}", [r for r in res["fixed"] if r[2] == k and r[0] in STATIONARY])
    by_offset(steady, "p99 <= limit on the stationary distributions")
    print(f"\nby distribution, offsets {' / '.join(f'{o:+.0%}' for o in SEQ_OFFSETS)}\n{head}")
    for rule in ("spending", "naive"):
        for name in DISTS:
            line(f"{rule}, {name}", [r for r in seq if r[0] == "p99" and r[1] == name and r[3] == rule])
        # a ramp's prefix is slower than the whole budget: scored against the budget's p99, an early
        # stop on the warm-up is a wrong verdict about the run
        line(f"{rule}, warm-up ramp vs the budget's p99", [(*r[:6], r[2] >= 0) for r in seq
                                                            if r[1] == "warm-up ramp" and r[3] == rule])
    errors = [r for r in seq if r[0] == "error rate"]
    if errors:
        print(f"\nerror rate <= limit, Bernoulli errors at {ERROR_RATE:.0%}, offsets as above\n{head}")
        for rule in ("one look", "spending", "naive"):
            line(rule, [r for r in errors if r[2] in OFFSETS and r[3] == rule])
        by_offset(errors, f"error rate <= limit, Bernoulli errors at {ERROR_RATE:.0%}")


def by_offset(rows, what: str) -> None:
    """Each rule's wrong share, undecided share and median requests to decide, by limit offset."""
    print(f"\n{what}, by offset (0: the limit at the truth): wrong / undecided / median requests")
    print(f"{'offset':>8}  " + "  ".join(f"{rule:>24}" for rule in ("spending", "naive", "one look")))
    for off in SEQ_OFFSETS:
        cells = []
        for rule in ("spending", "naive", "one look"):
            sel = [r for r in rows if r[2] == off and r[3] == rule]
            n = [r[4] for r in sel if r[5] != "undecided"]
            cells.append(f"{np.mean([r[5] == ('fail' if r[6] else 'pass') for r in sel]):.1%} / "
                         f"{np.mean([r[5] == 'undecided' for r in sel]):.0%} / "
                         + (f"{np.median(n):,.0f}" if n else "-"))
        print(f"{off:>+8.0%}  " + "  ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
