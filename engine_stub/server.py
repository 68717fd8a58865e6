"""The OpenAI-compatible HTTP server (FastAPI) in front of the engine thread.

Endpoints as vLLM: /v1/completions, /v1/chat/completions, /v1/models, /health, /version, /metrics,
/reset_prefix_cache (and SGLang's /flush_cache).
Errors use the OpenAI envelope; invalid bodies are 400 (never FastAPI's 422). A client that goes
away aborts its requests, which frees their KV blocks (idempotent with a natural finish).
"""
from __future__ import annotations

import asyncio
import hmac
import re
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from pydantic_core import from_json

from .answer import AnswerOptions, ChoiceDeltas, plan
from .engine import AsyncEngine, EngineCore, RequestOutput
from .faults import DroppedConnection, Faults, RequestFaults
from .images import ImageError, ImageOptions, chat_images
from .protocol import ChatExtras, ChatRequest, ChunkWriter, CompletionRequest, usage
from .request import EngineRequest, SamplingParams

VERSION = "0.1.0"
_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 409: "ConflictError",
                413: "RequestTooLargeError", 429: "RateLimitError", 500: "InternalServerError",
                503: "ServiceUnavailableError"}


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: str | None) -> tuple[str, str] | None | bool:
    """-> (trace id, parent span id) of a valid W3C header; None when absent or invalid (the span
    starts a new trace, as OpenTelemetry's propagator does); False when valid but not sampled:
    vLLM's default ParentBased sampler records no span then, and neither do we."""
    m = _TRACEPARENT.fullmatch(value.strip().lower()) if value else None
    if m is None or m[1] == "ff" or (m[1] == "00" and m[5]) or set(m[2]) == {"0"} or set(m[3]) == {"0"}:
        return None
    return (m[2], m[3]) if int(m[4], 16) & 1 else False


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after


def error_response(e: APIError) -> JSONResponse:
    body = {"error": {"message": e.message, "type": _ERROR_TYPES.get(e.status, "Error"), "param": e.param,
                      "code": e.status}}
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
    return JSONResponse(body, status_code=e.status, headers=headers)


@dataclass
class Served:
    """A served model name (the key of State.served): a base model or a LoRA adapter on one."""
    core: str           # the EngineCore serving it
    lora_id: int = 0
    parent: str | None = None


@dataclass
class ServerOptions:
    api_key: str | None = None
    max_waiting: int = 0            # 0: unbounded
    max_body_bytes: int = 4 << 20
    answer: AnswerOptions = AnswerOptions()     # reasoning and tool calls in chat answers
    images: ImageOptions = ImageOptions()       # image tokens of chat requests (images.py)


@dataclass
class State:
    """What the app needs once the engine is up (set by the CLI after startup)."""
    engine: AsyncEngine | None = None
    served: dict[str, Served] = field(default_factory=dict)


