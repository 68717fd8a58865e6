"""Shared test helpers: run our CLIs as real subprocesses against this checkout."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llm_replay.replay.local_engine import LocalEngine as Engine  # noqa: F401  (tests wrap their own Popen)

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
    """Run `python -m <module> args...` (e.g. module='replay', one of llm_replay's packages)."""
    if module.split(".")[0] in ("replay", "engine_stub", "traces", "reports"):
        module = "llm_replay." + module
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



def start_engine(*args: str, timeout: float = 90):
    """Start engine-stub on a free port (see replay.local_engine); `.url`, `.stop()`."""
    from llm_replay.replay.local_engine import start_engine as _start
    return _start(*args, timeout=timeout)


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
    """Say which tests the default `-m 'not timing and not slow'` left out, why, and how to run them."""
    if config.getoption("markexpr", "") == DEFAULT_MARKEXPR and not hasattr(config, "workerinput"):
        terminalreporter.write_line(
            "not run by default (.ci/run runs both after this):\n"
            "  marker `slow`: end-to-end runs of the README's and docs' blocks, sweeps, the pytest plugin, "
            "multi-host and realism fits (~10 more minutes on 2 cores): python3 -m pytest -q -m slow\n"
            "  marker `timing`: they judge this host's own CPU timing (signal delivery, dispatch lag, "
            "nice/realtime), which parallel workers and busy hosts disturb; alone: python3 -m pytest -q -m timing -n 0")
