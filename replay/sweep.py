"""`replay sweep`: capacity under SLO (DistServe's goodput).

Replays the same trace at increasing mean rates and finds, by bracketing then bisection,
the highest offered rate whose run still passes the SLO gate (typically
`attainment >= target`). Prints and writes the capacity curve (goodput and p99 latency
against offered load) and marks the knee of the latency curve.

Each point replays until its gate is decided (`replay run --until-decided`: further passes of the
trace, stopped at the first decided look) and has the gate's verdict: pass (exit 0), fail (exit 1)
or cannot evaluate (exit 2: undecided within the budget, figures tainted because the replay fell
behind its schedule, ...). A rate that could
not be evaluated bounds nothing: it steers the search like a failing one (the next rate tried is
lower), but the capacity is only bracketed by a rate that failed, and the gaps it leaves between
the highest passing rate and the lowest failing one are bisected too. A rate at which every
request failed (the target died, refused the model) measured nothing: it cannot be evaluated, and
when such a rate lies between the capacity and the lowest failing rate, the sweep exits 2.
"""
from __future__ import annotations

import argparse
import html
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from llm_replay.reports.svg import chart


PASS, FAIL, CANNOT = "pass", "fail", "cannot evaluate"
VERDICTS = {0: PASS, 1: FAIL, 2: CANNOT}   # the SLO gate's exit codes


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
    verdict: str = ""            # pass, fail or cannot evaluate (from exit_code when not given)
    reason: str | None = None    # why it could not be evaluated (the gate rows' notes)
    all_failed: bool = False     # every request failed: nothing about the server's capacity

    def __post_init__(self) -> None:
        self.verdict = self.verdict or VERDICTS.get(self.exit_code, CANNOT)


def shown(verdict: str) -> str:
    """A verdict as the table and the per-point line show it."""
    return "FAIL" if verdict == FAIL else verdict


def gate_reason(gate) -> str:
    """Why a gate could not be evaluated: its undecided objectives and the distinct notes of its
    rows that could not be (the gate's own notes when it had no rows)."""
    if gate.unfinished:
        return gate.unfinished
    if gate.undelivered:
        return "the stimulus was not delivered: " + "; ".join(gate.stimulus["reasons"])
    notes = [f"{r.objective} undecided" + (f": ~{r.more:,} more requests" if r.more else "") if r.verdict == "undecided"
             else r.note or f"{r.objective}: no reason given" for r in gate.rows if r.verdict in (CANNOT, "undecided")]
    if not gate.rows:
        notes = list(gate.notes) or ["no objectives"]
    return "; ".join(dict.fromkeys(notes))


def _rate(rate: float) -> float:
    return float(f"{rate:.4g}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="find the highest request rate that meets the SLO", description=(
        "Replay a trace at increasing rates; bracket and bisect the highest rate whose run passes the SLO gate."))
    p.add_argument("--trace", required=True, help="trace file (Parquet), replayed at each rate by time compression")
    p.add_argument("--target", action="append", default=[], metavar="[MODEL=]URL",
                   help="base URL (default: start engine-stub locally); MODEL=URL (repeatable) as in `replay run`")
    p.add_argument("--slo", required=True, help="SLO file (YAML/TOML/pyproject.toml)")
    p.add_argument("--rates", default=None, help="comma-separated rates (req/s) to try first, e.g. 1,2,4,8")
    p.add_argument("--tolerance", type=float, default=0.1, help="stop bisecting when hi/lo < 1 + tolerance (default 0.1)")
    p.add_argument("--max-runs", type=int, default=10, help="upper bound on replays (default 10)")
    p.add_argument("--max-requests", type=int, help="at most this many rows per run (default: up to 8 passes of the trace)")
    p.add_argument("-o", "--output", default="runs/sweep", help="sweep directory")
    p.add_argument("--engine-arg", action="append", default=[],
                   help="without --target: an engine-stub serve argument (repeatable), e.g. --engine-arg=--max-num-seqs")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="after `--`: extra arguments for every `replay run`")
    p.set_defaults(func=run, inputs={"trace": "file not found"})


