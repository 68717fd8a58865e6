"""`replay trace ...`: import, validate, export, describe, transform, generate, fit, compare.

Only argparse at module level: the parser is built for every `replay` invocation, so the
numpy/pyarrow-heavy modules are imported inside the command functions.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

IMPORT_FORMATS = ("azure", "burstgpt", "mooncake", "qwen-bailian", "servegen", "vidur", "sharegpt",
                  "aibrix", "csv", "jsonl", "weka", "sglang-agentic")
EXPORT_FORMATS = ("azure", "burstgpt", "mooncake", "qwen-bailian", "vidur", "aibrix", "csv", "jsonl")
# checked by `replay` before a command runs (replay/cli.py check_inputs)
TRACE_IN = {"trace": "file not found"}

TRANSFORMS = (
    ("--speed", "X", "replay X times faster (arrival / X)"),
    ("--rate", "R", "rescale time to a mean rate of R req/s"),
    ("--slice", "A:B", "keep arrivals in [A, B) seconds; A becomes the new origin"),
    ("--head", "N", "keep the first N requests"),
    ("--sample", "P", "keep each request with probability P (seeded by --seed)"),
    ("--model", "M1,M2", "keep only these models"),
    ("--client-id", "C1,C2", "keep only these clients"),
    ("--map-model", "A=B,...", "rename model labels"),
    ("--merge", "OTHER", "superpose another trace (both from their origins)"),
    ("--shift", "S", "add S seconds to every arrival"),
    ("--clip-input", "MIN:MAX", "clamp input_tokens (either side may be empty)"),
    ("--clip-output", "MIN:MAX", "clamp output_tokens"),
    ("--dequantize", "MS", "spread requests sharing a timestamp over a bucket of MS ms ('' = detect)"),
)


def _user_errors(func):
    """File-system failures (permissions, a directory where a file is expected) are the user's
    to fix: report them like TraceError (exit 2), not as a traceback. A reader that left
    (`| head`) is not a failure: `replay` ends quietly on it."""
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except BrokenPipeError:
            raise
        except OSError as e:
            from .errors import TraceError
            raise TraceError(f"{e.strerror or e}", file=e.filename) from None
    return run


class _Op(argparse.Action):
    """Collect transform options in command-line order: they are applied in that order."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.ops = [*(namespace.ops or []), (option_string.lstrip("-").replace("-", "_"), values)]


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("trace", help="create, import, inspect and transform traces",
                       description="Create, import, inspect and transform request traces.")
    t.set_defaults(func=lambda args: (t.print_help(), 0 if args.trace_command is None else 2)[1])
    tsub = t.add_subparsers(dest="trace_command", metavar="TRACE_COMMAND")

    def command(name, func, inputs, **kw):
        p = tsub.add_parser(name, **kw)
        p.set_defaults(func=_user_errors(func), inputs=inputs)
        return p

    p = command("import", cmd_import, {"src": "file not found"},
                help="import a public trace format into a canonical Parquet trace",
                description="Import a trace file (streamed, bounded memory) into canonical Parquet. "
                            "Formats and their columns: docs/traces.md, section Trace formats.")
    p.add_argument("format", choices=IMPORT_FORMATS, metavar="FORMAT", help=", ".join(IMPORT_FORMATS))
    p.add_argument("src", help="source file (servegen: a directory; weka: also a directory of .json traces)")
    p.add_argument("-o", "--output", required=True, help="output .parquet (servegen: a spec .yaml)")
    p.add_argument("--sort", action="store_true", help="sort by arrival time (holds the trace in memory)")
    p.add_argument("--drop-failed", action="store_true",
                   help="drop rows the source marks failed (BurstGPT: 0 response tokens); default: keep and flag")
    p.add_argument("--map", help="csv/jsonl: target=source[:unit],... e.g. arrival=ts:ms,input_tokens=prompt_len")
    p.add_argument("--dequantize", choices=("none", "uniform"), default="none",
                   help="mooncake/aibrix: spread requests that share a bucketed timestamp uniformly over the bucket")
    p.add_argument("--quantum-ms", type=float,
                   help="bucket width for --dequantize (default: detected buckets, else the timestamp resolution)")
    p.add_argument("--tokenizer", help="sharegpt: a tokenizer.json (needs the `tokenizers` package) for exact lengths")
    p.add_argument("--rate", type=float, metavar="R",
                   help="sources without arrival times: synthesize arrivals at R req/s (docs/traces.md)")
    p.add_argument("--arrivals", metavar="SPEC",
                   help="with --rate: the synthesized process, poisson (default), gamma:CV or weibull:CV")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthesized arrivals (default 0)")
    p.add_argument("--limit", type=int, help="sharegpt, sglang-agentic: at most this many conversations; weka: traces")

    p = command("validate", cmd_validate, TRACE_IN,
                help="check a trace file against the schema and rules (exit 0 ok, 2 invalid)")
    p.add_argument("trace", help="trace file (.parquet, canonical .csv or .jsonl)")
    p.add_argument("--sort", action="store_true", help="accept unsorted arrivals (they are sorted on read)")

    p = command("export", cmd_export, TRACE_IN,
                help="write a canonical trace in a source format (or canonical csv/jsonl)")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", choices=EXPORT_FORMATS, help="default: the format the trace was imported from")

    p = command("describe", cmd_describe, TRACE_IN,
                help="statistics of a trace: rate, burstiness, lengths, model mix, prefix reuse, images")
    p.add_argument("trace")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--windows", default="1,10,60", help="index-of-dispersion windows in seconds (default 1,10,60)")

    p = command("transform", cmd_transform, TRACE_IN,
                help="speed up, rescale, slice, sample, filter, remap, merge, clip a trace",
                description="Apply transforms in the order given on the command line; "
                            "each is recorded in the output's metadata (`transforms`).")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--sort", action="store_true", help="sort the input by arrival first")
    p.add_argument("--seed", type=int, default=0, help="seed for --sample")
    for flag, metavar, text in TRANSFORMS:
        p.add_argument(flag, metavar=metavar, dest="ops", action=_Op, help=text)
    p.set_defaults(ops=[])

    p = command("generate", cmd_generate, {"spec": "spec file not found"},
                help="generate a synthetic trace from a spec or a preset",
                description="Generate a synthetic trace. The spec and seed are embedded in the "
                            "Parquet metadata: `--spec T.parquet` re-creates T bit for bit.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", type=Path, help="spec file (YAML/JSON) or a generated .parquet trace")
    src.add_argument("--preset", type=_preset, help="chat, bursty, multi-model, long-context, multi-turn, diurnal, multi-lora, vision, agentic")
    p.add_argument("--start", type=_span, metavar="T",
                   help="with --spec: generate the window from T in the spec's own time (seconds, or 2d, 1d14h, 90m)")
    p.add_argument("--duration", type=_span, metavar="D", help="seconds (or 1h, 2d)")
    p.add_argument("--rate", type=float, help="total mean request rate in req/s (client shares kept)")
    p.add_argument("--seed", type=int, help="random seed (overrides the spec's)")
    p.add_argument("--length-scale", type=float, help="multiply every sampled length (e.g. 0.1 for tiny engines)")
    p.add_argument("--max-input-tokens", type=int, help="cap prompt lengths")
    p.add_argument("--max-output-tokens", type=int, help="cap output lengths")
    p.add_argument("--dump-spec", action="store_true", help="print the resolved spec as YAML and exit")
    p.add_argument("-o", "--output", type=Path, help="output trace (.parquet, .csv or .jsonl)")

    p = command("fit", cmd_fit, TRACE_IN, help="fit a generator spec to a trace",
                description="Learn a generator spec (rate function, arrival process, lengths, "
                            "model mix, sessions, prefixes) that reproduces the trace's statistics.")
    p.add_argument("trace", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True, help="spec file to write (.yaml or .json)")
    p.add_argument("--window", type=float, help="seconds per rate/mix window (default: automatic)")

    p = command("compare", cmd_compare, {"a": "file not found", "b": "file not found"},
                help="compare the realism statistics of two traces",
                description="Realism metrics side by side with a verdict per metric; exits 1 "
                            "when any metric is outside its tolerance, 2 on unreadable input.")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--html", type=Path, metavar="OUT", help="also write an HTML page (table and inter-arrival QQ plot)")