def build_app(opts: ServerOptions, faults: Faults) -> tuple[FastAPI, State]:
    app = FastAPI(title="engine-stub", docs_url=None, redoc_url=None, openapi_url=None)
    state = State()

    app.add_middleware(_Guard, opts=opts, state=state)

    @app.exception_handler(APIError)
    async def _api_error(_request, e: APIError):
        return error_response(e)

    @app.exception_handler(Exception)
    async def _internal(_request, e: Exception):
        return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}"))

    @app.exception_handler(404)
    async def _not_found(request: Request, _e):
        return error_response(APIError(404, f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def _bad_method(request: Request, _e):
        return error_response(APIError(405, f"method {request.method} not allowed on {request.url.path}"))

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.engine is not None else 503)

    @app.get("/version")
    async def version():
        return {"version": VERSION}

    @app.get("/metrics")
    async def metrics():
        body = await state.engine.backend.render_metrics() if state.engine is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/reset_prefix_cache")  # vLLM's: 409 when refused
    @app.post("/flush_cache")         # SGLang's: 400 when refused
    async def reset_prefix_cache(request: Request):
        if state.engine is None:
            raise APIError(503, "the engine is starting", retry_after=1)
        held = await state.engine.backend.reset_prefix_cache()
        if held:
            raise APIError(409 if request.url.path == "/reset_prefix_cache" else 400,
                           f"prefix cache not reset: running requests hold {held} KV blocks; retry when idle")
        return {"success": True}

    @app.get("/v1/models")
    async def models():
        created, cfg = int(time.time()), {name: core.cfg for name, core in state.engine.cores.items()}
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "engine-stub",
             "root": cfg[s.core].model.name, "parent": s.parent, "max_model_len": cfg[s.core].max_model_len}
            for name, s in state.served.items()]}

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def generate(request: Request):
        chat = request.url.path.endswith("/chat/completions")
        body = await _read_json(request, opts.max_body_bytes)
        try:
            req = ChatRequest.model_validate(body) if chat else CompletionRequest.model_validate(body)
            if chat:
                ChatExtras.model_validate(req.model_extra)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            param = str(err["loc"][0]) if err["loc"] else None
            raise APIError(400, f"invalid request: {loc}: {err['msg']}" if loc else err["msg"], param) from None
        model = req.model if req.model is not None else next(iter(state.served))
        served = state.served.get(model)
        if served is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        engine = state.engine
        core = engine.cores[served.core]
        prompts = _prompt_ids(core, req, chat, opts.images)
        params = _sampling(core, req, chat, prompts)
        fault = faults.draw()
        if fault.error:
            raise APIError(500, "injected fault: internal error")
        if fault.reject or (opts.max_waiting and engine.backend.num_waiting(served.core) >= opts.max_waiting):
            raise APIError(429, "too many requests waiting; retry later", retry_after=1)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        ids = [f"{rid}-{i}" for i in range(len(prompts))]
        queue: asyncio.Queue = asyncio.Queue()
        parent = parse_traceparent(request.headers.get("traceparent"))
        now = time.perf_counter()
        for sub_id, p in zip(ids, prompts):
            # gen_ai.request.id as vLLM: the chat response id; the engine ids `cmpl-...-i` of completions
            trace = None if parent is False else (rid if chat else sub_id, *(parent or (None, None)))
            engine.submit(served.core, EngineRequest(sub_id, p, params, now, lora_id=served.lora_id,
                                                     tenant=req.user or "", trace=trace), queue)
        writer = ChunkWriter(chat, rid, model)
        choices = [ChoiceDeltas(plan(opts.answer, req, params.max_tokens))] if chat else None  # one prompt
        watcher = asyncio.ensure_future(_watch_disconnect(request, engine, ids, queue))
        stops = req.stop or []  # None when absent: the validator runs on given values only
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(_stream(engine, queue, ids, writer, include_usage, fault, stops,
                                             params.max_tokens, watcher, choices),
                                     media_type="text/event-stream")
        try:
            texts, reasons, u, messages = await _collect(engine, queue, ids, stops, choices)
        finally:
            watcher.cancel()
        return JSONResponse(writer.final(texts, reasons, u, messages))

    return app, state


class _Guard:
    """Pure ASGI middleware (no per-chunk overhead on streams): API key and startup checks.
    The `Bearer` scheme is case-insensitive (RFC 9110, as vLLM)."""

    def __init__(self, app, opts: ServerOptions, state: State) -> None:
        self.app, self.opts, self.state = app, opts, state
        self.key = opts.api_key.encode() if opts.api_key is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            if self.key is not None:
                scheme, _, token = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
                if not (hmac.compare_digest(token, self.key) and scheme.lower() == b"bearer"):
                    return await error_response(APIError(401, "invalid or missing API key"))(scope, receive, send)
            if self.state.engine is None:
                error = APIError(503, "the engine is starting", retry_after=1)
                return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)