def native_rate(trace, rows: int | None = None) -> float:
    """Mean rate of the trace's first `rows` rows (all by default): the rows a run replays,
    so that speed = rate / native_rate makes the replayed rows arrive at `rate`."""
    a = trace.table.column("arrival_ns").to_numpy()[:rows]
    span = (a[-1] - a[0]) / 1e9
    return (len(a) - 1) / span if span > 0 else float("inf")


def knee(rates: list[float], values: list[float]) -> float | None:
    """Kneedle: the point farthest below the chord of the normalised (log rate, value) curve.
    Log rate because sweeps space their rates geometrically (doubling, geometric bisection)."""
    import numpy as np
    pts = sorted((r, v) for r, v in zip(rates, values) if v is not None and math.isfinite(v) and r > 0)
    if len(pts) < 3:
        return None
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
        self.bracketed, self.upper = False, None   # a failing rate above the capacity was found; the lowest one

    def measure(self, rate: float) -> Point:
        """Replay the trace at `rate` req/s and gate the run on the SLO."""
        from llm_replay import reports
        from .orchestrate import replay_run
        speed = rate / self.native
        run_dir = self.out / f"rate-{rate:g}"
        # each point replays until its gate is decided (more passes of the trace when needed):
        # an undecided point bounds nothing, so deciding it is cheaper than bisecting around it
        extra = ["--speed", f"{speed:.6g}", "--slo", str(self.args.slo), "--until-decided",
                 *(["--max-requests", str(self.args.max_requests)] if self.args.max_requests else []),
                 *(a for a in self.args.run_args if a != "--")]
        outcome = replay_run(self.trace_path, self.target, run_dir, extra=extra)
        if not (run_dir / "records.parquet").exists():
            raise SweepError(f"replay run at rate {rate:g} produced no records "
                             f"(exit {outcome.returncode}):\n{outcome.output[-2000:]}")
        gate = reports.evaluate_slo(run_dir, self.slo)
        summary = reports.summarize_run(run_dir)
        verdict = VERDICTS.get(gate.exit_code, CANNOT)
        reason = gate_reason(gate) if verdict == CANNOT else None
        dead = bool(gate.statuses) and not gate.statuses.get("ok")
        if dead:
            verdict, reason = CANNOT, "every request failed (" + "; ".join(
                f"{e['status']} x{e['count']}: {e['message']}"[:200] for e in gate.first_errors) + ")"
        return Point(rate, speed, verdict == PASS, gate.exit_code, gate.attainment, gate.goodput_rps,
                     _p99(summary, "ttft_ms"), _p99(summary, "tpot_ms"), str(run_dir), verdict, reason, dead)

    def probe(self, rate: float) -> Point:
        """The point at `rate` (4 significant digits): measured once, then remembered."""
        rate = _rate(rate)
        if rate in self.points:
            return self.points[rate]
        print(f"sweep: rate {rate:g} req/s (speed x{rate / self.native:.3g}) ...", flush=True)
        point = self.measure(rate)
        why = f" ({point.reason})" if point.verdict == CANNOT and point.reason else ""
        print(f"  attainment {_fmt(point.attainment)}  goodput {_fmt(point.goodput_rps)} req/s  "
              f"ttft p99 {_fmt(point.ttft_p99_ms)} ms  -> {shown(point.verdict)}{why}", flush=True)
        self.points[rate] = point
        return point

    def search(self) -> float | None:
        """The highest rate that passed below the lowest that failed (None when none passed).
        A rate that cannot be evaluated is neither bound: after one, the search goes lower as
        after a failure; bisection then fills every gap between the highest passing rate, the
        unjudged rates above it and the lowest failing rate (lowest gap first)."""
        lo = hi = None   # highest passing rate (below hi), lowest failing rate

        def judge(rate: float) -> Point:
            nonlocal lo, hi
            p = self.probe(rate)
            lo, hi = (p.rate if p.verdict == PASS else lo), (p.rate if p.verdict == FAIL else hi)
            return p

        def room() -> bool:
            return len(self.points) < self.args.max_runs
        if self.args.rates:   # ascending until one fails; an unjudged one bounds nothing: go on
            for r in sorted(float(x) for x in self.args.rates.split(",") if x.strip()):
                if not room() or judge(r).verdict == FAIL:
                    break
        else:
            p = judge(self.native if math.isfinite(self.native) else 1.0)
            up = p.verdict == PASS
            # doubling goes on while rates pass (a failing or unjudged one: bisect below it),
            # halving while they fail or cannot be evaluated
            while room():
                p = judge(p.rate * 2 if up else p.rate / 2)
                if (p.verdict == PASS) != up:
                    break
        while room() and (mid := self._next_mid(lo, hi)) is not None:
            judge(mid)
        self.bracketed, self.upper = hi is not None, hi
        return lo

    def unjudged(self, lo: float | None, hi: float | None) -> list[float]:
        """The rates between lo and hi (None: unbounded) that could not be evaluated."""
        return sorted(r for r, p in self.points.items() if p.verdict == CANNOT
                      and (lo is None or r > lo) and (hi is None or r < hi))

    def _next_mid(self, lo: float | None, hi: float | None) -> float | None:
        """The geometric midpoint of the lowest gap wider than the tolerance between lo, the
        unjudged rates above it and hi, not yet tried; None when there is none."""
        if lo is None:
            return None
        edges = [lo, *self.unjudged(lo, hi), *([hi] if hi is not None else [])]
        for a, b in zip(edges, edges[1:]):
            mid = _rate(math.sqrt(a * b))
            if b / a > 1 + self.args.tolerance and a < mid < b and mid not in self.points:
                return mid
        return None


