"""`replay run`: replay a trace open-loop against an OpenAI-compatible target.

This module only parses, validates, probes the target and prepares the run directory;
the replay itself runs in a child process (`python -m llm_replay.replay.runner RUN_DIR`) that is the
only one to import locust/gevent. Ctrl-C is forwarded to it (a second one skips the grace
time); if the child dies, the records it flushed are still finalised here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import __version__


class RunError(ValueError):
    exit_code = 2


class DurationError(RunError, argparse.ArgumentTypeError):
    """A RunError that argparse prints as it is (not as 'invalid parse_duration value')."""


def parse_duration(s: str) -> float:
    m = re.fullmatch(r"\s*([0-9]+\.?[0-9]*|\.[0-9]+)\s*(ms|s|sec|m|min|h)?\s*", str(s))
    if not m:
        raise DurationError(f"not a duration: {s!r} (a number of seconds, or with a unit ms, s, m or min, h: "
                            "30, 1.5s, 500ms, 2m, 5min, 1h)")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="replay a trace open-loop against an OpenAI-compatible target",
                       description="Send every trace row at its timestamp, stream the responses and "
                                   "record one row per request into RUN_DIR/records.parquet.")
    p.add_argument("--trace", required=True, help="trace file (Parquet)")
    add_target_argument(p, required=True)
    p.add_argument("-o", "--out", help="run directory (default runs/<UTC time>)")
    add_run_arguments(p)
    p.add_argument("--workers", type=int, default=1, help="local runner processes (N>1: Locust master + N workers)")
    p.add_argument("--remote-workers", type=int, default=0,
                   help="also wait for this many `replay worker --master HOST:PORT` processes")
    p.add_argument("--master-bind", default="0.0.0.0:5557", metavar="HOST:PORT",
                   help="master address for remote workers (default 0.0.0.0:5557)")
    p.add_argument("--max-error-rate", type=float, default=MAX_ERROR_RATE, metavar="FRACTION",
                   help=f"exit 1 when more than this share of the requests failed (default {MAX_ERROR_RATE:g}: "
                        "most of them; 0: any failure); the summary's last lines state both")
    p.add_argument("--exit-code-on-error", type=int, metavar="N",
                   help="exit N when any request failed (as Locust's option; default: --max-error-rate decides)")
    p.add_argument("--nice", type=int, metavar="N", help="run the runner (and, with scheduler autogroups, "
                   "this session's CPU group) at nice N while it lasts, e.g. -10; below 0 needs root or "
                   "CAP_SYS_NICE (a refusal is reported in run.json `scheduling`, not fatal)")
    p.add_argument("--realtime", action="store_true", help="run the runner under SCHED_FIFO 1 (root or "
                   "CAP_SYS_NICE): on a busy host it wakes at once instead of at the next scheduler tick "
                   "(lag p99 ~4 -> <1 ms measured); it can then hold its core from normal tasks while saturated. Not beside "
                   "a server on the same host: vLLM's TPOT rose 34%% and 49%% with the client at SCHED_FIFO on its "
                   "two cores (a warning says when the target is on this host)")
    p.add_argument("--otlp", nargs="?", const="127.0.0.1:4318", metavar="HOST:PORT",
                   help="send a W3C traceparent per request and receive the server's OTLP spans at HOST:PORT "
                        "(default 127.0.0.1:4318; point vLLM's --otlp-traces-endpoint at http://HOST:PORT/v1/traces; "
                        "HOST:0 picks a free port): spans.parquet, joined to the records by trace id; `--otlp send`: "
                        "the headers only, the spans go to your collector (then `replay report RUN --spans FILE`)")
    p.add_argument("--otlp-token", metavar="TOKEN", default=os.environ.get("REPLAY_OTLP_TOKEN"),
                   help="--otlp: accept only posts with `Authorization: Bearer TOKEN` (default: $REPLAY_OTLP_TOKEN, "
                        "which `ps` does not show); the server's exporter sends it with "
                        "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%%20TOKEN; required beyond loopback")
    p.add_argument("--otlp-wait", type=parse_duration, default=10.0, metavar="SECONDS",
                   help="--otlp: after the last response, wait up to this long for spans still to come "
                        "(default 10s: vLLM exports every 5 s)")
    p.add_argument("--slo", metavar="FILE", help="SLO spec: the report counts goodput with its per-request "
                   "thresholds and shows its objectives (exit codes come from `replay gate`)")
    from llm_replay.reports.cli import confidence_arg
    confidence_arg(p)
    p.add_argument("--until-decided", action="store_true",
                   help="with --slo: go on replaying (more passes of the trace) until the gate is decided, then "
                        "stop sending; the exit code is the gate's (docs/verdicts.md#run-until-decided)")
    p.add_argument("--max-duration", type=parse_duration, metavar="DURATION",
                   help="--until-decided: replay at most this long (--max-requests: at most that many rows; "
                        "default: the window and up to 7 more passes)")
    p.set_defaults(func=run, inputs={"trace": "file not found"})


def add_target_argument(p, required: bool = False) -> None:
    p.add_argument("--target", action="append", required=required, default=[], metavar="[MODEL=]URL",
                   help="base URL, e.g. http://127.0.0.1:8000; MODEL=URL (repeatable) sends the rows of "
                        "trace model MODEL to their own deployment, a plain URL takes every other row")


def parse_targets(values: list[str]) -> tuple[str, dict[str, str]]:
    """`--target` values -> (default URL or "", {trace model: URL}), every URL normalised."""
    default, per_model = "", {}
    for v in values:
        label, url = ("", v) if re.match(r"https?://", v) else (v.partition("=")[0], v.partition("=")[2])
        if not re.match(r"https?://[^/\s]+", url) or (label == "" and v != url):
            raise RunError(f"--target {v!r}: expected an http:// or https:// URL or MODEL=URL, "
                           "e.g. http://127.0.0.1:8000 or llama-70b=http://10.0.0.7:8000")
        url = url.rstrip("/").removesuffix("/v1")
        if not label:
            if default:
                raise RunError(f"--target: two default targets ({default}, {url}); name the model of "
                               "the others: --target MODEL=URL")
            default = url
        elif per_model.setdefault(label, url) != url:
            raise RunError(f"--target {label}=...: given twice ({per_model[label]}, {url})")
    return default, per_model


def per_model(values: list[str], flag: str) -> tuple[str | None, dict[str, str]]:
    """`VALUE` / `MODEL=VALUE` options (--api-key-env, --scrape) -> (default, {trace model: value});
    a URL is a plain value even though it may hold '='."""
    default, named = None, {}
    for v in values:
        if "=" in v and not re.match(r"https?://", v):
            label, _, value = v.partition("=")
            named[label] = value
        elif default is not None:
            raise RunError(f"{flag}: two defaults ({default}, {v}); name the model of the others: {flag} MODEL=...")
        else:
            default = v
    return default, named


def add_run_arguments(p) -> None:
    """The replay options shared by `replay run` and the locustfile (Locust's parser)."""
    p.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="API for rows without an `api` value (default completions)")
    p.add_argument("--model-map", action="append", default=[], metavar="TRACE=SERVED",
                   help="map a trace model label to a served model (repeatable; '*=NAME' for all others)")
    p.add_argument("--speed", type=float, default=1.0, help="time compression: 2 = twice as fast")
    p.add_argument("--start", type=parse_duration, default=0.0, help="skip this much trace time")
    p.add_argument("--duration", type=parse_duration, help="replay only this much trace time")
    p.add_argument("--max-requests", type=int, help="replay at most this many rows")
    p.add_argument("--warmup", type=int, default=0, help="unrecorded warm-up requests before T0")
    p.add_argument("--preconnect", type=int, default=0, metavar="N",
                   help="open N keep-alive connections before T0 (64 at a time; split across workers), so the "
                        "first requests reuse them instead of opening their own")
    p.add_argument("--timeout", type=parse_duration, default=300.0, help="per-request timeout")
    p.add_argument("--grace", type=parse_duration, default=5.0, help="wait for in-flight requests after Ctrl-C")
    p.add_argument("--api-key-env", action="append", default=[], metavar="[MODEL=]VAR",
                   help="environment variable holding the API key (MODEL=VAR: for that model's target; repeatable)")
    p.add_argument("--seed", type=int, default=0, help="prompt (and image) content seed")
    p.add_argument("--salt", type=int, metavar="N", help="salt of the prompt bytes (default: a new random salt "
                   "per run, recorded in run.json config.salt, so a run never hits the prefix cache an earlier run "
                   "filled; give an earlier run's salt to repeat its bytes on purpose)")
    p.add_argument("--image-url-base", metavar="URL", help="send rows' images as URLs {URL}/{W}x{H}.png "
                   "(files from `python3 -m llm_replay.replay.images`) instead of inline PNG data URLs")
    p.add_argument("--sessions", choices=("off", "timestamps", "closed"), default="off",
                   help="multi-turn sessions: off (default: every row at its own timestamp, no history), "
                        "timestamps (turns at their trace times, with the chat history), or closed (turn k+1 "
                        "sent when turn k has completed, plus the think time)")
    p.add_argument("--max-delay", type=parse_duration, metavar="S",
                   help="task graphs: cap each dependant's delay_s (tool/think time) at S, to cut idle gaps "
                        "(default: delays as recorded)")
    p.add_argument("--prompt-mode", choices=("ids", "text"),
                   help="token-id prompts (completions) or calibrated text (default: ids when the target accepts them)")
    p.add_argument("--tokenizer", metavar="tokenizer.json", help="local tokenizer for exact text prompts")
    p.add_argument("--force-output-len", action=argparse_bool(), default=None,
                   help="send min_tokens + ignore_eos (default: on when the target accepts them)")
    p.add_argument("--scrape", action="append", default=[], metavar="[MODEL=]URL",
                   help="Prometheus metrics URL to sample during the run (MODEL=URL: that model's "
                        "deployment; repeatable; samples carry a `target` label)")
    p.add_argument("--scrape-interval", type=parse_duration, default=1.0, metavar="DURATION",
                   help="time between two --scrape samples (default 1s)")
    p.add_argument("--spin-ms", type=float, default=0.0,
                   help="wake this many ms early and busy-wait (yielding to I/O) until each row is due: "
                        "sub-millisecond dispatch lag for extra client CPU (e.g. 1)")
    p.add_argument("--no-check", action="store_true", help="skip probing the target's capabilities")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")


