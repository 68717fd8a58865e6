"""Child-process driver for test_client.py: runs replay.client scenarios under gevent.

pytest's own process must not be gevent-monkey-patched, so the tests run
`python -m tests.replay.client_driver URL [TLS_URL CAFILE]` and read one JSON object
{scenario: outcome} from stdout. Every scenario uses real sockets to the sse_server.
"""
from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import sys  # noqa: E402

import time  # noqa: E402

import gevent  # noqa: E402
from gevent.monkey import get_original  # noqa: E402

from llm_replay.replay.client import ConnectionPool, StreamResult, stream_post  # noqa: E402

# waits scale with the host like the tests' (tests/conftest.py wait_s); a timeout a scenario
# expects to expire still expires
SLOW = float(os.environ.get("REPLAY_TEST_SLOWDOWN", "1"))
STREAM_FAULTS = ("done_early", "trailers", "split", "coalesce", "crlf", "comments", "identity", "no_done")


def body(n=8, chat=False, usage=True, **extra) -> bytes:
    b = {"model": "m", "max_tokens": n, "stream": True}
    b.update(extra)
    if usage:
        b["stream_options"] = {"include_usage": True}
    if chat:
        b["messages"] = [{"role": "user", "content": "hello there world"}]
    else:
        b.setdefault("prompt", [1, 2, 3, 4])
    return json.dumps(b).encode()


def summary(r: StreamResult, pool: ConnectionPool | None = None) -> dict:
    tt = list(r.token_times)
    return {"status": r.status, "http_status": r.http_status, "error": r.error, "n": len(tt),
            "distinct": len(set(tt)), "monotone": all(a <= b for a, b in zip(tt, tt[1:])),
            "after_sent": bool(tt) and r.sent is not None and tt[0] >= r.sent,
            "first_ok": r.first_token == (tt[0] if tt else None), "last_ok": r.last_token == (tt[-1] if tt else None),
            "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "chunk_tokens": r.chunk_tokens, "text": r.text, "reused": r.reused_connection,
            "sent": r.sent is not None, "opened": pool.opened if pool else None, "connect_s": r.connect_s}


def post(pool, path="/v1/completions", data=None, timeout=3.0, **kw) -> dict:
    return summary(stream_post(pool, path, data or body(), timeout=timeout * SLOW, **kw), pool)


def busy_client(url: str, kernel_timestamps: bool) -> dict:
    """Block the whole process for 0.3 s mid-stream (tokens 20 ms apart keep arriving meanwhile);
    count the token times that fall inside the blocked window."""
    p = ConnectionPool(url, headers={"X-Interval": "0.02"}, kernel_timestamps=kernel_timestamps)
    g = gevent.spawn(stream_post, p, "/v1/completions", body(30), timeout=10)
    gevent.sleep(0.1)
    b0 = time.perf_counter()
    get_original("time", "sleep")(0.3)
    b1 = time.perf_counter()
    g.join()
    return {"status": g.value.status, "n": len(g.value.token_times),
            "inside": sum(b0 < t < b1 for t in g.value.token_times),
            "after_sent": g.value.token_times[0] > g.value.sent}


def alarm_preempted(url: str) -> dict:
    """A dispatcher asleep on the pool's Alarm (its timerfd 60 s away) whose `due` has passed, as
    when a burst of reads holds the timerfd back: the stream's next read must wake it."""
    from llm_replay.replay.alarm import Alarm
    a = Alarm()
    p = ConnectionPool(url, headers={"X-Interval": "0.01"})
    p.alarm = a
    woke = []
    g = gevent.spawn(lambda: (a.sleep_until(time.perf_counter() + 60), woke.append(time.perf_counter())))
    gevent.sleep(0.01)
    armed = a.due != float("inf")
    a.due = time.perf_counter()
    r = stream_post(p, "/v1/completions", body(5), timeout=5)
    g.join(timeout=1)
    a.close()
    return {"armed": armed, "woke": bool(woke), "woke_mid_stream": bool(woke) and woke[0] < r.last_token,
            "due_reset": a.due == float("inf"), "stream": summary(r)}


def no_threads_no_fd_growth(url: str) -> dict:
    """A pool resolves its host without gevent's thread pool and sizes the fd table up front:
    no thread is started and no 200-connection burst makes the kernel grow the fd table."""
    import os

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    def fdsize() -> int:
        return int(next(ln for ln in open("/proc/self/status") if ln.startswith("FDSize:")).split()[1])

    before = tasks()
    p = ConnectionPool(url.replace("127.0.0.1", "localhost"), max_connections=1000)
    size = fdsize()
    gs = [gevent.spawn(post, p, data=body(3), timeout=10) for _ in range(200)]
    gevent.joinall(gs, timeout=20 * SLOW)
    return {"threads_added": tasks() - before, "fdsize_at_init": size, "fdsize_after": fdsize(),
            "ok": sum(g.value is not None and g.value["status"] == "ok" for g in gs), "opened": p.opened}


