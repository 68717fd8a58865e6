"""Lean streaming HTTP/1.1 client for the runner's hot path (gevent, keep-alive, SSE).

Why not FastHttpUser/aiohttp: per streamed token they cost 25-35 us of CPU, and the client's
CPU is what limits an open-loop replayer (DESIGN section 7). Here, per token:

- a per-connection libev I/O watcher callback runs *in the hub*: one `recv`, one
  `perf_counter()` stamp taken before any parsing, one `ResponseParser.feed`;
- the request greenlet only connects/sends and is woken once, at the end (no greenlet switch
  per event), by a `Waiter`;
- one deadline timer per request instead of a socket timeout per read; no failing EAGAIN
  `recv` per event (we only read when libev says the socket is readable).

TLS goes through `ssl.SSLObject` over memory BIOs, so the same watcher drives it.
Call `stream_post` from a greenlet of a gevent process (Locust); it blocks only that greenlet.
"""
from __future__ import annotations

import _socket
import errno
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gevent import GreenletExit
from gevent.hub import Waiter, get_hub
from gevent.lock import Semaphore
from gevent.socket import wait_read, wait_write

from .sse import COMPLETE, ProtocolError, ResponseParser

perf_counter = time.perf_counter
RECV_SIZE = 65536
_TLS_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


@dataclass
class StreamResult:
    status: str                 # 'ok','http_error','timeout','connection_error','protocol_error','cancelled'
    http_status: int | None = None
    error: str | None = None    # short, never secrets
    sent: float | None = None   # perf_counter when the request's last byte was written
    first_token: float | None = None
    last_token: float | None = None
    token_times: list[float] = field(default_factory=list)   # array('d') of perf_counter stamps
    chunk_tokens: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str | None = None
    reused_connection: bool = False   # sent on a kept-alive connection


class _Deadline(Exception):
    """A time limit passed before the response phase; args: (status, message)."""


class _Conn:
    """One TCP (optionally TLS) connection and its reusable read watcher."""

    __slots__ = ("sock", "io", "tls", "tls_in", "tls_out", "reused")

    def __init__(self, sock: _socket.socket, tls=None, tls_in=None, tls_out=None) -> None:
        self.sock, self.tls, self.tls_in, self.tls_out = sock, tls, tls_in, tls_out
        self.io = get_hub().loop.io(sock.fileno(), 1)
        self.reused = False

    def alive(self) -> bool:
        """An idle keep-alive connection is usable when the peer has neither closed it nor sent
        anything (a non-blocking peek; EAGAIN means alive)."""
        try:
            self.sock.recv(1, socket.MSG_PEEK)   # b"" (closed) or stray bytes: unusable
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.io.stop()
        self.io.close()
        self.sock.close()


