"""A/B calibration: how often `replay compare --not-worse-by` is wrong, on run pairs whose truth is known.

    python3 benchmarks/ab_calibration.py [--reps 100] [--seed 0] [--confidence 0.95] [--margin 5]

(about a minute on two cores at the default --reps 100; --reps 20 for a quick look)

Each pair is a base run and a candidate run of n requests each (n = 200, 1,000, 5,000), drawn from
one of three latency distributions (lognormal: median 100 ms, sigma 0.6; a Pareto tail; bimodal), the
candidate's latencies the base's distribution scaled by (1 + margin)(1 + d): every true quantile of
the candidate is the base's x (1 + margin)(1 + d), for d = -20/-5/-2/0/+2/+5/+20 %. d > 0: the
candidate is truly worse than the margin, so a PASS is a false pass; d <= 0: it is within the margin
(d = 0: at it), so a FAIL is a false fail; INCONCLUSIVE is neither. p50 and p99 are judged on every
pair by the functions `replay compare --not-worse-by` uses (reports/compare.py: ratio_bounds,
not_worse), at the confidence of one metric (the command splits its confidence over its metrics),
beside the point-estimate rule (PASS when the measured ratio is within the margin, else FAIL).
The same for error_rate on Bernoulli errors: the base at 2 %, the candidate at 2 % + margin x (1 + d)
with the margin --error-margin percentage points (difference_bounds, not_worse), for d = -100/-50/-20/
0/+20/+50/+100 % and n = 1,000, 5,000, 20,000 (a 1-point margin is not told from 0.8 or 1.2 points on
5,000 requests).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_replay.reports import compare  # noqa: E402  (module attributes: a test may swap in a naive rule)

NS = (200, 1000, 5000)
DS = (-0.20, -0.05, -0.02, 0.0, 0.02, 0.05, 0.20)
ERROR_NS = (1000, 5000, 20_000)
ERROR_DS = (-1.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0)
QUANTILES = {"p50": 0.50, "p99": 0.99}
BASE_ERRORS = 0.02

LOGN = stats.lognorm(0.6, scale=100.0)
PARETO = stats.lomax(2.5, loc=50.0, scale=30.0)
BIMODAL = (0.9, stats.norm(80, 10), stats.norm(400, 60))
DISTS = {
    "lognormal": lambda rng, n: LOGN.rvs(n, random_state=rng),
    "pareto": lambda rng, n: PARETO.rvs(n, random_state=rng),
    "bimodal": lambda rng, n: np.where(rng.random(n) < BIMODAL[0], BIMODAL[1].rvs(n, random_state=rng),
                                       BIMODAL[2].rvs(n, random_state=rng)),
}


def point_rule(xb: np.ndarray, xc: np.ndarray, p: float, margin: float) -> str:
    """What a reader of two p99s does: the measured ratio within the margin passes, else fails."""
    return "pass" if np.quantile(xc, p) / np.quantile(xb, p) - 1 <= margin else "fail"


def campaign(reps: int, seed: int, conf: float, margin: float, error_margin: float, ns=NS, ds=DS,
             dists=tuple(DISTS), error_ns=ERROR_NS, error_ds=ERROR_DS) -> list[tuple]:
    """Rows (metric, distribution, n, d, rule, verdict): rule 'bounds' (the command's) or 'point'."""
    rng = np.random.default_rng(seed)
    rows = []
    for name in dists:
        for n in ns:
            for d in ds:
                scale = (1 + margin) * (1 + d)
                for _ in range(reps):
                    xb, xc = DISTS[name](rng, n), DISTS[name](rng, n) * scale
                    for q, p in QUANTILES.items():
                        lo, hi = compare.ratio_bounds(xb, xc, p, conf)
                        rows.append((q, name, n, d, "bounds", compare.not_worse(lo, hi, margin)))
                        rows.append((q, name, n, d, "point", point_rule(xb, xc, p, margin)))
    for n in error_ns:
        for d in error_ds:
            pc = BASE_ERRORS + error_margin * (1 + d)
            for kb, kc in zip(rng.binomial(n, BASE_ERRORS, reps), rng.binomial(n, pc, reps)):
                lo, hi = compare.difference_bounds(int(kb), n, int(kc), n, conf)
                rows.append(("error_rate", "bernoulli", n, d, "bounds", compare.not_worse(lo, hi, error_margin)))
                point = "pass" if (kc - kb) / n <= error_margin else "fail"
                rows.append(("error_rate", "bernoulli", n, d, "point", point))
    return rows


def rates(rows) -> tuple[float, float, float]:
    """false pass (PASS of a pair truly worse than the margin), false fail (FAIL of a pair within
    it), inconclusive share of all."""
    worse = [r[5] for r in rows if r[3] > 0]
    within = [r[5] for r in rows if r[3] <= 0]
    share = lambda xs, v: xs.count(v) / len(xs) if xs else 0.0  # noqa: E731
    return share(worse, "pass"), share(within, "fail"), share([r[5] for r in rows], "inconclusive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=100, help="pairs per distribution, n and d")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confidence", type=float, default=0.95, help="one metric's confidence")
    ap.add_argument("--margin", type=float, default=5.0, help="the quantiles' margin, percent")
    ap.add_argument("--error-margin", type=float, default=1.0, help="error_rate's margin, percentage points")
    a = ap.parse_args()
    margin, error_margin = a.margin / 100, a.error_margin / 100
    rows = campaign(a.reps, a.seed, a.confidence, margin, error_margin)
    print(f"{a.reps} pairs per distribution, n and d; margin {a.margin:g}% (error_rate {a.error_margin:g} pt, "
          f"base errors {BASE_ERRORS:.0%}); confidence {a.confidence:.0%}")
    print(f"\n{'metric':<11} {'rule':<15} {'pairs':>7} {'false pass':>11} {'false fail':>11} {'inconclusive':>13}")
    for metric in (*QUANTILES, "error_rate"):
        for rule in ("bounds", "point"):
            sel = [r for r in rows if r[0] == metric and r[4] == rule]
            fp, ff, inc = rates(sel)
            label = "bounds (this)" if rule == "bounds" else "point estimate"
            print(f"{metric:<11} {label:<15} {len(sel):>7,} {fp:>11.1%} {ff:>11.1%} {inc:>13.1%}")
    print("\nthe command's verdicts by d and n: pass / fail / inconclusive (wrong verdicts: pass where d > 0, "
          "fail where d <= 0)")
    for metric, ns, ds in (*((q, NS, DS) for q in QUANTILES), ("error_rate", ERROR_NS, ERROR_DS)):
        print(f"\n{metric:<8}" + "".join(f"{f'n = {n:,}':>22}" for n in ns))
        for d in ds:
            cells = []
            for n in ns:
                v = [r[5] for r in rows if r[0] == metric and r[2] == n and r[3] == d and r[4] == "bounds"]
                cells.append(" / ".join(f"{v.count(k) / len(v):.0%}" for k in ("pass", "fail", "inconclusive")))
            print(f"{d:>+8.0%}" + "".join(f"{c:>22}" for c in cells))
    for name in DISTS:
        fp, ff, inc = rates([r for r in rows if r[1] == name and r[4] == "bounds"])
        print(f"\n{name:>10} (p50 and p99): false pass {fp:.1%}, false fail {ff:.1%}, inconclusive {inc:.1%}", end="")
    print()


if __name__ == "__main__":
    main()
