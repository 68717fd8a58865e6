"""OpenAI request bodies (pydantic) and response/SSE chunk builders, shaped like vLLM's."""
from __future__ import annotations

import json
import time
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

# engine-stub's own caps (vLLM has none): each batch prompt is a choice, each stop string is searched per step
MAX_BATCH_PROMPTS, MAX_STOPS, MAX_STOP_CHARS = 256, 64, 1024


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """Types and ranges as vLLM's protocol and SamplingParams._verify_args (top_k <= vocab and the
    stop_token_ids range are checked by the server, which knows the vocabulary)."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int | None = Field(None, ge=-2**63, lt=2**63)    # int64 as vLLM; -1 means none
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    user: str | None = None     # the tenant of --tenant-policy fair
    # vLLM extensions
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if not all(stops):
            raise ValueError("stop cannot contain an empty string")
        if len(stops) > MAX_STOPS or max(map(len, stops), default=0) > MAX_STOP_CHARS:
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters")
        return stops


class CompletionRequest(_Sampling):
    prompt: Union[list[int], list[list[int]], str, list[str]]

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if (isinstance(v, (str, list)) and len(v) == 0) or (isinstance(v, list) and any(
                isinstance(x, (str, list)) and len(x) == 0 for x in v)):
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and v and not isinstance(v[0], int) and len(v) > MAX_BATCH_PROMPTS:
            raise ValueError(f"at most {MAX_BATCH_PROMPTS} prompts in one request, got {len(v)}")
        return v

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[dict], None] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    reasoning_tokens: int | None = Field(None, ge=0)   # engine-stub extension (answer.py)


class _Function(BaseModel):
    name: str
    parameters: dict | None = None


class _Tool(BaseModel):
    """A tool, or a tool_choice naming one."""
    type: Literal["function"] = "function"
    function: _Function


class ChatExtras(BaseModel):
    """Types of the chat fields answer.py reads from a request's extras (as vLLM's protocol)."""
    tools: list[_Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], _Tool, None] = None
    chat_template_kwargs: dict | None = None


def usage(prompt: int, completion: int, cached: int = 0, reasoning: int | None = None) -> dict:
    u = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return u


class ChunkWriter:
    """Pre-renders the constant parts of a stream's SSE events; only the text is encoded per step."""

    def __init__(self, chat: bool, rid: str, model: str) -> None:
        self.chat, self.created, self.rid, self.model = chat, int(time.time()), rid, model
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'data: {{"id":{json.dumps(rid)},"object":"{self.obj}","created":{self.created},' \
                    f'"model":{json.dumps(model)},"choices":['
        self.started: set[int] = set()   # chat choices whose role chunk went out

    def content(self, index: int, text: str, finish_reason: str | None) -> str:
        """A completions chunk."""
        body = f'{{"index":{index},"text":{json.dumps(text)},"logprobs":null,' \
               f'"finish_reason":{json.dumps(finish_reason)},"stop_reason":null}}'
        return f"{self.head}{body}]}}\n\n"

    def delta(self, index: int, delta: str, finish_reason: str | None) -> str:
        """A chat chunk around `delta`, a JSON object (answer.ChoiceDeltas renders reasoning and tool calls),
        after the choice's role chunk when it is its first."""
        first, fr = index not in self.started, json.dumps(finish_reason)
        self.started.add(index)
        role = self.delta(index, '{"role":"assistant","content":""}', None) if first else ""
        return f'{role}{self.head}{{"index":{index},"delta":{delta},"logprobs":null,"finish_reason":{fr}}}]}}\n\n'

    def usage(self, u: dict) -> str:
        return "data: " + json.dumps({"id": self.rid, "object": self.obj, "created": self.created,
                                      "model": self.model, "choices": [], "usage": u}) + "\n\n"

    def final(self, texts: list[str], reasons: list[str | None], u: dict, messages: list[dict] | None) -> dict:
        """The non-streamed response (chat: `messages`, from answer.ChoiceDeltas)."""
        if self.chat:
            choices = [{"index": i, "message": m, "logprobs": None, "finish_reason": r}
                       for i, (m, r) in enumerate(zip(messages, reasons))]
        else:
            choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": r, "stop_reason": None}
                       for i, (t, r) in enumerate(zip(texts, reasons))]
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": u}
