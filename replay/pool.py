"""Keep-alive connections for the streaming client: non-blocking sockets, TLS over memory BIOs.

Sockets are plain `_socket.socket`s (never gevent's wrapper, patched or not) so the client's
I/O watcher can `recv` on them directly from the hub; only connecting, TLS handshakes and
sends that find the buffer full wait, and they wait in the calling greenlet.
"""
from __future__ import annotations

import _socket
import errno
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit

from gevent.hub import get_hub
from gevent.lock import Semaphore
from gevent.socket import wait_read, wait_write

from .alarm import NO_ALARM

perf_counter = time.perf_counter
RECV_SIZE = 65536
# SO_TIMESTAMPNS (Linux: 35; Python does not export it): recvmsg then returns the time the kernel
# received the bytes, so a client busy with other streams does not delay the stamp.
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
TLS_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Deadline(Exception):
    """A time limit passed before the response phase; args: (status, message)."""


def failure(e: Exception) -> tuple[str, str]:
    """(status, message) of a connect or send that failed: a `Deadline`'s own, else connection_error."""
    if isinstance(e, Deadline):
        return e.args
    if isinstance(e, ssl.SSLError):   # before OSError, its base class
        return "connection_error", f"TLS: {e.reason or e}"[:200]
    return "connection_error", f"{e.strerror or e}"[:200]


class Conn:
    """One TCP (optionally TLS) connection and its reusable read watcher."""

    __slots__ = ("sock", "io", "tls", "tls_in", "tls_out", "reused", "connect_s")

    def __init__(self, sock: _socket.socket, tls=None, tls_in=None, tls_out=None) -> None:
        self.sock, self.tls, self.tls_in, self.tls_out = sock, tls, tls_in, tls_out
        self.io = get_hub().loop.io(sock.fileno(), 1)
        self.reused = False
        self.connect_s: float | None = None   # seconds it took to open (TCP connect + TLS handshake)

    def alive(self) -> bool:
        """An idle keep-alive connection is usable when the peer has neither closed it nor sent
        anything (a non-blocking peek; EAGAIN means alive)."""
        try:
            if not self.sock.recv(1, socket.MSG_PEEK):   # b"": closed
                return False
        except BlockingIOError:
            return True
        except OSError:
            return False
        # stray bytes: unusable, unless they are TLS records without application data (a TLS 1.3
        # server's session tickets arrive after the handshake, on a connection opened and parked
        # by `preconnect` before any request read them)
        return self.tls is not None and self._absorb_tls()

    def _absorb_tls(self) -> bool:
        while True:
            try:
                data = self.sock.recv(RECV_SIZE)
            except BlockingIOError:
                break
            except OSError:
                return False
            if not data:
                return False
            self.tls_in.write(data)
        try:
            self.tls.read(RECV_SIZE)     # application data (or close_notify): unusable
            return False
        except ssl.SSLWantReadError:     # only post-handshake records: consumed, still usable
            return True
        except ssl.SSLError:
            return False

    def close(self) -> None:
        self.io.stop()
        self.io.close()
        self.sock.close()


