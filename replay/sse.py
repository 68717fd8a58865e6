"""Incremental HTTP/1.1 response + chunked-transfer + SSE parser for OpenAI-style streams.

`ResponseParser.feed(data, t)` is called once per `recv` with the bytes and the arrival time
that was stamped *before* parsing; every SSE event completed by those bytes gets time `t`.
It is the client's hot path (one call per streamed token), so it is hand-written rather than
built on h11/httptools + a JSON parse per event:

- content events are detected by byte pattern (`"text":"x` or `"content":"x`, a non-empty JSON
  string, in an event whose braces balance): no `json.loads` per token. A JSON string never
  contains an unescaped `":"`, so the pattern cannot match inside generated text. The price:
  a content event that is malformed JSON yet has balanced braces is counted, not rejected;
- a full JSON parse happens only where needed: the first event (validates the stream), events
  without content (usage, finish, errors), events carrying `usage`, and every event when the
  generated text is wanted (`keep_text`).

Handles: events split across reads or HTTP chunks, several events per read, CRLF line ends,
comment/ping lines and other SSE fields, `[DONE]` before the chunked terminator, trailers,
Content-Length and read-until-close bodies, error JSON inside a 200 stream.
"""
from __future__ import annotations

import json
from array import array

HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, TRAILERS, LENGTH, UNTIL_CLOSE, COMPLETE = range(8)
MAX_HEAD = 65536
MAX_ERROR_BODY = 4096


class ProtocolError(Exception):
    """The bytes on the wire are not a well-formed HTTP/1.1 SSE response."""


def _content_at(payload: bytes, key: bytes) -> bool:
    """True when `key` (e.g. b'"text":') is followed by a non-empty JSON string."""
    i = payload.find(key)
    if i < 0:
        return False
    i += len(key)
    if payload[i:i + 1] == b" ":
        i += 1
    return payload[i:i + 1] == b'"' and payload[i + 1:i + 2] != b'"'


def plain_content(payload: bytes) -> bool:
    """A `{...}` event that carries generated text and needs no JSON parse: a non-empty text or
    content string, no usage, balanced braces (a truncated event fails this and gets parsed)."""
    k = payload.find(b'"text":"')
    if k >= 0:
        k += 8
    else:
        k = payload.find(b'"content":"')
        if k >= 0:
            k += 11
        elif not (_content_at(payload, b'"text":') or _content_at(payload, b'"content":')):
            return False
    return ((k < 0 or payload[k] != 34) and payload[-1:] == b"}" and payload.find(b'"usage"') < 0
            and payload.count(b"{") == payload.count(b"}"))


def _event_text(obj: dict) -> str:
    out = []
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        piece = ch.get("text")
        if piece is None:
            piece = (ch.get("delta") or {}).get("content")
        if isinstance(piece, str):
            out.append(piece)
    return "".join(out)


class ResponseParser:
    """One response: status line, headers, body framing, and the SSE events inside it."""

    def __init__(self, keep_text: bool = False) -> None:
        self.keep_text = keep_text
        self.state = HEAD
        self.http_status: int | None = None
        self.content_type = b""
        self.keep_alive = True
        self.token_times = array("d")
        self.chunk_tokens: list[int] | None = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.text: list[str] | None = [] if keep_text else None
        self.done = False              # saw `data: [DONE]`
        self.stream_error: str | None = None
        self.error_code: int | None = None
        self.error_body = b""          # body kept for non-200 responses (bounded)
        self._buf = b""                # unparsed framing bytes
        self._sse = b""                # unparsed SSE bytes (an incomplete event)
        self._left = 0                 # bytes left in the current chunk / Content-Length body
        self._fast = False             # content events may skip the JSON parse (after the first)
        self._pre: bytes | None = None  # template of a plain content chunk (see _learn)
        self._post = b""
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

    def _plain_chunks(self, data: bytes, t: float) -> int:
        """The common read: whole chunks each holding one content event that differs from a
        learned one (`_learn`) only in its text. Counts them without parsing; returns the offset
        of the first byte it did not consume (the general path takes it from there)."""
        pre, post = self._pre, self._post
        lo, lq, n, pos, hit = len(pre), len(post), len(data), 0, False
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
            if (b <= a + lo or b + lq > n or not data.startswith(pre, a) or not data.startswith(post, b)
                    or data.find(b'"', a + lo, b) >= 0 or data[b - 1] == 92):
                break   # not plain: empty/escaped text, other fields, or a partial chunk
            self.token_times.append(t)
            hit, pos = True, b + lq
        if hit:
            self.chunk_tokens = None
        return pos

    def _learn(self, payload: bytes) -> None:
        """Remember a validated content event (one choice, no usage) as the template that
        `_plain_chunks` matches: its bytes before and after the text. Its JSON string cannot
        contain an unescaped quote, so bytes equal outside a quote-free text are the same event."""
        self._relearn -= 1
        k = payload.find(b'"text":"')
        k = k + 8 if k >= 0 else payload.find(b'"content":"') + 11
        q = payload.find(b'"', k) if k > 10 else -1
        if (q <= k or payload[q - 1] == 92 or payload.find(b'"text":"', q) >= 0
                or payload.find(b'"content":"', q) >= 0):
            return   # escapes in the text, or a second choice: keep parsing these
        self._pre, self._post = b"data: " + payload[:k], payload[q:] + b"\n\n\r\n"

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
        if self.done:
            return
        if payload == b"[DONE]":
            self.done, self._fast = True, False
            return
        if self._fast:
            if plain_content(payload):
                self.token_times.append(t)           # no JSON parse
                self.chunk_tokens = None
                if self._relearn > 0:
                    self._learn(payload)
                return
            if (payload.find(b'"finish_reason":"') > 0 and payload.find(b'"usage"') < 0
                    and payload.find(b'"error"') < 0 and (b'"text":""' in payload or b'"delta":{}' in payload)
                    and payload.count(b"{") == payload.count(b"}")):
                return     # the text-less finish event: nothing to record
        self._fast = not self.keep_text
        try:
            obj = json.loads(payload)
        except ValueError:
            raise ProtocolError(f"malformed SSE data: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"SSE data is not a JSON object: {payload[:80]!r}")
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            body = err if isinstance(err, dict) else obj
            msg = body.get("message") if isinstance(body, dict) else None
            code = body.get("code") if isinstance(body, dict) else None
            self.error_code = code if isinstance(code, int) else None
            self.stream_error = "error in stream: " + str(msg or err)[:200]
            return
        text = _event_text(obj)
        usage = obj.get("usage")
        prev = self.completion_tokens
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
        if text:
            self.token_times.append(t)
            if self._relearn > 0 and usage is None and len(obj["choices"]) == 1:
                self._learn(payload)
            if self.text is not None:
                self.text.append(text)
            if self.chunk_tokens is not None:
                if prev is not None and self.completion_tokens is not None and self.completion_tokens > prev:
                    self.chunk_tokens.append(self.completion_tokens - prev)
                elif prev is None and self.completion_tokens is not None:
                    self.chunk_tokens.append(self.completion_tokens)
                else:
                    self.chunk_tokens = None    # not every content chunk carries usage

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
