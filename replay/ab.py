"""`replay ab`: a live A/B test, the same trace blocks alternating between two targets until decided.

The trace window is cut into blocks of --block seconds of trace time. Each block is replayed to
both targets, one after the other (one `replay run` each), the base first in blocks 0, 3, 4, 7, ...
and the candidate first in blocks 1, 2, 5, 6, ... (ABBA): a host that drifts slowly (a neighbour
starting, thermal throttling) loads both arms alike, and a linear drift cancels within every four
blocks. After 1, 2, 4, 8, ... blocks the pooled records of each arm are judged by the
non-inferiority test of `replay compare --not-worse-by` (reports/compare.py) at look k's confidence
1 - (1 - c) 6 / (pi^2 k^2) (reports/sequential.py), so that the error rates over all looks stay
within 1 - c; the first decided look (PASS or FAIL) ends the test. Exit 0 PASS, 1 FAIL, 2
inconclusive when the trace (or --max-blocks) ran out.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ORDER = ("AB", "BA", "BA", "AB")     # who goes first in block b: ORDER[b % 4]


class ABError(RuntimeError):
    exit_code = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ab", help="live A/B: alternate trace blocks between two targets until decided", description=(
        "Replay each trace block to base and candidate (ABBA order), judge non-inferiority after 1, 2, 4, ... blocks "
        "(docs/verdicts.md#live-ab). Exit 0 PASS, 1 FAIL, 2 inconclusive."))
    p.add_argument("--trace", required=True, help="trace file (Parquet)")
    p.add_argument("--base", required=True, metavar="URL", help="the baseline target")
    p.add_argument("--cand", required=True, metavar="URL", help="the candidate target")
    p.add_argument("--not-worse-by", required=True, metavar="PCT", help="margin in percent: 5 or 5%%")
    p.add_argument("--error-margin", default="1", metavar="PTS", help="error_rate's margin in points (default 1)")
    p.add_argument("--metrics", metavar="LIST", help="metrics to judge, as `replay compare --metrics`")
    p.add_argument("--block", type=float, default=30.0, metavar="SECONDS", help="trace time per block (default 30)")
    p.add_argument("--max-blocks", type=int, default=16, help="at most this many blocks (default 16)")
    p.add_argument("--confidence", type=float, default=0.95, metavar="C", help="over all looks (default 0.95)")
    p.add_argument("-o", "--output", default="runs/ab", help="directory for the block runs and ab.json")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="after `--`: extra arguments for every `replay run`")
    p.set_defaults(func=run, inputs={"trace": "file not found"})


def run(args: argparse.Namespace) -> int:
    from llm_replay.reports.cli import _amount
    from llm_replay.reports.compare import NI_METRICS, check_metrics, non_inferiority
    from llm_replay.reports.sequential import look_confidence
    from llm_replay.reports.slo import check_confidence
    from llm_replay.traces import Trace
    from .orchestrate import replay_run
    margin = _amount(args.not_worse_by, "--not-worse-by", "%")
    error_margin = _amount(args.error_margin, "--error-margin", "pt")
    metrics = check_metrics([m.strip() for m in args.metrics.split(",")] if args.metrics else NI_METRICS)
    conf = check_confidence(args.confidence)
    if not args.block > 0 or args.max_blocks < 1:
        raise ABError("--block must be > 0 s and --max-blocks >= 1")
    a = Trace.read(args.trace).table.column("arrival_ns").to_numpy()
    blocks = min(args.max_blocks, max(1, math.ceil((a[-1] - a[0]) / 1e9 / args.block)))
    out, extra = Path(args.output), [x for x in args.run_args if x != "--"]
    out.mkdir(parents=True, exist_ok=True)
    arms: dict[str, list[Path]] = {"A": [], "B": []}
    looks, result, k = [], None, 1
    for b in range(blocks):
        for arm in ORDER[b % 4]:
            d = out / f"block-{b:02d}-{'base' if arm == 'A' else 'cand'}"
            o = replay_run(Path(args.trace), args.base if arm == "A" else args.cand, d,
                           extra=["--start", f"{b * args.block:g}s", "--duration", f"{args.block:g}s", *extra])
            if not (d / "records.parquet").exists():
                raise ABError(f"block {b} ({d.name}) produced no records (exit {o.returncode}):\n{o.output[-1500:]}")
            arms[arm].append(d)
        if b + 1 != 1 << (k - 1) and b + 1 != blocks:
            continue
        result = non_inferiority(_pooled(arms["A"]), _pooled(arms["B"]), margin, error_margin=error_margin,
                                 metrics=metrics, conf=look_confidence(conf, k))
        looks.append({"look": k, "blocks": b + 1, "confidence": look_confidence(conf, k), "exit_code": result.exit_code})
        print(f"ab: look {k} after {b + 1} block(s): {('PASS', 'FAIL', 'inconclusive')[result.exit_code]}", flush=True)
        k += 1
        if result.exit_code in (0, 1):
            break
    (out / "ab.json").write_text(json.dumps({"looks": looks, "margin": margin, "error_margin": error_margin,
                                             "confidence": conf, "block_s": args.block, "result": result.to_dict(),
                                             "runs": {a: [str(d) for d in ds] for a, ds in arms.items()}}, indent=1))
    print(result.table().rstrip("\n"))
    print(f"ab: {looks[-1]['blocks']} of {blocks} blocks, each to both targets (ABBA); look {looks[-1]['look']} at "
          f"{looks[-1]['confidence']:.2%} (the looks' error rates sum to at most {1 - conf:.0%}) -> {out / 'ab.json'}")
    return result.exit_code


def _pooled(dirs: list[Path]):
    """One Analysis of the records of every block of an arm."""
    import pyarrow as pa
    from llm_replay.reports.analysis import analyze
    from llm_replay.reports.records import load_records
    return analyze(pa.concat_tables([load_records(d) for d in dirs]))
