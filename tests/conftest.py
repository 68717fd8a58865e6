"""Shared test helpers: run our CLIs as real subprocesses against this checkout."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def repo_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses that import this checkout (installed or not)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


def run_cli(module: str, *args: str, timeout: float = 120, check: bool = False,
            **kw) -> subprocess.CompletedProcess:
    """Run `python -m <module> args...` (e.g. module='replay') and capture its output."""
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=repo_env(), timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def replay_cli():
    return lambda *args, **kw: run_cli("replay", *args, **kw)


class Engine:
    """A running `engine-stub serve` subprocess (started by `start_engine`)."""

    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_engine(*args: str, timeout: float = 90) -> Engine:
    """Start `python -m engine_stub serve --port 0 ARGS` and wait for its ready line
    `engine-stub ready: URL` on stdout. The caller stops it (by PID) with `.stop()`."""
    import select
    import time
    proc = subprocess.Popen([sys.executable, "-m", "engine_stub", "serve", "--port", "0", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=repo_env())
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith("engine-stub ready: "):
                eng = Engine(proc, line.split(": ", 1)[1].strip())
                # keep draining output so the engine never blocks on a full pipe
                import threading
                threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
                return eng
    proc.kill()
    raise RuntimeError("engine-stub did not become ready:\n" + "".join(seen[-40:]))


@pytest.fixture(scope="session")
def engine_url():
    """A default engine-stub shared by a test session (skipped where torch is absent)."""
    pytest.importorskip("torch")
    pytest.importorskip("engine_stub.cli")
    eng = start_engine()
    yield eng.url
    eng.stop()
