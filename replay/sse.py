"""Incremental HTTP/1.1 response + chunked-transfer + SSE parser for OpenAI-style streams.

`ResponseParser.feed(data, t)` is called once per `recv` with the bytes and the arrival time
that was stamped *before* parsing; every SSE event completed by those bytes gets time `t`.
It is the client's hot path (one call per streamed token), so it is hand-written rather than
built on h11/httptools + a JSON parse per event.

A *token event* carries generated tokens of either kind:
- answer: `text` (completions), `delta.content`, `delta.refusal`, or a streamed tool call
  (`delta.tool_calls[].function.name` / `.arguments`);
- reasoning: `delta.reasoning_content` (vLLM <= 0.15, SGLang, llama.cpp) or `delta.reasoning`
  (vLLM from about 0.11.2, Ollama, OpenRouter).
Each gets one entry in `token_times`; `answer_at` is the index of the first answer event and
`n_reasoning` counts the events that carried reasoning.

- token events are detected by byte pattern (`"content":"x`, `"reasoning":"x`, ..., a
  non-empty JSON string, in an event whose braces balance): no `json.loads` per token. A JSON
  string never contains an unescaped `":"`, so the pattern cannot match inside generated text.
  The price: a token event that is malformed JSON yet has balanced braces is counted, not
  rejected;
- a full JSON parse happens only where needed: the first event (validates the stream), events
  without tokens (usage, finish, errors), events carrying `usage`, events whose kind the bytes
  leave open (two token fields), and every event when the generated text is wanted (`keep_text`).

Handles: events split across reads or HTTP chunks, several events per read, CRLF line ends,
comment/ping lines and other SSE fields, `[DONE]` before the chunked terminator, trailers,
Content-Length and read-until-close bodies, error JSON inside a 200 stream.
"""
from __future__ import annotations

import json
from array import array

from .sse_events import (ANSWER, REASONING, ProtocolError, _string_end, event_tokens, json_string_body, malformed_json,
                         reasoning_reported, token_fields, token_kind)

HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, TRAILERS, LENGTH, UNTIL_CLOSE, COMPLETE = range(8)
MAX_HEAD = 65536
MAX_ERROR_BODY = 4096