class ConnectionPool:
    """Keep-alive connections to one origin; `max_connections` bounds those in use at once."""

    def __init__(self, base_url: str, *, max_connections: int = 10000, connect_timeout: float = 10.0,
                 headers: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http://host[:port] or https://...: {base_url!r}")
        self.host, self.tls = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.ssl_context = (ssl_context or ssl.create_default_context()) if self.tls else None
        hdrs = {"Host": u.netloc.rpartition("@")[2], "User-Agent": "llm-replay", "Accept": "text/event-stream",
                "Content-Type": "application/json", **(headers or {})}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()).encode("latin-1")
        self._idle: list[_Conn] = []
        self._slots = Semaphore(max_connections)
        self._addrs: list | None = None
        self.opened = 0   # connections opened so far (tests and benchmarks look at reuse)

    def request_bytes(self, path: str, body: bytes) -> bytes:
        return (b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n"
                % ((self.prefix + path).encode(), self._head, len(body))) + body

    def acquire(self, deadline: float) -> _Conn:
        if not self._slots.acquire(timeout=max(0.0, deadline - perf_counter())):
            raise _Deadline("timeout", "no free connection slot before the deadline")
        try:
            while self._idle:
                conn = self._idle.pop()
                if conn.alive():
                    conn.reused = True
                    return conn
                conn.close()
            return self._connect(min(self.connect_timeout, deadline - perf_counter()))
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def _connect(self, timeout: float) -> _Conn:
        if self._addrs is None:   # resolved once; e.g. localhost may give ::1 then 127.0.0.1
            self._addrs = [(ai[0], ai[4]) for ai in socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)]
        deadline = perf_counter() + timeout
        for k, (af, addr) in enumerate(self._addrs):
            try:
                conn = self._connect_to(af, addr, deadline)
            except OSError:
                if k == len(self._addrs) - 1:
                    raise
                continue
            if k:
                self._addrs.insert(0, self._addrs.pop(k))   # remember the address that worked
            return conn

    def _connect_to(self, af: int, addr: tuple, deadline: float) -> _Conn:
        sock = _socket.socket(af, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(addr)
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                wait_write(sock.fileno(), timeout=max(deadline - perf_counter(), 0.0),
                           timeout_exc=_Deadline("connection_error", "connect timeout"))
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
            self.opened += 1
            return self._handshake(sock, deadline) if self.tls else _Conn(sock)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock: _socket.socket, deadline: float) -> _Conn:
        tls_in, tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.ssl_context.wrap_bio(tls_in, tls_out, server_hostname=self.host)
        while True:
            try:
                tls.do_handshake()
                break
            except _TLS_WANT:
                send_all(sock, tls_out.read(), deadline)
                wait_read(sock.fileno(), timeout=max(deadline - perf_counter(), 0.0),
                          timeout_exc=_Deadline("connection_error", "TLS handshake timeout"))
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionResetError(errno.ECONNRESET, "closed during TLS handshake")
                tls_in.write(data)
        send_all(sock, tls_out.read(), deadline)
        return _Conn(sock, tls, tls_in, tls_out)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def send_all(sock: _socket.socket, data: bytes, deadline: float) -> int:
    """Write all of `data` on a non-blocking socket, waiting (greenlet only) when the buffer is full.
    Raises OSError with `.sent` = bytes accepted by the kernel before the failure."""
    view, sent = memoryview(data), 0
    while sent < len(data):
        try:
            sent += sock.send(view[sent:])
        except BlockingIOError:
            wait_write(sock.fileno(), timeout=max(deadline - perf_counter(), 0.0),
                       timeout_exc=_Deadline("timeout", "send timeout"))
        except OSError as e:
            e.sent = sent
            raise
    return sent


class _Stream:
    """One in-flight response, driven from the hub by the connection's I/O watcher."""

    __slots__ = ("conn", "recv", "feed", "parser", "waiter", "timer", "got_bytes", "outcome")

    def __init__(self, conn: _Conn, parser: ResponseParser, timeout: float) -> None:
        self.conn, self.parser, self.waiter = conn, parser, Waiter()
        self.recv, self.feed = conn.sock.recv, parser.feed     # bound once: the callback is hot
        self.got_bytes, self.outcome = False, None
        self.timer = get_hub().loop.timer(max(timeout, 0.0))

    def wait(self) -> tuple[str, str | None]:
        self.timer.start(self._on_deadline)
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

    def _on_deadline(self) -> None:
        self._end("timeout", "no complete response before the deadline")

    def _on_readable(self) -> None:
        # The hot path: one recv, stamp, parse. Runs in the hub, so it must never raise.
        try:
            data = self.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as e:
            return self._end("connection_error", f"recv: {e.strerror or e}")
        t = perf_counter()
        if data and self.got_bytes:
            try:
                if self.feed(data, t):
                    self._end("error" if self.parser.stream_error else "complete")
            except Exception as e:
                self._fail(e)
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
        if not raw:
            return self._data(b"", t)
        tls = self.conn.tls
        self.conn.tls_in.write(raw)
        try:
            while self.outcome is None:     # a read may carry several TLS records
                self._data(tls.read(RECV_SIZE), t)   # b"" = close_notify = EOF
        except _TLS_WANT:
            pass
        except ssl.SSLZeroReturnError:
            self._data(b"", t)
        except ssl.SSLError as e:
            self._end("connection_error", f"TLS: {e.reason or e}")

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
                self._end("connection_error", f"connection closed mid-response after "
                                              f"{len(p.token_times)} content chunks")
        except Exception as e:
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        # a parser bug (not a ProtocolError) must not hang the request until its deadline either
        self._end("protocol_error", (str(e) if isinstance(e, ProtocolError) else f"{type(e).__name__}: {e}")[:200])


