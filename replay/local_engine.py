"""Start and stop the bundled reference engine (`engine-stub serve`) as a subprocess.

Used by `replay demo`, `replay sweep` without a target, the pytest plugin and the tests.
The engine is reached only over HTTP: this module never imports engine_stub (nor torch).
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_PREFIX = "engine-stub ready: "


class LocalEngine:
    """A running `engine-stub serve` child process; stop it with `.stop()` (by PID)."""

    def __init__(self, proc: subprocess.Popen, url: str, log: list[str] | None = None) -> None:
        self.proc, self.url, self.log = proc, url, log if log is not None else []

    def pin(self, cpus: set[int]) -> bool:
        """Keep every thread of the engine on `cpus` (threads it starts later inherit it). False
        where CPU affinity is not available."""
        if not hasattr(os, "sched_setaffinity"):
            return False
        try:
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except OSError:
            return False
        return True

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def child_env() -> dict[str, str]:
    """Environment for our child processes: this checkout importable even when not installed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_engine(*args: str, timeout: float = 90, new_session: bool = False) -> LocalEngine:
    """Start `python -m llm_replay.engine_stub serve --port 0 ARGS` and wait for `engine-stub ready: URL`.
    `new_session`: its own session (and scheduler autogroup), as a server started from its own terminal;
    it then gets no SIGINT or SIGHUP from ours, so only a caller that always stops it should ask."""
    cmd = [sys.executable, "-m", "llm_replay.engine_stub", "serve", "--port", "0", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
                            start_new_session=new_session)
    log: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        line = proc.stdout.readline()
        log.append(line)
        if line.startswith(READY_PREFIX):
            # Keep draining (bounded) so the engine never blocks on a full pipe.
            def drain() -> None:
                for rest in proc.stdout:
                    log.append(rest)
                    del log[:-200]
            threading.Thread(target=drain, daemon=True).start()
            return LocalEngine(proc, line[len(READY_PREFIX):].strip(), log)
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    raise RuntimeError("engine-stub did not become ready (exit code %s):\n%s"
                       % (proc.returncode, "".join(log[-40:])))
