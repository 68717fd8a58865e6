"""`engine-stub serve`: parse options, start the HTTP server, build the engine, print the ready line.

The ready line `engine-stub ready: http://HOST:PORT` is printed (and flushed) once the engine has
warmed up and the socket accepts connections; tests and `replay demo` wait for it.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import fields, replace

from .answer import REASONING_FIELDS, AnswerOptions, parse_reasoning
from .config import POLICIES, PRESETS, TENANT_POLICIES, EngineConfig
from .faults import DroppedConnection, FaultConfig, Faults
from .images import MERGE, PATCH, ImageOptions
from .pacing import PROFILES
from .server import ServerOptions, build_app

KEY_ENV = "ENGINE_STUB_API_KEY"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine-stub", description="A small vLLM in torch (reference target).")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    a = s.add_argument
    a("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    a("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    a("--model", action="append", dest="models", metavar="NAME=PRESET",
      help=f"serve PRESET as NAME, or PRESET under its own name; repeatable ({', '.join(PRESETS)}; default tiny)")
    a("--lora", action="append", default=[], metavar="NAME[=BASE]", help="seeded LoRA adapter (BASE: first model)")
    a("--lora-rank", type=int, default=8, help="rank of each seeded LoRA adapter (default 8)")
    a("--max-loras", type=int, default=2, help="distinct adapters per step")
    a("--block-size", type=int, default=16, help="tokens per KV-cache block, the prefix-cache unit (default 16)")
    a("--num-blocks", type=int, help=f"KV blocks per model (default {EngineConfig.DEFAULT_NUM_BLOCKS})")
    a("--kv-cache-bytes", type=int, help="KV budget in bytes per model (instead of --num-blocks)")
    a("--max-num-seqs", type=int, default=64)
    a("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    a("--max-model-len", type=int, default=EngineConfig.max_model_len, help="longest prompt + output (clamped)")
    a("--policy", choices=POLICIES, default="chunked")
    a("--tenant-policy", choices=TENANT_POLICIES, default="fcfs", help="fair: admit the least-served `user` first")
    a("--no-prefix-caching", action="store_true")
    a("--prefix-cache-ttl", type=float, metavar="SECONDS", help="evict a cached prefix block free this long")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    a("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    a("--seed", type=int, default=0, help="sampling seed for requests without their own")
    a("--threads", type=int, default=1, help="torch threads (default 1: a load generator shares the cores)")
    a("--engine-process", action="store_true", help="run the engine loop in a child process (no GIL sharing)")
    a("--otlp-traces-endpoint", metavar="URL", help="export vLLM's llm_request spans over OTLP/HTTP to URL")
    a("--emulate", choices=sorted(PROFILES), help="pace steps and size the KV cache like this model+GPU")
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="KEY", help=f"require `Bearer KEY` on /v1/* (better: ${KEY_ENV})")
    key.add_argument("--api-key-file", metavar="PATH", help="read the API key from the first line of PATH")
    a("--max-waiting", type=int, default=0, help="429 when this many requests wait (0: unbounded)")
    a("--max-body-bytes", type=int, default=4 << 20)
    a("--reasoning", metavar="SHARE|N", help="chat answers start with reasoning: a share (0.3, 30%%) or N tokens")
    a("--reasoning-field", choices=REASONING_FIELDS, default="reasoning_content", help="delta field of reasoning")
    a("--tool-calls", action="store_true", help="chat requests that offer `tools` get a tool call as their answer")
    a("--image-patch", type=int, default=PATCH, help=f"vision patch side in pixels (default {PATCH})")
    a("--image-merge", type=int, default=MERGE, help=f"spatial merge of patches (default {MERGE})")
    for name, help_ in [("error-rate", "HTTP 500"), ("reject-rate", "HTTP 429"), ("stall-rate", "stalls (default 1)"),
                        ("drop-rate", "dropped streams"), ("malformed-rate", "one broken SSE event")]:
        a(f"--fault-{name}", type=float, default=1.0 if name == "stall-rate" else 0.0, help=f"fraction of {help_}")
    a("--fault-stall-ms", type=float, default=0.0, help="pause streams this long at their midpoint")
    a("--fault-seed", type=int, default=0)
    a("--log-level", default="warning")
    return parser


def api_key(args) -> str | None:
    """The key: --api-key, else the first line of --api-key-file, else $ENGINE_STUB_API_KEY (empty: none)."""
    if args.api_key_file is None:
        return args.api_key or os.environ.get(KEY_ENV) or None
    try:
        with open(args.api_key_file) as f:
            key = f.readline().strip()
    except OSError as e:
        raise ValueError(f"--api-key-file {args.api_key_file}: {e.strerror}") from None
    if not key:
        raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
    return key


def parse_models(specs: list[str] | None, loras: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """-> ({served name: preset}, {adapter name: base name})"""
    models: dict[str, str] = {}
    for spec in specs or ["tiny"]:
        name, _, preset = spec.partition("=")
        preset = preset or name
        if preset not in PRESETS:
            raise ValueError(f"--model {spec}: unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
        if name in models:
            raise ValueError(f"--model {spec}: name {name!r} given twice")
        models[name] = preset
    adapters: dict[str, str] = {}
    for spec in loras:
        name, _, base = spec.partition("=")
        base = base or next(iter(models))
        if base not in models:
            raise ValueError(f"--lora {spec}: unknown base model {base!r}")
        if name in models or name in adapters:
            raise ValueError(f"--lora {spec}: name {name!r} already served")
        adapters[name] = base
    return models, adapters


def from_args(cls, args, prefix: str = "", **given):
    """A `cls` from the options named like its fields (`--PREFIX-FIELD`), and `given`."""
    return cls(**{f.name: getattr(args, prefix + f.name) for f in fields(cls) if hasattr(args, prefix + f.name)}
               | given)


def engine_configs(args, models: dict[str, str], adapters: dict[str, str]) -> dict[str, EngineConfig]:
    base = from_args(EngineConfig, args, enable_prefix_caching=not args.no_prefix_caching)
    if args.emulate and args.num_blocks is None and args.kv_cache_bytes is None:
        from .pacing import Pacer
        base = replace(base, num_blocks=Pacer(PROFILES[args.emulate]).num_blocks(args.block_size))
    return {name: replace(base, model=PRESETS[preset],
                          lora_names=tuple(a for a, b in adapters.items() if b == name)).resolved()
            for name, preset in models.items()}


async def serve(args) -> int:
    import torch
    import uvicorn

    from .engine import AsyncEngine, EngineLoop, ProcessBackend, build_cores
    from .server import Served

    torch.set_num_threads(args.threads)
    models, adapters = parse_models(args.models, args.lora)
    configs = engine_configs(args, models, adapters)
    faults = Faults(from_args(FaultConfig, args, "fault_"))
    answer = AnswerOptions(parse_reasoning(args.reasoning), args.reasoning_field, args.tool_calls)
    images = from_args(ImageOptions, args, "image_")
    app, state = build_app(ServerOptions(api_key(args), args.max_waiting, args.max_body_bytes, answer, images), faults)

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        raise ValueError(f"cannot bind {args.host}:{args.port}: {e.strerror}") from None
    host, port = sock.getsockname()[:2]
    # uvicorn re-raises the signal that stopped it once it has shut down; exit 0 instead of dying by it
    signal.signal(signal.SIGTERM, lambda *_: None)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False,
                                           timeout_graceful_shutdown=0.5, lifespan="off"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))

    loop = asyncio.get_running_loop()
    if args.engine_process:
        backend = ProcessBackend(configs, args.emulate, args.threads)
        engine = AsyncEngine(backend.cores, backend)
        await loop.run_in_executor(None, backend.start, engine.deliver, loop)
    else:
        cores, metrics = await loop.run_in_executor(None, build_cores, configs, args.emulate)
        backend = EngineLoop(cores, lambda outs: loop.call_soon_threadsafe(engine.deliver, outs), metrics)
        engine = AsyncEngine(cores, backend)
    for name, cfg in configs.items():
        state.served[name] = Served(name)
        for i, adapter in enumerate(cfg.lora_names, start=1):
            state.served[adapter] = Served(name, i, parent=name)
    state.engine = engine
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if serving.done():  # stopped by a signal during startup (0), or could not serve (1)
            return 0 if server.should_exit else 1
        print(f"engine-stub ready: http://{f'[{host}]' if ':' in host else host}:{port}", flush=True)
        await serving
    finally:
        engine.stop()
    return 0


class _QuietDrops(logging.Filter):
    """An injected dropped connection is not a server error worth a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None and not isinstance(exc, DroppedConnection):
            exc = getattr(exc, "exceptions", [None])[0] if hasattr(exc, "exceptions") else exc.__cause__
        return exc is None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.api_key:
        print(f"warning: --api-key shows the key to every local user (ps); set {KEY_ENV} or use --api-key-file",
              file=sys.stderr, flush=True)
    logging.getLogger("uvicorn.error").addFilter(_QuietDrops())
    try:
        return asyncio.run(serve(args))
    except (ValueError, RuntimeError) as e:  # bad options: 2; the engine could not start (device, memory, process): 1
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
