"""`replay report | gate | compare | import-results`: argument parsing only at import time; the
analysis modules (pyarrow, numpy, scipy, rich, jinja2) load when a command runs."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from .errors import ReportError

NO_RUN = "no such file or run directory"


def _window_args(p: argparse.ArgumentParser) -> None:
    """Options every analysing command shares: the measured window and --json."""
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    for option, end in (("--warmup", "start"), ("--cooldown", "end")):
        p.add_argument(option, metavar="SPEC", help=f"exclude the run's {end}: '30s' (seconds) or '200' (requests)")
    p.add_argument("--steady-state", type=float, metavar="FRAC",
                   help="measure only the longest span with in-flight concurrency >= FRAC x peak")


def tenant_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant-column", metavar="NAME",
                   help="records column naming each request's tenant (default: client_id when it names several, "
                        "else slo_class)")


def confidence_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--confidence", type=float, metavar="C",
                   help="each verdict's confidence, 0.5 to below 1 (default: the SLO spec's, else 0.95)")


def _window(args) -> dict:
    return {"warmup": args.warmup, "cooldown": args.cooldown, "steady_state": args.steady_state}


def _show(result, as_json: bool) -> int:
    """Print a GateResult / CompareResult as its table or as JSON; return its exit code."""
    print(json.dumps(result.to_dict(), indent=1) if as_json else result.table().rstrip("\n"))
    return result.exit_code


def _report_suffix(args) -> str:
    """The output-name suffix of a report whose options change the run's own summary, e.g.
    `warmup-30s.slo-prod` (summary.warmup-30s.slo-prod.json); '' when no option does."""
    parts = (("warmup", args.warmup), ("cooldown", args.cooldown), ("steady-state", args.steady_state),
             ("slo", args.slo and Path(args.slo).stem), ("confidence", args.confidence), ("window", args.window_s),
             ("tenant", args.tenant_column))
    return ".".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{name}-{value:g}" if isinstance(value, float)
                           else f"{name}-{value}") for name, value in parts if value is not None)


def cmd_report(args) -> int:
    from . import format_summary, summarize_run
    suffix = "" if args.force or args.no_write else _report_suffix(args)
    out = Path(args.run) if Path(args.run).is_dir() else Path(args.run).parent
    if getattr(args, "spans", None):
        from .spans import import_spans
        got = import_spans(out, args.spans)
        print(f"spans: {got['request_spans']:,} request spans ({got['other_spans']:,} others skipped) from "
              f"{args.spans} -> {out / 'spans.parquet'}", file=sys.stderr)
    if suffix and not any((out / f).exists() for f in ("summary.json", "summary.md", "report.html")):
        suffix = ""   # nothing of the run's own to keep
    slo = args.slo
    if args.confidence is not None:   # the spec given, else the run's own (replay run --slo)
        from .slo import check_confidence, load_slo
        slo = load_slo(args.slo or out / "slo.json")
        slo.confidence = check_confidence(args.confidence)
    summary = summarize_run(args.run, slo=slo, window_s=args.window_s, write=not args.no_write,
                            suffix=suffix, tenant_column=args.tenant_column, **_window(args))
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary), end="\n" if args.json else "")
    log = sys.stderr if args.json else sys.stdout
    for path in summary.get("files", {}).values():
        print(f"wrote {path}", file=log)
    if suffix:
        print("(the run's own summary.json and report.html are kept; --force writes over them)", file=log)
    return 0


def cmd_gate(args) -> int:
    from . import evaluate_slo
    return _show(evaluate_slo(args.run, args.slo, as_measured=args.as_measured, confidence=args.confidence,
                              whole_run=args.whole_run, tenant_column=args.tenant_column, **_window(args)), args.json)


def _amount(text: str, option: str, unit: str) -> float:
    """'5%' or '5' -> 0.05 (unit '%'); '0.5pt' or '0.5' -> 0.005 (unit 'pt'): a margin >= 0."""
    try:
        value = float(text.strip().removesuffix(unit))
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise ReportError(f"{option}: expected a number >= 0 like 5{unit}, got {text!r}")
    return value / 100


def cmd_compare(args) -> int:
    if args.not_worse_by is not None:
        return _non_inferiority(args)
    stray = [o for o, v in (("--metrics", args.metrics), ("--error-margin", args.error_margin),
                            ("--confidence", args.confidence)) if v is not None]
    if stray:
        raise ReportError(f"{stray[0]} needs --not-worse-by PCT")
    from . import compare_runs
    result = compare_runs(args.base, args.cand, fail_on_regression_pct=args.fail_on_regression,
                          min_effect_pct=args.min_effect, slo=args.slo, html=args.html, **_window(args))
    if args.html:
        print(f"wrote {args.html}", file=sys.stderr)
    return _show(result, args.json)


def _non_inferiority(args) -> int:
    from .compare import NI_METRICS, non_inferiority_runs
    from .slo import check_confidence, load_slo
    for option, value in (("--fail-on-regression", args.fail_on_regression), ("--html", args.html)):
        if value is not None:
            raise ReportError(f"{option} does not go with --not-worse-by: the non-inferiority test has its own verdict")
    margin = _amount(args.not_worse_by, "--not-worse-by", "%")
    error_margin = _amount(args.error_margin or "1", "--error-margin", "pt")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else NI_METRICS
    conf = args.confidence if args.confidence is not None else load_slo(args.slo).confidence if args.slo else 0.95
    result = non_inferiority_runs(args.base, args.cand, margin, error_margin=error_margin, metrics=metrics,
                                  conf=check_confidence(conf), slo=args.slo, **_window(args))
    return _show(result, args.json)


def cmd_import(args) -> int:
    from .importers import import_results
    info = import_results(args.format, args.src, args.output, model=args.model)
    print(f"imported {info['rows']:,} requests from {args.src} ({args.format}) into {args.output}")
    if info["missing"]:
        print(f"missing in the source (left null): {', '.join(info['missing'])}")
    for note in info["notes"]:
        print(f"note: {note}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    # One line of help per option; docs/reports.md and docs/verdicts.md hold the detail.
    p = sub.add_parser("report", help="summarise a run: terminal table, summary.json, summary.md, report.html",
                       description="Summarise a run (docs/reports.md): summary.json, summary.md, report.html.")
    p.add_argument("run", help="run directory (with records.parquet) or a records file")
    p.add_argument("--slo", help="SLO spec (YAML/TOML/pyproject.toml): goodput thresholds and gated objectives")
    confidence_arg(p)
    p.add_argument("--window-s", type=float, help="time-series window length (default: about 100 windows)")
    p.add_argument("--no-write", action="store_true", help="print only; write no files")
    p.add_argument("--spans", metavar="FILE", help="a collector's OTLP/JSON span file to join by trace id")
    p.add_argument("--force", action="store_true", help="with window or SLO options, write over the run's own files")
    tenant_arg(p)
    _window_args(p)
    p.set_defaults(func=cmd_report, inputs={"run": NO_RUN})

    p = sub.add_parser("gate", help="check a run against an SLO spec (exit 0 pass, 1 fail, 2 undecided)",
                       description="Judge every objective of an SLO spec on a run at a confidence (docs/verdicts.md). "
                                   "Exit 0: all hold; 1: one failed; 2: undecided or cannot evaluate.")
    p.add_argument("run", help="run directory or records file")
    p.add_argument("--slo", required=True, help="SLO spec: YAML, TOML or a pyproject.toml with [tool.replay.slo]")
    p.add_argument("--as-measured", "--judge-as-measured", "--allow-client-bottleneck", dest="as_measured",
                   action="store_true", help="judge measured values: no confidence bounds, no bias bound (k6's way)")
    confidence_arg(p)
    p.add_argument("--whole-run", action="store_true", help="judge every request, not only the steady window")
    tenant_arg(p)
    _window_args(p)
    p.set_defaults(func=cmd_gate, inputs={"run": NO_RUN})

    p = sub.add_parser("compare", help="compare two runs (deltas with CIs, a verdict) or test non-inferiority",
                       description="Compare a candidate run with a base run (docs/reports.md). Exit 0; 1 with "
                                   "--fail-on-regression PCT on a significant regression by more than PCT percent, or "
                                   "with --not-worse-by PCT when worse by more; 2: no successes, or inconclusive.")
    p.add_argument("base", help="base run directory or records file")
    p.add_argument("cand", help="candidate run directory or records file")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 if a metric regressed significantly by more than PCT percent")
    p.add_argument("--min-effect", type=float, default=1.0, metavar="PCT",
                   help="smallest relative change reported as a change (default 1%%)")
    p.add_argument("--slo", help="SLO spec whose per-request thresholds define attainment")
    p.add_argument("--html", metavar="FILE", help="also write a side-by-side HTML page")
    p.add_argument("--not-worse-by", metavar="PCT", help="non-inferiority test, margin in percent: 5 or 5%% (not 0.05)")
    p.add_argument("--error-margin", metavar="PTS",
                   help="with --not-worse-by: error_rate's margin in percentage points, 0.5 or 0.5pt (default 1)")
    p.add_argument("--metrics", metavar="LIST",
                   help="with --not-worse-by: <latency>.<percentile> and error_rate, comma-separated")
    confidence_arg(p)
    _window_args(p)
    p.set_defaults(func=cmd_compare, inputs={"base": NO_RUN, "cand": NO_RUN})

    p = sub.add_parser("import-results", help="convert another tool's per-request results into a run directory",
                       description="Convert vLLM `bench serve --save-detailed` JSON or AIPerf "
                                   "profile_export.jsonl into records.parquet (fields the source lacks stay null).")
    p.add_argument("format", choices=("vllm", "aiperf"))
    p.add_argument("src", help="the tool's result file")
    p.add_argument("-o", "--output", required=True, help="run directory to create")
    p.add_argument("--model", help="model label for every request (when the source does not say)")
    p.set_defaults(func=cmd_import)


if __name__ == "__main__":  # pragma: no cover - `python -m reports.cli` for debugging
    sys.exit("use `replay report|gate|compare|import-results`")
