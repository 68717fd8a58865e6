"""How the runner is scheduled against the rest of the host, and the `--nice` opt-in.

The runner stays in the caller's session, in a process group of its own (so Ctrl-C at a
terminal reaches `replay run`, which forwards it once). A new session would be worse: with
scheduler autogroups on (Linux's default: /proc/sys/kernel/sched_autogroup_enabled = 1) each
session is its own CPU group, and a fresh group on a busy host waited 30-165 ms for its
wake-ups (issue 21). Within an autogroup a process's nice value only orders it against the
group's other processes; against other sessions the group's own nice counts
(/proc/<pid>/autogroup). So `--nice N` sets both: the runner's (its workers inherit it) and,
for the run's duration, the session's autogroup's; lowering either below 0 needs root or
CAP_SYS_NICE, and a refusal is reported, never fatal. run.json `scheduling` says what the
runner ran with, and the report repeats it when the replay fell behind its schedule.
"""
from __future__ import annotations

import os
from pathlib import Path

AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


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

    def __init__(self, nice: int | None) -> None:
        self.nice = nice
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
        if self.nice is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)
            except OSError:
                pass   # reported from the parent, which sees the nice the child really has

    def after_start(self, pid: int) -> dict:
        """run.json `scheduling`: session, autogroups, the runner's nice and its group's."""
        try:
            nice = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            nice = None
        if self.nice is not None and nice is not None and nice != self.nice:
            self.errors.append(f"nice {self.nice}: not permitted (the runner runs at nice {nice}; "
                               "lowering it below 0 needs root or CAP_SYS_NICE)")
        group = autogroup(pid)
        same = os.getsid(pid) == os.getsid(0) if hasattr(os, "getsid") else None
        return {"session": "caller" if same else "own", "autogroups": autogroups_on(),
                "autogroup": group[0] if group else None, "autogroup_nice": group[1] if group else None,
                "nice": nice, "nice_asked": self.nice, "errors": self.errors}

    def restore(self) -> None:
        if self._restore is not None:
            _set_autogroup_nice(self._restore)
            self._restore = None
