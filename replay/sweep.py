"""`replay sweep`: capacity under SLO (DistServe's goodput).

Replays the same trace at increasing mean rates and finds, by bracketing then bisection,
the highest offered rate whose run still passes the SLO gate (typically
`attainment >= target`). Prints and writes the capacity curve (goodput and p99 latency
against offered load) and marks the knee of the latency curve.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass
class Point:
    rate: float
    speed: float
    passed: bool
    exit_code: int
    attainment: float | None
    goodput_rps: float | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    run_dir: str


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="find the highest request rate that meets the SLO",
                       description="Replay a trace at increasing rates; bracket and bisect the "
                                   "highest rate whose run passes the SLO gate.")
    p.add_argument("--trace", required=True)
    p.add_argument("--target", action="append", default=[], metavar="[MODEL=]URL",
                   help="base URL (default: start engine-stub locally); MODEL=URL (repeatable) as in `replay run`")
    p.add_argument("--slo", required=True, help="SLO file (YAML/TOML/pyproject.toml)")
    p.add_argument("--rates", default=None, help="comma-separated rates (req/s) to try first, e.g. 1,2,4,8")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="stop bisecting when hi/lo < 1 + tolerance (default 0.1)")
    p.add_argument("--max-runs", type=int, default=10, help="upper bound on replays (default 10)")
    p.add_argument("--max-requests", type=int, default=None, help="replay at most this many rows per run")
    p.add_argument("-o", "--output", default="runs/sweep", help="sweep directory")
    p.add_argument("--engine-arg", action="append", default=[],
                   help="without --target: extra argument for engine-stub serve (repeatable, "
                        "e.g. --engine-arg=--max-num-seqs --engine-arg=8)")
    p.add_argument("run_args", nargs=argparse.REMAINDER,
                   help="after `--`: extra arguments for every `replay run`")
    p.set_defaults(func=run)


def native_rate(trace, rows: int | None = None) -> float:
    """Mean rate of the trace's first `rows` rows (all by default): the rows a run replays,
    so that speed = rate / native_rate makes the replayed rows arrive at `rate`."""
    a = trace.table.column("arrival_ns").to_numpy()[:rows]
    span = (a[-1] - a[0]) / 1e9
    return (len(a) - 1) / span if span > 0 else float("inf")


def knee(rates: list[float], values: list[float]) -> float | None:
    """Kneedle: the point farthest below the chord of the normalised (log rate, value) curve.
    Log rate because sweeps space their rates geometrically (doubling, geometric bisection)."""
    pts = [(r, v) for r, v in zip(rates, values) if v is not None and math.isfinite(v) and r > 0]
    if len(pts) < 3:
        return None
    pts.sort()
    x = np.log(np.array([p[0] for p in pts], float))
    y = np.array([p[1] for p in pts], float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    xn, yn = (x - x.min()) / np.ptp(x), (y - y.min()) / np.ptp(y)
    dist = xn - yn  # latency rises convexly: the knee is where the curve is furthest below the chord
    i = int(np.argmax(dist))
    return float(f"{np.exp(x[i]):.6g}") if dist[i] > 0 else None


class Sweeper:
    def __init__(self, args: argparse.Namespace, target: list[str]) -> None:
        from llm_replay import reports
        from llm_replay.traces import Trace
        self.args, self.target = args, target
        self.out = Path(args.output)
        self.out.mkdir(parents=True, exist_ok=True)
        self.trace_path = Path(args.trace)
        self.native = native_rate(Trace.read(self.trace_path), args.max_requests)
        self.slo = reports.load_slo(args.slo)
        self.points: dict[float, Point] = {}
        self.bracketed = False  # a failing rate above the capacity was found

    def measure(self, rate: float) -> Point:
        from llm_replay import reports
        from .runproc import replay_run
        rate = float(f"{rate:.4g}")
        if rate in self.points:
            return self.points[rate]
        speed = rate / self.native
        run_dir = self.out / f"rate-{rate:g}"
        extra = ["--speed", f"{speed:.6g}"]
        if self.args.max_requests:
            extra += ["--max-requests", str(self.args.max_requests)]
        extra += [a for a in self.args.run_args if a != "--"]
        print(f"sweep: rate {rate:g} req/s (speed x{speed:.3g}) ...", flush=True)
        outcome = replay_run(self.trace_path, self.target, run_dir, extra=extra)
        if not (run_dir / "records.parquet").exists():
            raise SweepError(f"replay run at rate {rate:g} produced no records "
                             f"(exit {outcome.returncode}):\n{outcome.output[-2000:]}")
        gate = reports.evaluate_slo(run_dir, self.slo)
        summary = reports.summarize_run(run_dir)
        point = Point(rate, speed, gate.exit_code == 0, gate.exit_code, gate.attainment,
                      gate.goodput_rps, _p99(summary, "ttft_ms"), _p99(summary, "tpot_ms"), str(run_dir))
        print(f"  attainment {_fmt(point.attainment)}  goodput {_fmt(point.goodput_rps)} req/s  "
              f"ttft p99 {_fmt(point.ttft_p99_ms)} ms  -> {'pass' if point.passed else 'FAIL'}", flush=True)
        self.points[rate] = point
        return point

    def search(self) -> float | None:
        args = self.args
        budget = args.max_runs
        lo = hi = None
        if args.rates:
            for r in sorted(float(x) for x in args.rates.split(",") if x.strip()):
                if len(self.points) >= budget:
                    break
                if self.measure(r).passed:
                    lo = r
                else:
                    hi = r
                    break
        else:
            r = self.native if math.isfinite(self.native) else 1.0
            first = self.measure(r).passed
            lo, hi = (r, None) if first else (None, r)
            while len(self.points) < budget and (lo is None or hi is None):
                r = r * 2 if first else r / 2
                if self.measure(r).passed:
                    lo = r if lo is None or r > lo else lo
                    if not first:
                        break
                else:
                    hi = r
                    if first:
                        break
        while lo is not None and hi is not None and hi / lo > 1 + args.tolerance \
                and len(self.points) < budget:
            mid = math.sqrt(lo * hi)
            if self.measure(mid).passed:
                lo = mid
            else:
                hi = mid
        self.bracketed = hi is not None
        return lo


class SweepError(RuntimeError):
    exit_code = 2


def _p99(summary: dict, metric: str) -> float | None:
    return (summary["latency"].get(metric) or {}).get("p99")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def run(args: argparse.Namespace) -> int:
    from .local_engine import start_engine
    engine = None
    target = list(args.target)
    if not target:
        engine = start_engine(*args.engine_arg)
        target = [engine.url]
        print(f"sweep: no --target, started engine-stub at {engine.url}")
    try:
        sweeper = Sweeper(args, target)
        capacity = sweeper.search()
    finally:
        if engine:
            engine.stop()
    points = sorted(sweeper.points.values(), key=lambda p: p.rate)
    knee_rate = knee([p.rate for p in points], [p.ttft_p99_ms for p in points])
    result = {"capacity_rps": capacity, "capacity_bracketed": sweeper.bracketed, "knee_rps": knee_rate,
              "native_rate_rps": sweeper.native, "points": [asdict(p) for p in points]}
    (sweeper.out / "sweep.json").write_text(json.dumps(result, indent=2))
    from .sweep_plot import write_capacity_html
    write_capacity_html(sweeper.out / "capacity.html", result)
    print("\n rate req/s | pass | attainment | goodput req/s | ttft p99 ms | tpot p99 ms")
    for p in points:
        print(f" {p.rate:10.3g} | {'yes' if p.passed else 'no':4} | {_fmt(p.attainment):>10} | "
              f"{_fmt(p.goodput_rps):>13} | {_fmt(p.ttft_p99_ms):>11} | {_fmt(p.tpot_p99_ms):>11}")
    if capacity is None:
        print("capacity: no tried rate meets the SLO")
    elif sweeper.bracketed:
        print(f"capacity (highest rate meeting the SLO): {capacity:.3g} req/s")
    else:  # no rate failed: the true capacity lies above the last one tried
        print(f"capacity: at least {capacity:.3g} req/s (every tried rate met the SLO)")
    if knee_rate is not None:
        print(f"knee of the p99 TTFT curve: {knee_rate:.3g} req/s")
    print(f"sweep directory: {sweeper.out} (sweep.json, capacity.html)")
    return 0 if capacity is not None else 1
