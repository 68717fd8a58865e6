"""`replay trace import | validate | export | describe | transform`.

Only argparse at module level: the parser is built for every `replay` invocation, so the
pyarrow-heavy modules are imported inside the command functions.
"""
from __future__ import annotations

import argparse
import sys

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
    to fix: report them like TraceError (exit 2), not as a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except OSError as e:
            from .errors import TraceError
            raise TraceError(f"{e.strerror or e}", file=e.filename) from None
    run.__name__ = func.__name__
    return run


class _Op(argparse.Action):
    """Collect transform options in command-line order: they are applied in that order."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.ops = [*(namespace.ops or []), (option_string.lstrip("-").replace("-", "_"), values)]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import a public trace format into a canonical Parquet trace",
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
                   help="sources without times (sharegpt; vidur/csv/jsonl lengths-only files): synthesize arrivals "
                        "at R req/s (sharegpt default 1; sglang-agentic, weka: conversation or trace starts, default all at 0); "
                        "refused where the file has arrival times")
    p.add_argument("--arrivals", metavar="SPEC",
                   help="with --rate: the synthesized process, poisson (default), gamma:CV or weibull:CV")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthesized arrivals (default 0)")
    p.add_argument("--limit", type=int, help="sharegpt, sglang-agentic: at most this many conversations; weka: traces")
    p.set_defaults(func=_user_errors(cmd_import), inputs={"src": "file not found"})

    p = sub.add_parser("validate", help="check a trace file against the schema and rules (exit 0 ok, 2 invalid)")
    p.add_argument("trace", help="trace file (.parquet, canonical .csv or .jsonl)")
    p.add_argument("--sort", action="store_true", help="accept unsorted arrivals (they are sorted on read)")
    p.set_defaults(func=_user_errors(cmd_validate), inputs=TRACE_IN)

    p = sub.add_parser("export", help="write a canonical trace in a source format (or canonical csv/jsonl)")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", choices=EXPORT_FORMATS, help="default: the format the trace was imported from")
    p.set_defaults(func=_user_errors(cmd_export), inputs=TRACE_IN)

    p = sub.add_parser("describe", help="statistics of a trace: rate, burstiness, lengths, model mix, prefix reuse, images")
    p.add_argument("trace")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--windows", default="1,10,60", help="index-of-dispersion windows in seconds (default 1,10,60)")
    p.set_defaults(func=_user_errors(cmd_describe), inputs=TRACE_IN)

    p = sub.add_parser("transform", help="speed up, rescale, slice, sample, filter, remap, merge, clip a trace",
                       description="Apply transforms in the order given on the command line; "
                                   "each is recorded in the output's metadata (`transforms`).")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--sort", action="store_true", help="sort the input by arrival first")
    p.add_argument("--seed", type=int, default=0, help="seed for --sample")
    for flag, metavar, text in TRANSFORMS:
        p.add_argument(flag, metavar=metavar, dest="ops", action=_Op, help=text)
    p.set_defaults(func=_user_errors(cmd_transform), ops=[], inputs=TRACE_IN)


def cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path
    from .errors import TraceError
    if args.format == "servegen":
        from .importers.common import reject_arrival_options
        reject_arrival_options(args, "servegen imports as a generator spec",
                               "give the rate to `replay trace generate --spec SPEC --rate R`")
        try:
            from .servegen import import_servegen
        except ModuleNotFoundError as e:
            if e.name != "llm_replay.traces.servegen":
                raise
            raise TraceError("the servegen importer (traces.servegen) is not available in this build") from None
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
    from pathlib import Path
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
