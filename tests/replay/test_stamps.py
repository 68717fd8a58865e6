"""Receive stamps of events that queued up while the client was not reading (issue 36 item 12).

On TCP the kernel returns one receive time per `recvmsg`: that of the last segment it copied. So a
late read that takes several events at once gives them all the last one's time. The client reads a
backlog one unit (the head, then each HTTP chunk) per `recvmsg`, so each event keeps the time of its
own segment wherever the kernel still holds the segments apart. It merges a segment into the one
before it once that one is acknowledged and the sender has let go of it; the server here keeps each
sent segment referenced (a transmit timestamp request queues a clone of it on its error queue), so
the segments stay apart and the test judges the client alone.

The client runs in a child process (gevent); it blocks its whole process in `on_sent` until the
server has written every event, 50 ms apart, so all of them wait in the socket before any read.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")

GAP = 0.05

CHILD = r"""
import json, os, socket, sys, threading, time
from llm_replay.replay.client import ConnectionPool, stream_post

GAP, N = float(sys.argv[1]), 4
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
r, w = os.pipe()

def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)

def serve():
    s, _ = ls.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # SO_TIMESTAMPING (37): SOF_TIMESTAMPING_TX_SOFTWARE | SOFTWARE: each segment stays referenced
    s.setsockopt(socket.SOL_SOCKET, 37, (1 << 1) | (1 << 4))
    req = b""
    while b"\r\n\r\n" not in req:
        req += s.recv(65536)
    head, body = req.split(b"\r\n\r\n", 1)
    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < n:
        body += s.recv(65536)
    s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    sent = []
    for k in range(N):
        time.sleep(GAP)
        sent.append(time.perf_counter())
        s.sendall(chunk(b'data: {"choices":[{"index":0,"text":"tok%d","finish_reason":null}]}\n\n' % k))
    time.sleep(GAP)
    s.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    os.write(w, json.dumps(sent).encode() + b"\n")

threading.Thread(target=serve, daemon=True).start()
pool = ConnectionPool("http://127.0.0.1:%d" % ls.getsockname()[1])
box = {}
def on_sent(t):     # blocks the whole process (hub included) until every event is queued
    box["sent"] = json.loads(os.read(r, 65536))
    box["read_from"] = time.perf_counter()
body = json.dumps({"model": "m", "prompt": "x", "max_tokens": N, "stream": True}).encode()
res = stream_post(pool, "/v1/completions", body, timeout=30, on_sent=on_sent)
print(json.dumps({"status": res.status, "error": res.error, "times": list(res.token_times), **box}))
"""


def test_a_backlog_read_late_keeps_each_events_own_receive_time():
    run = subprocess.run([sys.executable, "-c", CHILD, str(GAP)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["status"] == "ok", out
    times, sent = out["times"], out["sent"]
    assert len(times) == len(sent) == 4
    # every event was queued before the first read, and none is stamped later than that read
    assert sent[-1] < out["read_from"] and times[-1] <= out["read_from"]
    # each keeps its own segment's time: in order, the server's gaps apart (not one shared time)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g >= 0.8 * GAP for g in gaps), (gaps, times, sent)
    assert all(t >= s - 1e-3 for t, s in zip(times, sent)), (times, sent)   # never before its write
