"""Lean streaming HTTP/1.1 client for the runner's hot path (gevent, keep-alive, SSE).

Why not FastHttpUser/aiohttp: per streamed token they cost 25-35 us of CPU, and the client's
CPU is what limits an open-loop replayer (docs/client.md). Here, per token:

- a per-connection libev I/O watcher callback runs *in the hub*: one `recv`, one stamp taken
  before any parsing (the kernel's receive time via SO_TIMESTAMPNS where available, else
  `perf_counter()`), one `ResponseParser.feed`; a late read (a backlog) takes one HTTP chunk per
  `recvmsg` instead, as TCP stamps each read with its last segment's time (`_Stream._drain`);
- the request greenlet only connects/sends and is woken once, at the end (no greenlet switch
  per event), by a `Waiter`;
- one deadline timer per request instead of a socket timeout per read; no failing EAGAIN
  `recv` per event (we only read when libev says the socket is readable).

TLS goes through `ssl.SSLObject` over memory BIOs, so the same watcher drives it.
Call `stream_post` from a greenlet of a gevent process (Locust); it blocks only that greenlet.
"""
from __future__ import annotations

import ssl
import struct
import time
from dataclasses import dataclass, field
from socket import MSG_PEEK

from gevent import GreenletExit
from gevent.hub import Waiter, get_hub

from .pool import RECV_SIZE, TLS_WANT, Conn, ConnectionPool, Deadline, failure, send_all
from .sse import COMPLETE, ProtocolError, ResponseParser

__all__ = ["ConnectionPool", "StreamResult", "stream_post"]

perf_counter = time.perf_counter
_timespec = struct.Struct("@qq").unpack_from
INF, MAX_GAP = float("inf"), 0.05   # a read gap above MAX_GAP s counts as MAX_GAP (a TTFT, a pause)


@dataclass
class StreamResult:
    status: str                 # 'ok','http_error','timeout','connection_error','protocol_error','cancelled'
    http_status: int | None = None
    error: str | None = None    # short, never secrets
    sent: float | None = None   # perf_counter just before the write of the request's last byte
    first_token: float | None = None   # first token event of any kind (answer or reasoning)
    last_token: float | None = None
    first_answer: float | None = None  # first answer event (text or tool call), after any reasoning
    token_times: list[float] = field(default_factory=list)   # array('d') of perf_counter stamps
    reasoning_chunks: int = 0          # token events before the first answer (all of them when none came)
    chunk_tokens: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None   # usage's when it reports some, else reasoning events counted
    cached_tokens: int | None = None      # prompt tokens the server reports as prefix-cache hits
    text: str | None = None
    reused_connection: bool = False   # sent on a kept-alive connection
    connect_s: float | None = None    # seconds to open its new connection (TCP + TLS); None: reused one
    end: float | None = None          # perf_counter when the response ended (last byte, error, deadline)