def stream_post(pool: ConnectionPool, path: str, body: bytes, *, timeout: float,
                keep_text: bool = False, on_sent=None) -> StreamResult:
    """POST `body` to `path` and stream the SSE response; never raises for network or server
    faults (they become the result's status). `on_sent(t)` is called with the perf_counter at
    which the request's last byte was written. Killing the calling greenlet (GreenletExit)
    returns a 'cancelled' result and discards the connection."""
    deadline = perf_counter() + timeout
    req = pool.request_bytes(path, body)
    res = StreamResult(status="connection_error")
    conn = stream = None
    try:
        for attempt in (0, 1):
            conn = pool.acquire(deadline)
            res.reused_connection = conn.reused
            try:
                send_all(conn.sock, _encrypt(conn, req) if conn.tls else req, deadline)
                break
            except OSError as e:
                pool.release(conn, False)
                conn = None
                # a kept-alive connection the server had closed: safe to retry only if nothing was sent
                if attempt or not res.reused_connection or getattr(e, "sent", 1):
                    raise
        res.sent = perf_counter()
        if on_sent is not None:
            on_sent(res.sent)
        parser = ResponseParser(keep_text)
        stream = _Stream(conn, parser, deadline - perf_counter())
        status, error = stream.wait()
        _fill(res, parser, status, error)
        ok_to_reuse = status in ("complete", "error") and parser.state == COMPLETE and parser.keep_alive
        pool.release(conn, ok_to_reuse and status == "complete")
        conn = None
    except _Deadline as e:
        res.status, res.error = e.args
    except OSError as e:
        res.status, res.error = "connection_error", f"{e.strerror or e}"[:200]
    except GreenletExit:
        res.status, res.error = "cancelled", "cancelled while in flight"
        if stream is not None:
            _fill(res, stream.parser, "cancelled", res.error)
    except ssl.SSLError as e:
        res.status, res.error = "connection_error", f"TLS: {e.reason or e}"[:200]
    finally:
        if conn is not None:
            pool.release(conn, False)
    return res


def _encrypt(conn: _Conn, data: bytes) -> bytes:
    conn.tls.write(data)
    return conn.tls_out.read()


def _fill(res: StreamResult, p: ResponseParser, status: str, error: str | None) -> None:
    """Copy the parser's findings into the result and decide the final status."""
    tt = p.token_times
    res.http_status = p.http_status
    res.token_times = tt
    res.first_token = tt[0] if tt else None
    res.last_token = tt[-1] if tt else None
    res.chunk_tokens = p.chunk_token_counts()
    res.prompt_tokens, res.completion_tokens = p.prompt_tokens, p.completion_tokens
    if p.text is not None:
        res.text = "".join(p.text)
    if status == "complete":
        if p.http_status != 200:
            status, error = "http_error", f"HTTP {p.http_status}: {p.error_message()}"[:200]
        elif not tt and b"event-stream" not in p.content_type and p.content_type:
            status, error = "protocol_error", f"expected text/event-stream, got {p.content_type.decode()[:60]}"
        else:
            status = "ok"
    elif status == "error":
        status, error = "http_error", p.stream_error + (f" (code {p.error_code})" if p.error_code else "")
    res.status, res.error = status, error
