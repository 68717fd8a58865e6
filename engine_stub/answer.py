"""How a chat choice's generated tokens reach the client: reasoning first, then the answer as
text or as one tool call, in the delta shapes vLLM streams.

vLLM splits a reasoning model's output in the server (its reasoning parser) and frames tool calls
there too (its tool parser); the engine only generates tokens. Here the split is by count: the
first `reasoning` output tokens of a choice are reasoning (`delta.reasoning_content`, or
`delta.reasoning` as vLLM >= 0.16, or both as 0.11.2-0.15 do), the rest the answer. A tool call
streams a chunk with its id and name (the first answer token), then the tokens' text as the
pieces of its `arguments`: `{"<param>": "<text>"}`, one piece per token.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

REASONING_FIELDS = ("reasoning_content", "reasoning", "both")


def parse_reasoning(spec: str | None) -> float | int | None:
    """`--reasoning`: a share of each request's output tokens (a number with a point, 0-1, or N%)
    or a fixed count (a whole number); None: off."""
    if spec is None:
        return None
    s = str(spec).strip()
    try:
        value: float | int = float(s[:-1]) / 100 if s.endswith("%") else float(s) if "." in s else int(s)
    except ValueError:
        value = -1
    if isinstance(value, float) and not 0 <= value <= 1 or isinstance(value, int) and value < 0:
        raise ValueError(f"--reasoning {spec}: expected a share (0.3, 30%) or a token count (20)")
    return value


@dataclass(frozen=True)
class AnswerOptions:
    """The server's `--reasoning`, `--reasoning-field` and `--tool-calls`."""
    reasoning: float | int | None = None
    field: str = "reasoning_content"
    tool_calls: bool = False      # with tools offered and tool_choice "auto", call one


@dataclass(frozen=True)
class AnswerPlan:
    """One chat request's shape: how many reasoning tokens, and the tool to call (if any)."""
    reasoning: int = 0
    report: bool = False          # usage.completion_tokens_details.reasoning_tokens
    field: str = "reasoning_content"
    tool: str | None = None
    param: str = "input"


def plan(opts: AnswerOptions, req, max_tokens: int) -> AnswerPlan:
    """A chat request's plan. Its own `reasoning_tokens` (an engine-stub extension) beats the
    server's share or count; `chat_template_kwargs.enable_thinking: false` turns reasoning off,
    as for Qwen3 on vLLM. `tool_choice` "required" or a named function calls a tool whenever
    `tools` are offered; "auto" (the default) does with `--tool-calls`; "none" never does."""
    extra = req.model_extra or {}
    thinking = (extra.get("chat_template_kwargs") or {}).get("enable_thinking", True)
    if req.reasoning_tokens is not None:
        n, report = req.reasoning_tokens, True
    elif opts.reasoning is None or thinking is False:
        n, report = 0, opts.reasoning is not None
    elif isinstance(opts.reasoning, float):
        n, report = round(opts.reasoning * max_tokens), True
    else:
        n, report = opts.reasoning, True
    tool, param = _tool(extra.get("tools"), extra.get("tool_choice", "auto"), opts.tool_calls)
    return AnswerPlan(n, report, opts.field, tool, param)


def _tool(tools, choice, always: bool) -> tuple[str | None, str]:
    fns = [t["function"] for t in tools or () if isinstance(t, dict) and isinstance(t.get("function"), dict)
           and t["function"].get("name")]
    if not fns or choice == "none" or (choice == "auto" and not always):
        return None, "input"
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        fns = [f for f in fns if f["name"] == named] or fns
    params = fns[0].get("parameters") if isinstance(fns[0].get("parameters"), dict) else {}
    keys = next((k for k in (params.get("required"), params.get("properties")) if isinstance(k, (list, dict)) and k),
                ["input"])
    return fns[0]["name"], str(next(iter(keys)))


class ChoiceDeltas:
    """The delta of each engine step of one chat choice, as a JSON object string."""

    def __init__(self, p: AnswerPlan) -> None:
        self.p = p
        self.call_id = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
        self.step = 0          # answer steps so far (tool call: 0 = the name)
        self.reasoning_text: list[str] = []
        self.answer_text: list[str] = []

    def delta(self, text: str, done_tokens: int, finished: bool) -> str:
        """The delta of a step that brought the output to `done_tokens` tokens."""
        p = self.p
        if done_tokens <= p.reasoning:
            self.reasoning_text.append(text)
            t = json.dumps(text)
            if p.field == "both":
                return f'{{"reasoning":{t},"reasoning_content":{t}}}'
            return f'{{"{p.field}":{t}}}'
        self.answer_text.append(text)
        if p.tool is None:
            return f'{{"content":{json.dumps(text)}}}' if text or not finished else "{}"
        self.step += 1
        if self.step == 1:
            fn = f'"name":{json.dumps(p.tool)}' + (',"arguments":"{}"' if finished else "")
            return (f'{{"tool_calls":[{{"id":"{self.call_id}","type":"function","index":0,'
                    f'"function":{{{fn}}}}}]}}')
        piece = json.dumps(text)[1:-1]
        if self.step == 2:
            piece = "{" + json.dumps(p.param) + ": \"" + piece
        if finished:
            piece += "\"}"
        return f'{{"tool_calls":[{{"index":0,"function":{{"arguments":{json.dumps(piece)}}}}}]}}'

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason is not None and self.p.tool is not None and self.step else reason

    def message(self) -> dict:
        """The whole choice as a non-streamed `message`."""
        msg: dict = {"role": "assistant", "content": "".join(self.answer_text) if self.p.tool is None else None}
        if self.p.reasoning:
            field = "reasoning" if self.p.field == "reasoning" else "reasoning_content"
            msg[field] = "".join(self.reasoning_text)
        if self.p.tool is not None and self.step:
            args = json.dumps({self.p.param: "".join(self.answer_text[1:])}) if self.step > 1 else "{}"
            msg["tool_calls"] = [{"id": self.call_id, "type": "function",
                                  "function": {"name": self.p.tool, "arguments": args}}]
        return msg

    def reasoning_tokens(self, completion_tokens: int) -> int:
        return min(self.p.reasoning, completion_tokens)
