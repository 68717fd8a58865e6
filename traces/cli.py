"""`replay trace ...`: import, validate, export, describe, transform, generate, fit, compare.

Only light modules at module level: the parser is built for every `replay` invocation, so the
numpy/pyarrow-heavy modules are imported inside the command functions.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from .importers import FORMATS

IMPORT_FORMATS = (*FORMATS, "servegen")
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
    ("--prefix-reuse", "R", "rewrite hash_ids for a prefix-cache token hit ratio of R in [0, 1) (seeded by --seed)"),
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
    t.set_defaults(func=lambda args: t.print_help())
    tsub = t.add_subparsers(metavar="TRACE_COMMAND")

    def command(name, func, inputs, help, description=None):
        p = tsub.add_parser(name, help=help, description=description)
        p.set_defaults(func=_user_errors(func), inputs=inputs)
        return p

    p = command("import", cmd_import, {"src": "file not found"}, "import a public trace format into canonical Parquet",
                "Import a trace (streamed) into canonical Parquet; formats and columns: docs/traces.md, Trace formats.")
    p.add_argument("format", choices=IMPORT_FORMATS, metavar="FORMAT", help=", ".join(IMPORT_FORMATS))
    p.add_argument("src", help="source file (servegen: a directory; weka: a file or a directory of .json traces)")
    p.add_argument("-o", "--output", required=True, help="output .parquet (servegen: a spec .yaml)")
    p.add_argument("--sort", action="store_true", help="sort by arrival time (holds the trace in memory)")
    p.add_argument("--drop-failed", action="store_true", help="drop rows the source marks failed (default: flag them)")
    p.add_argument("--map", help="csv/jsonl: target=source[:unit],... e.g. arrival=ts:ms,input_tokens=prompt_len")
    p.add_argument("--dequantize", choices=("none", "uniform"), default="none",
                   help="mooncake/aibrix: spread the requests of a timestamp bucket evenly over it")
    p.add_argument("--quantum-ms", type=float, help="--dequantize's bucket width (default: detected)")
    p.add_argument("--tokenizer", help="sharegpt: a tokenizer.json for exact lengths (needs `tokenizers`)")
    p.add_argument("--rate", type=float, metavar="R", help="no arrival times in the source: synthesize R req/s")
    p.add_argument("--arrivals", metavar="SPEC", help="with --rate: poisson (default), gamma:CV or weibull:CV")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthesized arrivals (default 0)")
    p.add_argument("--limit", type=int, help="sharegpt, sglang-agentic: at most this many conversations; weka: traces")

    p = command("validate", cmd_validate, TRACE_IN, "check a trace against the schema and rules (exit 0 ok, 2 invalid)")
    p.add_argument("trace", help="trace file (.parquet, canonical .csv or .jsonl)")
    p.add_argument("--sort", action="store_true", help="accept unsorted arrivals (they are sorted on read)")

    p = command("export", cmd_export, TRACE_IN, "write a canonical trace in a source format (or canonical csv/jsonl)")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", choices=EXPORT_FORMATS, help="default: the format the trace was imported from")

    p = command("describe", cmd_describe, TRACE_IN, "rate, burstiness, lengths, model mix, prefix reuse, images")
    p.add_argument("trace")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--windows", default="1,10,60", help="index-of-dispersion windows in seconds (default 1,10,60)")

    p = command("transform", cmd_transform, TRACE_IN, "speed up, rescale, slice, sample, filter, remap, merge, clip",
                "Apply transforms in command-line order; each is recorded in the output's metadata (`transforms`).")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--sort", action="store_true", help="sort the input by arrival first")
    p.add_argument("--seed", type=int, default=0, help="seed for --sample and --prefix-reuse")
    p.add_argument("--block-size", type=int, metavar="N", help="--prefix-reuse's tokens per block (default: the "
                   "trace's, else 16)")
    for flag, metavar, text in TRANSFORMS:
        p.add_argument(flag, metavar=metavar, dest="ops", action=_Op, help=text)
    p.set_defaults(ops=[])

    p = command("generate", cmd_generate, {"spec": "spec file not found"}, "generate a trace from a spec or a preset",
                "Generate a synthetic trace; it embeds spec and seed: `--spec T.parquet` re-creates T bit for bit.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", type=Path, help="spec file (YAML/JSON) or a generated .parquet trace")
    src.add_argument("--preset", type=_preset, help="chat, bursty, multi-model, long-context, multi-turn, diurnal, "
                     "multi-lora, vision, agentic")
    p.add_argument("--start", type=_span, metavar="T", help="with --spec: start at T of the spec's time (90m, 1d14h)")
    p.add_argument("--duration", type=_span, metavar="D", help="seconds (or 1h, 2d)")
    p.add_argument("--rate", type=float, help="total mean request rate in req/s (client shares kept)")
    p.add_argument("--seed", type=int, help="random seed (overrides the spec's)")
    p.add_argument("--length-scale", type=float, help="multiply every sampled length (e.g. 0.1 for tiny engines)")
    p.add_argument("--max-input-tokens", type=int, help="cap prompt lengths")
    p.add_argument("--max-output-tokens", type=int, help="cap output lengths")
    p.add_argument("--dump-spec", action="store_true", help="print the resolved spec as YAML and exit")
    p.add_argument("-o", "--output", type=Path, help="output trace (.parquet, .csv or .jsonl)")

    p = command("fit", cmd_fit, TRACE_IN, "fit a generator spec to a trace", "Learn a generator spec (rates, "
                "arrivals, lengths, model mix, sessions, prefixes) that reproduces the trace's statistics.")
    p.add_argument("trace", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True, help="spec file to write (.yaml or .json)")
    p.add_argument("--window", type=float, help="seconds per rate/mix window (default: automatic)")

    p = command("compare", cmd_compare, {"a": "file not found", "b": "file not found"}, "compare two traces' realism",
                "Realism metrics side by side with verdicts; exit 1 if any is out of tolerance, 2 on unreadable input.")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--html", type=Path, metavar="OUT", help="also write an HTML page (table and inter-arrival QQ plot)")


def cmd_import(args: argparse.Namespace) -> int:
    if args.format == "servegen":
        from .importers.common import reject_arrival_options
        from .servegen import import_servegen
        reject_arrival_options(args, "servegen imports as a generator spec",
                               "give the rate to `replay trace generate --spec SPEC --rate R`")
        import_servegen(Path(args.src), Path(args.output))
        print(f"wrote {args.output}")
        return 0
    from .importers import import_trace
    from .transform import dequantize_message
    meta = import_trace(args.format, args.src, args.output, args)
    rows = meta["rows"]
    dropped = f", dropped {rows['dropped_failed']} failed" if rows["dropped_failed"] else ""
    print(f"wrote {args.output}: {rows['written']} requests from {rows['source']} source rows{dropped}")
    for op in meta.get("transforms", []):
        if op.get("op") == "dequantize":
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
    from .trace import Trace, is_text_path
    trace, out = Trace.read(args.trace), Path(args.output)
    fmt = args.format or trace.metadata.get("source", {}).get("format")
    if fmt not in EXPORT_FORMATS:
        raise TraceError(f"cannot export to {fmt!r}: give --format, one of {', '.join(EXPORT_FORMATS)}")
    if fmt in ("csv", "jsonl"):
        out = out if is_text_path(out) else out.with_suffix("." + fmt)
        trace.write(out)
    else:
        module(fmt).export(trace, out)
    print(f"wrote {out} ({fmt}, {trace.num_rows} requests)")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from .describe import describe_file
    try:
        windows = tuple(float(w) for w in args.windows.split(","))
        if not all(0 < w < math.inf for w in windows):
            raise ValueError
    except ValueError:
        from .errors import TraceError
        raise TraceError(f"--windows must be comma-separated seconds > 0, got {args.windows!r}") from None
    sys.stdout.write(describe_file(args.trace, as_json=args.json, windows_s=windows))
    return 0


def cmd_transform(args: argparse.Namespace) -> int:
    from .trace import Trace
    from .transform import apply, dequantize_message
    trace = Trace.read(args.trace, sort=args.sort)
    for op, value in args.ops:  # (set_defaults: [] without a transform)
        trace = apply(trace, op, value, args.seed, args.block_size)
        if op == "dequantize":
            print(dequantize_message(trace.metadata["transforms"][-1]))
    trace.write(args.output)
    print(f"wrote {args.output}: {trace.num_rows} requests over {trace.duration_s:.3f} s "
          f"({len(args.ops)} transform(s))")
    return 0


def _preset(name: str) -> str:
    """Refused while parsing: the spec modules (numpy, pyarrow) load only for a preset that exists."""
    import difflib
    from .presets import PRESETS
    if name not in PRESETS:
        near = "".join(f" (did you mean {n}?)" for n in difflib.get_close_matches(name, PRESETS, 1))
        raise argparse.ArgumentTypeError(f"unknown preset {name!r}{near}; presets: {', '.join(PRESETS)}")
    return name


_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}
_PART = r"(\d+(?:\.\d*)?|\.\d+)(d|h|min|m|s)"


def parse_span(text: str) -> float:
    """Seconds from `5400`, `90m`, `1h30m`, `2d` or `1d14h` (units d, h, m/min, s); NaN if none."""
    s = str(text).strip().replace(" ", "")
    try:
        v = float(s)
    except ValueError:
        v = sum(float(x) * _UNIT[u] for x, u in re.findall(_PART, s)) if re.fullmatch(f"(?:{_PART})+", s) else math.nan
    return v if 0 <= v < math.inf else math.nan


def _span(text: str) -> float:
    if math.isnan(s := parse_span(text)):
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (seconds, or with units d, h, m, s: 90m, 2d, 1d14h)")
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
    if args.output is None and not args.dump_spec:
        raise TraceError("-o/--output is required (or use --dump-spec)")
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
    n, seed = generate_to(spec, args.output)
    d = spec["duration"]
    at = f" from {args.start:g} s of the spec's time" if args.start else ""
    print(f"wrote {n} requests over {d:g} s{at} ({n / d:.4g} req/s{_span_rate(args.output, n / d)}, seed {seed}) "
          f"to {args.output}")
    return 0


def _span_rate(path: Path, rate: float) -> str:
    """`compare`'s mean rate of the written trace, (n - 1) / (last - first arrival), when it
    differs from rows / duration by over 1 % (bucketed timestamps, a few rows, several clients)."""
    import pyarrow.parquet as pq
    from .stats import mean_rate
    from .trace import Trace, is_text_path
    m = mean_rate(Trace.read(path).table if is_text_path(path) else pq.read_table(path, columns=["arrival_ns"]))
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
        a, why, warn = c["arrival"], c.get("why", ""), f"replay: warning: client {c['name']!r}:"
        detail = ", ".join(f"{k} {v:.3g}" for k, v in a.items() if isinstance(v, (int, float)))
        print(f"  {c['name']}: {c['rate']:.4g} req/s, {a['process']}{f' ({detail})' if detail else ''}, "
              f"profile {c.get('profile', {}).get('kind', 'constant')}")
        if SMALL in why:
            print(f"{warn} {why.split(': ', 1)[1].split(', so')[0]}: {SMALL}, the arrival model is fitted "
                  "but not judged (why: in the spec)", file=sys.stderr)
        if COPY in why:
            print(f"{warn} its rate table is {COPY}, not a model of it; the spec's why: names the modulated "
                  "alternative and its error", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare_traces, format_table, render_html
    from .trace import Trace
    a, b = Trace.read(args.a), Trace.read(args.b)
    rows = compare_traces(a, b)
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(rows, a, b, str(args.a), str(args.b)))
    print(json.dumps(rows, indent=2) if args.json else format_table(rows, str(args.a), str(args.b)))
    return 0 if all(r["verdict"] != "fail" for r in rows) else 1
