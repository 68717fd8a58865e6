"""Child processes for the orchestrators (`demo`, `sweep`, `ab`, the pytest plugin, the tests):
the bundled reference engine (`engine-stub serve`) and `replay run`.

The orchestrators must not import locust (it monkey-patches the whole process with gevent), so
each replay runs in its own `python -m llm_replay.replay run ...` child. The engine is reached
only over HTTP: this module never imports engine_stub (nor torch).
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY_PREFIX = "engine-stub ready: "


@dataclass(eq=False)
class LocalEngine:
    """A running `engine-stub serve` child process; stop it with `.stop()` (by PID)."""

    proc: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)

    def pin(self, cpus: set[int]) -> bool:
        """Keep every thread of the engine on `cpus` (threads it starts later inherit it). False
        where CPU affinity is not available."""
        try:
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except (OSError, AttributeError):   # no /proc, or no sched_setaffinity (macOS)
            return False
        return True

    def stop(self, timeout: float = 10) -> None:
        self.proc.terminate()   # terminate and kill: no-ops once it has exited
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
    root = str(Path(__file__).resolve().parents[1])
    return {"PYTHONUNBUFFERED": "1", **os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


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
        if not select.select([proc.stdout], [], [], 0.5)[0]:
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
    proc.kill()   # a no-op once it has exited (Popen.send_signal polls first)
    proc.wait(5)
    raise RuntimeError(f"engine-stub did not become ready (exit code {proc.returncode}):\n{''.join(log[-40:])}")


@dataclass
class RunOutcome:
    run_dir: Path
    returncode: int
    output: str


def run_args(options: dict[str, Any]) -> list[str]:
    """`{"max_requests": 10, "force_output_len": False}` -> `--max-requests 10 --no-force-output-len`;
    a list repeats the flag, a dict gives one `KEY=VALUE` flag per item, None leaves it out."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True or value is False:
            out.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            values = [f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else \
                value if isinstance(value, (list, tuple)) else [value]
            out += [a for v in values for a in (flag, str(v))]
    return out


def replay_run(trace: Path, target: str | list[str], run_dir: Path, *, extra: list[str] | None = None,
               timeout: float | None = None, echo: bool = False, cpus: set[int] | None = None) -> RunOutcome:
    """Replay `trace` against `target` (a URL, or `replay run --target` values) into `run_dir` in a
    child process (on `cpus` when given)."""
    targets = [a for t in ([target] if isinstance(target, str) else target) for a in ("--target", t)]
    cmd = [sys.executable, "-m", "llm_replay.replay", "run", "--trace", str(trace), *targets,
           "-o", str(run_dir), *(extra or [])]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus and hasattr(os, "sched_setaffinity") else None
    # echo: the child's live progress goes straight to our terminal
    proc = subprocess.run(cmd, env=child_env(), timeout=timeout, capture_output=not echo, text=True, preexec_fn=pin)
    return RunOutcome(Path(run_dir), proc.returncode, (proc.stdout or "") + (proc.stderr or ""))