class _Stream:
    """One in-flight response, driven from the hub by the connection's I/O watcher."""

    __slots__ = ("conn", "recv", "recvmsg", "feed", "parser", "waiter", "timer", "got_bytes", "outcome",
                 "sec0", "base", "alarm", "last_t", "due")

    def __init__(self, conn: Conn, parser: ResponseParser, timeout: float, kernel_timestamps: bool,
                 alarm) -> None:
        self.conn, self.parser, self.waiter, self.alarm = conn, parser, Waiter(), alarm
        self.recv, self.feed = conn.sock.recv, parser.feed     # bound once: the callback is hot
        self.recvmsg = conn.sock.recvmsg if kernel_timestamps else None
        self.got_bytes, self.outcome, self.last_t = False, None, None
        self.due = 0.0 if kernel_timestamps else INF   # a read after this goes unit by unit (_drain)
        # kernel stamps are CLOCK_REALTIME: map them onto perf_counter once per request
        ns, p = time.time_ns(), perf_counter()
        self.sec0, self.base = ns // 1_000_000_000, p - (ns % 1_000_000_000) * 1e-9
        self.timer = get_hub().loop.timer(max(timeout, 0.0))

    def wait(self) -> tuple[str, str | None]:
        self.timer.start(self._end, "timeout", "no complete response before the deadline")
        self.conn.io.start(self._on_readable_tls if self.conn.tls else self._on_readable)
        try:
            return self.waiter.get()
        finally:
            self.stop()

    def stop(self) -> None:
        self.conn.io.stop()
        self.timer.stop()
        self.timer.close()

    def _end(self, status: str, error: str | None = None) -> None:
        if self.outcome is None:
            self.outcome = (status, error)
            self.stop()
            self.waiter.switch(self.outcome)

    def _on_readable(self) -> None:
        # The hot path: one recv, stamp, parse. Runs in the hub, so it must never raise.
        t = perf_counter()
        if t >= self.alarm.due:   # a send is due: it goes first, even mid-burst
            self.alarm.wake()
        if t > self.due:
            return self._drain(t)
        try:
            if self.recvmsg is None:
                data, anc = self.recv(RECV_SIZE), None
            else:
                data, anc, _, _ = self.recvmsg(RECV_SIZE, 64)
        except BlockingIOError:
            return
        except OSError as e:
            return self._end("connection_error", f"recv: {e.strerror or e}")
        self._got(data, anc, t)

    def _drain(self, t: float) -> None:
        """The first read, or one later than 1.5 gaps after the last bytes: several writes may be
        queued, and TCP gives one stamp per read, the last segment's. So read them one unit (the
        head, then each HTTP chunk: one event) per recvmsg: each keeps its own segment's stamp,
        where the kernel kept the segments apart (it merges a segment into the previous one once
        the sender has let go of that one: then they share the later stamp whatever the reads)."""
        try:
            queued, last, _, _ = self.recvmsg(RECV_SIZE, 64, MSG_PEEK)   # stamped as its last byte
            last, pos = last and last[0][2], 0
            while True:
                n = self.parser.unit(queued, pos)
                data, anc, _, _ = self.recvmsg(n or RECV_SIZE, 64)
                self._got(data, anc, t)   # never raises (a parser failure ends the stream)
                pos += len(data)
                if not n or pos >= len(queued) or self.outcome is not None:
                    return
                if anc and anc[0][2] == last:   # stamps rise along the queue: the rest share this one
                    data, anc, _, _ = self.recvmsg(len(queued) - pos, 64)
                    return self._got(data, anc, t)
        except BlockingIOError:
            return
        except OSError as e:
            return self._end("connection_error", f"recv: {e.strerror or e}")

    def _got(self, data: bytes, anc: list | None, t: float) -> None:
        if anc:   # the kernel's receive time of the last byte read; never later than now
            sec, nsec = _timespec(anc[0][2])
            kt = (sec - self.sec0) + nsec * 1e-9 + self.base
            if kt < t:
                t = kt
            last = self.last_t
            self.due = t if last is None else t + 1.5 * min(t - last, MAX_GAP)
        self.last_t = t     # the response's end, once it has ended: its last bytes' receive time
        if data and self.got_bytes:
            try:
                if self.feed(data, t):
                    self._end("error" if self.parser.stream_error else "complete")
            except Exception as e:
                self._fail(e, data)
            return
        self._data(data, t)

    def _on_readable_tls(self) -> None:
        try:
            raw = self.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as e:
            return self._end("connection_error", f"recv: {e.strerror or e}")
        t = perf_counter()
        if t >= self.alarm.due:
            self.alarm.wake()
        self.last_t = t
        if not raw:
            return self._data(b"", t)
        tls = self.conn.tls
        self.conn.tls_in.write(raw)
        try:
            while self.outcome is None:     # a read may carry several TLS records
                self._data(tls.read(RECV_SIZE), t)   # b"" = close_notify = EOF
        except TLS_WANT:
            pass
        except ssl.SSLZeroReturnError:
            self._data(b"", t)
        except ssl.SSLError as e:
            self._end(*failure(e))

    def _data(self, data: bytes, t: float) -> None:
        p = self.parser
        try:
            if data:
                self.got_bytes = True
                if p.feed(data, t):
                    self._end("error" if p.stream_error else "complete")
            elif p.eof(t):
                self._end("complete")
            elif not self.got_bytes:
                self._end("connection_error", "connection closed before any response byte")
            else:
                self._end("connection_error", f"connection closed mid-response after {len(p.token_times)} token chunks")
        except Exception as e:
            self._fail(e, data)

    def _fail(self, e: Exception, data: bytes) -> None:
        # a parser bug (not a ProtocolError) must not hang the request until its deadline either;
        # its record names the bytes it failed on, not only an exception from inside the parser
        why = str(e) if isinstance(e, ProtocolError) else f"unparsed response bytes ({type(e).__name__}: {e}): {data[:80]!r}"
        self._end("protocol_error", why[:200])