class ConnectionPool:
    """Keep-alive connections to one origin; `max_connections` bounds those in use at once."""

    def __init__(self, base_url: str, *, max_connections: int = 10000, connect_timeout: float = 10.0,
                 headers: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None,
                 kernel_timestamps: bool = True) -> None:
        self.target = base_url   # as the run config names it (records keep it per row)
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http://host[:port] or https://...: {base_url!r}")
        self.host, self.tls = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.connect_timeout = connect_timeout
        # stamp bytes with the kernel's receive time where the OS offers it (plain TCP only)
        self.kernel_timestamps = kernel_timestamps and SO_TIMESTAMPNS is not None and u.scheme == "http"
        self.ssl_context = (ssl_context or ssl.create_default_context()) if self.tls else None
        hdrs = {"Host": u.netloc.rpartition("@")[2], "User-Agent": "llm-replay", "Accept": "text/event-stream",
                "Accept-Encoding": "identity", "Content-Type": "application/json", **(headers or {})}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()).encode("latin-1")
        # the dispatcher's Alarm, when one shares this hub: reads check its `due` (see alarm.py)
        self.alarm = NO_ALARM
        self._idle: list[Conn] = []
        self._slots = Semaphore(max_connections)
        # The origin's addresses (e.g. localhost: ::1 then 127.0.0.1), resolved once, up front, by
        # the C resolver. gevent's patched `getaddrinfo` would start its thread pool, whose idle
        # threads later wake and exit mid-run: each takes the GIL and the CPU from the hub for
        # milliseconds (5-10 ms dispatch-lag spikes). None when resolution fails here.
        try:
            self._addrs: list | None = self._addresses(_socket.getaddrinfo)
        except OSError:
            self._addrs = None
        _grow_fd_table(max_connections + 64)
        self.opened = 0   # connections opened so far (tests and benchmarks look at reuse)

    def request_bytes(self, path: str, body: bytes, extra: bytes = b"") -> bytes:
        """`extra`: header lines of this request only (each ending in CRLF), e.g. its traceparent."""
        return (b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n"
                % ((self.prefix + path).encode(), self._head, extra, len(body))) + body

    def acquire(self, deadline: float) -> Conn:
        if not self._slots.acquire(timeout=max(0.0, deadline - perf_counter())):
            raise Deadline("timeout", "no free connection slot before the deadline")
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

    def release(self, conn: Conn, reusable: bool) -> None:
        if reusable:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def preconnect(self, n: int, concurrency: int = 64, deadline: float | None = None) -> tuple[int, str | None]:
        """Open `n` keep-alive connections now, at most `concurrency` at a time (each within the
        connect timeout), and park them idle, so that the first requests reuse them instead of
        opening them when due (the connect in their dispatch lag, and a burst of new connections
        for the server to accept while it serves them). No new attempt starts after the first
        failure or after `deadline` (perf_counter). Returns (connections opened, first error)."""
        import gevent
        left, opened, errors = [n], [0], []

        def work() -> None:
            while left[0] > 0 and not errors:
                now = perf_counter()
                if deadline is not None and now >= deadline:
                    errors.append("stopped at the deadline (T0)")
                    return
                left[0] -= 1
                try:
                    conn = self._connect(self.connect_timeout if deadline is None
                                         else min(self.connect_timeout, deadline - now))
                except (Deadline, OSError) as e:
                    errors.append(failure(e)[1])
                else:
                    self._idle.append(conn)
                    opened[0] += 1
        gevent.joinall([gevent.spawn(work) for _ in range(max(0, min(n, concurrency)))])
        return opened[0], (errors[0] if errors else None)

    def _addresses(self, getaddrinfo) -> list:
        return [(ai[0], ai[4]) for ai in getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)]

    def _connect(self, timeout: float) -> Conn:
        if self._addrs is None:   # failed up front: retry, in the calling greenlet only
            self._addrs = self._addresses(socket.getaddrinfo)
        start = perf_counter()
        deadline = start + timeout
        for k, (af, addr) in enumerate(self._addrs):
            try:
                conn = self._connect_to(af, addr, deadline)
            except OSError:
                if k == len(self._addrs) - 1:
                    raise
                continue
            conn.connect_s = perf_counter() - start   # TCP connect (+ TLS handshake), all addresses tried
            if k:
                self._addrs.insert(0, self._addrs.pop(k))   # remember the address that worked
            return conn

    def _connect_to(self, af: int, addr: tuple, deadline: float) -> Conn:
        sock = _socket.socket(af, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.kernel_timestamps:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            err = sock.connect_ex(addr)
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                _wait(wait_write, sock, deadline, "connection_error", "connect timeout")
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
            self.opened += 1
            return self._handshake(sock, deadline) if self.tls else Conn(sock)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock: _socket.socket, deadline: float) -> Conn:
        tls_in, tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.ssl_context.wrap_bio(tls_in, tls_out, server_hostname=self.host)
        while True:
            try:
                tls.do_handshake()
                break
            except TLS_WANT:
                send_all(sock, tls_out.read(), deadline)
                _wait(wait_read, sock, deadline, "connection_error", "TLS handshake timeout")
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionResetError(errno.ECONNRESET, "closed during TLS handshake")
                tls_in.write(data)
        send_all(sock, tls_out.read(), deadline)
        return Conn(sock, tls, tls_in, tls_out)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _grow_fd_table(n: int) -> None:
    """Size the process's file-descriptor table for `n` descriptors now (capped by the soft
    RLIMIT_NOFILE and 65536). The kernel doubles the table when a new fd does not fit, and in a
    multi-threaded process (pyarrow starts threads) each doubling waits for an RCU grace period:
    the `socket()` of a new connection sat 5-15 ms in `expand_files` while sends were due."""
    try:
        import fcntl
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return
    top = min(n, 65536, soft if soft > 0 else n) - 1
    if top < 64:
        return
    fd = os.open(os.devnull, os.O_RDONLY)
    try:   # the lowest free fd >= top (never one in use); the table never shrinks back
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top))
    except OSError:
        pass
    finally:
        os.close(fd)


def _wait(wait, sock: _socket.socket, deadline: float, status: str, what: str) -> None:
    """`wait` (gevent's wait_read or wait_write, this greenlet only) for `sock` until `deadline`,
    past which it raises Deadline(status, what)."""
    wait(sock.fileno(), timeout=max(deadline - perf_counter(), 0.0), timeout_exc=Deadline(status, what))


def send_all(sock: _socket.socket, data: bytes, deadline: float) -> float:
    """Write all of `data` on a non-blocking socket, waiting (greenlet only) when the buffer is full.
    Returns perf_counter taken just *before* the send() that wrote the last byte: a stamp taken
    after it could land after the response's (kernel) arrival time if the process is preempted.
    Raises OSError with `.sent` = bytes accepted by the kernel before the failure."""
    view, sent, t = memoryview(data), 0, perf_counter()
    while sent < len(data):
        try:
            t = perf_counter()
            sent += sock.send(view[sent:])
        except BlockingIOError:
            _wait(wait_write, sock, deadline, "timeout", "send timeout")
        except OSError as e:
            e.sent = sent
            raise
    return t
