"""`replay run`: replay a trace open-loop against an OpenAI-compatible target.

The options, then `run` in named steps: the run directory claimed (parent.py), the pre-flight
(preflight.py: the options, the trace's facts, the targets' models and capabilities, text-prompt
calibration) written into its run.json, the runner supervised beside its scraper and span
receiver, and the wrap-up (parent.py: salvage, spans, verdict, summary).
"""
from __future__ import annotations

import argparse
import json
import os
import re

from .parent import (MAX_ERROR_RATE, UNWRITABLE, RunInfo, claim_run_dir, finish_receiver, prepare_run_dir,
                     release_run_dir, salvage_if_died, start_receiver, summarize, supervise, unwritable,
                     until_verdict, verdict, warn_realtime_beside)
from .preflight import RunError, build_config


class DurationError(RunError, argparse.ArgumentTypeError):
    """A RunError that argparse prints as it is (not as 'invalid parse_duration value')."""


def parse_duration(s: str) -> float:
    m = re.fullmatch(r"\s*([0-9]+\.?[0-9]*|\.[0-9]+)\s*(ms|s|sec|m|min|h)?\s*", str(s))
    if not m:
        raise DurationError(f"not a duration: {s!r} (seconds, or with a unit: 30, 1.5s, 500ms, 2m, 5min, 1h)")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]


def add_parser(sub) -> None:
    """The options of `replay run`; docs/replay.md's option table says more of each."""
    p = sub.add_parser("run", help="replay a trace open-loop against an OpenAI-compatible target", description=(
        "Send every trace row at its timestamp, stream the responses, record one row per request (docs/replay.md)."))
    p.add_argument("--trace", required=True, help="trace file (Parquet)")
    add_target_argument(p, required=True)
    p.add_argument("-o", "--out", help="run directory (default runs/<UTC time>)")
    add_run_arguments(p)
    p.add_argument("--workers", type=int, default=1, help="local runner processes (N>1: Locust master + N workers)")
    p.add_argument("--remote-workers", type=int, default=0, help="also wait for this many `replay worker` processes")
    p.add_argument("--master-bind", default="0.0.0.0:5557", metavar="HOST:PORT", help="address for remote workers")
    p.add_argument("--max-error-rate", type=float, default=MAX_ERROR_RATE, metavar="FRACTION",
                   help=f"exit 1 when more than this share of the requests failed (default {MAX_ERROR_RATE:g})")
    p.add_argument("--exit-code-on-error", type=int, metavar="N", help="exit N when any request failed (Locust's)")
    p.add_argument("--nice", type=int, metavar="N", help="run the runner (and its autogroup) at nice N, e.g. -10")
    p.add_argument("--realtime", action="store_true", help="runner at SCHED_FIFO 1 (root); not on the same host as the server")
    p.add_argument("--otlp", nargs="?", const="127.0.0.1:4318", metavar="HOST:PORT",
                   help="send traceparents, receive the server's spans here (default 127.0.0.1:4318; send: headers only)")
    p.add_argument("--otlp-token", metavar="TOKEN", default=os.environ.get("REPLAY_OTLP_TOKEN"),
                   help="--otlp: require `Authorization: Bearer TOKEN` (default $REPLAY_OTLP_TOKEN)")
    p.add_argument("--otlp-wait", type=parse_duration, default=10.0, metavar="SECONDS", help="--otlp: wait for late spans")
    p.add_argument("--slo", metavar="FILE", help="SLO spec: goodput and objectives in the report")
    from llm_replay.reports.cli import confidence_arg
    confidence_arg(p)
    p.add_argument("--until-decided", action="store_true", help="with --slo: replay until the gate is decided")
    p.add_argument("--max-duration", type=parse_duration, metavar="DURATION", help="--until-decided: at most this long")
    p.set_defaults(func=run, inputs={"trace": "file not found"})


def add_target_argument(p, required: bool = False) -> None:
    p.add_argument("--target", action="append", required=required, default=[], metavar="[MODEL=]URL",
                   help="base URL, e.g. http://127.0.0.1:8000; MODEL=URL (repeatable): that model's deployment")