async def _read_json(request: Request, limit: int):
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise APIError(400, "Unsupported Media Type: Only 'application/json' is allowed")  # vLLM's 400
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body larger than {limit} bytes")
        chunks.append(chunk)
    try:  # pydantic-core's parser (jiter) bounds nesting at 200 levels: a deep body is a 400, not a RecursionError
        body = from_json(b"".join(chunks))
    except ValueError as e:
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def _prompt_ids(core: EngineCore, req, chat: bool, image_opts: ImageOptions) -> list[list[int]]:
    tok, vocab = core.tokenizer, core.cfg.model.vocab_size
    if chat:
        return [_chat_prompt(core, req, image_opts)]
    prompts = req.prompts()
    for p in prompts:
        bad = None if isinstance(p, str) else next((t for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of vocabulary range [0, {vocab})", "prompt")
    return [tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def _chat_prompt(core: EngineCore, req, image_opts: ImageOptions) -> list[int]:
    """The ChatML prompt with each image's tokens at its part's place. Images are base64-decoded
    and hashed here, in the request handler, never on the engine thread."""
    messages = [m.model_dump() for m in req.messages]
    for i, m in enumerate(messages):
        content = m.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if part.get("type") == "text" and not isinstance(part.get("text", ""), str):
                raise APIError(400, f"invalid request: messages.{i}.content.{j}.text: must be a string", "messages")
    try:
        images = chat_images(messages)
    except ImageError as e:
        raise APIError(400, f"invalid image: {e}", "messages") from None
    if not images:
        return core.tokenizer.chat_prompt(messages)
    counts = [img.tokens(image_opts) for img in images]
    limit = core.cfg.max_model_len
    if sum(counts) >= limit:  # refused whatever the text: do not materialize the placeholder ids
        length = len(core.tokenizer.chat_prompt(messages, [()] * len(images))) + sum(counts)
        raise _context_error(limit, length, req.max_completion_tokens or req.max_tokens or 1)
    vocab = core.cfg.model.vocab_size
    return core.tokenizer.chat_prompt(messages, [img.token_ids(vocab, image_opts) for img in images])


def _context_error(limit: int, longest: int, max_tokens: int) -> APIError:
    return APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                         f"{longest + max_tokens} tokens ({longest} in the messages, {max_tokens} in the "
                         f"completion). Please reduce the length of the messages or completion.",
                    "max_tokens" if longest < limit else "prompt")


def _sampling(core: EngineCore, req, chat: bool, prompts: list[list[int]]) -> SamplingParams:
    limit = core.cfg.max_model_len
    longest = max(len(p) for p in prompts)
    max_tokens = (req.max_completion_tokens or req.max_tokens) if chat else req.max_tokens
    if max_tokens is None:
        max_tokens = max(1, limit - longest) if chat else 16
    if longest + max_tokens > limit:
        raise _context_error(limit, longest, max_tokens)
    if req.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({req.min_tokens}) must be <= max_tokens ({max_tokens})", "min_tokens")
    vocab = core.cfg.model.vocab_size
    if req.top_k > vocab:
        raise APIError(400, f"top_k must be -1 or 0 (disable) or in [1, {vocab}] (the vocabulary), got {req.top_k}",
                       "top_k")
    stop_ids = tuple(dict.fromkeys(req.stop_token_ids or ()))
    if any(not 0 <= t < vocab for t in stop_ids):
        raise APIError(400, f"stop_token_ids must be in [0, {vocab}) (the vocabulary)", "stop_token_ids")
    return SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                          top_p=req.top_p, top_k=req.top_k, seed=None if req.seed == -1 else req.seed,  # as vLLM
                          min_tokens=req.min_tokens, ignore_eos=req.ignore_eos, stop_token_ids=stop_ids)


async def _watch_disconnect(request: Request, engine: AsyncEngine, ids: list[str], queue: asyncio.Queue):
    """Abort the requests (freeing their blocks) as soon as the client goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for i in ids:
        engine.abort(i)
    queue.put_nowait(None)


class _StopText:
    """Stop strings: cut the text before the first match and finish the choice. Like vLLM, the
    last len(longest stop) - 1 characters are held back until they cannot start a match."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.text, self.sent = stops, "", 0
        self.hold = max(map(len, stops), default=1) - 1

    def feed(self, delta: str, finished: bool) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        start = max(0, len(self.text) - self.hold)
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        end = min(hits) if hits else len(self.text) if finished else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:end], end
        return out, bool(hits)


