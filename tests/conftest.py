"""Shared test helpers: run our CLIs as real subprocesses against this checkout.

Waits scale with the host. SLOWDOWN is how many times slower than a quiet host this test session's CPU
work runs now: measured once, when the first pytest process imports this file (the controller, before
xdist starts its workers), by forking one child per usable core that spins for 0.2 s; their CPU time
over the wall time is the share of the cores this session gets (a quiet host: all; at load 8 on 2 cores
beside 3 spinners in their own sessions: a quarter, as Linux autogroups give each session an equal
share). Clamped to 1..10 and passed to the workers and every subprocess as $REPLAY_TEST_SLOWDOWN (set it
to override the measurement). `wait_s(base)` is a quiet host's `base` seconds times SLOWDOWN; run_cli
and start_engine scale their timeouts with it.

The servers and CLIs the tests start run in their own sessions (start_new_session), each its own
autogroup, as when a user starts the engine in one terminal and `replay run` in another: a busy host
then slows them as much as it would slow those, not by the share of one session split among every
worker and child of the test run. Tests that judge the client's own timing are marked `timing` and
run alone.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_replay.replay.orchestrate import LocalEngine as Engine  # noqa: F401  (tests wrap their own Popen)

REPO = Path(__file__).resolve().parents[1]


def measure_slowdown(seconds: float = 0.2) -> float:
    """Quiet-host CPU over the CPU this session gets: one forked spinner per usable core for `seconds`."""
    if not hasattr(os, "fork"):
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    start = time.monotonic()
    end = start + seconds
    pids = []
    for _ in range(cores):
        pid = os.fork()
        if pid == 0:
            while time.monotonic() < end:
                pass
            os._exit(0)
        pids.append(pid)
    cpu = 0.0
    for pid in pids:
        usage = os.wait4(pid, 0)[2]
        cpu += usage.ru_utime + usage.ru_stime
    return cores * (time.monotonic() - start) / max(cpu, 1e-3)


if "REPLAY_TEST_SLOWDOWN" not in os.environ:
    os.environ["REPLAY_TEST_SLOWDOWN"] = f"{min(10.0, max(1.0, measure_slowdown())):.2f}"
SLOWDOWN = min(10.0, max(1.0, float(os.environ["REPLAY_TEST_SLOWDOWN"])))


def wait_s(base: float) -> float:
    """A wait of `base` seconds on a quiet host, scaled by this host's SLOWDOWN (module docstring)."""
    return base * SLOWDOWN


def repo_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses that import this checkout (installed or not)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


def run_cli(module: str, *args: str, timeout: float = 120, check: bool = False,
            **kw) -> subprocess.CompletedProcess:
    """Run `python -m <module> args...` (e.g. module='replay', one of llm_replay's packages) in its own
    session; `timeout` is a quiet host's, scaled by wait_s."""
    if module.split(".")[0] in ("replay", "engine_stub", "traces", "reports"):
        module = "llm_replay." + module
    kw.setdefault("start_new_session", True)
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=repo_env(), timeout=wait_s(timeout), **kw)
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



def start_engine(*args: str, timeout: float = 90):
    """Start engine-stub on a free port in its own session (see replay.orchestrate); `.url`, `.stop()`.
    `timeout` is a quiet host's, scaled by wait_s."""
    from llm_replay.replay.orchestrate import start_engine as _start
    return _start(*args, timeout=wait_s(timeout), new_session=True)


@pytest.fixture(scope="session")
def engine_url():
    """A default engine-stub shared by a test session (skipped where torch is absent)."""
    pytest.importorskip("torch")
    pytest.importorskip("llm_replay.engine_stub.cli")
    eng = start_engine()
    yield eng.url
    eng.stop()


DEFAULT_MARKEXPR = "not timing and not slow"   # pyproject.toml addopts


def pytest_terminal_summary(terminalreporter, config) -> None:
    """Say how busy the host was and which tests the default `-m 'not timing and not slow'` left out,
    why, and how to run them."""
    if not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"host slowdown {SLOWDOWN:.2f}x at the start: each wait in the tests was that many "
                                    "times a quiet host's (REPLAY_TEST_SLOWDOWN sets it)")
    if config.getoption("markexpr", "") == DEFAULT_MARKEXPR and not hasattr(config, "workerinput"):
        terminalreporter.write_line(
            "not run by default (.ci/run runs both after this):\n"
            "  marker `slow`: end-to-end runs of the README's and docs' blocks, sweeps, the pytest plugin, "
            "multi-host and realism fits (~10 more minutes on 2 cores): python3 -m pytest -q -m slow\n"
            "  marker `timing`: they judge this host's own CPU timing (signal delivery, dispatch lag, "
            "nice/realtime), which parallel workers and busy hosts disturb; alone: python3 -m pytest -q -m timing -n 0")
