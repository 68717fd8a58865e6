"""What the runner and worker processes share: the Job hand-off to Locust's Dispatcher user,
the wall-clock to perf_counter mapping of T0, the pre-T0 steps and the process helpers."""
from __future__ import annotations

import gc
import sys
import time

import gevent
import gevent.event
import pandas  # noqa: F401  (pyarrow imports it lazily on first use: ~1 s blocking the hub)

from . import plan
from .dispatcher import Job


class ProcessContext:
    """`environment.replay`: lets the (single) Dispatcher user of a process run its Job."""

    def __init__(self) -> None:
        self.claimed = False
        self.job: Job | None = None
        self.ready = gevent.event.Event()
        self.on_done = lambda: None

    def claim(self) -> bool:
        """True for the first caller only."""
        claimed, self.claimed = self.claimed, True
        return not claimed

    def run_job(self) -> None:
        self.ready.wait()
        # its own greenlet: when Locust stops (kills) its users, the job still records every row
        gevent.spawn(self._run).join()

    def _run(self) -> None:
        try:
            self.job.run()
        finally:
            self.on_done()


def perf_at(wall: float) -> float:
    """This process's perf_counter at wall-clock time `wall`."""
    return time.perf_counter() + (wall - time.time())


def freeze_gc() -> None:
    """Before T0: warm lazy paths, then keep the long-lived heap out of later collections."""
    from .recorder import to_batch, unsent
    to_batch([unsent((0, "0", 0.0, 1, 1, *[None] * (plan.ROW_LEN - 5)), None, 0)])
    gc.collect()
    gc.freeze()  # keep the long-lived heap out of later collections (30-60 ms pauses)


def target_labels(config: plan.RunConfig) -> list[str | None]:
    """One trace model label per target (None: the default target), to reach each deployment."""
    labels = {config.target: None} if config.target else {}
    for label, url in config.targets.items():
        labels.setdefault(url, label)
    return list(labels.values())


PRECONNECT_AT_ONCE = 64   # --preconnect: connections being opened at the same time


def preconnect(job: Job, n: int, deadline: float | None = None, who: str = "") -> None:
    """--preconnect: `n` keep-alive connections to each deployment, opened before T0 and parked idle
    in `job`'s pools, so the first requests reuse them (a connection the server closes while idle is
    replaced on use, as any other). Says on stderr how many and how long; a failure is a warning,
    never an error."""
    if n <= 0:
        return
    for label in target_labels(job.c):
        t = time.perf_counter()
        opened, err = job.pool_for(label).preconnect(n, PRECONNECT_AT_ONCE, deadline)
        took = time.perf_counter() - t
        if opened == n:
            print(f"replay: {who}preconnect: opened {n} connections in {took:.2f} s", file=sys.stderr)
        else:
            print(f"replay: warning: {who}preconnect opened {opened} of {n} connections in {took:.2f} s "
                  f"({err}); the first requests open the others themselves", file=sys.stderr)


def cpu_seconds() -> float:
    """This process's user + system CPU so far."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def die_with_parent() -> None:
    """A local worker must not outlive the runner that started it (Linux prctl)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