class SweepError(RuntimeError):
    exit_code = 2


def _p99(summary: dict, metric: str) -> float | None:
    return (summary["latency"].get(metric) or {}).get("p99")


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _rates(rates: list[float], digits: int) -> str:
    r = [f"{x:.{digits}g}" for x in rates]
    return r[0] if len(r) == 1 else ", ".join(r[:-1]) + " and " + r[-1]


def capacity_text(result: dict, digits: int = 3) -> str:
    """The capacity line: the capacity, whether a failing rate bounds it, and the rates that
    could not be evaluated where the capacity could lie (with the gate's reasons)."""
    cap, pts = result["capacity_rps"], result["points"]
    verdicts = [p["verdict"] for p in pts]
    unjudged = result["inconclusive_rps"]
    why = "; ".join(dict.fromkeys(p["reason"] or "no reason given" for p in pts if p["rate"] in unjudged))
    skipped = f"; {_rates(unjudged, digits)} req/s could not be evaluated ({why})" if unjudged else ""
    x = f"{cap:.{digits}g}" if cap is not None else ""
    if cap is None:
        head = "capacity: no tried rate meets the SLO" if FAIL in verdicts else "capacity: unknown"
    elif unjudged:
        upper = result["upper_rps"]
        head = f"capacity: at least {x} req/s" + (f" ({upper:.{digits}g} req/s failed)" if upper else "")
    elif result["capacity_bracketed"]:
        head = f"capacity (highest rate meeting the SLO): {x} req/s"
    elif set(verdicts) == {PASS}:  # the true capacity lies above the last rate tried
        head = f"capacity: at least {x} req/s (every tried rate met the SLO)"
    else:
        head = f"capacity: at least {x} req/s (no tried rate failed)"
    return head + skipped


def exit_code(result: dict) -> int:
    """The gate's convention: 0 a capacity was found, 1 no tried rate meets the SLO and one
    failed, 2 no tried rate could be judged, or one where every request failed lies where the
    capacity could be (above the capacity, below the lowest failing rate)."""
    dead = [p["rate"] for p in result["points"] if p.get("all_failed")]
    if set(dead) & set(result["inconclusive_rps"]):
        return 2
    if result["capacity_rps"] is not None:
        return 0
    return 1 if any(p["verdict"] == FAIL for p in result["points"]) else 2


