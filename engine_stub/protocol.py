"""OpenAI request bodies (pydantic) and response/SSE chunk builders, shaped like vLLM's."""
from __future__ import annotations

import json
import time
from typing import Union

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    # vLLM extensions
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None

    @property
    def stop_strings(self) -> list[str]:
        s = self.stop
        return [x for x in ([s] if isinstance(s, str) else s or []) if x]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: Union[list[int], list[list[int]], str, list[str]]

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if (isinstance(v, (str, list)) and len(v) == 0) or (isinstance(v, list) and any(
                isinstance(x, (str, list)) and len(x) == 0 for x in v)):
            raise ValueError("prompt must not be empty")
        return v

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[dict], None] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    reasoning_tokens: int | None = Field(None, ge=0)   # engine-stub extension (answer.py)


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
        self.chat, self.created = chat, int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'data: {{"id":{json.dumps(rid)},"object":"{obj}","created":{self.created},' \
                    f'"model":{json.dumps(model)},"choices":['
        self.rid, self.model = rid, model

    def content(self, index: int, text: str, finish_reason: str | None) -> str:
        if self.chat:
            return self.delta(index, f'{{"content":{json.dumps(text)}}}' if text or finish_reason is None else "{}",
                              finish_reason)
        fr = "null" if finish_reason is None else f'"{finish_reason}"'
        body = f'{{"index":{index},"text":{json.dumps(text)},"logprobs":null,"finish_reason":{fr},' \
               f'"stop_reason":null}}'
        return f"{self.head}{body}]}}\n\n"

    def delta(self, index: int, delta: str, finish_reason: str | None) -> str:
        """A chat chunk around `delta`, a JSON object (answer.ChoiceDeltas renders reasoning and tool calls)."""
        fr = "null" if finish_reason is None else f'"{finish_reason}"'
        return f'{self.head}{{"index":{index},"delta":{delta},"logprobs":null,"finish_reason":{fr}}}]}}\n\n'

    def role(self, index: int) -> str:
        return (f'{self.head}{{"index":{index},"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]}}\n\n')

    def usage(self, u: dict) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return "data: " + json.dumps({"id": self.rid, "object": obj, "created": self.created,
                                      "model": self.model, "choices": [], "usage": u}) + "\n\n"

    def final(self, texts: list[str], reasons: list[str | None], u: dict, messages: list[dict] | None = None) -> dict:
        if self.chat:
            messages = messages or [{"role": "assistant", "content": t} for t in texts]
            choices = [{"index": i, "message": m, "logprobs": None, "finish_reason": r}
                       for i, (m, r) in enumerate(zip(messages, reasons))]
            obj = "chat.completion"
        else:
            choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": r, "stop_reason": None}
                       for i, (t, r) in enumerate(zip(texts, reasons))]
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": u}
