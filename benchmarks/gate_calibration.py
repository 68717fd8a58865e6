"""Gate calibration: how often `replay gate` is wrong about a p99, from distributions whose truth is known.

    python3 benchmarks/gate_calibration.py [--reps 25] [--seed 0] [--confidence 0.95]

Four latency distributions (lognormal, a Pareto tail, bimodal, a warm-up ramp: the first requests
up to 3x slower, its truth the p99 of the whole run's mixture), each with `p99 <= limit` at the
true p99 -20/-5/-2/+2/+5/+20 %. A limit below the truth makes the objective truly fail, so a pass is
a false pass; above, a fail is a false fail; undecided is neither. Each gate is one run of n requests
(n = 150, 1,000, 5,000) judged once by the gate's own verdict (reports/gate.py: quantile_bounds,
judge), beside fixed-n point-estimate rules (the sample p99 of the first 100, 368 or 662 requests,
as k6 would with a minimum-sample rule). "n to decide": per stream, the shortest run on a grid
(50 * 1.25^k, up to 20,000) that a single gate decides; the median over streams (">" when most
never decide within the grid).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_replay.reports.gate import judge, quantile_bounds  # noqa: E402

P = 0.99
OFFSETS = (-0.20, -0.05, -0.02, 0.02, 0.05, 0.20)
GRID = (50, 100, 150, 250, 400, 650, 1000, 1600, 2500, 4000, 6500, 10_000, 16_000)
SHOWN = (150, 1000, 10_000)
FIXED = (100, 368, 662)
RAMP = 3.0   # the first request's latency multiplier; it decays as exp(-i / 50)


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
    """{"gates": [(dist, offset, n, verdict, truth_holds)], "fixed": [(rule_n, offset, verdict, truth_holds)]}:
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
                out["fixed"] += [(k, off, "pass" if est <= q * (1 + off) else "fail", off > 0) for off in OFFSETS]
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
    a = ap.parse_args()
    res = campaign(a.reps, a.seed, a.confidence)
    g = res["gates"]
    print(f"{len(g):,} gates of p99 <= limit (one run each), confidence {a.confidence:.0%}, {a.reps} runs per "
          f"distribution and length\n")
    fp, ff, und = rates(g)
    print(f"bound verdicts, all gates:   false pass {fp:.1%}  false fail {ff:.1%}  undecided {und:.1%}")
    for k in FIXED:
        fpk, ffk, _ = rates([r for r in res["fixed"] if r[0] == k])
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
            rows = [r for r in res["fixed"] if r[0] == k and r[1] == off]
            cells.append(f"{np.mean([r[2] == ('fail' if r[3] else 'pass') for r in rows]):.1%}")
        print("  ".join(f"{c:>17}" for c in cells))
    print("\nn to decide by distribution (offsets " + " / ".join(f"{o:+.0%}" for o in OFFSETS) + "):")
    for name in DISTS:
        print(f"  {name:>13}: " + "  ".join(f"{to_decide(g, name, o):>8}" for o in OFFSETS))


if __name__ == "__main__":
    main()