def argparse_bool():
    import argparse
    return argparse.BooleanOptionalAction


def http_json(target: str, path: str, body: dict | None = None, key: str | None = None,
              timeout: float = 30.0) -> dict:
    """One blocking JSON call to the target; any failure (HTTP error, refused, timeout, a body
    that is not a JSON object) is a RunError naming the target, the method, the path and why."""
    import urllib.error
    import urllib.request   # http.client: not while `replay --help` builds the parser
    method = "GET" if body is None else "POST"
    where = f"target {target}: {method} {path}"
    req = urllib.request.Request(target.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, ctype = r.read(), r.headers.get("Content-Type") or "no Content-Type"
    except urllib.error.HTTPError as e:
        raise RunError(f"{where} -> HTTP {e.code}: {_snippet(e.read())}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:   # refused, DNS, timeout, bad URL
        raise RunError(f"{where} failed: {getattr(e, 'reason', None) or e}") from None
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise RunError(f"{where} -> HTTP 200 but not a JSON object ({ctype}): {_snippet(raw)}")
    return obj


def _snippet(raw: bytes) -> str:
    text = " ".join(raw[:200].decode("utf-8", "replace").split())
    return text or "(empty body)"


def served_models(target: str, key: str | None) -> dict:
    """GET /v1/models: {"models": ids, "max_model_len": {id: tokens}} (the context: vLLM, SGLang, engine-stub)."""
    try:
        data = http_json(target, "/v1/models", key=key, timeout=10).get("data")
        return {"models": [m["id"] for m in data], "max_model_len": {
            m["id"]: m["max_model_len"] for m in data if isinstance(m.get("max_model_len"), int)}}
    except RunError as e:   # the hint only where the target answered: a dead one is just dead
        raise RunError(f"{e} (--model-map '*=NAME' skips the model list)" if " -> " in str(e) else str(e)) from None
    except (KeyError, TypeError, AttributeError):
        raise RunError(f"target {target}: GET /v1/models -> not an OpenAI model list (no data[].id); "
                       "pass --model-map '*=NAME'") from None


def build_config(args) -> tuple[plan.RunConfig, dict]:
    from . import plan   # numpy, pyarrow: not while `replay --help` builds the parser
    if args.speed <= 0:
        raise RunError("--speed must be > 0")
    target, targets = parse_targets(args.target if isinstance(args.target, list) else [args.target])
    if not target and not targets:
        raise RunError("--target: no target given")
    key_env, key_envs = per_model(args.api_key_env or [], "--api-key-env")
    scrape, scrapes = per_model(args.scrape or [], "--scrape")
    if args.workers < 1 or args.remote_workers < 0:
        raise RunError("--workers must be >= 1 and --remote-workers >= 0")
    if args.preconnect < 0:
        raise RunError("--preconnect must be >= 0")
    run_dir = args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    host, _, port = args.master_bind.rpartition(":")
    c = plan.RunConfig(trace=str(args.trace), target=target, targets=targets,
                       run_dir=run_dir, api=args.api, speed=args.speed, start_s=args.start,
                       duration_s=args.duration, max_requests=args.max_requests, warmup=args.warmup,
                       preconnect=args.preconnect,
                       timeout_s=args.timeout, grace_s=args.grace, api_key_env=key_env, api_key_envs=key_envs,
                       workers=args.workers, remote_workers=args.remote_workers, master_host=host or "0.0.0.0",
                       master_port=int(port) if args.remote_workers and port.isdigit() else 0,
                       seed=args.seed, salt=args.salt if args.salt is not None else secrets.randbits(32),
                       image_url_base=args.image_url_base, sessions=args.sessions,
                       max_delay_s=args.max_delay, tokenizer=args.tokenizer,
                       scrape_url=scrape, scrapes=scrapes, scrape_interval_s=args.scrape_interval,
                       progress=not args.no_progress, spin_s=max(0.0, args.spin_ms) / 1e3,
                       run_id=secrets.token_hex(8), otlp=getattr(args, "otlp", None),
                       otlp_wait_s=max(0.0, getattr(args, "otlp_wait", 10.0)))
    c.rows, c.window_s = plan.scan(c)
    from llm_replay.traces.validate import timing_warnings
    for w in timing_warnings(c.trace, c.max_delay_s):   # a gap or delay that would keep the run waiting
        print(f"replay: warning: {w}", file=sys.stderr)
    c.block_size = plan.trace_block_size(c.trace)
    for var in {key_env, *key_envs.values()} - {None}:
        if not os.environ.get(var):
            raise RunError(f"--api-key-env {var}: that environment variable is not set")
    rows = _rows_per_target(c)     # {url: {"labels": [...], "apis": {...}, "rows": n}}
    notes: dict = {}
    mapping = dict(m.split("=", 1) for m in args.model_map if "=" in m)
    bad = [m for m in args.model_map if "=" not in m]
    if bad:
        raise RunError(f"--model-map expects TRACE=SERVED, got {bad[0]!r}")
    c.default_model = mapping.pop("*", None)
    c.model_map = mapping
    # the model list before the capability probe: a model the target does not serve is refused
    # before a single request is sent
    listed: dict[str, dict] = {}
    for url, g in rows.items():
        if c.default_model is None:
            listed[url] = served_models(url, _key(g["key_env"]))
        elif not args.no_check:
            try:
                listed[url] = served_models(url, _key(g["key_env"]))
            except RunError:   # no model list: the probe below says what the target does answer
                pass
    if c.default_model is None:
        for url, g in rows.items():
            served = listed[url]["models"]
            if not served:
                raise RunError(f"target {url} serves no models (GET /v1/models is empty)")
            c.served_defaults[url] = served[0]   # also the model text prompts are calibrated on
            unmapped = [m for m in g["labels"] if m not in mapping]
            to = (f"{served[0]!r} (the target's first served model" if len(rows) == 1
                  else f"{served[0]!r} (the first model {url} serves")
            if unmapped and mapping:
                print(f"replay: trace models not in --model-map ({', '.join(unmapped)}) -> {to})", file=sys.stderr)
            elif unmapped:
                print(f"replay: trace models {'' if len(rows) == 1 else '(' + ', '.join(unmapped) + ') '}-> {to}; "
                      f"change with --model-map TRACE=SERVED)", file=sys.stderr)
        c.default_model = c.served_defaults.get(c.target) or next(iter(c.served_defaults.values()))
    if not args.no_check:
        _check_served(c, rows, listed)
    caps_of: dict[str, dict] = {}
    if not args.no_check:
        from .check import probe
        from .otlp import traceparent
        for url, g in rows.items():
            caps_of[url] = probe(url, _key(g["key_env"]), headers={"traceparent": traceparent(c.run_id, "probe")[0]}
                                 if getattr(args, "otlp", None) else None)
        first = c.target if c.target in caps_of else next(iter(caps_of), None)
        notes["capabilities"] = caps_of.get(first, {})
    if len(rows) > 1:
        notes["targets"] = {url: {"models": g["labels"], "rows": g["rows"], "served_model": c.served_defaults.get(url),
                                  **({"capabilities": caps_of[url]} if url in caps_of else {})}
                            for url, g in rows.items()}
        print("replay: targets: " + "; ".join(f"{', '.join(g['labels'])} -> {url}" for url, g in rows.items()),
              file=sys.stderr)
    for url, caps in caps_of.items():
        _check_apis(url, rows[url]["apis"], caps)
    reuse = _intended_reuse(c)
    if reuse:
        notes["intended_prefix_reuse"] = reuse
    apis = set().union(*(g["apis"] for g in rows.values()))
    caps = list(caps_of.values())
    ids_ok = all(k.get("token_id_prompts", True) for k in caps)   # every target, or text for all
    c.prompt_mode = args.prompt_mode or ("ids" if c.api == "completions" and ids_ok else "text")
    force_ok = all(k.get("min_tokens_ignore_eos", True) for k in caps)
    c.force_output_len = force_ok if args.force_output_len is None else args.force_output_len
    c.ask_reasoning = all(k.get("reasoning_tokens_request", True) for k in caps)
    import pyarrow.parquet as pq
    if caps and "reasoning_tokens" in pq.read_schema(c.trace).names:
        print("replay: the trace's reasoning_tokens " + ("go in each chat request's reasoning_tokens field" if
              c.ask_reasoning else "are not sent: the target takes no count (a real server reasons as long as it "
              "decides); the report compares the reasoning share it generated with the trace's"), file=sys.stderr)
    if caps:
        print(f"replay: prompt mode {c.prompt_mode}, force output length "
              f"{'on' if c.force_output_len else 'off'} (from `replay check` of the "
              f"target{'s' if len(caps) > 1 else ''})", file=sys.stderr)
    # text prompts: chat rows, and completions rows in text mode; only the APIs the run uses
    text_apis = {a for a in apis if a == "chat" or c.prompt_mode == "text"}
    if text_apis and c.tokenizer:
        notes["tokenizer"] = _check_tokenizer(c.tokenizer)
        if "chat" in text_apis:   # the template's tokens are the server's, within input_tokens
            from .prompts import load_tokenizer, template_tokens
            tok = load_tokenizer(c.tokenizer)
            for url, g in rows.items():
                if "chat" in g["apis"]:
                    key, model = _key(g["key_env"]), c.target_model(g["labels_raw"][0]) if g["labels_raw"] else c.default_model
                    c.template_tokens["chat" if url == c.target else f"chat@{url}"] = template_tokens(
                        lambda p, b: http_json(url, p, b, key), model, tok, c.seed)
        print(f"replay: text prompts cut to exact token counts with {c.tokenizer} "
              f"(vocab {notes['tokenizer']['vocab_size']}; no calibration"
              + (f"; chat template {', '.join(f'{v} tokens ({k})' for k, v in c.template_tokens.items())}"
                 if c.template_tokens else "") + ")", file=sys.stderr)
    elif c.tokenizer:
        print(f"replay: --tokenizer unused: {c.prompt_mode} prompts only", file=sys.stderr)
    if text_apis and not c.tokenizer:
        from .prompts import calibrate
        c.calibration, notes["calibration"] = {}, {}
        for url, g in rows.items():   # each deployment's tokenizer: its own calibration
            key = _key(g["key_env"])
            model = c.target_model(g["labels_raw"][0]) if g["labels_raw"] else c.default_model
            context = ((listed.get(url) or caps_of.get(url) or {}).get("max_model_len") or {}).get(model)
            for api in sorted(a for a in g["apis"] if a in text_apis):
                name = api if url == c.target else f"{api}@{url}"
                a, b, probes = calibrate(lambda p, b: http_json(url, p, b, key), api, model, c.seed, context)
                c.calibration[name] = (a, b)
                # the probes' spread under the line: how far a prompt may stray from it (0: a word
                # is a token, as on engine-stub and common BPE vocabularies)
                spread = max(a + b * w - t for w, t in probes)
                notes["calibration"][name] = {"tokens": f"{a:.2f} + {b:.4f} * words", "probes": probes,
                                              "max_model_len": context, "max_over_tokens": int(spread + 0.999)}
    return c, notes


def _key(var: str | None) -> str | None:
    return os.environ.get(var) if var else None


def _rows_per_target(c: plan.RunConfig) -> dict[str, dict]:
    """Which trace models, APIs and how many rows of the whole trace go to each target; a model
    with no target (no MODEL=URL and no default URL) is an error before the run."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    names = pq.read_schema(c.trace).names
    cols = [n for n in ("model", "api", "num_images") if n in names]
    t = pq.read_table(c.trace, columns=cols) if cols else None
    n = pq.ParquetFile(c.trace).metadata.num_rows
    model = t.column("model") if t is not None and "model" in cols else pa.nulls(n, pa.string())
    api = pc.fill_null(t.column("api"), c.api) if t is not None and "api" in cols else None
    if t is not None and "num_images" in cols:
        chat = pc.fill_null(pc.greater(t.column("num_images"), 0), False)
        n_img = pc.sum(chat).as_py() or 0
        if n_img:
            api = pc.if_else(chat, "chat", api if api is not None else c.api)
            print(f"replay: {n_img} rows carry images: sent as chat requests with "
                  f"{'images from ' + c.image_url_base if c.image_url_base else 'generated PNG images'}",
                  file=sys.stderr)
    keys = pa.table({"model": model.cast(pa.string()),
                     "api": api.cast(pa.string()) if api is not None else pa.array([c.api] * n, pa.string())})
    out: dict[str, dict] = {}
    unrouted = []
    for g in keys.group_by(["model", "api"]).aggregate([([], "count_all")]).to_pylist():
        label = g["model"]
        url = c.target_of(label)
        if not url:
            unrouted.append((label, g["count_all"]))
            continue
        d = out.setdefault(url, {"labels": [], "labels_raw": [], "apis": set(), "rows": 0,
                                 "key_env": c.key_env_of(label)})
        name = "(none)" if label is None else label
        if name not in d["labels"]:
            d["labels"].append(name)
            d["labels_raw"].append(label)
        d["apis"].add(g["api"])
        d["rows"] += g["count_all"]
    if unrouted:
        counts: dict = {}
        for label, k in unrouted:
            counts[label] = counts.get(label, 0) + k
        names = ", ".join(f"{'(none)' if m is None else repr(m)} ({k} rows)" for m, k in counts.items())
        raise RunError(f"trace models with no target: {names}: add --target MODEL=URL for each, or a "
                       f"default --target URL")
    unused = sorted(set(c.targets) - {m for d in out.values() for m in d["labels_raw"]})
    if unused:
        print(f"replay: warning: --target names models the trace does not have: {', '.join(unused)}",
              file=sys.stderr)
    for d in out.values():
        d["labels"].sort()
    return out


def _intended_reuse(c: plan.RunConfig) -> dict | None:
    """The prefix reuse the trace's hash_ids intend (an unbounded cache), for the report to set
    against the server's own prefix-cache counters."""
    import pyarrow.parquet as pq
    from llm_replay.traces.stats import prefix_cache_hits
    if "hash_ids" not in pq.read_schema(c.trace).names:
        return None
    r = prefix_cache_hits(pq.read_table(c.trace, columns=["hash_ids", "input_tokens"]), c.block_size)
    return None if r is None else {k: r[k] for k in ("token_hit_ratio", "block_hit_ratio")}


def _check_served(c: plan.RunConfig, rows: dict[str, dict], caps_of: dict[str, dict]) -> None:
    """Before sending: every trace model goes to a model its target lists (else an error naming
    the served ones), and no row needs more than that model's context (max_model_len in
    /v1/models: vLLM, SGLang, engine-stub): the server would refuse it, so the run stops naming
    the rows and the way out rather than sending them to fail."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    names = pq.read_schema(c.trace).names
    t = pq.read_table(c.trace, columns=[n for n in ("model", "input_tokens", "output_tokens", "request_id")
                                        if n in names])
    total = pc.add(pc.fill_null(t.column("input_tokens"), 0), pc.fill_null(t.column("output_tokens"), 0)) \
        if "output_tokens" in names else pc.fill_null(t.column("input_tokens"), 0)
    too_long = []
    for url, g in rows.items():
        caps = caps_of.get(url) or {}
        served, lens = caps.get("models") or [], caps.get("max_model_len") or {}
        for label in g["labels_raw"]:
            name = c.target_model(label)
            if served and name not in served:
                how = f"--model-map {label}=SERVED" if label is not None else "--model-map '*=SERVED'"
                raise RunError(f"target {url} does not serve {name!r} (the trace's model {label or '(none)'!r} is "
                               f"sent as {name!r}); it serves: {', '.join(served)}; choose one with {how}")
            if name not in lens:
                continue
            mine = None
            if "model" in names:
                col = t.column("model")
                mine = pc.is_null(col) if label is None else pc.equal(col.cast("string"), label)
            over = pc.greater(total, lens[name])
            sel = over if mine is None else pc.and_(pc.fill_null(mine, False), over)
            k = pc.sum(sel).as_py() or 0
            if k:
                idx = pc.indices_nonzero(pc.fill_null(sel, False)).slice(0, 3)
                first = ("request ids " + ", ".join(pc.take(t.column("request_id"), idx).to_pylist())
                         if "request_id" in names else "rows " + ", ".join(map(str, idx.to_pylist())))
                first += ", ..." if k > 3 else ""
                too_long.append(f"{k} of {t.num_rows} trace rows need more than {name!r}'s context (max_model_len "
                                f"{lens[name]}; input + output tokens up to {pc.max(pc.filter(total, sel)).as_py()}"
                                f"; {first}); the server would refuse them: clip them first, e.g. `replay "
                                f"trace transform {c.trace} --clip-input :{max(1, lens[name] // 2)} --clip-output "
                                f":{max(1, lens[name] // 2)} -o clipped.parquet` (--no-check sends them as they are)")
    if too_long:
        raise RunError("; ".join(too_long))


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _check_apis(target: str, apis: set[str], caps: dict) -> None:
    """A run against an API the target does not stream (a chat-only gateway asked for completions)
    would only record failures: say so before it starts."""
    for api in sorted(apis):
        probe = f"{api}_stream"
        if not caps.get(probe):
            why = caps["errors"].get(probe) or "it streamed no tokens"
            other = next((a for a in PATHS if a != api and caps.get(f"{a}_stream")), None)
            hint = f"; the target streams {PATHS[other]}: use --api {other}" if other else ""
            raise RunError(f"target {target}: POST {PATHS[api]} (stream) failed in the capability check: "
                           f"{why}{hint} (--no-check skips the check)")


def _check_tokenizer(path: str) -> dict:
    """Load the tokenizer once here, so a bad file is an error before the run; run.json
    records which one made the prompts."""
    from . import plan
    from .prompts import PromptError, load_tokenizer
    try:
        tok = load_tokenizer(path)
    except PromptError as e:
        raise RunError(str(e)) from None
    return {"path": str(Path(path).resolve()), "sha256": plan.sha256_file(path),
            "vocab_size": tok.get_vocab_size()}


MAX_ERROR_RATE = 0.5   # --max-error-rate: above it, a completed run exits 1
UNWRITABLE = 3         # the runner's exit code when the run directory could not be written


def run(args) -> int:
    slo = None
    if args.slo:
        from llm_replay import reports
        slo = reports.load_slo(args.slo)  # a bad spec fails before the run, not after
        if getattr(args, "confidence", None) is not None:
            from llm_replay.reports.slo import check_confidence
            slo.confidence = check_confidence(args.confidence)
    if not 0 <= args.max_error_rate <= 1:
        raise RunError(f"--max-error-rate {args.max_error_rate:g}: a share of the requests, from 0 to 1")
    until = getattr(args, "until_decided", False)
    if until and slo is None:
        raise RunError("--until-decided needs --slo: the objectives it runs until they are decided")
    if getattr(args, "max_duration", None) is not None and not until:
        raise RunError("--max-duration is the budget of --until-decided; without it, --duration cuts the trace")
    run_dir, made = claim_run_dir(args.out)
    args.out = str(run_dir)
    try:
        if until:   # the trace and its further passes, up to the budget: RUN_DIR/trace.parquet
            from .until import extend_trace
            extended = extend_trace(args, run_dir)
            args.trace, args.start, args.duration, args.max_requests = str(run_dir / "trace.parquet"), 0.0, None, None
        # listening before the capability probe: its spans (engine-stub exports every 0.5 s) count as own
        receiver = _start_receiver(args.otlp, getattr(args, "otlp_token", None)) \
            if getattr(args, "otlp", None) not in (None, "send") else None
        config, notes = build_config(args)
        prepare_run_dir(config, notes, claimed=True)
        if until:
            from .output import update_run_json
            update_run_json(run_dir, until_decided=extended)
    except BaseException:   # nothing was run: the directory is free again
        (run_dir / "run.json").unlink(missing_ok=True)
        (run_dir / "trace.parquet").unlink(missing_ok=True)
        if made and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise
    if getattr(args, "realtime", False):
        _warn_realtime_beside([config.target, *config.targets.values()])
    try:
        if slo is not None:   # `replay report RUN` then keeps the gate when it writes summary.json again
            (run_dir / "slo.json").write_text(json.dumps({k: v for k, v in slo.to_dict().items() if k != "source"},
                                                         indent=1) + "\n")
        looks = None
        if until:
            from .until import Looks
            looks = Looks(run_dir, slo, config.speed)
        code = _run_child(run_dir, getattr(args, "nice", None), getattr(args, "realtime", False), looks)
        if code == UNWRITABLE:   # the runner said why in one `error:` line; its run.json says failed
            return 2
        if receiver is not None:
            _finish_receiver(receiver, run_dir, config.otlp_wait_s)
        verdict = ""
        if looks is not None and code in (0, 130) and (code == 0 or looks.decided is not None):
            from .output import update_run_json
            looks.look()   # a run faster than the parent's polls: the looks it finished before
            update_run_json(run_dir, until_decided=looks.record(stopped=code == 130),
                            **({"status": "decided"} if code == 130 else {}))
            from llm_replay import reports
            code = reports.evaluate_slo(run_dir, slo).exit_code
            verdict = _until_line(run_dir, code, slo.confidence)
        elif code == 0:
            code, verdict = _verdict(run_dir, getattr(args, "exit_code_on_error", None), args.max_error_rate)
        _summary_now(run_dir, slo, verdict)
    except OSError as e:   # a full disk: one line, and run.json (where it can still be written) says so
        raise RunError(_unwritable(run_dir, e)) from None
    return code


def _unwritable(run_dir: Path, e: OSError) -> str:
    """The one-line reason of a write that failed (ENOSPC, EFBIG, EDQUOT...), also put in run.json."""
    from .output import update_run_json
    why = f"cannot write {e.filename or run_dir}: {os.strerror(e.errno) if e.errno else e}"
    try:
        if json.loads((run_dir / "run.json").read_text()).get("status") not in (None, "running"):
            return f"{why}; the run itself ended and its records are kept: `replay report {run_dir}` when there is room"
        update_run_json(run_dir, status="failed", error=why)
    except (OSError, ValueError):
        pass
    return f"{why}; the run in {run_dir} did not complete"


def _warn_realtime_beside(urls: list[str]) -> None:
    """--realtime next to the server it measures takes CPU from that server (vLLM's TPOT +34/+49%)."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit
    for url in filter(None, urls):
        host = urlsplit(url).hostname or ""
        try:
            addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
        except OSError:
            continue
        for addr in addrs:
            try:
                local = ipaddress.ip_address(addr.split("%")[0]).is_loopback
                if not local:   # this host's own address: one a socket can bind
                    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
                        s.bind((addr, 0))
                        local = True
            except (OSError, ValueError):
                continue
            if local:
                print(f"replay: warning: --realtime with a target on this host ({host}): the runner at SCHED_FIFO "
                      "takes CPU time from the server it measures (vLLM's TPOT rose 34% and 49% in two A/B pairs); "
                      "pin them to different cores or leave --realtime out", file=sys.stderr)
                return


def _summary_now(run_dir: Path, slo, verdict: str) -> None:
    hits = []

    def late_ctrl_c(_sig, _frame):   # a Ctrl-C meant for the run must not cost its summary
        hits.append(1)
        if len(hits) > 1:
            raise KeyboardInterrupt
        print("replay: writing the summary (Ctrl-C again to skip it)", file=sys.stderr)
    old = signal.signal(signal.SIGINT, late_ctrl_c)
    try:
        _print_summary(run_dir, slo)
        if verdict:
            print(verdict)
    finally:
        signal.signal(signal.SIGINT, old)


def _start_receiver(address: str, token: str | None):
    """--otlp: the span receiver, listening before the run starts. A taken port fails here: the
    server exports to the address it was given, so another port would silently receive nothing."""
    from .otlp import PATH, Receiver, is_loopback, parse_address
    try:
        host, port = parse_address(address)
        if not token and not is_loopback(host):
            raise ValueError(f"--otlp {address}: beyond loopback anyone could post spans into this run; set a "
                             "secret with REPLAY_OTLP_TOKEN (or --otlp-token) and the server's "
                             "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20TOKEN")
        rec = Receiver(host, port, token or None)
    except ValueError as e:
        raise RunError(str(e)) from None
    except OSError as e:
        raise RunError(f"--otlp {address}: cannot receive spans there ({e.strerror or e}; another `replay run "
                       "--otlp`?); choose a free address with --otlp HOST:PORT and point the server's traces "
                       "endpoint there (HOST:0: any free port, printed at the start)") from None
    print(f"replay: otlp: receiving spans at http://{rec.address}{PATH} " + ("(token required)" if token else
          "(unauthenticated: any local process can post spans; --otlp-token sets a secret)"), file=sys.stderr)
    return rec


def _finish_receiver(receiver, run_dir: Path, wait_s: float) -> None:
    from .output import update_run_json
    info = json.loads((run_dir / "run.json").read_text())
    if wait_s > 0:
        print(f"replay: waiting up to {wait_s:g} s for the server's last spans (--otlp-wait)", file=sys.stderr)
    o = receiver.finish(run_dir, wait_s, info)
    update_run_json(run_dir, otlp=o)
    odd = ", ".join(f"{o[k]} {w}" for k, w in (
        ("rejected", "with no credible span"), ("impossible", "impossible spans"),
        ("unauthorized", "posts without the token"), ("over_limit", "spans over the limit")) if o.get(k))
    print(f"replay: otlp: {o['matched']} of {o['traced']} traced requests have a server span ({o['missing']} missing, "
          f"{o['unmatched']} spans of other traces, {o['late']} late, {o['bad_posts']} bad posts{', ' if odd else ''}"
          f"{odd}) -> {run_dir / 'spans.parquet'}", file=sys.stderr)


def _verdict(run_dir: Path, on_error: int | None, max_rate: float = MAX_ERROR_RATE) -> tuple[int, str]:
    """The exit code of a run that ended, and the line that states it. A run that lost a worker,
    or in which no request succeeded, did not complete: its status says so and the exit code is
    1; so is a completed one in which more than `max_rate` of the requests failed.
    `--exit-code-on-error N` (Locust's convention): N when any request failed."""
    from .output import update_run_json
    info = json.loads((run_dir / "run.json").read_text())
    counts = info.get("status_counts") or {}
    failed = sum(v for k, v in counts.items() if k != "ok")
    if info.get("lost_workers"):
        update_run_json(run_dir, status="worker_lost")
        print(f"replay: worker(s) {', '.join(map(str, info['lost_workers']))} lost during the run: their rows "
              "are recorded as cancelled/not_sent", file=sys.stderr)
        return 1, ""
    if counts and not counts.get("ok"):
        update_run_json(run_dir, status="all_failed")
        return 1, ""
    total = sum(counts.values())
    if on_error is not None:
        code, rule = (on_error if failed else 0), f"--exit-code-on-error {on_error}"
    else:
        code, rule = int(bool(total) and failed / total > max_rate), f"--max-error-rate {max_rate:.0%}"
    share = f"{failed / total:.0%}" if total else "-"
    return code, f"{failed} of {total} requests failed ({share}; {rule}): exit {code}"


def claim_run_dir(out: str | None) -> tuple[Path, bool]:
    """Make the run directory (default runs/<UTC time>, -2, -3... when taken) and create its run.json
    exclusively, before anything is sent or written: of two runs given one -o, one gets it and the
    other an error. Returns the directory and whether it was made here."""
    base = out or f"runs/{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    run_dir, k = Path(base), 1
    while out is None and run_dir.exists() and k < 100:
        k += 1
        run_dir = Path(f"{base}-{k}")
    made = not run_dir.exists()
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"-o {run_dir}: that is a file, not a run directory; choose another -o")
    if any((run_dir / f).exists() for f in ("records.parquet", "records.arrows")):
        raise RunError(f"{run_dir} already holds a run; choose another -o")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / "run.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise RunError(f"{run_dir} already holds a run (its run.json: another `replay run` with this -o?); "
                       "choose another -o") from None
    except OSError as e:   # a file on the way, no permission, a full disk
        raise RunError(f"-o {run_dir}: cannot make the run directory ({e.strerror}: {e.filename}); "
                       "choose another -o") from None
    with os.fdopen(fd, "w") as f:
        f.write("{}\n")
    return run_dir, made


def prepare_run_dir(config: plan.RunConfig, notes: dict, claimed: bool = False) -> Path:
    """Write run.json (config without secrets, trace hash, host...) into the run directory,
    claimed here unless `claimed` (by `claim_run_dir`)."""
    from . import plan
    run_dir = Path(config.run_dir)
    if not claimed:
        claim_run_dir(str(run_dir))
    from .output import update_run_json
    update_run_json(run_dir, config=config.to_json(), target=config.target,
                    trace={"path": str(Path(config.trace).resolve()), "sha256": plan.sha256_file(config.trace),
                           "rows": config.rows},
                    tool={"name": "llm-replay", "version": __version__, "python": platform.python_version()},
                    host=platform.node(), workers=config.workers + config.remote_workers,
                    started_wall=time.time(), status="running", **notes)
    return run_dir


STOP_MARGIN_S = 15.0   # after a forwarded Ctrl-C/SIGTERM and the grace time, a stuck runner is killed


def _until_line(run_dir: Path, code: int, confidence: float) -> str:
    """The last line of a run until decided: what was decided, at which look, with how many rows."""
    info = json.loads((run_dir / "run.json").read_text())
    u, counts = info["until_decided"], info.get("status_counts") or {}
    what = {0: "passed", 1: "failed"}.get(code, "undecided")
    how = f"decided at look {u['look']}" if u["decided"] else f"not decided within the budget ({u['look']} looks)"
    left = f"; {counts.get('not_sent', 0):,} rows not sent" if u["stopped"] else ""
    return (f"until decided: {what}, {how}: judged the first {u['judged_rows']:,} of {u['rows']:,} rows at "
            f"{u['confidence_per_look']:.2%} (the looks' error rates sum to at most "
            f"{1 - confidence:.0%}){left}: exit {code}")


def _run_child(run_dir: Path, nice: int | None = None, realtime: bool = False, looks=None) -> int:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    from .output import update_run_json
    from .priority import Priority
    prio = Priority(nice, realtime)
    prio.before_start()
    # our session (a new one is a CPU group of its own: priority.py), its own process group:
    # Ctrl-C at a terminal reaches only us, and we forward it once
    from . import scrape
    scraper = scrape.start(run_dir)   # first: its imports are done by T0, its first sample before it
    env[scrape.OWNED] = "1"
    child = subprocess.Popen([sys.executable, "-m", "llm_replay.replay.runner", str(run_dir)], env=env,
                             preexec_fn=prio.in_child)
    update_run_json(run_dir, scheduling=prio.after_start(child.pid))
    for err in prio.errors:
        print(f"replay: warning: {err}", file=sys.stderr)
    asked: list[float] = []   # when we forwarded a signal

    def forward(sig, _frame) -> None:
        asked.append(time.monotonic())
        child.send_signal(sig)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    from .hostcpu import CpuSampler
    sampler = CpuSampler(child.pid)   # while we wait anyway: the client's and the host's CPU
    grace = float(json.loads((run_dir / "run.json").read_text())["config"].get("grace_s") or 0)
    try:
        while True:
            try:
                rc = child.wait(timeout=min(max(0.0, sampler.due - time.monotonic()) if sampler.ok else 0.5,
                                             0.5 if looks is not None else 60.0))
                break
            except subprocess.TimeoutExpired:
                if sampler.ok:
                    sampler.sample()
                if looks is not None and not asked and looks.look():   # decided: stop sending
                    update_run_json(run_dir, stop_reason="decided: the SLO gate reached its verdict")
                    asked.append(time.monotonic())
                    child.send_signal(signal.SIGINT)
                # a runner stuck in a computation never sees the signal (its handler runs in its
                # event loop): after the grace and a margin it is killed, its records salvaged
                if asked and time.monotonic() > asked[0] + grace + STOP_MARGIN_S and child.poll() is None:
                    print(f"replay: the runner did not stop within {grace + STOP_MARGIN_S:g} s of the signal; "
                          "killing it (its flushed records are kept)", file=sys.stderr)
                    child.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        prio.restore()
        if scraper is not None:   # stdin closed: a last sample, then server_metrics.parquet
            scraper.stdin.close()
            try:
                scraper.wait(15)
            except subprocess.TimeoutExpired:
                scraper.kill()
    if rc == UNWRITABLE:   # nothing more to write where writing failed
        return rc
    t0_wall = json.loads((run_dir / "run.json").read_text()).get("t0_wall")
    if t0_wall:
        sampler.write(run_dir, t0_wall)
    if rc not in (0, 130):  # the runner died: keep what it flushed, account for every other row
        from . import plan
        from .recorder import salvage
        info = json.loads((run_dir / "run.json").read_text())
        config = plan.RunConfig.from_json(info["config"])
        kept, added = salvage(run_dir, config, time.time() - info.get("t0_wall", time.time()))
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        counts = {v["values"]: v["counts"] for v in pc.value_counts(
            pq.read_table(run_dir / "records.parquet", columns=["status"]).column("status").combine_chunks()
        ).to_pylist()} if (run_dir / "records.parquet").exists() else {}
        update_run_json(run_dir, status="failed", runner_exit=rc, ended_wall=time.time(),
                        status_counts=dict(sorted(counts.items())))
        print(f"replay: the runner exited with {rc}; {kept} records flushed before that were kept, "
              f"{added} rows without one recorded as cancelled/not_sent", file=sys.stderr)
        return 1
    return rc


def _print_summary(run_dir: Path, slo=None) -> None:
    """The reports summary table (also written as summary.json/.md and report.html)."""
    from llm_replay import reports
    info = json.loads((run_dir / "run.json").read_text())
    counts = info.get("status_counts") or {}
    if (run_dir / "records.parquet").exists():
        print(reports.format_summary(reports.summarize_run(run_dir, slo=slo)), end="")
    print(f"status: {info.get('status')}  " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"run directory: {run_dir}  (report.html, summary.json, summary.md)")
