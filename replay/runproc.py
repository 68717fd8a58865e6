"""Run `replay run` as a child process and collect its run directory.

`demo`, `sweep` and the pytest plugin orchestrate replays from processes that must not
import locust (it monkey-patches the whole process with gevent), so each replay runs in
its own `python -m llm_replay.replay run ...` child.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .local_engine import child_env


@dataclass
class RunOutcome:
    run_dir: Path
    returncode: int
    output: str


def run_args(options: dict[str, Any]) -> list[str]:
    """`{"max_requests": 10, "force_output_len": False}` -> `--max-requests 10 --no-force-output-len`."""
    out: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        elif isinstance(value, dict):
            for k, v in value.items():
                out += [flag, f"{k}={v}"]
        else:
            out += [flag, str(value)]
    return out


def replay_run(trace: Path, target: str | list[str], run_dir: Path, *, extra: list[str] | None = None,
               timeout: float | None = None, echo: bool = False, cpus: set[int] | None = None) -> RunOutcome:
    """Replay `trace` against `target` (a URL, or `replay run --target` values) into `run_dir` in a
    child process (on `cpus` when given)."""
    env = child_env()
    targets = [a for t in ([target] if isinstance(target, str) else target) for a in ("--target", t)]
    cmd = [sys.executable, "-m", "llm_replay.replay", "run", "--trace", str(trace), *targets,
           "-o", str(run_dir), *(extra or [])]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus and hasattr(os, "sched_setaffinity") else None
    if echo:  # the child's live progress goes straight to our terminal
        proc = subprocess.run(cmd, env=env, timeout=timeout, text=True, preexec_fn=pin)
    else:
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True, preexec_fn=pin)
    return RunOutcome(Path(run_dir), proc.returncode, (proc.stdout or "") + (proc.stderr or ""))
