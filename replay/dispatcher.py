"""The dispatcher: one Locust user per process that replays its rows open-loop.

`Job` walks the process's rows in schedule order, sleeps until each row's absolute due
time (perf_counter of T0 + scheduled_s; never relative sleeps, so lag cannot accumulate)
and hands each request to its own greenlet, in a `Group` while in flight (a finished one parks
and takes a later request); sending never waits for responses.
Each request streams through the lean client (`replay.client`), writes exactly one record,
fires one Locust request event (E2E) and logs its TTFT in a stats row of its own (never
anything per token).
`stop()` ends dispatching: unsent rows become `not_sent`, in-flight requests get a grace
time and are then killed (`cancelled`).

`Dispatcher` is the Locust user: a FastHttpUser subclass (Locust's conventions, UI, stats;
its own pool is sized far above any in-flight count) whose task runs the process's Job.
"""
from __future__ import annotations

import heapq
import itertools
import os
import time
from collections import deque

import gevent
import pyarrow as pa
from gevent import getcurrent
from gevent.event import Event
from gevent.hub import get_hub
from gevent.pool import Group
from greenlet import GreenletExit
from locust import task
from locust.contrib.fasthttp import FastHttpUser

from . import plan
from .alarm import NEVER, Alarm
from .client import ConnectionPool, StreamResult, stream_post
from .prompts import PromptBuilder
from .recorder import Recorder, record, unsent, unsent_batch
from .graph import Graph
from .otlp import header as trace_header
from .sessions import Sessions

MAX_CONNECTIONS = 100_000

# A process that imports this module replays (runner, worker, locustfile): its Arrow buffers
# (trace feed, record batches) come from malloc from now on. Arrow's default, mimalloc, maps
# transparent huge pages, and the first touch of each fresh 2 MiB page (zeroing it) held the
# hub for 5-7 ms mid-run; malloc faults in 4 KiB pages.
pa.set_memory_pool(pa.system_memory_pool())
# a batch takes the hub ~1.5 ms in a busy run (cold caches), nearly all of it fixed per batch:
# quiet moments write big batches; at low rates the periodic flusher writes the few records there are
QUIET_S, QUIET_MIN, QUIET_ROWS = 0.004, 96, 128
# task graphs: read the feed this far (trace seconds, rows) past the next root, so a dependant is
# registered before its dependencies complete even when the target is faster than the recording
AHEAD_S, AHEAD_ROWS = 600.0, 100_000
UNSENT_ROWS = 16384   # rows of a bulk not_sent batch
BREATHE_S = 0.02   # a long computation in the hub (the rows left after a stop, a read-ahead) lets the loop poll this often