def run(args: argparse.Namespace) -> int:
    from .orchestrate import start_engine
    engine, target = None, list(args.target)
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
              # the lowest failing rate; the unjudged rates between the capacity and it
              "native_rate_rps": sweeper.native, "upper_rps": sweeper.upper,
              "inconclusive_rps": sweeper.unjudged(capacity, sweeper.upper), "points": [asdict(p) for p in points]}
    (sweeper.out / "sweep.json").write_text(json.dumps(result, indent=2))
    write_capacity_html(sweeper.out / "capacity.html", result)
    print("\n rate req/s | verdict         | attainment | goodput req/s | ttft p99 ms | tpot p99 ms")
    for p in points:
        print(f" {p.rate:10.3g} | {shown(p.verdict):15} | {_fmt(p.attainment):>10} | "
              f"{_fmt(p.goodput_rps):>13} | {_fmt(p.ttft_p99_ms):>11} | {_fmt(p.tpot_p99_ms):>11}")
    print(capacity_text(result))
    if knee_rate is not None:
        print(f"knee of the p99 TTFT curve: {knee_rate:.3g} req/s")
    print(f"sweep directory: {sweeper.out} (sweep.json, capacity.html)")
    return exit_code(result)


def write_capacity_html(path: Path, result: dict) -> None:
    """capacity.html: goodput and p99 latency against offered load, one self-contained page
    (inline SVG, nothing fetched)."""
    pts = result["points"]
    rates = [p["rate"] for p in pts]
    cap, knee_rps = result["capacity_rps"], result["knee_rps"]
    mark = (cap, cap) if cap else None  # the measured capacity as a thin band
    goodput = chart([{"label": "offered req/s", "x": rates, "y": rates, "dash": True},
                     {"label": "goodput req/s", "x": rates, "y": [p["goodput_rps"] for p in pts]},
                     {"label": "attainment", "x": rates, "y": [p["attainment"] for p in pts], "axis": 2}],
                    title="Goodput vs offered load", xlabel="offered rate (req/s)", ylabel="req/s",
                    y2label="attainment", band=mark)
    latency = chart([{"label": "TTFT p99 (ms)", "x": rates, "y": [p["ttft_p99_ms"] for p in pts]},
                     {"label": "TPOT p99 (ms)", "x": rates, "y": [p["tpot_p99_ms"] for p in pts], "axis": 2}],
                    title="Tail latency vs offered load", xlabel="offered rate (req/s)",
                    ylabel="TTFT p99 (ms)", y2label="TPOT p99 (ms)", band=mark)
    cells = ("attainment", "goodput_rps", "ttft_p99_ms", "tpot_p99_ms")
    rows = "".join(f"<tr><td>{p['rate']:.4g}</td>{_verdict(p)}{''.join(f'<td>{_fmt(p[k], 4)}</td>' for k in cells)}"
                   f"<td>{html.escape(p['run_dir'])}</td></tr>" for p in pts)
    verdict = f"<b>{html.escape(capacity_text(result, digits=4))}</b>"
    if knee_rps:
        verdict += f"; knee of the p99 TTFT curve: {knee_rps:.4g} req/s"
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>llm-replay capacity sweep</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}svg{{margin:1em 1em 0 0}}
td.fail{{color:#b00020;font-weight:bold}}td.unjudged{{color:#8a5a00;background:#fff4d6;font-style:italic}}</style></head><body>
<h1>Capacity sweep</h1><p>{verdict}</p>{goodput}{latency}
<table><tr><th>rate req/s</th><th>verdict</th><th>attainment</th><th>goodput req/s</th><th>TTFT p99 ms</th>
<th>TPOT p99 ms</th><th>run</th></tr>{rows}</table></body></html>
""")


def _verdict(p: dict) -> str:
    """The verdict cell: pass, FAIL, or cannot evaluate (set apart, with the gate's reason)."""
    if p["verdict"] == CANNOT:
        why = html.escape(p["reason"] or "")
        return f'<td class="unjudged" title="{why}">cannot evaluate{f" ({why})" if why else ""}</td>'
    return f'<td class="{p["verdict"]}">{html.escape(shown(p["verdict"]))}</td>'
