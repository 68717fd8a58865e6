"""Pre-flight of `replay run` (and the locustfile): everything decided before a request is sent.

`build_config` turns the options into a `RunConfig` and run.json notes in named steps: read the
trace's facts once, route its models to targets, map them to served models, check that every row
fits its model's context, read their cache state, probe the targets (`replay check`), choose the
prompt mode, calibrate text prompts and, with --reset-cache, empty their prefix caches. Any refusal
is a `RunError` (one `error:` line, exit 2), before the run.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path


class RunError(ValueError):
    exit_code = 2


# what the pre-flight needs of the whole trace, read in one pass: the columns that route, size and name the rows
FACT_COLUMNS = ("model", "api", "num_images", "input_tokens", "output_tokens", "request_id", "hash_ids",
                "reasoning_tokens")


def parse_targets(values: list[str]) -> tuple[str, dict[str, str]]:
    """`--target` values -> (default URL or "", {trace model: URL}), every URL normalised."""
    default, per_model = "", {}
    for v in values:
        label, url = ("", v) if re.match(r"https?://", v) else (v.partition("=")[0], v.partition("=")[2])
        if not re.match(r"https?://[^/\s]+", url) or (label == "" and v != url):
            raise RunError(f"--target {v!r}: expected an http:// or https:// URL or MODEL=URL, e.g. http://127.0.0.1:8000")
        url = url.rstrip("/").removesuffix("/v1")
        if not label:
            if default:
                raise RunError(f"--target: two default targets ({default}, {url}); name the others: --target MODEL=URL")
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
            named[v.partition("=")[0]] = v.partition("=")[2]
        elif default is not None:
            raise RunError(f"{flag}: two defaults ({default}, {v}); name the model of the others: {flag} MODEL=...")
        else:
            default = v
    return default, named


def http_json(target: str, path: str, body: dict | None = None, key: str | None = None, timeout: float = 30.0) -> dict:
    """One blocking JSON call to the target; any failure (HTTP error, refused, timeout, a body
    that is not a JSON object) is a RunError naming the target, the method, the path and why."""
    method, data = ("GET", None) if body is None else ("POST", json.dumps(body).encode())
    where = f"target {target}: {method} {path}"
    status, raw, ctype = http_call(target.rstrip("/") + path, method, key, timeout, data)
    if isinstance(status, str):
        raise RunError(f"{where} failed: {status}")
    if not 200 <= status < 300:
        raise RunError(f"{where} -> HTTP {status}: {_snippet(raw)}")
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise RunError(f"{where} -> HTTP 200 but not a JSON object ({ctype}): {_snippet(raw)}")
    return obj


def http_call(url: str, method: str = "GET", key: str | None = None, timeout: float = 10.0,
              data: bytes | None = None) -> tuple[int | str, bytes, str]:
    """(HTTP status, body, Content-Type) of one request (`data`: a JSON body), or (why it failed, b"", "")."""
    import urllib.error
    import urllib.request   # http.client: not while `replay --help` builds the parser
    headers = {**({"Content-Type": "application/json"} if data is not None else {}),
               **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type") or "no Content-Type"
    except urllib.error.HTTPError as e:
        return e.code, e.read(), ""
    except (urllib.error.URLError, OSError, ValueError) as e:   # refused, DNS, timeout, bad URL
        return str(getattr(e, "reason", None) or e), b"", ""


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
        raise RunError(f"target {target}: GET /v1/models -> not an OpenAI model list; pass --model-map '*=NAME'") from None


def build_config(args) -> tuple:
    """(RunConfig, run.json notes) from the options, or a RunError before anything is sent."""
    import pyarrow.parquet as pq
    c = config_from_options(args)
    facts = pq.read_table(c.trace, columns=[n for n in FACT_COLUMNS if n in pq.read_schema(c.trace).names])
    rows = route_targets(c, facts)     # {url: {"labels": [...], "apis": {...}, "rows": n, ...}}
    listed = map_models(c, args, rows)
    if not args.no_check:
        check_served(c, rows, listed, facts)
    notes: dict = {}
    cache = cache_states(c, rows)   # before the probes: what the targets had served before this run
    caps_of = probe_targets(c, args, rows, notes)
    _intended_reuse(c, facts, notes)
    text_apis = choose_prompt_mode(c, args, rows, caps_of, facts)
    if c.tokenizer and not text_apis:
        print(f"replay: --tokenizer unused: {c.prompt_mode} prompts only", file=sys.stderr)
    elif c.tokenizer:
        exact_text(c, rows, text_apis, notes)
    elif text_apis:
        calibrate(c, rows, listed, caps_of, text_apis, notes)
    if getattr(args, "reset_cache", False):   # after the last probe: the trace's first request finds it empty
        reset_caches(c, rows, cache)
    notes["cache_state"] = cache.get(c.target) or next(iter(cache.values()))
    for url in notes.get("targets", {}):
        notes["targets"][url]["cache_state"] = cache[url]
    return c, notes


def config_from_options(args):
    """The options checked and copied into a RunConfig; the trace window scanned and validated."""
    from . import plan   # numpy, pyarrow: not while `replay --help` builds the parser
    if args.speed <= 0:
        raise RunError("--speed must be > 0")
    target, targets = parse_targets(args.target if isinstance(args.target, list) else [args.target])
    if not target and not targets:
        raise RunError("--target: no target given")
    key_env, key_envs = per_model(args.api_key_env or [], "--api-key-env")
    scrape, scrapes = per_model(args.scrape or [], "--scrape")
    if args.workers < 1 or args.remote_workers < 0 or args.preconnect < 0:
        raise RunError("--workers must be >= 1, --remote-workers and --preconnect >= 0")
    host, _, port = args.master_bind.rpartition(":")
    same = ("api", "speed", "max_requests", "warmup", "preconnect", "workers", "remote_workers", "seed",
            "image_url_base", "sessions", "tokenizer")   # the option's name is the field's
    secs = ("start", "duration", "timeout", "grace", "max_delay", "scrape_interval")   # option X: field X_s
    c = plan.RunConfig(trace=str(args.trace), target=target, targets=targets, run_dir=args.out,
                       **{k: getattr(args, k) for k in same}, **{f"{k}_s": getattr(args, k) for k in secs},
                       api_key_env=key_env, api_key_envs=key_envs, scrape_url=scrape, scrapes=scrapes,
                       master_host=host or "0.0.0.0", master_port=int(port) if args.remote_workers and port.isdigit() else 0,
                       salt=secrets.randbits(32) if args.salt is None else args.salt, run_id=secrets.token_hex(8),
                       progress=not args.no_progress, spin_s=max(0.0, args.spin_ms) / 1e3, otlp=getattr(args, "otlp", None),
                       otlp_wait_s=max(0.0, getattr(args, "otlp_wait", 10.0)))
    c.rows, c.window_s = plan.scan(c)
    from llm_replay.traces.validate import timing_warnings
    for w in timing_warnings(c.trace, c.max_delay_s):   # a gap or delay that would keep the run waiting
        print(f"replay: warning: {w}", file=sys.stderr)
    c.block_size = plan.trace_block_size(c.trace)
    for var in {key_env, *key_envs.values()} - {None}:
        if not os.environ.get(var):
            raise RunError(f"--api-key-env {var}: that environment variable is not set")
    return c


def route_targets(c, facts) -> dict[str, dict]:
    """Which trace models, APIs and how many rows of the whole trace go to each target; a model
    with no target (no MODEL=URL and no default URL) is an error before the run."""
    import pyarrow as pa
    import pyarrow.compute as pc
    n = facts.num_rows
    model = facts.column("model") if "model" in facts.column_names else pa.nulls(n, pa.string())
    api = pc.fill_null(facts.column("api"), c.api) if "api" in facts.column_names else pa.array([c.api] * n)
    if "num_images" in facts.column_names:
        chat = pc.fill_null(pc.greater(facts.column("num_images"), 0), False)
        n_img = pc.sum(chat).as_py() or 0
        if n_img:
            api = pc.if_else(chat, "chat", api)
            how = f"images from {c.image_url_base}" if c.image_url_base else "generated PNG images"
            print(f"replay: {n_img} rows carry images: sent as chat requests with {how}", file=sys.stderr)
    keys = pa.table({"model": model.cast(pa.string()), "api": api.cast(pa.string())})
    out: dict[str, dict] = {}
    unrouted: dict = {}
    for g in keys.group_by(["model", "api"]).aggregate([([], "count_all")]).to_pylist():
        label, url = g["model"], c.target_of(g["model"])
        if not url:
            unrouted[label] = unrouted.get(label, 0) + g["count_all"]
            continue
        d = out.setdefault(url, {"labels": [], "labels_raw": [], "apis": set(), "rows": 0,
                                 "key": os.environ.get(c.key_env_of(label) or "")})
        if label not in d["labels_raw"]:
            d["labels_raw"].append(label)
        d["apis"].add(g["api"])
        d["rows"] += g["count_all"]
    if unrouted:
        names = ", ".join(f"{'(none)' if m is None else repr(m)} ({k} rows)" for m, k in unrouted.items())
        raise RunError(f"trace models with no target: {names}: add --target MODEL=URL for each, or a default URL")
    unused = sorted(set(c.targets) - {m for d in out.values() for m in d["labels_raw"]})
    if unused:
        print(f"replay: warning: --target names models the trace does not have: {', '.join(unused)}", file=sys.stderr)
    for d in out.values():
        d["labels"] = sorted("(none)" if m is None else m for m in d["labels_raw"])
    return out


def map_models(c, args, rows: dict[str, dict]) -> dict[str, dict]:
    """--model-map into the config, each target's model list (before the capability probe: a
    model the target does not serve is refused before a single request is sent), and without
    '*=NAME' each target's first served model for the trace models the map does not name.
    Returns {url: served_models(url)} for the targets that listed theirs."""
    bad = [m for m in args.model_map if "=" not in m]
    if bad:
        raise RunError(f"--model-map expects TRACE=SERVED, got {bad[0]!r}")
    c.model_map = dict(m.split("=", 1) for m in args.model_map)
    c.default_model = c.model_map.pop("*", None)
    listed: dict[str, dict] = {}
    for url, g in rows.items():
        if c.default_model is None or not args.no_check:
            try:
                listed[url] = served_models(url, g["key"])
            except RunError:   # with '*=NAME', no model list: the probe says what the target does answer
                if c.default_model is None:
                    raise
    if c.default_model is not None:
        return listed
    for url, g in rows.items():
        served = listed[url]["models"]
        if not served:
            raise RunError(f"target {url} serves no models (GET /v1/models is empty)")
        c.served_defaults[url] = served[0]   # also the model text prompts are calibrated on
        unmapped = [m for m in g["labels"] if m not in c.model_map]
        to = f"{served[0]!r} (" + ("the target's first served model" if len(rows) == 1 else f"the first model {url} serves")
        if unmapped and c.model_map:
            print(f"replay: trace models not in --model-map ({', '.join(unmapped)}) -> {to})", file=sys.stderr)
        elif unmapped:
            which = "" if len(rows) == 1 else f"({', '.join(unmapped)}) "
            print(f"replay: trace models {which}-> {to}; change with --model-map TRACE=SERVED)", file=sys.stderr)
    c.default_model = c.served_defaults.get(c.target) or next(iter(c.served_defaults.values()))
    return listed


def check_served(c, rows: dict[str, dict], listed: dict[str, dict], t) -> None:
    """Before sending: every trace model goes to a model its target lists (else an error naming
    the served ones), and no row needs more than that model's context (max_model_len in
    /v1/models: vLLM, SGLang, engine-stub): the server would refuse it, so the run stops naming
    the rows and the way out rather than sending them to fail."""
    import pyarrow.compute as pc
    total = pc.fill_null(t.column("input_tokens"), 0)
    if "output_tokens" in t.column_names:
        total = pc.add(total, pc.fill_null(t.column("output_tokens"), 0))
    too_long = []
    for url, g in rows.items():
        caps = listed.get(url) or {}
        served, lens = caps.get("models") or [], caps.get("max_model_len") or {}
        for label in g["labels_raw"]:
            name = c.target_model(label)
            if served and name not in served:
                how = f"--model-map {label}=SERVED" if label is not None else "--model-map '*=SERVED'"
                raise RunError(f"target {url} does not serve {name!r} (trace model {label or '(none)'!r}); it serves: "
                               f"{', '.join(served)}; choose one with {how}")
            if name not in lens:
                continue
            over = pc.greater(total, lens[name])
            if "model" in t.column_names:
                col = t.column("model")
                mine = pc.is_null(col) if label is None else pc.equal(col.cast("string"), label)
                over = pc.and_(pc.fill_null(mine, False), over)
            k = pc.sum(over).as_py() or 0
            if k:
                idx = pc.indices_nonzero(pc.fill_null(over, False)).slice(0, 3)
                named = "request_id" in t.column_names
                first = ", ".join(map(str, (pc.take(t.column("request_id"), idx) if named else idx).to_pylist()))
                half, most = max(1, lens[name] // 2), pc.max(pc.filter(total, over)).as_py()
                too_long.append(f"{k} of {t.num_rows} trace rows need more than {name!r}'s context (max_model_len "
                                f"{lens[name]}; input + output tokens up to {most}; {'request ids' if named else 'rows'} "
                                f"{first}{', ...' if k > 3 else ''}); clip them: `replay trace transform {c.trace} "
                                f"--clip-input :{half} --clip-output :{half} -o clipped.parquet` (or --no-check)")
    if too_long:
        raise RunError("; ".join(too_long))


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# the engines' prefix-cache resets, tried in this order: vLLM's (served with VLLM_SERVER_DEV_MODE=1), SGLang's
CACHE_RESETS = ("/reset_prefix_cache", "/flush_cache")


def cache_states(c, rows: dict[str, dict]) -> dict[str, dict]:
    """run.json `cache_state` of each target, from one GET of its /metrics (its --scrape URL where given)
    before the first probe: `warm` when vLLM's prefix-cache query counter says it has served prompts,
    `cold` when it has served none, else `uncontrolled`; `uptime_s` from process_start_time_seconds."""
    import time
    from prometheus_client.parser import text_string_to_metric_families
    from .scrape import sources
    metrics_of = {t or c.target: u for u, t in reversed(sources(c))}
    out = {}
    for url, g in rows.items():
        _, body, _ = http_call(metrics_of.get(url, url + "/metrics"), key=g["key"], timeout=5.0)
        values: dict[str, float] = {}
        try:
            for s in (x for fam in text_string_to_metric_families(body.decode()) for x in fam.samples):
                values[s.name] = values.get(s.name, 0.0) + s.value   # summed over its models and engines
        except (ValueError, IndexError):   # not a Prometheus page (an HTML page, a JSON answer)
            values = {}
        queries, start = values.get("vllm:prefix_cache_queries_total"), values.get("process_start_time_seconds")
        out[url] = {"state": "uncontrolled" if queries is None else "warm" if queries > 0 else "cold", "reset": None,
                    "uptime_s": None if start is None else round(time.time() - start, 1)}
    return out


def reset_caches(c, rows: dict[str, dict], cache: dict[str, dict]) -> None:
    """--reset-cache: each target's prefix cache emptied by the first of CACHE_RESETS that answers 2xx
    (kept in `c.cache_resets`: the runner resets again after --warmup); none: a RunError."""
    for url, g in rows.items():
        tried = []
        for path in CACHE_RESETS:
            status, _, _ = http_call(url + path, "POST", g["key"])
            if isinstance(status, int) and 200 <= status < 300:
                break
            tried.append(f"POST {path} -> {f'HTTP {status}' if isinstance(status, int) else status}")
        else:
            raise RunError(f"--reset-cache: target {url} has no cache reset endpoint ({'; '.join(tried)}; vLLM serves "
                           "/reset_prefix_cache with VLLM_SERVER_DEV_MODE=1); drop --reset-cache to run uncontrolled")
        c.cache_resets[url] = path
        cache[url].update(state="cold", reset=path)
        print(f"replay: cache reset: POST {url}{path}", file=sys.stderr)


def probe_targets(c, args, rows: dict[str, dict], notes: dict) -> dict[str, dict]:
    """`replay check` of every target (unless --no-check): {url: capabilities}; an API a target
    does not stream is refused here, and run.json notes what each target answered."""
    caps_of: dict[str, dict] = {}
    if not args.no_check:
        from .check import probe
        from .otlp import traceparent
        headers = {"traceparent": traceparent(c.run_id, "probe")[0]} if getattr(args, "otlp", None) else None
        caps_of = {url: probe(url, g["key"], headers=headers) for url, g in rows.items()}
        first = c.target if c.target in caps_of else next(iter(caps_of), None)
        notes["capabilities"] = caps_of.get(first, {})
    if len(rows) > 1:
        notes["targets"] = {url: {"models": g["labels"], "rows": g["rows"], "served_model": c.served_defaults.get(url),
                                  **({"capabilities": caps_of[url]} if url in caps_of else {})}
                            for url, g in rows.items()}
        print("replay: targets: " + "; ".join(f"{', '.join(g['labels'])} -> {url}" for url, g in rows.items()), file=sys.stderr)
    # a run against an API the target does not stream (a chat-only gateway asked for completions)
    # would only record failures: say so before it starts
    for url, caps in caps_of.items():
        for api in sorted(a for a in rows[url]["apis"] if not caps.get(f"{a}_stream")):
            other = next((a for a in PATHS if a != api and caps.get(f"{a}_stream")), None)
            hint = f"; the target streams {PATHS[other]}: use --api {other}" if other else ""
            raise RunError(f"target {url}: POST {PATHS[api]} (stream) failed in the capability check: "
                           f"{caps['errors'].get(f'{api}_stream') or 'it streamed no tokens'}{hint} (or --no-check)")
    return caps_of


def _intended_reuse(c, facts, notes: dict) -> None:
    """The prefix reuse the trace's hash_ids intend (an unbounded cache), for the report to set
    against the server's own prefix-cache counters."""
    from llm_replay.traces.stats import prefix_cache_hits
    r = "hash_ids" in facts.column_names and prefix_cache_hits(facts.select(["hash_ids", "input_tokens"]), c.block_size)
    if r:
        notes["intended_prefix_reuse"] = {k: r[k] for k in ("token_hit_ratio", "block_hit_ratio")}