class ResponseParser:
    """One response: status line, headers, body framing, and the SSE events inside it."""

    def __init__(self, keep_text: bool = False) -> None:
        self.keep_text = keep_text
        self.state = HEAD
        self.http_status: int | None = None
        self.content_type = b""
        self.keep_alive = True
        self.token_times = array("d")   # one per token event (answer or reasoning)
        self.answer_at: int | None = None   # index of the first answer event
        self.n_reasoning = 0               # token events that carried reasoning
        self.chunk_tokens: list[int] | None = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.reasoning_tokens: int | None = None   # as the usage reported them
        self.cached_tokens: int | None = None      # usage.prompt_tokens_details.cached_tokens (prefix-cache hit)
        self.text: list[str] | None = [] if keep_text else None
        self.done = False              # saw `data: [DONE]`
        self.saw_data = False          # some event carried data (token events imply it)
        self.stream_error: str | None = None
        self.error_code: int | None = None
        self.error_body = b""          # body kept for non-200 responses (bounded)
        self._buf = b""                # unparsed framing bytes
        self._sse = b""                # unparsed SSE bytes (an incomplete event)
        self._left = 0                 # bytes left in the current chunk / Content-Length body
        self._fast = False             # content events may skip the JSON parse (after the first)
        self._pre: bytes | None = None  # template of a plain token chunk (see _learn)
        self._post = b""
        self._mid: bytes | None = None   # a template whose text appears twice: the bytes between
        self._kind = ANSWER              # what the template's text is
        self._relearn = 0 if keep_text else 4   # templates learned at most this often per stream

    # -- framing ----------------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> bool:
        """Consume bytes read at perf_counter time `t`; True once the response is complete."""
        if self._pre is not None and self.state == CHUNK_SIZE and not self._buf and not self._sse:
            pos = self._plain_chunks(data, t)
            if pos == len(data):
                return False
            data = data[pos:] if pos else data
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, n = 0, len(buf)
        while pos < n:
            st = self.state
            if st == CHUNK_SIZE:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if n - pos > 1024:
                        raise ProtocolError("chunk size line too long")
                    break
                line = buf[pos:i]
                semi = line.find(b";")      # chunk extensions are ignored
                try:
                    size = int(line if semi < 0 else line[:semi], 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {line[:20]!r}") from None
                pos = i + 2
                if size == 0:
                    self.state = TRAILERS
                else:
                    self._left, self.state = size, CHUNK_DATA
            elif st == CHUNK_DATA:
                end = pos + self._left
                if end <= n:
                    self._body(buf[pos:end], t)
                    pos, self._left, self.state = end, 0, CHUNK_CRLF
                else:
                    self._body(buf[pos:], t)
                    self._left -= n - pos
                    pos = n
            elif st == CHUNK_CRLF:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("missing CRLF after chunk data")
                pos += 2
                self.state = CHUNK_SIZE
            elif st == TRAILERS:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    break
                self.state = COMPLETE if i == pos else TRAILERS   # an empty line ends trailers
                pos = i + 2
            elif st == HEAD:
                i = buf.find(b"\r\n\r\n", pos)
                if i < 0:
                    if n - pos > MAX_HEAD:
                        raise ProtocolError("response head too large")
                    break
                self._head(buf[pos:i])
                pos = i + 4
            elif st == LENGTH:
                take = min(self._left, n - pos)
                self._body(buf[pos:pos + take], t)
                pos += take
                self._left -= take
                if self._left == 0:
                    self.state = COMPLETE
            elif st == UNTIL_CLOSE:
                self._body(buf[pos:], t)
                pos = n
            else:   # COMPLETE: bytes after the response on a keep-alive connection
                self.keep_alive = False
                break
        if pos < n and self.state != COMPLETE:
            self._buf = buf[pos:]
        elif self.state == COMPLETE and self._sse:
            self._finish_sse(t)
        return self.state == COMPLETE or self.stream_error is not None

    def unit(self, queued: bytes, pos: int) -> int:
        """How many bytes of `queued` (not yet fed), from `pos`, finish what is being read now:
        the head, or the current HTTP chunk with its CRLF; 0 when the framing does not say (the
        chunked terminator, a Content-Length or read-until-close body, an incomplete size line).
        A server writes one event per chunk, so a read that stops there takes one write's segments."""
        st, held = self.state, len(self._buf)
        if held:    # the start of a head or size line came with the last read (rare): look at both
            queued, pos = self._buf + queued[pos:], 0
        if st == CHUNK_SIZE:
            i = queued.find(b"\r\n", pos, pos + 20)
            try:
                size = int(queued[pos:i], 16) if i > pos else 0
            except ValueError:
                return 0
            return i + 4 + size - pos - held if size else 0
        if st == CHUNK_DATA:
            return self._left + 2
        if st == CHUNK_CRLF:
            return 2 - held
        if st == HEAD:
            i = queued.find(b"\r\n\r\n", pos)
            return i + 4 - pos - held if i >= 0 else 0
        return 0

    def _plain_chunks(self, data: bytes, t: float) -> int:
        """The common read: whole chunks each holding one token event that differs from a
        learned one (`_learn`) only in its text. Counts them without parsing; returns the offset
        of the first byte it did not consume (the general path takes it from there)."""
        pre, post, mid, tt = self._pre, self._post, self._mid, self.token_times
        lo, lq, n, pos, first = len(pre), len(post), len(data), 0, len(tt)
        while pos < n:
            i = data.find(b"\r\n", pos, pos + 10)
            if i < 0:
                break
            try:
                size = int(data[pos:i], 16)
            except ValueError:
                break
            a = i + 2
            b = a + size + 2 - lq           # where the text's closing quote must be
            if b <= a + lo or b + lq > n or not data.startswith(pre, a) or not data.startswith(post, b):
                break   # not plain: empty text, other fields, or a partial chunk
            e = b
            if mid is not None:             # the text twice: pre T mid T post
                half, odd = divmod(b - a - lo - len(mid), 2)
                e = a + lo + half
                if half <= 0 or odd or not data.startswith(mid, e) or data[a + lo:e] != data[e + len(mid):b]:
                    break
            if (data.find(b'"', a + lo, e) >= 0 or data[e - 1] == 92) and not json_string_body(data[a + lo:e]):
                break   # the quote at e is not where the text ends
            tt.append(t)
            pos = b + lq
        if len(tt) > first:
            self.chunk_tokens = None
            if self._kind == REASONING:
                self.n_reasoning += len(tt) - first
            elif self.answer_at is None:
                self.answer_at = first
        return pos

    def _learn(self, payload: bytes, kind: int, fields: list | None) -> None:
        """Remember a validated token event (one choice, no usage) as the template that
        `_plain_chunks` matches: its bytes before and after the text. A chunk whose bytes equal
        these outside a text that is one JSON string is the same event. The text may appear
        twice, in two fields of one kind (vLLM 0.11.2-0.15 echo `reasoning` in `reasoning_content`)."""
        self._relearn -= 1
        if not fields or len(fields) > 2:
            return      # keep parsing these
        fields.sort(key=lambda f: f[1])
        k = fields[0][1]
        q = end = _string_end(payload, k)
        mid = None
        if len(fields) == 2:
            k2 = fields[1][1]
            end = _string_end(payload, k2)
            if fields[1][0] != fields[0][0] or payload[k:q] != payload[k2:end] or k2 < q:
                return
            mid = payload[q:k2]
        self._pre, self._post, self._mid, self._kind = b"data: " + payload[:k], payload[end:] + b"\n\n\r\n", mid, kind

    def _token(self, kind: int, t: float) -> None:
        if kind & ANSWER and self.answer_at is None:
            self.answer_at = len(self.token_times)
        if kind & REASONING:
            self.n_reasoning += 1
        self.token_times.append(t)

    def eof(self, t: float) -> bool:
        """The peer closed the connection; True when that ends the response normally."""
        self.keep_alive = False
        if self.state == UNTIL_CLOSE:
            self._finish_sse(t)
            self.state = COMPLETE
        return self.state == COMPLETE or (self.done and self.state != HEAD)

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:60]!r}")
        status = int(parts[1])
        if 100 <= status < 200:    # interim response (100 Continue): the real head follows
            return
        self.http_status = status
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        chunked, length = False, None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise ProtocolError(f"bad Content-Length {value[:20]!r}") from None
            elif name == b"connection":
                v = value.lower()
                if b"close" in v:
                    self.keep_alive = False
                elif b"keep-alive" in v:
                    self.keep_alive = True
            elif name == b"content-type":
                self.content_type = value.lower()
            elif name == b"content-encoding" and value.lower() not in (b"identity", b""):
                raise ProtocolError(f"Content-Encoding {value[:20].decode('latin-1')} that the client did not "
                                    "ask for (it sends Accept-Encoding: identity): the body cannot be read")
        if chunked:
            self.state = CHUNK_SIZE
        elif length is not None:
            self._left = length
            self.state = LENGTH if length else COMPLETE
        else:
            self.keep_alive = False
            self.state = UNTIL_CLOSE

    # -- body: SSE events (or a bounded error body) -----------------------------------------
    def _body(self, piece: bytes, t: float) -> None:
        if self.http_status != 200:
            room = MAX_ERROR_BODY - len(self.error_body)
            if room > 0:
                self.error_body += piece[:room]
            return
        sse = self._sse + piece if self._sse else piece
        if b"\r" in sse:
            # normalise CRLF / CR line ends; a trailing CR may be half of a CRLF split by a read
            keep = b"\r" if sse.endswith(b"\r") else b""
            sse = sse[:len(sse) - len(keep)].replace(b"\r\n", b"\n").replace(b"\r", b"\n") + keep
        start = 0
        while True:
            end = sse.find(b"\n\n", start)
            if end < 0:
                break
            self._event(sse[start:end], t)
            start = end + 2
        self._sse = sse[start:] if start < len(sse) else b""
        if len(self._sse) > 1 << 22:
            raise ProtocolError("SSE event larger than 4 MiB without a blank line")

    def _finish_sse(self, t: float) -> None:
        if self._sse.strip():
            self._event(self._sse.rstrip(b"\r\n"), t)
        self._sse = b""

    def _event(self, ev: bytes, t: float) -> None:
        if ev.startswith(b"data: ") and b"\n" not in ev:
            payload = ev[6:]
        else:   # general case: several lines, comments, other fields
            datas = []
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    v = line[5:]
                    datas.append(v[1:] if v[:1] == b" " else v)
                elif line.startswith(b"event:") and b"error" in line:
                    self.stream_error = self.stream_error or "error event in stream"
            if not datas:
                return    # comment / ping / id / retry only
            payload = b"\n".join(datas)
        self.saw_data = True
        if self.done:
            return
        if payload == b"[DONE]":
            self.done, self._fast = True, False
            return
        if self._fast:
            kind, fields = token_kind(payload)
            if kind:
                self._token(kind, t)           # no JSON parse
                self.chunk_tokens = None
                if self._relearn > 0:
                    self._learn(payload, kind, fields)
                return
            if (payload.find(b'"finish_reason":"') > 0 and payload.find(b'"usage"') < 0
                    and payload.find(b'"error"') < 0 and (b'"text":""' in payload or b'"delta":{}' in payload)
                    and payload.count(b"{") == payload.count(b"}")):
                return     # the text-less finish event: nothing to record
        self._fast = not self.keep_text
        try:
            obj = json.loads(payload)
        except ValueError as e:
            raise ProtocolError(malformed_json(payload, e)) from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"SSE data is not a JSON object: {payload[:80]!r}")
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            body = err if isinstance(err, dict) else obj
            code = body.get("code")
            self.error_code = code if isinstance(code, int) else None
            self.stream_error = "error in stream: " + str(body.get("message") or err)[:200]
            return
        text, kind = event_tokens(obj)
        usage = obj.get("usage")
        prev = self.completion_tokens
        if isinstance(usage, dict):
            for name in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(name), int):
                    setattr(self, name, usage[name])
            reasoning = reasoning_reported(usage)
            if reasoning is not None:
                self.reasoning_tokens = reasoning
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_tokens = details["cached_tokens"]
        if kind:
            self._token(kind, t)
            if self._relearn > 0 and usage is None and len(obj["choices"]) == 1 and kind != ANSWER | REASONING:
                self._learn(payload, kind, token_fields(payload))
            if self.text is not None and text:
                self.text.append(text)
            if self.chunk_tokens is not None:
                now = self.completion_tokens
                if now is not None and (prev is None or now > prev):
                    self.chunk_tokens.append(now - (prev or 0))
                else:
                    self.chunk_tokens = None    # not every token chunk carries usage

    def chunk_token_counts(self) -> list[int] | None:
        ct = self.chunk_tokens
        return ct if ct and len(ct) == len(self.token_times) else None

    def error_message(self) -> str:
        """Short text of a non-200 response body (the OpenAI error message when present)."""
        raw = self.error_body
        try:
            obj = json.loads(raw)
            err = obj.get("error", obj) if isinstance(obj, dict) else obj
            msg = err.get("message") if isinstance(err, dict) else None
            if msg:
                return str(msg)[:200]
        except ValueError:
            pass
        return raw[:200].decode("utf-8", "replace").strip()
