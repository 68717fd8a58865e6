"""replay.sse.ResponseParser on byte streams cut at every possible point (no sockets needed)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from llm_replay.replay.sse import COMPLETE, ProtocolError, ResponseParser

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def completion_event(text: str, **extra) -> bytes:
    obj = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}], **extra}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat_event(delta: dict) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"   # ", " and ": "


def stream(n: int = 5, nl: bytes = b"\n") -> bytes:
    evs = [completion_event(f" w{i}") for i in range(n)]
    evs.append(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % n)
    evs.append(b"data: [DONE]\n\n")
    return HEAD + b"".join(chunk(e.replace(b"\n", nl)) for e in evs) + b"0\r\n\r\n"


def feed_pieces(data: bytes, cuts: list[int], keep_text=False) -> tuple[ResponseParser, bool]:
    p, done, prev = ResponseParser(keep_text), False, 0
    for i, c in enumerate(sorted(set(cuts)) + [len(data)]):
        if c > prev:
            done = p.feed(data[prev:c], float(i))
            prev = c
    return p, done


def check_full(p: ResponseParser, done: bool, n: int = 5) -> None:
    assert done and p.state == COMPLETE and p.http_status == 200 and p.keep_alive
    assert len(p.token_times) == n and list(p.token_times) == sorted(p.token_times)
    assert (p.prompt_tokens, p.completion_tokens, p.stream_error, p.done) == (7, n, None, True)


@pytest.mark.parametrize("nl", [b"\n", b"\r\n"])
def test_every_single_split_point(nl):
    data = stream(nl=nl)
    for cut in range(1, len(data)):
        p, done = feed_pieces(data, [cut], keep_text=cut % 2 == 0)
        check_full(p, done)
        if p.text is not None:
            assert "".join(p.text) == "".join(f" w{i}" for i in range(5))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=900), max_size=40), st.booleans())
def test_random_splits_and_one_byte_reads(cuts, crlf):
    data = stream(nl=b"\r\n" if crlf else b"\n")
    check_full(*feed_pieces(data, [c % len(data) for c in cuts]))


def test_one_byte_at_a_time_stamps_the_completing_read():
    data = stream(2)
    p, done = feed_pieces(data, list(range(1, len(data))))
    check_full(p, done, 2)
    ends = [data.index(b'w%d"' % i) for i in range(2)]
    # the event completes at the read carrying its blank line, after the text position
    assert all(t > e for t, e in zip(p.token_times, ends))


def test_several_events_in_one_chunk_and_one_read_share_the_time():
    body = b"".join(completion_event(f"x{i}") for i in range(4))
    p = ResponseParser()
    assert p.feed(HEAD + chunk(body) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n", 3.5)
    assert list(p.token_times) == [3.5] * 4


def test_comments_fields_and_multiline_data():
    body = (b": ping\n\nevent: completion\nid: 1\nretry: 10\ndata: " + completion_event("a")[6:]
            + b'data: {"choices":[{"text":\ndata: "b"}]}\n\n' + b":keepalive\n\n" + b"data: [DONE]\n\n")
    p = ResponseParser(keep_text=True)
    assert p.feed(HEAD + chunk(body) + b"0\r\n\r\n", 1.0)
    assert len(p.token_times) == 2 and "".join(p.text) == "ab"


def test_empty_and_null_content_are_not_tokens():
    body = (chat_event({"role": "assistant", "content": ""}) + chat_event({"content": None})
            + chat_event({"content": "hi"}) + chat_event({"content": "\"quoted\" \"text\":\"x\""})
            + chat_event({}) + completion_event("") + b"data: [DONE]\n\n")
    p = ResponseParser()
    assert p.feed(HEAD + chunk(body) + b"0\r\n\r\n", 1.0)
    assert len(p.token_times) == 2


def test_done_before_terminator_then_trailers():
    p = ResponseParser()
    assert not p.feed(HEAD + chunk(completion_event("a") + b"data: [DONE]\n\n"), 1.0)
    assert p.done and p.state != COMPLETE           # the response is not over yet
    assert not p.feed(b"0\r\nX-Trailer: 1\r\n", 2.0)
    assert p.feed(b"\r\n", 3.0) and p.keep_alive


def test_eof_after_done_is_complete_but_mid_stream_is_not():
    p = ResponseParser()
    p.feed(HEAD + chunk(completion_event("a") + b"data: [DONE]\n\n"), 1.0)
    assert p.eof(2.0) and not p.keep_alive
    q = ResponseParser()
    q.feed(HEAD + chunk(completion_event("a")), 1.0)
    assert not q.eof(2.0)


def test_error_json_inside_200_stream():
    p = ResponseParser()
    body = completion_event("a") + b'data: {"error":{"message":"engine died","code":503}}\n\n'
    assert p.feed(HEAD + chunk(body), 1.0)
    assert p.stream_error == "error in stream: engine died" and p.error_code == 503
    assert len(p.token_times) == 1


@pytest.mark.parametrize("bad", [b'data: {"choices":[{"text":"a"}\n\n', b"data: not json\n\n", b"data: [1,2]\n\n"])
def test_malformed_data_raises(bad):
    p = ResponseParser()
    p.feed(HEAD + chunk(completion_event("ok")), 1.0)      # the first event is always parsed fully
    with pytest.raises(ProtocolError):
        p.feed(chunk(bad), 2.0)


@pytest.mark.parametrize("raw", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                                 b"garbage\r\n\r\n", b"HTTP/1.1 2x0 OK\r\n\r\n"])
def test_bad_framing_raises(raw):
    with pytest.raises(ProtocolError):
        ResponseParser().feed(raw, 1.0)


def test_error_status_body_with_content_length_keeps_message():
    err = b'{"error":{"message":"rate limited","type":"x"}}'
    p = ResponseParser()
    assert p.feed(b"HTTP/1.1 429 Too Many\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err), 1.0)
    assert p.http_status == 429 and p.error_message() == "rate limited" and p.keep_alive


def test_until_close_body_and_interim_response():
    p = ResponseParser()
    assert not p.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
                      + completion_event("a") + b"data: " + completion_event("b")[6:-2], 1.0)
    assert p.eof(2.0) and list(p.token_times) == [1.0, 2.0]


def test_usage_on_every_chunk_gives_tokens_per_chunk():
    body = b"".join(completion_event("ab" * k, usage={"prompt_tokens": 3, "completion_tokens": c})
                    for k, c in ((1, 1), (1, 3), (1, 4))) + b"data: [DONE]\n\n"
    p = ResponseParser()
    assert p.feed(HEAD + chunk(body) + b"0\r\n\r\n", 1.0)
    assert p.chunk_token_counts() == [1, 2, 1] and p.completion_tokens == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8), st.booleans(),
       st.lists(st.integers(min_value=1, max_value=4000), max_size=6))
def test_arbitrary_generated_text_is_counted_once_and_kept_exactly(texts, chat, cuts):
    # text with quotes, braces, newlines, unicode or even '"text":"' must neither hide nor add tokens
    evs = [chat_event({"content": x}) if chat else completion_event(x) for x in texts]
    evs.append(completion_event("").replace(b'"finish_reason":null', b'"finish_reason":"stop"'))
    data = HEAD + b"".join(chunk(e) for e in evs) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    for keep in (False, True):
        p, done = feed_pieces(data, [c % len(data) for c in cuts], keep_text=keep)
        assert done and len(p.token_times) == len(texts)
        if keep:
            assert "".join(p.text) == "".join(texts)


def test_finish_event_with_text_counts():
    body = completion_event("a") + completion_event("b").replace(b'"finish_reason":null', b'"finish_reason":"length"')
    p = ResponseParser()
    assert p.feed(HEAD + chunk(body + b"data: [DONE]\n\n") + b"0\r\n\r\n", 1.0)
    assert len(p.token_times) == 2


def vllm_event(text: str, created: int = 100) -> bytes:
    # vLLM's completions chunks carry "usage":null on every event
    obj = {"id": "cmpl-1", "object": "text_completion", "created": created, "model": "m",
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None}],
           "usage": None}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@pytest.mark.parametrize("per_read", [1, 3])
def test_learned_chunks_count_tricky_texts_once(per_read):
    texts = [" a", " b", 'q"uote', "back\\", "\\", " c", "", " d", "}{", '"text":"x', " e"]
    evs = [vllm_event(x, created=100 + i // 6) for i, x in enumerate(texts)]   # `created` changes mid-stream
    evs.append(b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":10}}\n\n')
    pieces = [HEAD] + [chunk(e) for e in evs] + [chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    p, t = ResponseParser(), 0.0
    for k in range(0, len(pieces), per_read):
        t += 1.0
        done = p.feed(b"".join(pieces[k:k + per_read]), t)
    assert done and len(p.token_times) == 10 and p.completion_tokens == 10
    assert p._pre is not None and p._pre.startswith(b'data: {"id":"cmpl-1"')   # the no-parse path is in use
    if per_read == 1:   # one read per event: each token keeps its own read's time
        assert list(p.token_times) == [float(i + 2) for i, x in enumerate(texts) if x]


def test_learned_template_never_counts_a_changed_event():
    # same bytes around the text, but a usage or finish event must still be parsed
    p = ResponseParser()
    p.feed(HEAD + chunk(vllm_event(" a")) + chunk(vllm_event(" b")), 1.0)
    assert p._pre is not None
    fin = vllm_event(" c").replace(b'"finish_reason":null', b'"finish_reason":"length"')
    use = vllm_event("").replace(b'"usage":null', b'"usage":{"prompt_tokens":1,"completion_tokens":3}')
    assert p.feed(chunk(fin) + chunk(use) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n", 2.0)
    assert len(p.token_times) == 3 and p.completion_tokens == 3


def test_learned_template_rejects_quotes_and_trailing_backslash():
    p = ResponseParser()
    p.feed(HEAD + chunk(vllm_event(" a")), 1.0)
    # a raw quote in the "text": same bytes around it, yet an empty text and another field
    sneaky = vllm_event("").replace(b'"text":""', b'"text":"","x":""')
    assert not p.feed(chunk(sneaky), 2.0)
    assert len(p.token_times) == 1
    # a text ending in a lone backslash escapes the closing quote: malformed, not a token
    broken = vllm_event("zz").replace(b'"text":"zz"', b'"text":"zz\\"')
    with pytest.raises(ProtocolError):
        p.feed(chunk(broken), 3.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=900), max_size=6), st.booleans())
def test_unit_reads_take_the_head_then_one_chunk_each(cuts, crlf):
    """A backlog read unit by unit (the client's late reads): `unit` ends each read at the head's
    end, then at each chunk's end (one event each), from wherever the reads before it stopped."""
    data = stream(nl=b"\r\n" if crlf else b"\n")
    ends, pos = [len(HEAD)], len(HEAD)
    while data[pos:pos + 1] != b"0":
        i = data.index(b"\r\n", pos)
        pos = i + 4 + int(data[pos:i], 16)
        ends.append(pos)
    p, prev, reads, done = ResponseParser(), 0, 0, False
    for c in sorted({c % len(data) for c in cuts if c % len(data)}):   # arbitrary reads first
        p.feed(data[prev:c], 0.0)
        prev = c
    pos = prev
    while pos < len(data):
        n = p.unit(data, pos)
        if n:
            assert pos + n in ends
        else:           # the chunked terminator: the rest
            assert pos >= ends[-1]
            n = len(data) - pos
        reads += 1
        done = p.feed(data[pos:pos + n], float(reads))
        pos += n
    check_full(p, done)
    if prev <= ends[3]:     # the last two events each came by a unit read of its own
        assert p.token_times[3] < p.token_times[4]