def cmd_import(args: argparse.Namespace) -> int:
    if args.format == "servegen":
        from .importers.common import reject_arrival_options
        reject_arrival_options(args, "servegen imports as a generator spec",
                               "give the rate to `replay trace generate --spec SPEC --rate R`")
        from .servegen import import_servegen
        import_servegen(Path(args.src), Path(args.output))
        print(f"wrote {args.output}")
        return 0
    from .importers import import_trace
    meta = import_trace(args.format, args.src, args.output, args)
    rows = meta["rows"]
    dropped = f", dropped {rows['dropped_failed']} failed" if rows["dropped_failed"] else ""
    print(f"wrote {args.output}: {rows['written']} requests from {rows['source']} source rows{dropped}")
    for op in meta.get("transforms", []):
        if op.get("op") == "dequantize":
            from .transform import dequantize_message
            print(dequantize_message(op))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .validate import timing_warnings, validate_file
    v = validate_file(args.trace, sort=args.sort)
    print(f"ok: {args.trace}: {v['rows']} requests over {v['duration_s']:.3f} s; columns: {', '.join(v['columns'])}")
    for w in timing_warnings(args.trace):
        print(f"replay: warning: {w}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .errors import TraceError
    from .importers import module
    from .trace import Trace
    trace = Trace.read(args.trace)
    fmt = args.format or trace.metadata.get("source", {}).get("format")
    if fmt in ("csv", "jsonl"):
        out = Path(args.output)
        if out.suffix.lower() not in (".csv", ".jsonl", ".ndjson"):
            out = out.with_suffix("." + fmt)
        trace.write(out)
    elif fmt not in EXPORT_FORMATS:
        raise TraceError(f"cannot export to {fmt!r}: give --format, one of {', '.join(EXPORT_FORMATS)}")
    else:
        out = Path(args.output)
        module(fmt).export(trace, out)
    print(f"wrote {out} ({fmt}, {trace.num_rows} requests)")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from .describe import describe_file
    try:
        windows = tuple(float(w) for w in args.windows.split(","))
        if not all(0 < w < float("inf") for w in windows):
            raise ValueError
    except ValueError:
        from .errors import TraceError
        raise TraceError(f"--windows must be comma-separated seconds > 0, got {args.windows!r}") from None
    sys.stdout.write(describe_file(args.trace, as_json=args.json, windows_s=windows))
    return 0


def cmd_transform(args: argparse.Namespace) -> int:
    from .transform import run_cli
    return run_cli(args)



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


def cmd_generate(args: argparse.Namespace) -> int:
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


def cmd_fit(args: argparse.Namespace) -> int:
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


def cmd_compare(args: argparse.Namespace) -> int:
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