def stream_post(pool: ConnectionPool, path: str, body: bytes, *, timeout: float,
                keep_text: bool = False, on_sent=None, extra: bytes = b"") -> StreamResult:
    """POST `body` to `path` and stream the SSE response; never raises for network or server
    faults (they become the result's status). `on_sent(t)` is called with `result.sent`, the
    perf_counter just before the request's last byte was written; `extra`: header lines of this
    request only (`ConnectionPool.request_bytes`). Killing the calling greenlet
    (GreenletExit) returns a 'cancelled' result and discards the connection."""
    deadline = perf_counter() + timeout
    req = pool.request_bytes(path, body, extra)
    res = StreamResult(status="connection_error")
    conn = stream = None
    try:
        for attempt in (0, 1):
            conn = pool.acquire(deadline)
            res.reused_connection = conn.reused
            res.connect_s = None if conn.reused else conn.connect_s
            try:
                res.sent = send_all(conn.sock, _encrypt(conn, req) if conn.tls else req, deadline)
                break
            except OSError as e:
                pool.release(conn, False)
                conn = None
                # a kept-alive connection the server had closed: safe to retry only if nothing was sent
                if attempt or not res.reused_connection or getattr(e, "sent", 1):
                    raise
        if on_sent is not None:
            on_sent(res.sent)
        parser = ResponseParser(keep_text)
        stream = _Stream(conn, parser, deadline - perf_counter(), pool.kernel_timestamps, pool.alarm)
        status, error = stream.wait()
        _fill(res, parser, status, error)
        pool.release(conn, status == "complete" and parser.state == COMPLETE and parser.keep_alive)
        conn = None
    except (Deadline, OSError) as e:
        res.status, res.error = failure(e)
    except GreenletExit:
        res.status, res.error = "cancelled", "cancelled while in flight"
        if stream is not None:
            _fill(res, stream.parser, "cancelled", res.error)
    finally:
        if conn is not None:
            pool.release(conn, False)
        if res.sent is not None:   # the last bytes' receive time when it completed, else now
            res.end = stream.last_t if stream is not None and stream.outcome and stream.outcome[0] in (
                "complete", "error") and stream.last_t is not None else perf_counter()
    return res


def _encrypt(conn: Conn, data: bytes) -> bytes:
    conn.tls.write(data)
    return conn.tls_out.read()


def _fill(res: StreamResult, p: ResponseParser, status: str, error: str | None) -> None:
    """Copy the parser's findings into the result and decide the final status."""
    tt = p.token_times
    res.http_status = p.http_status
    res.token_times = tt
    res.first_token, res.last_token = (tt[0], tt[-1]) if tt else (None, None)
    res.reasoning_chunks = len(tt) if p.answer_at is None else p.answer_at
    res.first_answer = None if p.answer_at is None else tt[p.answer_at]
    res.chunk_tokens = p.chunk_token_counts()
    res.prompt_tokens, res.completion_tokens, res.cached_tokens = p.prompt_tokens, p.completion_tokens, p.cached_tokens
    # a server that streams reasoning yet reports 0 of it (SGLang on some paths) is not believed
    res.reasoning_tokens = p.reasoning_tokens or p.n_reasoning or None
    if p.text is not None:
        res.text = "".join(p.text)
    if status == "complete":
        if p.http_status != 200:
            status, error = "http_error", f"HTTP {p.http_status}: {p.error_message()}"[:200]
        elif not tt and b"event-stream" not in p.content_type and p.content_type:
            status, error = "protocol_error", f"expected text/event-stream, got {p.content_type.decode()[:60]}"
        elif not tt and not p.saw_data:
            status, error = "protocol_error", "HTTP 200 but the stream ended with no data event and no [DONE]"
        else:
            status = "ok"
    elif status == "error":
        status, error = "http_error", p.stream_error + (f" (code {p.error_code})" if p.error_code else "")
    res.status, res.error = status, error
