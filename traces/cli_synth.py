"""`replay trace generate | fit | compare`: synthetic traces from the command line.

Heavy work is imported inside the handlers so that building the `replay` parser stays cheap.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate a synthetic trace from a spec or a preset",
                       description="Generate a synthetic trace. The spec and seed are embedded in the "
                                   "Parquet metadata: `--spec T.parquet` re-creates T bit for bit.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", type=Path, help="spec file (YAML/JSON) or a generated .parquet trace")
    src.add_argument("--preset", help="chat, bursty, multi-model, long-context, multi-turn, diurnal, multi-lora, vision, agentic")
    g.add_argument("--duration", type=float, help="seconds (overrides the spec)")
    g.add_argument("--rate", type=float, help="total mean request rate in req/s (client shares kept)")
    g.add_argument("--seed", type=int, help="random seed (overrides the spec's)")
    g.add_argument("--length-scale", type=float, help="multiply every sampled length (e.g. 0.1 for tiny engines)")
    g.add_argument("--max-input-tokens", type=int, help="cap prompt lengths")
    g.add_argument("--max-output-tokens", type=int, help="cap output lengths")
    g.add_argument("--dump-spec", action="store_true", help="print the resolved spec as YAML and exit")
    g.add_argument("-o", "--output", type=Path, help="output trace (.parquet, .csv or .jsonl)")
    g.set_defaults(func=_generate)

    f = sub.add_parser("fit", help="fit a generator spec to a trace",
                       description="Learn a generator spec (rate function, arrival process, lengths, "
                                   "model mix, sessions, prefixes) that reproduces the trace's statistics.")
    f.add_argument("trace", type=Path)
    f.add_argument("-o", "--output", type=Path, required=True, help="spec file to write (.yaml or .json)")
    f.add_argument("--window", type=float, help="seconds per rate/mix window (default: automatic)")
    f.set_defaults(func=_fit)

    c = sub.add_parser("compare", help="compare the realism statistics of two traces",
                       description="Realism metrics side by side with a verdict per metric; exits 1 "
                                   "when any metric is outside its tolerance, 2 on unreadable input.")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--html", type=Path, metavar="OUT", help="also write an HTML page (table and inter-arrival QQ plot)")
    c.set_defaults(func=_compare)


def _resolve_spec(args: argparse.Namespace) -> dict:
    from .presets import preset_spec, scale_rate
    from .spec import load_spec_file
    if args.preset:
        spec = preset_spec(args.preset, args.duration, args.rate)
    else:
        spec = load_spec_file(args.spec)
        if args.duration is not None:
            spec["duration"] = args.duration
        if args.rate is not None:
            spec = scale_rate(spec, args.rate)
    for key in ("seed", "length_scale", "max_input_tokens", "max_output_tokens"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    return spec


def _generate(args: argparse.Namespace) -> int:
    from .generate import generate_to
    from .spec import parse_spec
    spec = _resolve_spec(args)
    if args.dump_spec:
        import yaml
        parse_spec(spec, file=str(args.spec) if args.spec else None)
        sys.stdout.write(yaml.safe_dump(spec, sort_keys=False))
        return 0
    if args.output is None:
        print("error: -o/--output is required (or use --dump-spec)", file=sys.stderr)
        return 2
    n, seed = generate_to(spec, args.output)
    d = spec["duration"]
    print(f"wrote {n} requests over {d:g} s ({n / d:.3g} req/s, seed {seed}) to {args.output}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from .fit import fit_trace, write_spec
    from .trace import Trace
    spec = fit_trace(Trace.read(args.trace), window=args.window)
    write_spec(spec, args.output)
    n = len(spec["clients"])
    print(f"fitted {n} client{'s' * (n != 1)} over {spec['duration']:g} s to {args.output}")
    for c in spec["clients"]:
        a = c["arrival"]
        detail = ", ".join(f"{k} {v:.3g}" for k, v in a.items() if isinstance(v, (int, float)))
        print(f"  {c['name']}: {c['rate']:.4g} req/s, {a['process']}{f' ({detail})' if detail else ''}, "
              f"profile {c.get('profile', {}).get('kind', 'constant')}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare_traces, format_table, render_html
    from .trace import Trace
    a, b = Trace.read(args.a), Trace.read(args.b)
    rows = compare_traces(a, b)
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(rows, a, b, str(args.a), str(args.b)))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows, str(args.a), str(args.b)))
    return 0 if all(r["verdict"] != "fail" for r in rows) else 1
