"""replay.sse on reasoning and tool-call streams, in the exact chunk shapes real servers send.

The shapes are copied from the servers' own serializers (vLLM `DeltaMessage` with exclude_unset,
SGLang's pydantic and msgspec paths, Ollama, llama.cpp) and from a recorded OpenAI stream:
key order, nulls and all, since the parser's no-parse paths depend on the bytes.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from llm_replay.replay import sse
from llm_replay.replay.sse import ResponseParser
from llm_replay.replay.sse_events import REASONING, json_string_body

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def env(delta: dict | None, *, head: dict | None = None, tail: dict | None = None, choice_tail: dict | None = None,
        finish=None, choices=None) -> bytes:
    """One `data:` event: id, object, created, model, choices[index, delta, ...], then `tail`."""
    obj = {"id": "chatcmpl-84fd71592962667f", "object": "chat.completion.chunk", "created": 1779158289,
           "model": "m", **(head or {})}
    if choices is None:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **(choice_tail or {})}]
    obj["choices"] = choices
    obj.update(tail or {})
    return b"data: " + dumps(obj) + b"\n\n"


def vllm(delta, finish=None):                       # vLLM >= 0.16: `reasoning`, exclude_unset
    return env(delta, finish=finish, choice_tail={"token_ids": None})


def vllm_mid(delta, finish=None):                   # vLLM 0.11.2-0.15: `reasoning_content` echoed
    return env({**delta, "reasoning_content": delta.get("reasoning")}, finish=finish, choice_tail={"token_ids": None})


def vllm_old(delta, finish=None):                   # vLLM <= 0.11.0: `reasoning_content` only
    d = {("reasoning_content" if k == "reasoning" else k): v for k, v in delta.items()}
    return env(d, finish=finish, choice_tail={"stop_reason": None})


def sglang_pydantic(delta, finish=None):            # every null emitted, usage null on each chunk
    d = {"role": None, "content": None, "reasoning_content": delta.get("reasoning"), "tool_calls": None}
    d.update({k: v for k, v in delta.items() if k != "reasoning"})
    return env(d, finish=finish, choice_tail={"matched_stop": None}, tail={"usage": None})


def sglang_msgspec(delta, finish=None):             # omit_defaults, reasoning_content always first
    d = {"reasoning_content": delta.get("reasoning")}
    d.update({k: v for k, v in delta.items() if k != "reasoning"})
    return env(d, finish=finish, choice_tail={"matched_stop": None})


def ollama(delta, finish=None):                     # every delta repeats role and content
    d = {"role": "assistant", "content": delta.get("content") or ""}
    if delta.get("reasoning"):
        d["reasoning"] = delta["reasoning"]
    return env(d, finish=finish, head={"system_fingerprint": "fp_ollama"})


def llamacpp(delta, finish=None):                   # choices first, then created/id/model
    d = {("reasoning_content" if k == "reasoning" else k): v for k, v in delta.items()}
    return b"data: " + dumps({"choices": [{"finish_reason": finish, "index": 0, "delta": d}], "created": 1,
                              "id": "chatcmpl-x", "model": "m", "system_fingerprint": "b9554",
                              "object": "chat.completion.chunk"}) + b"\n\n"


SHAPES = {"vllm": vllm, "vllm-0.11.2": vllm_mid, "vllm-0.10": vllm_old, "sglang-pydantic": sglang_pydantic,
          "sglang-msgspec": sglang_msgspec, "ollama": ollama, "llama.cpp": llamacpp}
USAGE = {   # how each reports reasoning in its usage chunk (None: it does not)
    "vllm": {"prompt_tokens": 9, "total_tokens": 0, "completion_tokens": 0,
             "completion_tokens_details": {"reasoning_tokens": 0}},
    "sglang-pydantic": {"prompt_tokens": 9, "total_tokens": 0, "completion_tokens": 0,
                        "prompt_tokens_details": None, "reasoning_tokens": 0},
}


def answer_texts(n: int) -> list[str]:
    return [f" a{i}" if i % 4 else 'x\ny "z"' for i in range(n)]


def reasoning_stream(shape: str, n_reason: int, n_answer: int, reported: int | None = None) -> list[bytes]:
    """role chunk, reasoning chunks, the transition chunk (vLLM: content null), answer chunks,
    finish, usage, [DONE]: each element one HTTP chunk."""
    ev = SHAPES[shape]
    texts = [f" r{i}" if i % 3 else 'say "hi" \\ {ok}' for i in range(n_reason)]
    evs = [ev({"role": "assistant", "content": ""})]
    evs += [ev({"reasoning": t}) for t in texts[:-1]]
    evs.append(ev({"content": None, "reasoning": texts[-1]}) if shape.startswith("vllm") else ev({"reasoning": texts[-1]}))
    evs += [ev({"content": t}) for t in answer_texts(n_answer)]
    evs.append(ev({}, finish="stop"))
    usage = dict(USAGE.get(shape) or {"prompt_tokens": 9, "total_tokens": 0, "completion_tokens": 0})
    usage["completion_tokens"] = n_reason + n_answer
    if "completion_tokens_details" in usage:
        usage["completion_tokens_details"] = {"reasoning_tokens": n_reason if reported is None else reported}
    if "reasoning_tokens" in usage:
        usage["reasoning_tokens"] = n_reason if reported is None else reported
    evs.append(env(None, choices=[], tail={"usage": usage}))
    evs.append(b"data: [DONE]\n\n")
    return [chunk(e) for e in evs]


def feed_each(pieces: list[bytes], keep_text: bool = False) -> ResponseParser:
    """One read per HTTP chunk, read k at time k."""
    p = ResponseParser(keep_text)
    done = p.feed(HEAD, 0.0)
    for k, piece in enumerate(pieces, 1):
        done = p.feed(piece, float(k))
    assert not done
    assert p.feed(b"0\r\n\r\n", float(len(pieces) + 1))
    return p


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("keep_text", [False, True])
def test_reasoning_then_answer_each_chunk_counted_with_its_kind(shape, keep_text):
    p = feed_each(reasoning_stream(shape, 20, 10), keep_text)
    # chunk 1 is the role chunk; reasoning arrives at reads 2..21, the answer at 22..31
    assert list(p.token_times) == [float(k) for k in range(2, 32)]
    assert p.answer_at == 20 and p.n_reasoning == 20 and p.completion_tokens == 30
    assert p.reasoning_tokens == (20 if shape in USAGE else None)
    if keep_text:    # the answer only: reasoning never enters a conversation's history
        assert "".join(p.text) == "".join(answer_texts(10))


@pytest.mark.parametrize("shape", SHAPES)
def test_every_split_point_gives_the_same_counts(shape):
    data = HEAD + b"".join(reasoning_stream(shape, 3, 2)) + b"0\r\n\r\n"
    for cut in range(1, len(data)):
        p = ResponseParser()
        p.feed(data[:cut], 1.0)
        assert p.feed(data[cut:], 2.0)
        assert (len(p.token_times), p.answer_at, p.n_reasoning) == (5, 3, 3), cut


@pytest.mark.parametrize("shape", SHAPES)
def test_templates_count_long_streams_without_a_json_parse_per_token(shape, monkeypatch):
    parses = []
    real = json.loads
    monkeypatch.setattr(sse.json, "loads", lambda b, *a, **k: parses.append(b) or real(b, *a, **k))
    p = feed_each(reasoning_stream(shape, 200, 100))
    assert len(p.token_times) == 300 and p.answer_at == 200 and p.n_reasoning == 200
    assert len(parses) <= 4, parses    # role, first of each kind, usage


def test_twice_written_text_template_needs_both_copies_equal():
    evs = [vllm_mid({"reasoning": t}) for t in (" a", " bb", ' c"c')]
    odd = vllm_mid({"reasoning": " dd"}).replace(b'"reasoning_content":" dd"', b'"reasoning_content":" de"')
    longer = vllm_mid({"reasoning": " e"}).replace(b'"reasoning_content":" e"', b'"reasoning_content":" ee"')
    p = feed_each([chunk(e) for e in evs + [odd, longer, vllm_mid({"reasoning": " f"})]])
    assert p._mid is not None and list(p.token_times) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and p.n_reasoning == 6


def test_both_kinds_in_one_chunk_is_reasoning_and_the_first_answer():
    # vLLM's older parsers put the end of reasoning and the start of the answer in one delta
    evs = [vllm_old({"reasoning": " think"}), vllm_old({"reasoning": " done", "content": "Hi"}),
           vllm_old({"content": " there"})]
    p = feed_each([chunk(e) for e in evs])
    assert list(p.token_times) == [1.0, 2.0, 3.0] and p.answer_at == 1 and p.n_reasoning == 2


def test_reasoning_only_stream_has_no_answer():
    p = feed_each(reasoning_stream("vllm", 5, 0)[:-3] + [chunk(b"data: [DONE]\n\n")])
    assert len(p.token_times) == 5 and p.answer_at is None and p.n_reasoning == 5


def test_reported_reasoning_tokens_win_over_the_count():
    p = feed_each(reasoning_stream("vllm", 6, 2, reported=9))     # chunks carried several tokens
    assert p.reasoning_tokens == 9 and p.n_reasoning == 6


def test_openrouter_nested_text_is_not_an_answer():
    d = {"role": "assistant", "content": "", "reasoning": "Let me",
         "reasoning_details": [{"type": "reasoning.text", "text": "Let me", "format": "unknown", "index": 0}]}
    evs = [env(d), env(dict(d, reasoning=" see")), env({"role": "assistant", "content": "Yes"})]
    p = feed_each([chunk(e) for e in evs])
    assert list(p.token_times) == [1.0, 2.0, 3.0] and p.answer_at == 2 and p.n_reasoning == 2


# --- tool calls -------------------------------------------------------------------------
ARGS = ['{"', 'task', '":', ' "', 'buy \\"milk\\"', '", ', '"due": {"day": 3}', '}']


def vllm_tool_stream() -> list[bytes]:
    first = vllm({"tool_calls": [{"id": "chatcmpl-tool-a7348842dffa4c47", "type": "function", "index": 0,
                                  "function": {"name": "add_todo"}}]})
    evs = [vllm({"role": "assistant", "content": ""}), first]
    evs += [vllm({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in ARGS]
    evs.append(env({}, finish="tool_calls", choice_tail={"stop_reason": None}))
    return [chunk(e) for e in evs]


def openai_tool_stream() -> list[bytes]:
    tail = {"usage": None, "obfuscation": "kPmohDP"}
    first = env({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_XevDuUMYIPg4YiA0oGOYlJTt", "type": "function",
         "function": {"name": "add_todo", "arguments": ""}}], "refusal": None},
        head={"service_tier": "default", "system_fingerprint": None}, tail=tail)
    evs = [first] + [env({"tool_calls": [{"index": 0, "function": {"arguments": a}}]},
                         head={"service_tier": "default", "system_fingerprint": None},
                         tail={"usage": None, "obfuscation": "x" * (i % 7)}) for i, a in enumerate(ARGS)]
    evs.append(env(None, choices=[], tail={"usage": {
        "prompt_tokens": 64, "completion_tokens": 25, "total_tokens": 89,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 14, "audio_tokens": 0}}, "obfuscation": "BMY"}))
    return [chunk(e) for e in evs]


def sglang_tool_stream() -> list[bytes]:
    base = {"role": None, "content": None, "reasoning_content": None}
    evs = [sglang_pydantic({"tool_calls": [{"id": "call_0123456789abcdef01234567", "index": 0, "type": "function",
                                            "function": {"name": "add_todo", "arguments": ""}}], **base})]
    evs += [sglang_pydantic({"tool_calls": [{"id": None, "index": 0, "type": "function",
                                             "function": {"name": None, "arguments": a}}], **base}) for a in ARGS]
    return [chunk(e) for e in evs]


@pytest.mark.parametrize("stream,first", [(vllm_tool_stream, 2), (openai_tool_stream, 1), (sglang_tool_stream, 1)])
def test_tool_call_name_and_arguments_are_answer_tokens(stream, first):
    p = feed_each(stream())
    n = 1 + len(ARGS)          # the name, then each piece of the arguments
    assert list(p.token_times) == [float(k) for k in range(first, first + n)]
    assert p.answer_at == 0 and p.n_reasoning == 0


def test_openai_hidden_reasoning_is_reported_not_streamed():
    p = feed_each(openai_tool_stream())
    assert p.reasoning_tokens == 14 and p.n_reasoning == 0 and p.completion_tokens == 25


def test_escaped_arguments_match_the_template(monkeypatch):
    parses = []
    real = json.loads
    monkeypatch.setattr(sse.json, "loads", lambda b, *a, **k: parses.append(b) or real(b, *a, **k))
    evs = [vllm({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in ARGS * 30]
    p = feed_each([chunk(e) for e in evs])
    assert len(p.token_times) == len(evs) and len(parses) <= 3


# --- the JSON string check behind the templates -----------------------------------------
def reference_body(s: bytes) -> bool:
    """A JSON lexer's view: a backslash escapes the next byte; a bare quote ends the string."""
    i = 0
    while i < len(s):
        if s[i] == 92:
            if i + 1 == len(s):
                return False
            i += 2
        elif s[i] == 34:
            return False
        else:
            i += 1
    return True


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\\", b'"', b"n", b"u"]), max_size=12))
def test_json_string_body_agrees_with_a_lexer(parts):
    s = b"".join(parts)
    assert json_string_body(s) == reference_body(s)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20), st.booleans())
def test_every_encoded_string_is_a_body(text, ascii_only):
    assert json_string_body(json.dumps(text, ensure_ascii=ascii_only)[1:-1].encode())


def test_template_kind_is_kept():
    p = feed_each(reasoning_stream("sglang-msgspec", 8, 0)[:-3])
    assert p._pre is not None and p._kind == REASONING and p.n_reasoning == 8
