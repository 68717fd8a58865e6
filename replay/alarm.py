"""A precise "sleep until perf_counter() == t" for the dispatcher greenlet.

gevent's own timers live in libev, whose epoll backend rounds every wait up to a whole
millisecond (and never waits less than 1 ms): a row due at t is sent 0-1 ms late even on an
idle hub, which is most of the dispatch lag at p50. A Linux timerfd armed at the absolute
CLOCK_MONOTONIC time (what `time.perf_counter` reads) becomes readable within tens of
microseconds of t, and the hub wakes the waiting greenlet from its I/O watcher like any
socket. Elsewhere (no timerfd, or perf_counter on another clock) `Alarm` falls back to an
Event wait. `ring()` wakes the sleeper now (used by stop()).

The hub runs every watcher that one poll found ready before it polls again, so a burst of
streamed tokens (hundreds of reads, a few ms) would hold a due timerfd back until its end.
So `due` is public: the client's read callbacks compare their stamp with it and call `wake()`
once it has passed, which switches to the sleeper there and then, mid-burst.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from types import SimpleNamespace

from gevent.event import Event
from gevent.hub import Waiter, get_hub

_CLOCK_MONOTONIC, _TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = 1, os.O_NONBLOCK, os.O_CLOEXEC, 1
NEVER = float("inf")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timerfd():
    """(libc, fd) or None where timerfd cannot serve perf_counter deadlines."""
    if not sys.platform.startswith("linux") or "CLOCK_MONOTONIC)" not in time.get_clock_info("perf_counter").implementation:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    except (OSError, AttributeError):
        return None
    return (libc, fd) if fd >= 0 else None


NO_ALARM = SimpleNamespace(due=NEVER)   # what a connection pool checks when no dispatcher shares its hub


class Alarm:
    """One sleeper at a time (the dispatcher); `sleep_until` returns at `due` or on `ring()`."""

    def __init__(self) -> None:
        tfd = _timerfd()
        self.event = Event()
        self.fd = -1
        self.due = NEVER   # perf_counter at which the sleeper is due; NEVER while none sleeps
        self._waiter: Waiter | None = None
        if tfd is not None:
            self.libc, self.fd = tfd
            self.spec = _Itimerspec()
            # the highest priority: when it and many sockets are ready together, dispatch first
            self.watcher = get_hub().loop.io(self.fd, 1, priority=2)
        self.rung = False

    def sleep_until(self, due: float) -> None:
        if self.rung:
            return
        delay = due - time.perf_counter()
        if delay <= 0:
            return
        if self.fd < 0:
            self.event.wait(delay)
            return
        self._arm(due)
        self._waiter = waiter = Waiter()
        self.due = due
        self.watcher.start(self.wake)
        try:
            waiter.get()
        finally:
            self.watcher.stop()
            self.due, self._waiter = NEVER, None
        try:
            os.read(self.fd, 8)  # consume the expiry (absent after ring(), wake() or a re-arm)
        except BlockingIOError:
            pass

    def wake(self) -> None:
        """In the hub: resume the sleeper now (its timerfd fired, or a reader saw `due` pass)."""
        waiter, self._waiter, self.due = self._waiter, None, NEVER
        if waiter is not None:
            waiter.switch(None)

    def _arm(self, due: float) -> None:
        sec = int(due)
        self.spec.it_value.tv_sec, self.spec.it_value.tv_nsec = sec, max(1, int((due - sec) * 1e9))
        if self.libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def ring(self) -> None:
        self.rung = True
        self.event.set()
        if self.fd >= 0:
            self._arm(1e-9)  # an absolute time in the past: readable now

    def close(self) -> None:
        if self.fd >= 0:
            self.watcher.close()
            os.close(self.fd)
            self.fd = -1
