"""`--engine-process`: the engine loop in a child process, so model compute never holds the
server's GIL. Same surface as EngineLoop for AsyncEngine (add / abort / num_waiting / stop);
outputs and metrics travel over multiprocessing queues (one message per engine step)."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import signal
import threading
from types import SimpleNamespace

from .config import EngineConfig
from .tokenizer import Tokenizer


def _child(configs: dict[str, EngineConfig], emulate: str | None, threads: int, inbox, outbox) -> None:
    import torch

    from .engine import EngineLoop, build_cores
    from .metrics import Metrics
    from .pacing import PROFILES, Pacer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when to stop
    torch.set_num_threads(threads)
    metrics = Metrics()
    cores = build_cores(configs, metrics, Pacer(PROFILES[emulate]) if emulate else None)

    def emit(outputs):
        outbox.put(("out", outputs, {n: len(c.scheduler.waiting) for n, c in cores.items()}))

    loop = EngineLoop(cores, emit)
    loop.start()
    outbox.put(("ready", None, None))
    while True:
        msg = inbox.get()
        if msg[0] == "add":
            loop.add(msg[1], msg[2])
        elif msg[0] == "abort":
            loop.abort(msg[1])
        elif msg[0] == "metrics":
            outbox.put(("metrics", metrics.render(), None))
        else:
            loop.stop()
            return


class ProcessBackend:
    def __init__(self, configs: dict[str, EngineConfig], emulate: str | None, threads: int) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that has torch threads
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_child, args=(configs, emulate, threads, self.inbox, self.outbox),
                                name="engine-stub-engine", daemon=True)
        self.cores = {n: SimpleNamespace(cfg=c, tokenizer=Tokenizer(c.model.vocab_size)) for n, c in configs.items()}
        self._waiting = {n: 0 for n in configs}
        self._pending = {n: 0 for n in configs}  # sent, not yet reflected in a step report
        self._metrics: asyncio.Future | None = None
        self._metrics_lock = asyncio.Lock()

    def start(self, deliver, loop: asyncio.AbstractEventLoop) -> None:
        """Blocks until the child has built and warmed up its cores (call it in an executor)."""
        self.proc.start()
        while True:
            try:
                kind, _, _ = self.outbox.get(timeout=1)
                break
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the engine process exited with code {self.proc.exitcode}") from None
        assert kind == "ready", kind

        def read():
            while True:
                try:
                    kind, payload, waiting = self.outbox.get()
                except (EOFError, OSError):
                    return
                if kind == "out":
                    loop.call_soon_threadsafe(self._on_outputs, deliver, payload, waiting)
                elif kind == "metrics":
                    loop.call_soon_threadsafe(self._metrics.set_result, payload)

        threading.Thread(target=read, name="engine-outputs", daemon=True).start()

    def _on_outputs(self, deliver, outputs, waiting) -> None:
        self._waiting = waiting
        self._pending = dict.fromkeys(self._pending, 0)
        deliver(outputs)

    def add(self, core: str, req) -> None:
        self._pending[core] += 1
        self.inbox.put(("add", core, req))

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))

    def num_waiting(self, core: str) -> int:
        return self._waiting.get(core, 0) + self._pending.get(core, 0)

    async def render_metrics(self) -> bytes:
        async with self._metrics_lock:
            self._metrics = asyncio.get_running_loop().create_future()
            self.inbox.put(("metrics",))
            return await asyncio.wait_for(self._metrics, 10)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(("stop",))
            self.proc.join(timeout=3)
            if self.proc.is_alive():
                self.proc.terminate()