async def _outputs(engine: AsyncEngine, queue: asyncio.Queue, ids: list[str], stops: list[str],
                   finals: dict[int, RequestOutput], choices: list[ChoiceDeltas] | None):
    """Yield (index, text, finish_reason, chat delta or None) per engine step until every choice is
    done; each choice's last output goes to finals[index]."""
    index = {rid: i for i, rid in enumerate(ids)}
    stop_text = [_StopText(stops) for _ in ids]
    pending = len(ids)
    while pending:
        o: RequestOutput | None = await queue.get()
        if o is None:  # client went away
            return
        i = index.get(o.request_id)
        if i is None or stop_text[i] is None:
            continue
        text, hit = stop_text[i].feed(o.text, o.finished)
        reason = "stop" if hit else o.finish_reason
        if hit and not o.finished:
            engine.abort(o.request_id)
        if reason is not None:
            stop_text[i] = None
            pending -= 1
            finals[i] = o
        delta = None
        if choices is not None:  # the chat delta, then the reason (a tool call finishes as tool_calls)
            delta = choices[i].delta(text, o.completion_tokens, reason is not None)
            reason = choices[i].finish_reason(reason)
        yield i, text, reason, delta


def _usage(finals: dict[int, RequestOutput], choices: list[ChoiceDeltas] | None) -> dict:
    """The usage of the finished choices, with their reasoning tokens when the answer plan reports them."""
    done = finals.values()
    reasoning = sum(choices[i].reasoning_tokens(o.completion_tokens) for i, o in finals.items()) \
        if choices is not None and choices[0].p.report else None
    return usage(sum(o.prompt_tokens for o in done), sum(o.completion_tokens for o in done),
                 sum(o.cached_tokens for o in done), reasoning)


async def _collect(engine, queue, ids, stops, choices: list[ChoiceDeltas] | None):
    texts, reasons, finals = [""] * len(ids), [None] * len(ids), {}
    async for i, text, reason, _ in _outputs(engine, queue, ids, stops, finals, choices):
        texts[i] += text
        reasons[i] = reason
    messages = [c.message() for c in choices] if choices is not None else None
    return texts, reasons, _usage(finals, choices), messages


async def _stream(engine, queue, ids, writer: ChunkWriter, include_usage: bool, fault: RequestFaults,
                  stops: list[str], max_tokens: int, watcher: asyncio.Future, choices: list[ChoiceDeltas] | None):
    try:
        events, midpoint, faulted, finals = 0, max(1, max_tokens // 2), False, {}
        async for i, text, reason, delta in _outputs(engine, queue, ids, stops, finals, choices):
            yield writer.content(i, text, reason) if delta is None else writer.delta(i, delta, reason)
            events += 1
            # a busy engine may deliver the tokens in fewer events than midpoint: the last one carries the fault
            if not faulted and (events >= midpoint or reason is not None):
                faulted = True
                if fault.stall_s:
                    await asyncio.sleep(fault.stall_s)
                if fault.malformed:
                    yield f'{writer.head}{{"index":{i},"text":"\n\n'
                if fault.drop:
                    raise DroppedConnection("injected fault: connection dropped")
        if watcher.done():  # the client is gone: nothing more to say
            return
        if include_usage:
            yield writer.usage(_usage(finals, choices))
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        for i in ids:
            engine.abort(i)
