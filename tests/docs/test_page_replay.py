"""docs/replay.md, every block as written (mdblocks.py: how): engine-stub on a free port for
`8000`; the fleet's two deployments are SSE test servers in place of 10.0.0.5 and 10.0.0.7."""
from __future__ import annotations

import signal

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, free_port, wait_s
from tests.docs.mdblocks import (DOCS, Page, background, commands, serve, sh, shown_run_output, stop, substitute,
                                 wait_http)
from tests.replay.runkit import sse_server

PAGE = Page(DOCS / "replay.md", {
    "engine-stub serve --port 8000 &": "test_first_run",
    "replay: trace models -> 'tiny'": "test_first_run",
    "replay trace generate --preset multi-model": "test_fleet_block",
    "locust -f replay/locustfile.py --host": "test_locust_block",
    "replay check --target http://127.0.0.1:8000": "test_check_block",
})
PAGES = [PAGE]
block = PAGE.block
LOCUSTFILE = {"replay/locustfile.py": str(REPO / "replay" / "locustfile.py")}


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-replay")


@pytest.fixture(scope="module")
def engine(work):
    pytest.importorskip("torch")
    proc, url = serve(commands(block("engine-stub serve --port 8000 &").text)[0], work, work / "engine.log")
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def first_run(work, engine):
    """The page's first block after its engine: generate the trace, replay it."""
    generate, run = commands(block("engine-stub serve --port 8000 &").text)[1:]
    sh(generate, work)
    p = sh(substitute(run, {"http://127.0.0.1:8000": engine}), work, timeout=300)
    return p.stdout + p.stderr


@pytest.mark.slow
def test_first_run(work, first_run):
    rows = pq.read_metadata(work / "chat.parquet").num_rows
    shown_run_output(block("replay: trace models -> 'tiny'").text, first_run, rows, "runs/first")


@pytest.mark.slow
def test_fleet_block(work, monkeypatch):
    generate, run = commands(block("replay trace generate --preset multi-model").text)
    sh(generate, work)
    monkeypatch.setenv("KEY_LARGE", "k")
    with sse_server("--model", "small") as small, sse_server("--model", "big") as big:
        sh(substitute(run, {"http://10.0.0.5:8000": small, "http://10.0.0.7:8000": big}), work)
    df = pq.read_table(work / "runs" / "fleet" / "records.parquet").to_pandas()
    assert (df.status == "ok").all() and len(df) == pq.read_metadata(work / "fleet.parquet").num_rows
    assert set(df[df.model == "large"].target) == {big} and set(df[df.model != "large"].target) == {small}


@pytest.mark.slow
def test_locust_block(work, engine, first_run):
    ui, headless, master, worker = commands(block("locust -f replay/locustfile.py --host").text)
    web = free_port()
    ui = substitute(ui, {**LOCUSTFILE, "http://127.0.0.1:8000": engine}).split("#")[0].strip() + f" --web-port {web}"
    proc = background(ui, work, work / "locust-ui.log")
    try:
        assert b"locust" in wait_http(f"http://127.0.0.1:{web}/", timeout=60, proc=proc, log=work / "locust-ui.log").lower()
    finally:
        stop(proc, signal.SIGINT)
    sh(substitute(headless, {**LOCUSTFILE, "http://127.0.0.1:8000": engine}), work, timeout=180)
    mport = free_port()
    master = substitute(master, {**LOCUSTFILE, "--host URL": f"--host {engine}"}) + f" --master-bind-port {mport}"
    worker = substitute(worker, LOCUSTFILE).split("#")[0].strip() + f" --master-port {mport}"
    m = background(master, work, work / "locust-master.log")
    ws = [background(worker, work, work / f"locust-worker{i}.log") for i in range(2)]  # "twice"
    try:
        assert m.wait(wait_s(240)) == 0, (work / "locust-master.log").read_text()[-3000:]
    finally:
        for p in (m, *ws):
            stop(p)


def test_check_block(work, engine):
    cmd = commands(block("replay check --target http://127.0.0.1:8000").text)[0]
    assert "stream" in sh(substitute(cmd, {"http://127.0.0.1:8000": engine}), work).stdout
