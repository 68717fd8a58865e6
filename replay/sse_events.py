"""What one SSE event of an OpenAI-style stream carries, for `replay.sse.ResponseParser`: the
token fields found by byte pattern (no JSON parse per token), the tokens of a parsed event,
the reasoning tokens a usage object reports, and the message for a malformed event.
"""
from __future__ import annotations

import json


class ProtocolError(Exception):
    """The bytes on the wire are not a well-formed HTTP/1.1 SSE response."""


ANSWER, REASONING = 1, 2
# Keys whose non-empty string value is generated text, and its kind. `text` is the completions
# API's; `arguments` a streamed tool call's.
TOKEN_KEYS = ((b'"text":', ANSWER), (b'"content":', ANSWER), (b'"arguments":', ANSWER),
              (b'"reasoning_content":', REASONING), (b'"reasoning":', REASONING))


def token_fields(payload: bytes) -> list[tuple[int, int]] | None:
    """(kind, offset of the text) of each token key whose value is a non-empty string (one space
    allowed after the colon); None when a key occurs twice (a second choice, or a nested field of
    that name such as OpenRouter's `reasoning_details[].text`) or a text is not followed by `,`
    or `}` (malformed): such events are parsed."""
    out = []
    for key, kind in TOKEN_KEYS:
        i = payload.find(key)
        if i < 0:
            continue
        i += len(key)
        if payload.find(key, i) >= 0:
            return None
        if payload[i:i + 1] == b" ":
            i += 1
        if payload[i:i + 1] == b'"' and payload[i + 1:i + 2] != b'"':
            q = _string_end(payload, i + 1)
            if q < 0 or payload[q + 1:q + 2] not in (b",", b"}"):
                return None     # the string does not end where JSON would go on: parse it
            out.append((kind, i + 1))
    return out


def _string_end(payload: bytes, k: int) -> int:
    """Offset of the quote that closes the JSON string whose body starts at `k` (-1: none)."""
    q = payload.find(b'"', k)
    while q >= 0:
        j = q
        while j > k and payload[j - 1] == 92:
            j -= 1
        if (q - j) % 2 == 0:    # preceded by an even run of backslashes: not escaped
            return q
        q = payload.find(b'"', q + 1)
    return -1


def json_string_body(s: bytes) -> bool:
    """`s`, the bytes between two quotes, is one JSON string: every quote in it escaped and no
    dangling backslash at its end (escaped backslashes go first, left to right, as JSON reads them)."""
    r = s.replace(b"\\\\", b"").replace(b'\\"', b"")
    return r.find(b'"') < 0 and r[-1:] != b"\\"


def token_kind(payload: bytes) -> tuple[int, list | None]:
    """ANSWER or REASONING for a `{...}` event that carries generated tokens of one kind and needs
    no JSON parse (`token_fields`), no usage object, balanced braces (a truncated event fails this
    and gets parsed); else 0 (parse it). With the event's token fields."""
    fields = token_fields(payload)
    kind = fields[0][0] if fields else 0
    if not kind or any(k != kind for k, _ in fields) or payload[-1:] != b"}" or payload.find(b'"usage":{') >= 0 \
            or payload.find(b'"usage": {') >= 0 or payload.count(b"{") != payload.count(b"}"):
        return 0, fields
    return kind, fields


def event_tokens(obj: dict) -> tuple[str, int]:
    """(answer text, kind) of a parsed event: ANSWER for `text`, `delta.content`, `delta.refusal`
    or a tool call's name or arguments; REASONING for `delta.reasoning_content` or
    `delta.reasoning`; kind 0 when it carries no generated token."""
    out, kind = [], 0
    for ch in _expect(obj.get("choices"), list, "choices", "an array"):
        ch = _expect(ch, dict, "choices[]", "an object")
        piece = ch.get("text")
        delta = _expect(ch.get("delta"), dict, "delta", "an object")   # {} when absent (completions)
        if piece is None:
            piece = delta.get("content")
        if _nonempty(delta.get("reasoning_content")) or _nonempty(delta.get("reasoning")):
            kind |= REASONING
        if _nonempty(delta.get("refusal")):
            kind |= ANSWER
        for call in _expect(delta.get("tool_calls"), list, "delta.tool_calls", "an array"):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and (_nonempty(fn.get("name")) or _nonempty(fn.get("arguments"))):
                kind |= ANSWER
        if _nonempty(piece):
            out.append(piece)
            kind |= ANSWER
    return "".join(out), kind


def _expect(v, typ: type, what: str, expected: str):
    """`v` when it is a `typ` (an empty one for null or absent); else the event is malformed, and
    the error says where (not a TypeError from iterating a number)."""
    if v is None:
        return typ()
    if not isinstance(v, typ):
        raise ProtocolError(f"malformed SSE event: {what} is {json.dumps(v)[:40]}, not {expected}")
    return v


def malformed_json(payload: bytes, e: ValueError) -> str:
    """What a JSON decoder found wrong with an event, and the bytes around where it did."""
    if isinstance(e, json.JSONDecodeError):     # its pos counts characters of the decoded text
        pos = len(e.doc[:e.pos].encode("utf-8", "surrogatepass"))
    else:                                       # UnicodeDecodeError: start is a byte offset
        pos = getattr(e, "start", None)
    why = getattr(e, "msg", None) or getattr(e, "reason", None) or str(e)
    if pos is None:
        return f"malformed SSE data ({why}): {payload[:80]!r}"
    lo = max(0, pos - 50)
    return (f"malformed SSE data ({why.removesuffix(' at')} at byte {pos} of {len(payload)}): "
            f"{'...' if lo else ''}{payload[lo:pos + 30]!r}")


def _nonempty(v: object) -> bool:
    return isinstance(v, str) and v != ""


def reasoning_reported(usage: dict) -> int | None:
    """Reasoning tokens in a usage object: OpenAI's `completion_tokens_details.reasoning_tokens`
    (OpenAI, OpenRouter, recent vLLM with a reasoning parser), else SGLang's top-level `reasoning_tokens`."""
    details = usage.get("completion_tokens_details")
    n = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if n is None:
        n = usage.get("reasoning_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
