"""The master of a distributed run: shards the trace, feeds workers, collects records.

Rows are sharded round-robin (all turns of a session to one worker, by a hash of its id)
and shipped in chunks when a worker asks (`replay_want`), so no process holds more than a
window of the trace. Workers send records back as Arrow IPC batches (`replay_records`)
while running and `replay_done` at the end. A worker that goes missing is reported; its
rows in flight are recorded `cancelled` (their due time had passed) or `not_sent`, and its
later rows `not_sent`, so every trace row still yields exactly one record.
"""
from __future__ import annotations

import sys
import time
import zlib
from collections import deque

import gevent
import pyarrow as pa
import pyarrow.compute as pc
from gevent.event import Event
from locust.runners import STATE_MISSING

from . import plan
from .recorder import by_value, unsent, unsent_batch

CHUNK = 2048


class Master:
    def __init__(self, config: plan.RunConfig, runner, out) -> None:
        self.c, self.runner, self.out = config, runner, out
        self.ids = [w.id for w in runner.clients.ready + runner.clients.spawning + runner.clients.running]
        self.n = len(self.ids)
        self.index = {cid: k for k, cid in enumerate(self.ids)}
        self.queues = [deque() for _ in self.ids]
        self.outstanding: list[dict] = [{} for _ in self.ids]
        self.stats = [[0, 0] for _ in self.ids]
        self.window = plan.TraceWindow(config)
        self.rows = self.window.rows()
        self.exhausted = self.stopping = False
        self.counter = 0
        self.done, self.lost = set(), set()   # worker indices: finished, gone missing
        self.finished = Event()
        self.t0 = 0.0
        self.worker_cpu_s = 0.0   # reported by the workers that finished: their CPU over the run
        for name, fn in (("replay_want", self._on_want), ("replay_records", self._on_records),
                         ("replay_done", self._on_done)):
            runner.register_message(name, fn)
        out.progress.live = lambda: (sum(s[0] for s in self.stats), sum(s[1] for s in self.stats))

    def start(self, t0_wall: float) -> None:
        self.t0 = time.perf_counter() + (t0_wall - time.time())
        for k, cid in enumerate(self.ids):
            self.runner.send_message("replay_setup", {"config": self.c.to_json(), "worker": k, "workers": self.n,
                                                      "t0_wall": t0_wall}, client_id=cid)
            self._ship(k)
        gevent.spawn(self._watch)

    # --- feeding ------------------------------------------------------------------
    def _fill(self, k: int) -> None:
        while len(self.queues[k]) < CHUNK and not self.exhausted and not self.stopping:
            chunk = next(self.rows, None)
            if chunk is None:
                self.exhausted = True
                return
            for row in chunk:
                w = plan.shard_of(row, self.n, self.counter)
                if row[plan.SESSION] is None:
                    self.counter += 1
                if w in self.lost:
                    label = row[plan.MODEL]
                    self.out.recorder.add(unsent(row, self.c.target_model(label), w, "not_sent", f"worker {w} lost",
                                                 self.c.target_of(label)))
                else:
                    self.queues[w].append(row)

    def _ship(self, k: int) -> None:
        self._fill(k)
        q = self.queues[k]
        rows = [] if self.stopping else [q.popleft() for _ in range(min(CHUNK, len(q)))]
        self.outstanding[k].update((r[plan.RID], r) for r in rows)
        end = self.stopping or (self.exhausted and not q)
        self.runner.send_message("replay_rows", {"rows": rows, "end": end}, client_id=self.ids[k])

    def _on_want(self, environment, msg, **kw) -> None:
        k = self.index.get(msg.node_id)
        if k is not None and k not in self.lost:
            self._ship(k)

    def _on_records(self, environment, msg, **kw) -> None:
        k = self.index.get(msg.node_id)
        if k is None or k in self.lost:
            return  # a lost worker's rows are already recorded
        table = pa.ipc.open_stream(pa.py_buffer(msg.data["ipc"])).read_all()
        pending = self.outstanding[k]
        for rid in table.column("request_id").to_pylist():
            pending.pop(rid, None)
        for b in table.to_batches():
            self.out.write(b)
        self.stats[k] = msg.data["stats"]

    def _on_done(self, environment, msg, **kw) -> None:
        k = self.index.get(msg.node_id)
        if k is not None and k not in self.lost:
            self.done.add(k)
            self.stats[k] = msg.data["stats"]
            self.worker_cpu_s += msg.data.get("cpu_s") or 0.0
            bulk = self.out.recorder.bulk   # run.json unsent_bulk: the workers' too
            bulk[:] = [x + y for x, y in zip(bulk, msg.data.get("unsent_bulk") or (0, 0))]
            self._check_finished()

    # --- failures and stop --------------------------------------------------------
    def _watch(self) -> None:
        while not self.finished.is_set():
            gevent.sleep(0.5)
            for k, cid in enumerate(self.ids):
                w = self.runner.clients.get(cid)
                if k not in self.done and k not in self.lost and (w is None or w.state == STATE_MISSING):
                    self._lose(k, "went missing")

    def _lose(self, k: int, why: str) -> None:
        self.lost.add(k)
        now = time.perf_counter() - self.t0
        print(f"replay: worker {k} {why}: its {len(self.outstanding[k])} unfinished rows are "
              "recorded as cancelled/not_sent", file=sys.stderr)
        rows = list(self.outstanding[k].values())
        self._unsent_rows([r for r in rows if r[plan.SCHED] <= now], k, "cancelled")
        self._unsent_rows([r for r in rows if r[plan.SCHED] > now] + list(self.queues[k]), k, "not_sent")
        self.outstanding[k].clear()
        self.queues[k].clear()
        self.stats[k] = [self.stats[k][0], 0]
        self._check_finished()

    def _unsent_rows(self, rows: list[tuple], k: int, status: str) -> None:
        if rows:
            err = f"worker {k} lost" if k in self.lost else None
            self.out.recorder.write(unsent_batch(plan.table_of(rows), self.c, k, status, err))

    def stop(self, now: bool = False) -> None:
        """Ctrl-C: workers stop dispatching; rows not yet shipped are recorded not_sent."""
        if not self.stopping:
            self.stopping = True
            for k, cid in enumerate(self.ids):
                if k not in self.lost:
                    self.runner.send_message("replay_stop", {"now": now}, client_id=cid)
                    self.runner.send_message("replay_rows", {"rows": [], "end": True}, client_id=cid)
            self._drain()
            gevent.spawn_later(self.c.grace_s + 15, self._give_up)
        elif now:
            for cid in self.ids:
                self.runner.send_message("replay_stop", {"now": True}, client_id=cid)

    def _give_up(self) -> None:
        for k in range(self.n):
            if k not in self.done and k not in self.lost:
                self._lose(k, "did not finish after stop")

    def _drain(self) -> None:
        """Rows shipped to no worker: not_sent, the unread trace column-wise (`worker`: the one
        `shard_of` gives the row), a pause for the loop after each batch."""
        self.exhausted = True
        for k, q in enumerate(self.queues):
            self._unsent_rows(list(q), k, "not_sent")
            q.clear()
        n = max(1, self.n)
        for t in self.window.rest():
            keys = [t.column(c) for c in ("task_id", "session_id") if c in t.column_names]
            worker = by_value(pc.coalesce(*keys) if keys else None, t.num_rows,
                              lambda v: 0 if v is None else zlib.crc32(v.encode()) % n, pa.int32())
            self.out.recorder.write(unsent_batch(t, self.c, worker))
            gevent.sleep(0.001)

    def _check_finished(self) -> None:
        if len(self.done | self.lost) == self.n and not self.finished.is_set():
            self._drain()  # rows still unread when every worker is gone
            self.finished.set()
