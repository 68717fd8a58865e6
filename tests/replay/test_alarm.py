"""replay.alarm: never wakes before the due time; ring() and wake() wake a sleeper at once.

Runs in a child process (gevent's hub; pytest's process stays unpatched). Only order and
reachability are asserted, never how late a wake-up was.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import repo_env, wait_s

CHILD = r"""
import json, time
import gevent
from llm_replay.replay.alarm import Alarm
a = Alarm()
out = {"timerfd": a.fd >= 0, "early": 0}
for k in range(200):   # due times spread over 0..4 ms, some already past
    due = time.perf_counter() + (k % 9 - 1) * 0.0005
    a.sleep_until(due)
    out["early"] += time.perf_counter() < due
woke = []
g = gevent.spawn(lambda: (a.sleep_until(time.perf_counter() + 60), woke.append(1)))
gevent.sleep(0.05)
a.ring()
g.join(timeout=10)
out["rung_woke"] = bool(woke)
g2 = gevent.spawn(a.sleep_until, time.perf_counter() + 60); g2.join(timeout=10)
out["after_ring_returns"] = g2.dead
b = Alarm()
b.wake()                      # nobody asleep: nothing happens
woke = []
g3 = gevent.spawn(lambda: (b.sleep_until(time.perf_counter() + 60), woke.append(1)))
gevent.sleep(0.02)
out["due_while_asleep"] = b.due > time.perf_counter() + 50
gevent.get_hub().loop.run_callback(b.wake)   # from the hub, as the client's read callbacks call it
g3.join(timeout=10)
out["wake_woke"], out["due_after_wake"] = bool(woke), b.due
b.sleep_until(time.perf_counter() + 0.002)   # still usable after a wake()
a.close()
b.close()
print(json.dumps(out))
"""


def test_alarm_never_early_and_ring_wakes():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=repo_env(), timeout=wait_s(60))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["timerfd"] == sys.platform.startswith("linux")
    assert out["early"] == 0
    assert out["rung_woke"] and out["after_ring_returns"]
    if out["timerfd"]:
        assert out["due_while_asleep"] and out["wake_woke"] and out["due_after_wake"] == float("inf")