class Job:
    """One process's share of a run."""

    def __init__(self, config: plan.RunConfig, worker: int, t0: float, feed, recorder: Recorder,
                 env=None) -> None:
        self.c, self.worker, self.t0, self.feed, self.rec, self.env = config, worker, t0, feed, recorder, env
        self.alarm = Alarm()
        self.pools: dict[tuple[str, str | None], ConnectionPool] = {}   # (target URL, key env var)
        self.pool = self.pool_for(None)  # the default target's (warm-up, preconnect)
        self.group = Group()           # requests in flight
        self.idle: list[gevent.Greenlet] = []   # request greenlets parked between requests
        self.prompts = PromptBuilder(config)
        self.sessions = Sessions(config.sessions) if config.sessions != "off" else None
        self.graph = Graph(config.speed, config.max_delay_s) if config.graph else None
        self.ready: list = []          # task graphs: released dependants, (due, seq, (row, prepared))
        self.seq = itertools.count()
        self.poke = Event()            # a release (or the end of one) while the dispatcher idles
        self.stopping = False
        self.stop_reason: str | None = None   # the not_sent rows' error after a stop that gave a reason
        self.breath = 0.0              # perf_counter when _breathe yields next
        self.finished = Event()
        self.sent = self.errors = 0
        self.run_id = config.run_id if config.otlp else None   # --otlp: a traceparent per request

    def pool_for(self, label: str | None) -> ConnectionPool:
        """The keep-alive pool of the deployment `label`'s rows go to, with that label's key."""
        url, var = self.c.target_of(label) or next(iter(self.c.targets.values())), self.c.key_env_of(label)
        pool = self.pools.get((url, var))
        if pool is None:
            key = os.environ.get(var, "") if var else ""
            pool = self.pools[url, var] = ConnectionPool(url, max_connections=MAX_CONNECTIONS,
                                                         headers={"Authorization": f"Bearer {key}"} if key else None)
            pool.alarm = self.alarm
        return pool

    # --- dispatch loop --------------------------------------------------------------
    def run(self) -> None:
        try:
            if self.graph is not None:
                self._run_graph()
            else:
                for chunk in self.feed:
                    for row in chunk:
                        if self.stopping:
                            self._unsent(row)
                        elif self.sessions is None or self.sessions.admit(row):
                            self._dispatch(row)
                    if self.stopping:
                        self._unsent_rest()
            self._drain()
        finally:
            self.finished.set()

    def _run_graph(self) -> None:
        """Task graphs: send the next root at its trace time or the next released dependant at its
        due time, whichever comes first, on the same precise alarm; a release due before the
        alarm wakes the dispatcher (`_released`) to pick again."""
        roots = self._roots()
        root, prepared = next(roots, None), None
        while not self.stopping:
            if root is not None and prepared is None:
                prepared = self._prepare(root)
            r_due = self.t0 + root[plan.SCHED] if root is not None else NEVER
            d_due = self.ready[0][0] if self.ready else NEVER
            due = min(r_due, d_due)
            if due == NEVER:
                if not self.group:
                    break
                self.poke.clear()
                self.poke.wait(0.05)
                continue
            if len(self.rec.buf) >= QUIET_MIN and due - time.perf_counter() > QUIET_S:
                self.rec.flush(QUIET_ROWS)
            self.alarm.sleep_until(due - self.c.spin_s)
            if time.perf_counter() < due - self.c.spin_s - 1e-4 and not self.stopping:
                continue   # woken by an earlier release: pick again
            while time.perf_counter() < due and not self.stopping:
                gevent.sleep(0)
            if self.stopping:
                break
            if d_due <= r_due:
                self._start_now(heapq.heappop(self.ready)[2])
            else:
                self._start_now((root, prepared))
                root, prepared = next(roots, None), None
        self._unsent_rest()
        self._unsent_all(itertools.chain([root] if root is not None else [], roots))
        self._unsent_all(heapq.heappop(self.ready)[2][0] for _ in range(len(self.ready)))

    def _roots(self):
        """Task graphs: the feed's roots, in order, one at a time; dependants are taken out as they
        are read (up to AHEAD_S/AHEAD_ROWS ahead of the next root) and wait for their dependencies."""
        rows = (row for chunk in self.feed for row in chunk)
        ahead: deque = deque()
        more = True
        while True:
            if not self.stopping:   # a read-ahead of a few rows between sends never yields
                self.breath = time.perf_counter() + BREATHE_S
            while more and (not ahead or (len(ahead) < AHEAD_ROWS and ahead[-1][plan.SCHED] - ahead[0][plan.SCHED] < AHEAD_S)):
                self._breathe()
                row = next(rows, None)
                if row is None:
                    more = False
                elif self.stopping:
                    self._unsent(row)
                    self._unsent_rest()
                elif row[plan.DEPS]:
                    self._released(self.graph.read(row))
                else:
                    self.graph.read(row)
                    ahead.append(row)
            if not ahead:
                return
            yield ahead.popleft()

    def _released(self, rel) -> None:
        """Act on a graph release: queue a dependant for its due time, or record it failed."""
        if rel is None:
            return
        row = rel[1]
        if rel[0] == "fail":
            self._unsent(row, "dependency_failed", rel[2])
            self.errors += 1
            for nxt in self.graph.completed(row, "dependency_failed", time.perf_counter() - self.t0,
                                            None, None, None, None):
                self._released(nxt)
        elif self.stopping:
            self._unsent(row)
        else:
            due = self.t0 + row[plan.SCHED]
            heapq.heappush(self.ready, (due, next(self.seq), (row, self._prepare(row))))
            self.poke.set()
            if due < self.alarm.due:
                get_hub().loop.run_callback(self.alarm.wake)

    def _dispatch(self, row: tuple) -> None:
        prepared = self._prepare(row)
        due = self.t0 + row[plan.SCHED]
        if len(self.rec.buf) >= QUIET_MIN and due - time.perf_counter() > QUIET_S:
            self.rec.flush(QUIET_ROWS)  # a quiet moment: write records now, not while a send is due
        self.alarm.sleep_until(due - self.c.spin_s)
        while time.perf_counter() < due and not self.stopping:
            gevent.sleep(0)  # --spin-ms: the hub's timers are ~1 ms coarse; finish yielding to I/O
        if self.stopping:
            self._unsent(row)
        else:
            self._start_now((row, prepared))

    def _start_now(self, item: tuple) -> None:
        """Send `item` from a request greenlet at once (it writes its request, then waits in the
        hub) and resume dispatching after it. `spawn` + `sleep(0)` would send only after the hub
        has run every other watcher that was ready in this loop iteration: a burst of streamed
        tokens would delay the send. Request greenlets are reused: a new one costs ~15 us (its
        frame stack is mmap'ed and unmapped each time), a parked one ~1 us."""
        if self.idle:
            g, args = self.idle.pop(), (item,)
        else:
            g, args = gevent.Greenlet(self._serve, item), ()
        self.group.add(g)
        get_hub().loop.run_callback(getcurrent().switch)
        g.switch(*args)

    def _serve(self, item: tuple) -> None:
        """A request greenlet's life: send a row, park in `idle` until the next one, repeat."""
        me = getcurrent()
        while True:
            self._send(*item)
            self.group.discard(me)
            if self.stopping:
                return
            self.idle.append(me)
            item = get_hub().switch()   # resumed by _start_now; _drain kills the parked ones

    def _prepare(self, row: tuple):
        api = "chat" if row[plan.IMAGES] else row[plan.API] or self.c.api   # images need chat
        label = row[plan.MODEL]
        model, pool = self.c.target_model(label), self.pool_for(label)
        history, user_tokens = None, None
        if self.graph is not None and row[plan.DEPS] and api == "chat":
            history, user_tokens = self.graph.history(row)
        elif self.sessions is not None and row[plan.SESSION] is not None and api == "chat":
            history, user_tokens = self.sessions.context(row)
        path, body, chars, text = self.prompts.body(row, model, api, history, user_tokens, pool.target)
        return api, model, pool, path, body, chars, text

    def _drain(self) -> None:
        """Wait for in-flight requests; after stop(), at most the grace time, then kill them."""
        while self.group:
            if self.stopping:
                self.group.join(timeout=self.c.grace_s)
                self.group.kill(block=True, timeout=5)
                break
            self.group.join(timeout=0.2)
        gevent.killall(self.idle, block=True, timeout=5)
        self.idle.clear()
        if self.sessions is not None:
            self._unsent_all(self.sessions.parked())
        if self.graph is not None:
            self._unsent_all(self.graph.parked())

    def stop(self) -> None:
        """Stop dispatching now (the rest of the feed is recorded `not_sent`)."""
        self.stopping = True
        self.alarm.ring()

    # --- one request --------------------------------------------------------------
    def _send(self, row: tuple, prepared, due: float | None = None) -> None:
        api, model, pool, path, body, chars, text = prepared
        if due is not None:  # closed-session turn: wait for its think time
            delay = self.t0 + due - time.perf_counter()
            if delay > 0:
                try:
                    gevent.sleep(delay)
                except GreenletExit:
                    self._unsent(row)
                    return
            if self.stopping:
                self._unsent(row)
                return
        self.sent += 1
        keep = (self.sessions is not None and row[plan.SESSION] is not None) or bool(row[plan.NDEP])
        extra, trace_id = trace_header(self.run_id, row[plan.RID]) if self.run_id else (b"", None)
        try:
            res = stream_post(pool, path, body, timeout=self.c.timeout_s, keep_text=keep, extra=extra)
        except GreenletExit:
            res = StreamResult(status="cancelled", error="cancelled while in flight")
        if res.status == "cancelled" and res.sent is None:
            self._unsent(row, "cancelled")  # killed before the bytes left: cancelled, never sent
        else:
            self.rec.add(record(row, model, self.worker, self.t0, res, pool.target, trace_id))
        ok = res.status == "ok"
        if not ok:
            self.errors += 1
        if ok and not row[plan.IMAGES]:     # image tokens are not text: no drift to learn from them
            self.prompts.observe(api, chars, res.prompt_tokens, pool.target)
        self._fire(row, res)
        if self.sessions is not None and row[plan.SESSION] is not None:
            nxt = self.sessions.completed(row, text, res.text, ok, res.prompt_tokens,
                                          res.completion_tokens, time.perf_counter() - self.t0)
            if nxt is not None:
                nrow, ndue = nxt
                if self.stopping:
                    self._unsent(nrow)
                else:
                    self.group.spawn(self._send, nrow, self._prepare(nrow), ndue)
        if self.graph is not None and (row[plan.NDEP] or row[plan.DEPS]):   # (drops its own state too)
            end = (res.end if res.end is not None else time.perf_counter()) - self.t0
            for rel in self.graph.completed(row, res.status, end, text, res.text, res.prompt_tokens,
                                            res.completion_tokens):
                self._released(rel)

    def _unsent(self, row: tuple, status: str = "not_sent", error: str | None = None) -> None:
        label = row[plan.MODEL]
        error = error or (self.stop_reason if status == "not_sent" else None)
        self.rec.add(unsent(row, self.c.target_model(label), self.worker, status, error,
                            target=self.c.target_of(label)))

    def _unsent_rest(self) -> None:
        self._unsent_tables(getattr(self.feed, "rest", tuple)())

    def _unsent_all(self, rows) -> None:
        rows = iter(rows)
        self._unsent_tables(plan.table_of(c) for c in iter(lambda: list(itertools.islice(rows, UNSENT_ROWS)), []))

    def _unsent_tables(self, tables) -> None:
        """Rows left at a stop (the feed's unread remainder, a graph's read-ahead, parked turns):
        not_sent, column-wise in batches of thousands, the loop polled between them (the responses
        still arriving, the flusher)."""
        for t in tables:
            self.rec.write(unsent_batch(t, self.c, self.worker, error=self.stop_reason))
            self.breath = 0.0
            self._breathe()

    def _breathe(self) -> None:
        """In a long computation in the hub: every BREATHE_S let the loop poll its sockets (the
        responses still arriving, whose ends their records carry) and run its flusher. A timer, as
        sleep(0) resumes this greenlet among the loop's callbacks, up to 50 of them before a poll."""
        if time.perf_counter() >= self.breath:
            gevent.sleep(0.001)
            self.breath = time.perf_counter() + BREATHE_S

    def _fire(self, row: tuple, res: StreamResult) -> None:
        """Locust's dashboard (its histograms round; records are the data): one request event
        per request (E2E). TTFT goes straight into a stats entry of its own: a request event
        would count in Locust's Total, doubling its request count and RPS. Entries travel to
        the master (worker reports) apart from the Total, so this holds distributed too."""
        if self.env is None or res.sent is None:
            return
        end = res.last_token or time.perf_counter()
        exc = None if res.status == "ok" else RuntimeError(f"{res.status}: {res.error}")
        name = row[plan.MODEL] or "all"
        self.env.events.request.fire(request_type="E2E", name=name, response_time=(end - res.sent) * 1000,
                                     response_length=res.completion_tokens or 0, exception=exc, context={})
        if res.first_token is not None:
            self.env.stats.get(name, "TTFT").log((res.first_token - res.sent) * 1000, 0)

    @property
    def in_flight(self) -> int:
        return len(self.group)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.alarm.close()


class Dispatcher(FastHttpUser):
    """The replay user: one per process; extra users on a process idle."""

    host = "http://127.0.0.1"  # overridden by --host / the run config
    concurrency = MAX_CONNECTIONS  # Locust's own pool: never the bottleneck (the default 10 is closed-loop)
    wait_time = staticmethod(lambda: 3600)

    @task
    def replay(self) -> None:
        ctx = getattr(self.environment, "replay", None)
        if ctx is not None and ctx.claim():   # else a second user on this process: nothing to do
            ctx.run_job()
        gevent.sleep(3600)  # the process's runner quits when the job is done