def scenarios(url: str, tls_url: str | None, cafile: str | None) -> dict:
    out = {}
    pool = ConnectionPool(url)
    sent_at = []
    out["completions"] = post(pool, keep_text=True, on_sent=sent_at.append)
    out["on_sent_called"] = len(sent_at) == 1
    out["chat"] = post(pool, "/v1/chat/completions", body(5, chat=True), keep_text=True)
    out["chat_fast"] = post(pool, "/v1/chat/completions", body(5, chat=True, usage=False))
    out["not_streamed"] = post(pool, data=body(3, stream=False))
    out["interval_unbatched"] = post(ConnectionPool(url, headers={"X-Interval": "0.02"}), data=body(6))
    for f in ("http500", "http429", "malformed", "error_in_stream", "drop", "stall", *STREAM_FAULTS):
        p = ConnectionPool(url, headers={"X-Fault": f})
        out[f] = post(p, timeout=0.5)
        out[f + "_next"] = post(p, timeout=0.5)    # the pool stays usable after the fault
    out["model_fault"] = post(pool, data=body(model="fault:http429"))
    p = ConnectionPool(url, headers={"X-Fault": "close_idle"})
    out["close_idle"] = post(p)
    gevent.sleep(0.2)    # the server has now closed the kept-alive connection
    out["stale_next"] = post(p)
    out["busy_kernel_ts"] = busy_client(url, True)
    out["busy_read_ts"] = busy_client(url, False)
    out["alarm_preempted"] = alarm_preempted(url)
    if sys.platform.startswith("linux"):
        out["no_threads"] = no_threads_no_fd_growth(url)
    big = body(2, prompt="x " * 1_000_000)   # ~2 MB request: send blocks and resumes
    out["big_body"] = post(pool, data=big)

    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    out["refused"] = post(ConnectionPool(f"http://127.0.0.1:{port}"), timeout=2)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)     # accepts at the TCP level, never answers
    out["no_answer"] = post(ConnectionPool(f"http://127.0.0.1:{silent.getsockname()[1]}"), timeout=0.3)
    silent.close()
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)       # accept queue of one, never accepted: later SYNs are dropped
    fillers = [socket.socket() for _ in range(3)]
    for f in fillers:
        f.setblocking(False)
        f.connect_ex(full.getsockname())
    gevent.sleep(0.05)
    out["connect_timeout"] = post(ConnectionPool(f"http://127.0.0.1:{full.getsockname()[1]}",
                                                 connect_timeout=0.3), timeout=5)
    for f in [*fillers, full]:
        f.close()

    # cancel: kill the greenlet mid-stream; it returns 'cancelled' and the pool stays usable
    p = ConnectionPool(url, headers={"X-Interval": "0.02"})
    g = gevent.spawn(stream_post, p, "/v1/completions", body(50), timeout=5)
    gevent.sleep(0.15)
    g.kill()
    out["cancelled"] = summary(g.value, p) if isinstance(g.value, StreamResult) else {"status": repr(g.value)}
    out["after_cancel"] = post(ConnectionPool(url))

    # concurrency: many streams at once on one pool, and a pool capped at 2 connections
    # two waves on one pool (the second reuses the first's connections); each request asks for
    # its own token count, so a response delivered to the wrong request would show
    p = ConnectionPool(url, headers={"X-Interval": "0.005"})
    for wave in ("concurrent", "concurrent_reused"):
        gs = [gevent.spawn(post, p, data=body(3 + k % 29)) for k in range(200)]
        gevent.joinall(gs, timeout=30 * SLOW)
        out[wave] = [dict(g.value, asked=3 + k % 29) if g.value else None for k, g in enumerate(gs)]
    p = ConnectionPool(url, max_connections=2, headers={"X-Interval": "0.005"})
    gs = [gevent.spawn(post, p, data=body(5)) for _ in range(6)]
    gevent.joinall(gs, timeout=30 * SLOW)
    out["capped"] = [g.value for g in gs]

    # preconnect: parked connections are reused by the next requests (no connect_s on them)
    p = ConnectionPool(url, headers={"X-Interval": "0.002"})
    t = time.perf_counter()
    opened, err = p.preconnect(5, concurrency=2)
    gs = [gevent.spawn(post, p, data=body(3)) for _ in range(5)]
    gevent.joinall(gs, timeout=10 * SLOW)
    out["preconnect"] = {"opened": opened, "error": err, "took": time.perf_counter() - t,
                         "results": [g.value for g in gs]}
    t = time.perf_counter()
    opened, err = ConnectionPool(f"http://127.0.0.1:{port}").preconnect(500)   # refused
    out["preconnect_refused"] = {"opened": opened, "error": err, "took": time.perf_counter() - t}
    out["preconnect_late"] = ConnectionPool(url).preconnect(3, deadline=time.perf_counter())   # T0 has passed

    if tls_url:
        ctx = ssl.create_default_context(cafile=cafile)
        p = ConnectionPool(tls_url, ssl_context=ctx, headers={"X-Interval": "0.002"})
        opened, err = p.preconnect(2)
        gevent.sleep(0.2)   # a TLS 1.3 server's session tickets reach the parked connections
        gs = [gevent.spawn(post, p) for _ in range(2)]    # both parked connections at once
        gevent.joinall(gs, timeout=10 * SLOW)
        out["tls_preconnect"] = {"opened": opened, "error": err, "results": [g.value for g in gs],
                                 "total_opened": p.opened}
    if tls_url:
        ctx = ssl.create_default_context(cafile=cafile)
        p = ConnectionPool(tls_url, ssl_context=ctx, headers={"X-Interval": "0.002"})
        out["tls"] = post(p, keep_text=True)
        out["tls_next"] = post(p, "/v1/chat/completions", body(4, chat=True))
        out["tls_untrusted"] = post(ConnectionPool(tls_url), timeout=2)
    return out


if __name__ == "__main__":
    args = sys.argv[1:] + [None, None]
    print(json.dumps(scenarios(args[0], args[1], args[2])))