def add_run_arguments(p) -> None:
    """The replay options shared by `replay run` and the locustfile (Locust's parser)."""
    p.add_argument("--api", choices=("completions", "chat"), default="completions", help="API for rows without an `api`")
    p.add_argument("--model-map", action="append", default=[], metavar="TRACE=SERVED",
                   help="map a trace model label to a served model (repeatable; '*=NAME' for all others)")
    p.add_argument("--speed", type=float, default=1.0, help="time compression: 2 = twice as fast")
    p.add_argument("--start", type=parse_duration, default=0.0, help="skip this much trace time")
    p.add_argument("--duration", type=parse_duration, help="replay only this much trace time")
    p.add_argument("--max-requests", type=int, help="replay at most this many rows")
    p.add_argument("--warmup", type=int, default=0, help="unrecorded warm-up requests before T0")
    p.add_argument("--preconnect", type=int, default=0, metavar="N", help="open N keep-alive connections before T0")
    p.add_argument("--reset-cache", action="store_true", help="empty the targets' prefix caches before T0")
    p.add_argument("--timeout", type=parse_duration, default=300.0, help="per-request timeout")
    p.add_argument("--grace", type=parse_duration, default=5.0, help="wait for in-flight requests after Ctrl-C")
    p.add_argument("--api-key-env", action="append", default=[], metavar="[MODEL=]VAR",
                   help="environment variable holding the API key (MODEL=VAR: for that model's target; repeatable)")
    p.add_argument("--seed", type=int, default=0, help="prompt (and image) content seed")
    p.add_argument("--salt", type=int, metavar="N", help="salt of the prompt bytes (default: random, in run.json)")
    p.add_argument("--image-url-base", metavar="URL", help="send images as URLs {URL}/{W}x{H}.png, not inline")
    p.add_argument("--sessions", choices=("off", "timestamps", "closed"), default="off", help="multi-turn sessions")
    p.add_argument("--max-delay", type=parse_duration, metavar="S", help="task graphs: cap each delay_s at S")
    p.add_argument("--prompt-mode", choices=("ids", "text"), help="token ids or calibrated text (default: ids if accepted)")
    p.add_argument("--tokenizer", metavar="tokenizer.json", help="local tokenizer for exact text prompts")
    p.add_argument("--force-output-len", action=argparse.BooleanOptionalAction,
                   help="send min_tokens + ignore_eos (default: on when the target accepts them)")
    p.add_argument("--scrape", action="append", default=[], metavar="[MODEL=]URL",
                   help="Prometheus metrics URL to sample during the run (MODEL=URL: that model's; repeatable)")
    p.add_argument("--scrape-interval", type=parse_duration, default=1.0, metavar="DURATION",
                   help="time between two --scrape samples (default 1s)")
    p.add_argument("--spin-ms", type=float, default=0.0, help="wake this many ms early and busy-wait to each due time")
    p.add_argument("--no-check", action="store_true", help="skip probing the target's capabilities")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")


def run(args) -> int:
    """`replay run`: the SLO options, the run directory, pre-flight, supervision, wrap-up; a
    refusal before the runner starts frees the run directory again."""
    from .until import Looks, extend_trace   # numpy: not while `replay --help` builds the parser
    slo = load_slo(args)
    run_dir, made = claim_run_dir(args.out)
    args.out = str(run_dir)
    try:
        extended = None
        if args.until_decided:   # the trace and its further passes, up to the budget: RUN_DIR/trace.parquet
            extended = extend_trace(args, run_dir)
            args.trace, args.start, args.duration, args.max_requests = str(run_dir / "trace.parquet"), 0.0, None, None
        # listening before the capability probe: its spans (engine-stub exports every 0.5 s) count as own
        receiver = start_receiver(args.otlp, args.otlp_token) if args.otlp not in (None, "send") else None
        config, notes = build_config(args)
        prepare_run_dir(config, notes | ({"until_decided": extended} if extended else {}), claimed=True)
    except BaseException:
        release_run_dir(run_dir, made)
        raise
    if args.realtime:
        warn_realtime_beside([config.target, *config.targets.values()])
    try:
        if slo is not None:   # `replay report RUN` then keeps the gate when it writes summary.json again
            spec = {k: v for k, v in slo.to_dict().items() if k != "source"}
            (run_dir / "slo.json").write_text(json.dumps(spec, indent=1) + "\n")
        looks = Looks(run_dir, slo, config.speed) if args.until_decided else None
        code, sampler = supervise(config, args.nice, args.realtime, looks)
        if code == UNWRITABLE:   # the runner said why in one `error:` line; its run.json says failed
            return 2
        info = RunInfo(run_dir)
        if info.get("t0_wall"):
            sampler.write(run_dir, info.get("t0_wall"))
        code = salvage_if_died(info, config, code)
        if receiver is not None:
            finish_receiver(receiver, info, config.otlp_wait_s)
        line = ""
        if looks is not None and code in (0, 130) and (code == 0 or looks.decided is not None):
            code, line = until_verdict(info, looks, slo, code)
        elif code == 0:
            code, line = verdict(info, args.exit_code_on_error, args.max_error_rate)
        summarize(info, slo, line)
    except OSError as e:   # a full disk: one line, and run.json (where it can still be written) says so
        raise RunError(unwritable(run_dir, e)) from None
    return code


def load_slo(args):
    """The SLO spec and the run options that depend on it, checked before anything is claimed."""
    slo = None
    if args.slo:
        from llm_replay import reports
        slo = reports.load_slo(args.slo)  # a bad spec fails before the run, not after
        if args.confidence is not None:
            from llm_replay.reports.slo import check_confidence
            slo.confidence = check_confidence(args.confidence)
    if not 0 <= args.max_error_rate <= 1:
        raise RunError(f"--max-error-rate {args.max_error_rate:g}: a share of the requests, from 0 to 1")
    if args.until_decided and slo is None:
        raise RunError("--until-decided needs --slo: the objectives it runs until they are decided")
    if args.max_duration is not None and not args.until_decided:
        raise RunError("--max-duration is the budget of --until-decided; without it, --duration cuts the trace")
    return slo
