"""docs/engine-stub.md, every block as written (mdblocks.py: how): each `serve` line on a free
port (`--port 0` as written lets the engine pick one, which this test picks instead so it can
talk to it), and the curl request against the first (tiny) engine."""
from __future__ import annotations

import pytest

from tests.conftest import free_port
from tests.docs.mdblocks import DOCS, Page, background, commands, sh, stop, substitute, wait_http

PAGE = Page(DOCS / "engine-stub.md", {
    "engine-stub serve                          # tiny model": "test_engine_stub_block",
    "curl -s localhost:8000/v1/completions": "test_engine_stub_block",
})
PAGES = [PAGE]
block = PAGE.block


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.mark.slow
def test_engine_stub_block(tmp_path):
    pytest.importorskip("torch")
    lines = commands(block("engine-stub serve                          # tiny model").text)
    assert len(lines) == 5
    for i, line in enumerate(lines):
        cmd, port = line.split("#")[0].strip(), free_port()
        cmd = substitute(cmd, {"--port 0": f"--port {port}"}) if "--port 0" in cmd else f"{cmd} --port {port}"
        log = tmp_path / f"engine{i}.log"
        proc = background(cmd, tmp_path, log)
        try:
            wait_http(f"http://127.0.0.1:{port}/v1/models", proc=proc, log=log)
            if i == 0:  # the curl block, against the first (tiny) engine
                curl = commands(block("curl -s localhost:8000/v1/completions").text)[0]
                out = sh(substitute(curl, {"localhost:8000": f"127.0.0.1:{port}"}), tmp_path, timeout=60).stdout
                assert out.rstrip().endswith("data: [DONE]") and '"text"' in out
        finally:
            stop(proc)
        assert "engine-stub ready: http://" in log.read_text()
