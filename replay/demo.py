"""`replay demo`: the whole loop on one machine, in about a minute.

Starts engine-stub on a free port, generates a short bursty multi-model trace, replays it
open-loop (scraping the engine's metrics), writes the report with goodput under a demo SLO,
prints where it is and the headline numbers, and stops the engine.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# What "good" means for the demo's tiny CPU engine; --slo FILE replaces it.
DEMO_SLO = {"per_request": {"ttft_ms": 1000, "tpot_ms": 100},
            "objectives": ["ttft_ms.p90 <= 1000", "tpot_ms.p90 <= 100", "attainment >= 0.8", "error_rate <= 0.1"]}


# engine-stub presets behind the multi-model preset's labels
DEMO_PRESETS = {"small": "micro", "medium": "tiny", "large": "tiny-wide"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="engine-stub + synthetic trace + replay + report, end to end", description=(
        "Start the bundled engine, generate a short bursty multi-model trace, replay it and write the report."))
    p.add_argument("--preset", default="multi-model", help="trace preset (default: multi-model)")
    p.add_argument("--duration", type=float, default=45.0, help="trace seconds (default: 45)")
    p.add_argument("--rate", type=float, default=3.0, help="mean requests/s (default: 3)")
    p.add_argument("--length-scale", type=float, default=0.5, help="scale the preset's lengths (default: 0.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default=None, help="run directory (default: runs/demo-<time>)")
    p.add_argument("--slo", default=None, help="SLO file (default: a demo SLO for the tiny engine)")
    p.add_argument("--engine-arg", action="append", default=[], help="extra argument for engine-stub serve (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from llm_replay import reports
    from llm_replay.traces.generate import generate
    from llm_replay.traces.presets import preset_spec

    from .orchestrate import replay_run, start_engine
    from .preflight import RunError

    run_dir = Path(args.output or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunError(f"{run_dir} is not empty; choose another -o")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    slo_path = Path(args.slo) if args.slo else run_dir.parent / f"{run_dir.name}-slo.yaml"
    if not args.slo:
        slo_path.write_text(yaml.safe_dump(DEMO_SLO, sort_keys=False))
    slo = reports.load_slo(slo_path)
    spec = preset_spec(args.preset, duration=args.duration, rate=args.rate, length_scale=args.length_scale,
                       max_input_tokens=1536, max_output_tokens=384, seed=args.seed)
    trace = generate(spec, seed=args.seed)
    trace_path = run_dir.parent / f"{run_dir.name}-trace.parquet"
    trace.write(trace_path)
    print(f"trace: {trace_path} ({trace.num_rows} requests over {trace.duration_s:.0f} s, "
          f"preset {args.preset!r}, seed {args.seed})")
    print("starting engine-stub ...", flush=True)
    models = sorted(set(trace.table.column("model").to_pylist())) if "model" in trace.table.column_names else []
    # one engine core per trace model (stepped round-robin, as a multi-model server would)
    engine_args = args.engine_arg or [a for m in models for a in ("--model", f"{m}={DEMO_PRESETS.get(m, 'tiny')}")]
    with start_engine(*engine_args) as engine:
        cpus = _split_cpus(engine)
        print(f"engine-stub: {engine.url} serving {', '.join(models) or 'tiny'}"
              + (f" (engine on CPU {max(cpus[1])}, the replay on {', '.join(map(str, sorted(cpus[0])))})"
                 if cpus else ""), flush=True)
        extra = ["--scrape", f"{engine.url}/metrics", "--slo", str(slo_path)]
        if not args.engine_arg:
            extra += [a for m in models for a in ("--model-map", f"{m}={m}")]
        outcome = replay_run(trace_path, engine.url, run_dir, echo=True, extra=extra, cpus=cpus[0] if cpus else None)
    if not (run_dir / "records.parquet").exists():
        print(f"replay run failed (exit {outcome.returncode})")
        return outcome.returncode or 1
    gate = reports.evaluate_slo(run_dir, slo)
    h = reports.headline(reports.summarize_run(run_dir, slo=slo, write=False))
    print(f"\nheadline: {h['requests']} requests, {h['ok']} ok; TTFT p50/p99 {_ms(h['ttft_ms_p50'])}/"
          f"{_ms(h['ttft_ms_p99'])} ms; TPOT p50/p99 {_ms(h['tpot_ms_p50'])}/{_ms(h['tpot_ms_p99'])} ms; "
          f"goodput {h['goodput_rps']:.3g} req/s; attainment {h['attainment']:.1%}; "
          f"SLO gate: {('pass', 'FAIL', 'undecided or cannot evaluate')[gate.exit_code]}")
    print(f"report: {run_dir / 'report.html'}\nnext: replay gate {run_dir} --slo {slo_path}")
    return 0


def _split_cpus(engine) -> tuple[set[int], set[int]] | None:
    """(client CPUs, engine CPUs): the engine on the last CPU, the replay on the others. The
    engine computes in bursts that take a whole core; sharing cores with it, the replay's sends
    wait behind them (measured at 3 req/s on 2 cores: dispatch lag p99 24 ms, the report's
    first line a bottleneck warning). None on one CPU or without CPU affinity."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(mine) < 2 or not engine.pin({mine[-1]}):
        return None
    return set(mine[:-1]), {mine[-1]}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
