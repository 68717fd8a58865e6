"""How the runner is scheduled against the rest of the host, and the `--nice` opt-in.

The runner stays in the caller's session, in a process group of its own (so Ctrl-C at a
terminal reaches `replay run`, which forwards it once). A new session would be worse: with
scheduler autogroups on (Linux's default: /proc/sys/kernel/sched_autogroup_enabled = 1) each
session is its own CPU group, and a fresh group on a busy host waited 30-165 ms for its
wake-ups (issue 21). Within an autogroup a process's nice value only orders it against the
group's other processes; against other sessions the group's own nice counts
(/proc/<pid>/autogroup). So `--nice N` sets both: the runner's (its workers inherit it) and,
for the run's duration, the session's autogroup's; lowering either below 0 needs root or
CAP_SYS_NICE, and a refusal is reported, never fatal. Measured on a 2-core Linux 6.18 host
(HZ=250) under three busy processes (benchmarks/contention.py), a woken normal task waits for
the next scheduler tick (lag p99 ~4 ms, in the caller's session or a new one alike), and nice
does not change that reliably; `--realtime` (SCHED_FIFO 1, same permissions) preempts at once
(lag p99 0.6-0.9 ms). A runner that saturates its core under SCHED_FIFO can hold it from normal
tasks up to the kernel's real-time throttling (95 % by default), so it is opt-in. run.json
`scheduling` says what the runner ran with, and the report repeats it when the replay fell
behind its schedule.
"""
from __future__ import annotations

import os
from pathlib import Path

AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")
REALTIME_PRIORITY = 1   # the lowest SCHED_FIFO priority: above every normal task, below the kernel's own


def autogroups_on() -> bool | None:
    """Whether the kernel groups CPU time by session (None: not Linux, or unknown)."""
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return None


def autogroup(pid: int | str = "self") -> tuple[str, int] | None:
    """(group name, group nice) of a process, from /proc/PID/autogroup ('/autogroup-57 nice 0')."""
    try:
        name, _, nice = Path(f"/proc/{pid}/autogroup").read_text().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _set_autogroup_nice(nice: int) -> str | None:
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
        return None
    except OSError as e:
        return f"autogroup nice {nice}: {e.strerror or e}"


class Priority:
    """The runner's scheduling: apply `nice` (None: leave it) in the child before exec, raise
    the session's autogroup while the run lasts, and describe what was in force."""

    def __init__(self, nice: int | None, realtime: bool = False) -> None:
        self.nice, self.realtime = nice, realtime
        self.errors: list[str] = []
        self._restore: int | None = None

    def before_start(self) -> None:
        """In `replay run` (the runner's session): the autogroup's nice for the run."""
        group = autogroup() if self.nice is not None and autogroups_on() else None
        if group is not None and group[1] != self.nice:
            err = _set_autogroup_nice(self.nice)
            if err:
                self.errors.append(err)
            else:
                self._restore = group[1]

    def in_child(self) -> None:
        """preexec_fn of the runner: its own process group (same session) and its nice."""
        os.setpgid(0, 0)
        try:
            if self.nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)
            if self.realtime:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        except OSError:
            pass   # reported from the parent, which sees what the child really has

    def after_start(self, pid: int) -> dict:
        """run.json `scheduling`: session, autogroups, the runner's nice and its group's."""
        try:
            nice = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            nice = None
        if self.nice is not None and nice is not None and nice != self.nice:
            self.errors.append(f"--nice {self.nice}: not permitted (the runner runs at nice {nice}; "
                               "lowering it below 0 needs root or CAP_SYS_NICE)")
        try:
            policy = "fifo" if os.sched_getscheduler(pid) == os.SCHED_FIFO else "normal"
        except (OSError, AttributeError):
            policy = None
        if self.realtime and policy != "fifo":
            self.errors.append("--realtime: not permitted (SCHED_FIFO needs root or CAP_SYS_NICE); the runner "
                               "runs under the normal policy")
        group = autogroup(pid)
        same = os.getsid(pid) == os.getsid(0) if hasattr(os, "getsid") else None
        return {"session": "caller" if same else "own", "autogroups": autogroups_on(), "policy": policy,
                "autogroup": group[0] if group else None, "autogroup_nice": group[1] if group else None,
                "nice": nice, "nice_asked": self.nice, "errors": self.errors}

    def restore(self) -> None:
        if self._restore is not None:
            _set_autogroup_nice(self._restore)
            self._restore = None
