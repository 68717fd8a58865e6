"""`replay demo`: the whole loop on one machine, in about a minute.

Starts engine-stub on a free port, generates a short bursty multi-model trace, replays it
open-loop, writes the report, prints where it is and the headline numbers, stops the engine.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="engine-stub + synthetic trace + replay + report, end to end",
                       description="Start the bundled engine, generate a short bursty multi-model "
                                   "trace, replay it and write the report.")
    p.add_argument("--preset", default="multi-model", help="trace preset (default: multi-model)")
    p.add_argument("--duration", type=float, default=45.0, help="trace seconds (default: 45)")
    p.add_argument("--rate", type=float, default=2.0, help="mean requests/s (default: 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default=None, help="run directory (default: runs/demo-<time>)")
    p.add_argument("--slo", default=None, help="also gate the run on this SLO file")
    p.add_argument("--engine-arg", action="append", default=[],
                   help="extra argument for engine-stub serve (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traces.generate import generate
    from traces.presets import preset_spec
    import reports

    from .local_engine import start_engine
    from .runproc import replay_run

    run_dir = Path(args.output or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    spec = preset_spec(args.preset, duration=args.duration, rate=args.rate)
    trace = generate(spec, seed=args.seed)
    trace_path = run_dir.parent / f"{run_dir.name}-trace.parquet"
    trace.write(trace_path)
    print(f"trace: {trace_path} ({trace.num_rows} requests over {trace.duration_s:.0f} s, "
          f"preset {args.preset!r}, seed {args.seed})")

    print("starting engine-stub ...", flush=True)
    with start_engine(*args.engine_arg) as engine:
        print(f"engine-stub: {engine.url}", flush=True)
        outcome = replay_run(trace_path, engine.url, run_dir, echo=True)
    if outcome.returncode not in (0, 1):
        print(f"replay run failed (exit {outcome.returncode})")
        return outcome.returncode
    summary = reports.summarize_run(run_dir)
    print(reports.format_summary(summary))
    code = 0
    if args.slo:
        result = reports.evaluate_slo(run_dir, reports.load_slo(args.slo))
        print(result.table())
        code = result.exit_code
    print(f"\nrun directory: {run_dir}\nreport: {run_dir / 'report.html'}")
    return code
