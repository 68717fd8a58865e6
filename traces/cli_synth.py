"""`replay trace generate | fit | compare`: synthetic traces from the command line.

Heavy work is imported inside the handlers so that building the `replay` parser stays cheap.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate a synthetic trace from a spec or a preset",
                       description="Generate a synthetic trace. The spec and seed are embedded in the "
                                   "Parquet metadata: `--spec T.parquet` re-creates T bit for bit.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", type=Path, help="spec file (YAML/JSON) or a generated .parquet trace")
    src.add_argument("--preset", type=_preset, help="chat, bursty, multi-model, long-context, multi-turn, diurnal, multi-lora, vision, agentic")
    g.add_argument("--start", type=_span, metavar="T",
                   help="with --spec: generate the window from T in the spec's own time (seconds, or 2d, 1d14h, 90m), "
                        "at that window's own rates, client mix and lengths")
    g.add_argument("--duration", type=_span, metavar="D",
                   help="seconds (or 1h, 2d); with --spec, a table profile is cut to [start, start + D) at its own rates "
                        "(no rescale to the whole profile's mean)")
    g.add_argument("--rate", type=float, help="total mean request rate in req/s (client shares kept; with --start/"
                                              "--duration: the window's total, its client mix and shape kept)")
    g.add_argument("--seed", type=int, help="random seed (overrides the spec's)")
    g.add_argument("--length-scale", type=float, help="multiply every sampled length (e.g. 0.1 for tiny engines)")
    g.add_argument("--max-input-tokens", type=int, help="cap prompt lengths")
    g.add_argument("--max-output-tokens", type=int, help="cap output lengths")
    g.add_argument("--dump-spec", action="store_true", help="print the resolved spec as YAML and exit")
    g.add_argument("-o", "--output", type=Path, help="output trace (.parquet, .csv or .jsonl)")
    g.set_defaults(func=_generate, inputs={"spec": "spec file not found"})

    f = sub.add_parser("fit", help="fit a generator spec to a trace",
                       description="Learn a generator spec (rate function, arrival process, lengths, "
                                   "model mix, sessions, prefixes) that reproduces the trace's statistics.")
    f.add_argument("trace", type=Path)
    f.add_argument("-o", "--output", type=Path, required=True, help="spec file to write (.yaml or .json)")
    f.add_argument("--window", type=float, help="seconds per rate/mix window (default: automatic)")
    f.set_defaults(func=_fit, inputs={"trace": "file not found"})

    c = sub.add_parser("compare", help="compare the realism statistics of two traces",
                       description="Realism metrics side by side with a verdict per metric; exits 1 "
                                   "when any metric is outside its tolerance, 2 on unreadable input.")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--html", type=Path, metavar="OUT", help="also write an HTML page (table and inter-arrival QQ plot)")
    c.set_defaults(func=_compare, inputs={"a": "file not found", "b": "file not found"})


def _preset(name: str) -> str:
    """Refused while parsing: the spec modules (numpy, pyarrow) load only for a preset that exists."""
    import difflib
    from .presets import PRESETS
    if name not in PRESETS:
        near = difflib.get_close_matches(name, PRESETS, 1)
        raise argparse.ArgumentTypeError(f"unknown preset {name!r}{f' (did you mean {near[0]}?)' if near else ''}; "
                                         f"presets: {', '.join(PRESETS)}")
    return name


_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}
_PART = r"(\d+(?:\.\d*)?|\.\d+)(d|h|min|m|s)"


def parse_span(text: str) -> float:
    """Seconds from `5400`, `90m`, `1h30m`, `2d` or `1d14h` (units d, h, m/min, s)."""
    s = str(text).strip().replace(" ", "")
    try:
        return float(s) if math.isfinite(float(s)) and float(s) >= 0 else math.nan
    except ValueError:
        pass
    if s and re.fullmatch(f"(?:{_PART})+", s):
        return sum(float(v) * _UNIT[u] for v, u in re.findall(_PART, s))
    return math.nan


def _span(text: str) -> float:
    s = parse_span(text)
    if not s >= 0:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (seconds, or with units d, h, m, s: 3600, 90m, 2d, 1d14h)")
    return s


def _resolve_spec(args: argparse.Namespace) -> dict:
    from .errors import TraceError
    from .presets import preset_spec, scale_rate
    from .spec import load_spec_file
    from .window import slice_spec
    if args.preset:
        if args.start is not None:
            raise TraceError("--start cuts a window of a --spec's own time; a preset starts at 0 (use --duration)")
        spec = preset_spec(args.preset, args.duration, args.rate)
    else:
        spec = load_spec_file(args.spec)
        if args.start is not None or args.duration is not None:
            spec = slice_spec(spec, args.start or 0.0, args.duration)
        if args.rate is not None:
            spec = scale_rate(spec, args.rate)
            spec.setdefault("exact_count", True)  # --rate is the rate a user gets: round(R x duration) rows
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
    at = f" from {args.start:g} s of the spec's time" if getattr(args, "start", None) else ""
    print(f"wrote {n} requests over {d:g} s{at} ({n / d:.4g} req/s{_span_rate(args.output, n / d)}, seed {seed}) "
          f"to {args.output}")
    return 0


def _span_rate(path: Path, rate: float) -> str:
    """`compare`'s mean rate of the written trace, (n - 1) / (last - first arrival), when it
    differs from rows / duration by over 1 % (bucketed timestamps, a few rows, several clients)."""
    import pyarrow.parquet as pq
    from .stats import mean_rate
    from .trace import Trace, is_text_path
    t = Trace.read(path).table if is_text_path(path) else pq.read_table(path, columns=["arrival_ns"])
    m = mean_rate(t)
    return f"; {m:.4g} req/s from the first to the last arrival" if m and abs(m / rate - 1) > 0.01 else ""


def _fit(args: argparse.Namespace) -> int:
    from .fit import fit_trace, write_spec
    from .fit_dists import COPY, SMALL
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
        why = c.get("why", "")
        if SMALL in why:
            print(f"replay: warning: client {c['name']!r}: {why.split(': ', 1)[1].split(', so')[0]}: {SMALL}, "
                  "the arrival model is fitted but not judged (why: in the spec)", file=sys.stderr)
        if COPY in why:
            print(f"replay: warning: client {c['name']!r}: its rate table is {COPY}, not a model of it; "
                  "the spec's why: names the modulated alternative and its error", file=sys.stderr)
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