def choose_prompt_mode(c, args, rows: dict[str, dict], caps_of: dict[str, dict], facts) -> set[str]:
    """Token ids or text, forced output lengths, reasoning counts: what every target accepts unless
    the options say otherwise. Returns the APIs that send text prompts (chat rows, and completions
    rows in text mode)."""
    caps = list(caps_of.values())
    ids_ok = all(k.get("token_id_prompts", True) for k in caps)   # every target, or text for all
    c.prompt_mode = args.prompt_mode or ("ids" if c.api == "completions" and ids_ok else "text")
    force_ok = all(k.get("min_tokens_ignore_eos", True) for k in caps)
    c.force_output_len = force_ok if args.force_output_len is None else args.force_output_len
    c.ask_reasoning = all(k.get("reasoning_tokens_request", True) for k in caps)
    if caps and "reasoning_tokens" in facts.column_names:
        print("replay: the trace's reasoning_tokens " + ("go in each chat request's reasoning_tokens field" if
              c.ask_reasoning else "are not sent: the target takes no count (a real server reasons as long as it "
              "decides); the report compares the reasoning share it generated with the trace's"), file=sys.stderr)
    if caps:
        print(f"replay: prompt mode {c.prompt_mode}, force output length {'on' if c.force_output_len else 'off'} "
              f"(from `replay check` of the target{'s' if len(caps) > 1 else ''})", file=sys.stderr)
    return {a for g in rows.values() for a in g["apis"] if a == "chat" or c.prompt_mode == "text"}


