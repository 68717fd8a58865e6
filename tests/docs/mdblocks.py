"""The code blocks of README.md and docs/*.md, and running them as a user would.

Blocks are read from the pages themselves (not copied into tests), so editing a page edits its
test. A module that checks a page declares `PAGES = [Page(path, {snippet: check name})]`: each
block is claimed by the one check whose snippet occurs in the block's first line, and
`Page.assert_checked` fails on a block no check claims (tests/docs/test_site.py makes sure every
page with blocks has such a module). Commands run as written, with only the substitutions a test
names (each asserted to occur in its block, so they cannot go stale): free local ports and
hosts, and this checkout's path for files a page names relative to a clone.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO, free_port, wait_s

DOCS = REPO / "docs"
FIX = REPO / "tests" / "traces" / "fixtures"


@dataclass
class Block:
    lang: str
    line: int          # 1-based line of the opening fence
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def read_blocks(path: Path) -> list[Block]:
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        # a fence indented (in a list item) would be a block this reader skips: none allowed
        assert not re.match(r"^\s+```", lines[i]), f"{path.name}:{i + 1}: indented code fence"
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            blocks.append(Block(m.group(1), i + 1, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


class Page:
    def __init__(self, path: Path, checks: dict[str, str]):
        self.path, self.checks = path, checks

    def blocks(self) -> list[Block]:
        return read_blocks(self.path)

    def block(self, snippet: str) -> Block:
        found = [b for b in self.blocks() if snippet in b.first]
        assert len(found) == 1, f"{self.path.name}: blocks whose first line has {snippet!r}: {[b.line for b in found]}"
        return found[0]

    def assert_checked(self, namespace: dict) -> None:
        unclaimed = [(b.line, b.first) for b in self.blocks() if not any(s in b.first for s in self.checks)]
        assert not unclaimed, f"{self.path.name}: code blocks no test runs: {unclaimed}"
        for snippet in self.checks:
            self.block(snippet)  # each snippet names exactly one block
        missing = set(self.checks.values()) - set(namespace)
        assert not missing, f"{self.path.name}: checks named but not defined: {missing}"


# ---------------------------------------------------------------- running shell lines

def commands(text: str) -> list[str]:
    """The block's shell commands: continuations joined, blank and comment lines dropped."""
    return [c for c in text.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def substitute(text: str, subs: dict[str, str]) -> str:
    for old, new in subs.items():
        assert old in text, f"substitution {old!r} no longer occurs in the block:\n{text}"
        text = text.replace(old, new)
    return text


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user: the installed package
    e["PYTHONUNBUFFERED"] = "1"
    return e


def sh(cmd: str, cwd: Path, timeout: float = 240, ok=(0,)) -> subprocess.CompletedProcess:
    """Run a block's command as from a terminal of its own; `timeout`: a quiet host's (wait_s)."""
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env(), capture_output=True, text=True,
                       timeout=wait_s(timeout), start_new_session=True)
    out = p.stdout + p.stderr
    assert p.returncode in ok, f"`{cmd}` exited {p.returncode} (expected {ok}):\n{out[-4000:]}"
    assert "Traceback" not in out, f"`{cmd}`:\n{out[-4000:]}"
    return p


def background(cmd: str, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env(), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_http(url: str, timeout: float = 120, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + wait_s(timeout)
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read()
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {wait_s(timeout):.0f} s:\n{log.read_text()[-3000:] if log else ''}")


def serve(line: str, cwd: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """A page's `engine-stub serve --port 8000 ... &` line, on a free port: (process, URL)."""
    port = free_port()
    cmd = substitute(line, {"--port 8000": f"--port {port}"}).split("#")[0].strip().rstrip("&").strip()
    proc = background(cmd, cwd, log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc=proc, log=log)
    return proc, url


def same_shape(shown: str, real: str) -> None:
    """Each line a page shows starts a line of the real output with the same first word;
    header lines (no digits) appear verbatim, spacing aside."""
    norm = [" ".join(line.split()) for line in real.splitlines()]
    for line in shown.splitlines():
        words = line.split()
        if not words or line.strip() == "...":
            continue
        if not re.search(r"\d", line):
            assert " ".join(words) in norm, f"shown line {line!r} not in the real output:\n{real[-3000:]}"
        else:
            assert any(n.startswith(words[0]) for n in norm), f"shown line {line!r}: no real line starts " \
                                                                f"with {words[0]!r}:\n{real[-3000:]}"


def shown_run_output(shown: str, real: str, rows: int, run_dir: str) -> None:
    """The `replay run` output a page shows: its `replay:` notes are in the real output, and the
    run completed with every row ok into the run directory it names."""
    for line in shown.splitlines():
        if line.startswith("replay: "):
            assert line.split("(")[0].strip() in real, real[-3000:]
    assert re.search(r"^status: completed  ok (\d+)$", shown, re.M)
    assert f"status: completed  ok {rows}" in real, real[-3000:]
    assert f"run directory: {run_dir}" in shown and f"run directory: {run_dir}" in real
