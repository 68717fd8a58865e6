"""The engine: ModelRunner (a SchedulerOutput as one flat batch through the model, then
sampling), EngineCore (one model: scheduler + runner + output processing), EngineLoop (the
thread that steps every core round-robin and emits one batch of outputs per step), AsyncEngine
(the asyncio side: per-request queues) and ProcessBackend (`--engine-process`: the loop in a
child process).

ModelRunner puts decodes (one new token) first in the flat batch so attention can batch them;
prefill chunks follow. Only requests whose chunk reaches the end of their known tokens sample.
ProcessBackend keeps model compute from holding the server's GIL: same surface as EngineLoop
(add / abort / num_waiting / render_metrics / reset_prefix_cache / stop); outputs and metrics travel
over multiprocessing queues (one message per engine step).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from .attention import AttentionMetadata, PagedAttention, PagedKVCache, PrefillChunk, bottom_right_causal_mask
from .block_manager import BlockManager
from .config import EngineConfig
from .metrics import Metrics, ModelMetrics
from .model import TinyGPT
from .pacing import PROFILES, Pacer
from .request import EngineRequest, SamplingParams
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerOutput
from .tokenizer import EOS, IncrementalDetokenizer, Tokenizer


class ModelRunner:
    def __init__(self, model: TinyGPT, attn: PagedAttention, sampler: Sampler, block_size: int,
                 device: torch.device) -> None:
        self.model, self.attn, self.sampler = model, attn, sampler
        self.block_size, self.device = block_size, device
        self._arange = torch.arange(1 << 16, device=device)

    def prepare(self, items: list[tuple[EngineRequest, int]]):
        """Flat inputs and attention metadata for the scheduled (request, num_new_tokens) items."""
        bs, dev = self.block_size, self.device
        items = sorted(items, key=lambda it: it[1] != 1)  # decodes first (stable)
        ids, pos, slots, logits_idx, sampling = [], [], [], [], []
        dec_tables, dec_lens, prefills = [], [], []
        for req, n in items:
            start, table, offset = req.num_computed_tokens, req.block_ids, len(ids)
            end = start + n
            ids.extend(req.token_ids[start:end])
            pos.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            nb = -(-end // bs)
            if n == 1:
                dec_tables.append(table[:nb])
                dec_lens.append(end)
            else:
                mask = None if start == 0 else bottom_right_causal_mask(n, end, dev)
                prefills.append(PrefillChunk(offset, n, end, torch.tensor(table[:nb], device=dev), mask))
            if end == req.num_tokens:
                logits_idx.append(offset + n - 1)
                sampling.append(req)
        dec_bt = dec_mask = None
        if dec_tables:
            width = max(len(t) for t in dec_tables)
            dec_bt = torch.tensor([t + [0] * (width - len(t)) for t in dec_tables], device=dev)
            lens = torch.tensor(dec_lens, device=dev)
            valid = self._arange[: width * bs][None, :] < lens[:, None]
            dec_mask = torch.zeros(valid.shape, device=dev).masked_fill_(~valid, float("-inf"))[None, :, None, :]
        meta = AttentionMetadata(torch.tensor(slots, device=dev), len(dec_tables), dec_bt, dec_mask, prefills)
        lora = [req.lora_id for req, n in items for _ in range(n)] if any(r.lora_id for r, _ in items) else None
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta,
                torch.tensor(logits_idx, device=dev, dtype=torch.long), sampling, lora)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[EngineRequest], list[int]]:
        """Run one step; returns the requests that sampled and their new tokens."""
        ids, pos, meta, logits_idx, sampling, lora = self.prepare(out.items)
        logits = self.model(ids, pos, self.attn, meta, logits_idx, lora)
        if not sampling:
            return [], []
        return sampling, self.sampler(logits, sampling)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    text: str                 # newly detokenized text of this step
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class EngineCore:
    def __init__(self, cfg: EngineConfig, name: str, metrics: ModelMetrics | None,
                 pacer: Pacer | None = None, spans=None) -> None:
        self.cfg, self.name, self.metrics, self.pacer = cfg, name, metrics, pacer
        self.spans = spans  # tracing.SpanExporter with --otlp-traces-endpoint
        self.device, dtype, spec = torch.device(cfg.device), getattr(torch, cfg.dtype), cfg.model
        self.tokenizer = Tokenizer(spec.vocab_size)
        self.model = TinyGPT(spec, len(cfg.lora_names), cfg.lora_rank).to(self.device, dtype).eval()
        self.kv = PagedKVCache(spec.layers, cfg.num_blocks, cfg.block_size, spec.kv_heads, spec.head_dim,
                               dtype, self.device)
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching, cfg.prefix_cache_ttl)
        self.scheduler = Scheduler(cfg, self.blocks)
        sampler = Sampler(spec.vocab_size, self.tokenizer.generation_banned_ids(), self.device, cfg.seed)
        self.runner = ModelRunner(self.model, PagedAttention(self.kv, spec.head_dim ** -0.5), sampler,
                                  cfg.block_size, self.device)
        self.requests: dict[str, EngineRequest] = {}
        self._seq = 0

    def add(self, req: EngineRequest) -> None:
        self._seq += 1
        req.seq, req.queued_time, req.detok = self._seq, time.perf_counter(), IncrementalDetokenizer(self.tokenizer)
        self.requests[req.request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req, "abort")
            self.runner.sampler.forget(request_id)
            self._observe_finish(req, time.perf_counter())

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        if not sched.items:
            return []
        reqs, tokens = self.runner.execute(sched)
        if self.pacer is not None:
            target = self.pacer.step_seconds([(n, r.num_computed_tokens + n) for r, n in sched.items])
            delay = t0 + target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        now = time.perf_counter()  # the tokens of this step exist from here on
        for req, n in sched.items:
            req.num_computed_tokens += n
            if req.first_scheduled_time is None:
                req.first_scheduled_time = t0
            self.blocks.cache_full_blocks(req)
        outputs = [self._process(req, tok, now) for req, tok in zip(reqs, tokens)]
        m = self.metrics
        if m is not None:
            m.iteration_tokens.observe(sched.num_tokens)
            m.generation_tokens.inc(len(reqs))
            m.preemptions.inc(len(sched.preempted))
            m.prefix_queries.inc(sched.prefix_queries)
            m.prefix_hits.inc(sched.prefix_hits)
            self.update_gauges()
        return outputs

    def _process(self, req: EngineRequest, tok: int, now: float) -> RequestOutput:
        req.token_ids.append(tok)
        p, m = req.params, self.metrics
        if req.first_token_time is None:
            req.first_token_time = now
            if m is not None:  # as vLLM V1: the whole prompt (cached part included) at the first token
                m.ttft.observe(now - req.arrival_time)
                m.prompt_tokens.inc(req.num_prompt_tokens)
        elif m is not None:
            m.itl.observe(now - req.last_token_time)
        req.last_token_time = now
        reason = "stop" if (tok == EOS and not p.ignore_eos) or tok in p.stop_token_ids else \
            "length" if req.num_output_tokens >= p.max_tokens or req.num_tokens >= self.cfg.max_model_len else None
        text = req.detok.step([tok])
        if reason is not None:
            text += req.detok.flush()
            self.scheduler.finish(req, reason)
            self.requests.pop(req.request_id, None)
            self.runner.sampler.forget(req.request_id)
            self._observe_finish(req, now)
        return RequestOutput(req.request_id, text, reason is not None, reason, req.num_prompt_tokens,
                             req.num_output_tokens, req.num_cached_tokens)

    def _observe_finish(self, req: EngineRequest, now: float) -> None:
        # vLLM V1 traces a request when it finishes in the engine (aborts too on recent main, whose
        # abort_requests calls do_tracing); one aborted before it was ever scheduled has no latencies
        if self.spans is not None and req.trace is not None and req.first_scheduled_time is not None:
            self.spans.add(req, now)
        m = self.metrics
        if m is None:
            return
        m.success[req.finish_reason].inc()
        m.e2e.observe(now - req.arrival_time)
        m.prompt_len.observe(req.num_prompt_tokens)
        m.gen_len.observe(req.num_output_tokens)
        if req.first_scheduled_time is not None:
            m.queue.observe(req.first_scheduled_time - req.arrival_time)
        if req.first_token_time is not None:
            m.prefill.observe(req.first_token_time - req.first_scheduled_time)
            m.decode.observe(now - req.first_token_time)

    def fail_all(self) -> list[RequestOutput]:
        """Abort every request (after an engine error) and say so to their clients."""
        outs = []
        for req in list(self.requests.values()):
            self.abort(req.request_id)
            outs.append(RequestOutput(req.request_id, "", True, "abort", req.num_prompt_tokens,
                                      req.num_output_tokens, req.num_cached_tokens))
        return outs

    def update_gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self.scheduler.running))
        m.waiting.set(len(self.scheduler.waiting))
        m.kv_usage.set(self.blocks.usage)

    def warmup(self) -> None:
        """Run one short request so the first real step pays no one-time costs."""
        metrics, self.metrics = self.metrics, None
        self.add(EngineRequest("warmup", list(range(1000, 1000 + 3 * self.cfg.block_size)),
                               SamplingParams(max_tokens=4, ignore_eos=True), time.perf_counter()))
        while self.scheduler.has_work():
            self.step()
        self.blocks.reset_prefix_cache()  # clients must not get hits on the warm-up prompt
        self.metrics = metrics


_RESET = object()  # the engine loop's command to reset the prefix caches


class EngineLoop:
    """The engine thread (started at once): applies queued adds/aborts, steps every core round-robin
    and emits one batch of outputs per round. add/abort are thread-safe; emit runs on the engine thread."""

    def __init__(self, cores: dict[str, EngineCore], emit: Callable[[list[RequestOutput]], None],
                 metrics: Metrics | None = None) -> None:
        self.cores, self.emit, self.metrics = cores, emit, metrics
        self._commands: deque = deque()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for spans in {c.spans for c in self.cores.values()} - {None}:  # one exporter, shared by the cores
            spans.close()

    def add(self, core: str, req: EngineRequest) -> None:
        self._commands.append((core, req))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._commands.append((None, request_id))
        self._wake.set()

    def reset(self, done: Callable[[int], None]) -> None:
        """Between two steps, forget every core's cached prefix blocks unless requests hold KV blocks
        (vLLM's BlockPool refuses then too, so a reset is never partial); done(held blocks), 0: reset."""
        self._commands.append((_RESET, done))
        self._wake.set()

    def num_waiting(self, core: str) -> int:
        return len(self.cores[core].scheduler.waiting) + sum(1 for c, _ in list(self._commands) if c == core)

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    async def reset_prefix_cache(self) -> int:
        loop = asyncio.get_running_loop()
        held = loop.create_future()
        self.reset(lambda n: loop.call_soon_threadsafe(held.set_result, n))
        return await held

    def _reset(self) -> int:
        held = sum(c.blocks.num_blocks - c.blocks.num_free for c in self.cores.values())
        if not held:
            for c in self.cores.values():
                c.blocks.reset_prefix_cache()
        return held

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stopped:
            if not self._commands and not any(c.scheduler.has_work() for c in self.cores.values()):
                self._wake.wait()
            self._wake.clear()
            while self._commands:
                core, item = self._commands.popleft()
                if core is None:
                    for c in self.cores.values():
                        c.abort(item)
                elif core is _RESET:
                    item(self._reset())
                else:
                    self.cores[core].add(item)
            outputs: list[RequestOutput] = []
            for c in self.cores.values():
                if c.scheduler.has_work():
                    try:
                        outputs.extend(c.step())
                    except Exception:  # a bug must not hang every client: fail this core's requests
                        traceback.print_exc()
                        outputs.extend(c.fail_all())
                elif c.metrics is not None:
                    c.update_gauges()
            if outputs:
                self.emit(outputs)


class AsyncEngine:
    """What the server talks to, on the asyncio loop thread: submits requests to a backend (the
    engine thread, or a process) and routes each step's outputs to per-request queues."""

    def __init__(self, cores: dict, backend) -> None:
        self.cores = cores  # name -> object with .cfg and .tokenizer
        self.backend = backend
        self._sinks: dict[str, asyncio.Queue] = {}

    def submit(self, core: str, req: EngineRequest, sink: asyncio.Queue) -> None:
        self._sinks[req.request_id] = sink
        self.backend.add(core, req)

    def abort(self, request_id: str) -> None:
        """Idempotent: aborting a finished or unknown request does nothing."""
        if self._sinks.pop(request_id, None) is not None:
            self.backend.abort(request_id)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            q = self._sinks.pop(o.request_id, None) if o.finished else self._sinks.get(o.request_id)
            if q is not None:
                q.put_nowait(o)

    def stop(self) -> None:
        self.backend.stop()


def build_cores(configs: dict[str, EngineConfig], emulate: str | None) -> tuple[dict[str, EngineCore], Metrics]:
    """A warmed-up core per model; they share the metrics, the pacer (`--emulate`) and the span exporter."""
    cores, metrics, pacer, spans = {}, Metrics(), Pacer(PROFILES[emulate]) if emulate else None, None
    endpoint = next(iter(configs.values())).otlp_traces_endpoint
    if endpoint:
        from .tracing import SpanExporter
        spans = SpanExporter(endpoint)
    for name, cfg in configs.items():
        cores[name] = core = EngineCore(cfg, name, ModelMetrics(metrics, name), pacer, spans)
        core.warmup()
        core.update_gauges()
    return cores, metrics


def _child(configs: dict[str, EngineConfig], emulate: str | None, threads: int, inbox, outbox) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when to stop
    torch.set_num_threads(threads)
    cores, metrics = build_cores(configs, emulate)

    loop = EngineLoop(cores, lambda outs: outbox.put(("out", outs, {n: len(c.scheduler.waiting)
                                                                   for n, c in cores.items()})))
    outbox.put(("ready", None, None))
    while True:
        msg = inbox.get()
        if msg[0] in ("add", "abort"):
            getattr(loop, msg[0])(*msg[1:])
        elif msg[0] == "metrics":
            outbox.put(("metrics", metrics.render(), None))
        elif msg[0] == "reset":
            loop.reset(lambda held: outbox.put(("reset", held, None)))
        else:
            loop.stop()
            return


class ProcessBackend:
    def __init__(self, configs: dict[str, EngineConfig], emulate: str | None, threads: int) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that has torch threads
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_child, args=(configs, emulate, threads, self.inbox, self.outbox),
                                name="engine-stub-engine", daemon=True)
        self.cores = {n: SimpleNamespace(cfg=c, tokenizer=Tokenizer(c.model.vocab_size)) for n, c in configs.items()}
        # waiting: as of the child's last step report; pending: sent to the child since then
        self._waiting, self._pending = dict.fromkeys(configs, 0), dict.fromkeys(configs, 0)
        self._reply: asyncio.Future | None = None  # of the one question (metrics, reset) the child answers
        self._ask_lock = asyncio.Lock()

    def start(self, deliver, loop: asyncio.AbstractEventLoop) -> None:
        """Blocks until the child has built and warmed up its cores (call it in an executor)."""
        self.proc.start()
        while True:
            try:
                kind, _, _ = self.outbox.get(timeout=1)
                break
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the engine process exited with code {self.proc.exitcode}") from None
        assert kind == "ready", kind

        def read():
            while True:
                try:
                    kind, payload, waiting = self.outbox.get()
                except (EOFError, OSError):
                    return
                if kind == "out":
                    loop.call_soon_threadsafe(self._on_outputs, deliver, payload, waiting)
                elif kind in ("metrics", "reset"):
                    loop.call_soon_threadsafe(self._reply.set_result, payload)

        threading.Thread(target=read, name="engine-outputs", daemon=True).start()

    def _on_outputs(self, deliver, outputs, waiting) -> None:
        self._waiting = waiting
        self._pending = dict.fromkeys(self._pending, 0)
        deliver(outputs)

    def add(self, core: str, req) -> None:
        self._pending[core] += 1
        self.inbox.put(("add", core, req))

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))

    def num_waiting(self, core: str) -> int:
        return self._waiting.get(core, 0) + self._pending.get(core, 0)

    async def _ask(self, question: str):
        async with self._ask_lock:
            self._reply = asyncio.get_running_loop().create_future()
            self.inbox.put((question,))
            return await asyncio.wait_for(self._reply, 10)

    async def render_metrics(self) -> bytes:
        return await self._ask("metrics")

    async def reset_prefix_cache(self) -> int:
        return await self._ask("reset")

    def stop(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(("stop",))
            self.proc.join(timeout=3)
            if self.proc.is_alive():
                self.proc.terminate()