def _model_of(c, g: dict) -> str | None:
    """The served model a target's text prompts are made for: its first trace model's."""
    return c.target_model(g["labels_raw"][0]) if g["labels_raw"] else c.default_model


def exact_text(c, rows: dict[str, dict], text_apis: set[str], notes: dict) -> None:
    """--tokenizer: text prompts cut to exact token counts (no calibration); a chat template's own
    tokens, which the server counts within input_tokens, are measured per target."""
    from . import plan
    from .prompts import load_tokenizer, template_tokens
    tok = load_tokenizer(c.tokenizer)   # here, so a bad file is an error (PromptError) before the run
    notes["tokenizer"] = {"path": str(Path(c.tokenizer).resolve()), "sha256": plan.sha256_file(c.tokenizer),
                          "vocab_size": tok.get_vocab_size()}
    for url, g in rows.items():
        if "chat" in text_apis and "chat" in g["apis"]:
            c.template_tokens["chat" if url == c.target else f"chat@{url}"] = template_tokens(
                lambda p, b: http_json(url, p, b, g["key"]), _model_of(c, g), tok, c.seed)
    chat = ", ".join(f"{v} tokens ({k})" for k, v in c.template_tokens.items())
    print(f"replay: text prompts cut to exact token counts with {c.tokenizer} (vocab {tok.get_vocab_size()}; "
          f"no calibration{'; chat template ' + chat if chat else ''})", file=sys.stderr)


def calibrate(c, rows: dict[str, dict], listed: dict[str, dict], caps_of: dict[str, dict], text_apis: set[str], notes: dict):
    """Words per token of each deployment's tokenizer, per API, from probe prompts."""
    from . import prompts
    c.calibration, notes["calibration"] = {}, {}
    for url, g in rows.items():
        key, model = g["key"], _model_of(c, g)
        context = ((listed.get(url) or caps_of.get(url) or {}).get("max_model_len") or {}).get(model)
        for api in sorted(a for a in g["apis"] if a in text_apis):
            name = api if url == c.target else f"{api}@{url}"
            a, b, probes = prompts.calibrate(lambda p, b: http_json(url, p, b, key), api, model, c.seed, context)
            c.calibration[name] = (a, b)
            # the probes' spread under the line: how far a prompt may stray from it (0: a word
            # is a token, as on engine-stub and common BPE vocabularies)
            spread = max(a + b * w - t for w, t in probes)
            notes["calibration"][name] = {"tokens": f"{a:.2f} + {b:.4f} * words", "probes": probes,
                                          "max_model_len": context, "max_over_tokens": int(spread + 0.999)}
