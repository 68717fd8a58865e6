"""docs/distributed.md, every block as written (mdblocks.py: how): the master and the "other
host's" worker on this host (127.0.0.1 and a free port for 0.0.0.0:5557 and master-host:5557),
the target an SSE test server for 10.0.0.5. No cluster here: the Kubernetes block's files exist,
its kustomization builds where kubectl is installed (tests/test_deploy.py validates what it
builds), and its `replay` line runs on a run directory collected as the block collects it."""
from __future__ import annotations

import json
import re
import shutil
import time

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, free_port, wait_s
from tests.docs.mdblocks import DOCS, Page, background, commands, sh, stop, substitute
from tests.replay.runkit import sse_server

PAGE = Page(DOCS / "distributed.md", {
    "replay trace generate --preset chat --duration 30": "test_distributed_block",
    "docker build -f deploy/kubernetes/Dockerfile": "test_kubernetes_block",
})
PAGES = [PAGE]
block = PAGE.block


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-distributed")


@pytest.fixture(scope="module")
def distributed_run(work):
    generate, master, worker = commands(block("replay trace generate --preset chat --duration 30").text)
    sh(generate, work)
    port = free_port()
    with sse_server("--tokens", "8") as url:
        master = substitute(master, {"http://10.0.0.5:8000": url, "0.0.0.0:5557": f"127.0.0.1:{port}"})
        worker = substitute(worker, {"master-host:5557": f"127.0.0.1:{port}"}).split("#")[0].strip()
        m = background(master, work, work / "master.log")
        time.sleep(2)
        w = background(worker, work, work / "worker.log")
        try:
            assert m.wait(wait_s(240)) == 0, (work / "master.log").read_text()[-3000:]
            assert w.wait(wait_s(60)) == 0, (work / "worker.log").read_text()[-3000:]
        finally:
            stop(m), stop(w)
    return work / "runs" / "d"


@pytest.mark.slow
def test_distributed_block(work, distributed_run):
    info = json.loads((distributed_run / "run.json").read_text())
    rows = pq.read_metadata(work / "chat.parquet").num_rows
    assert info["status"] == "completed" and info["status_counts"] == {"ok": rows}
    workers = set(pq.read_table(distributed_run / "records.parquet", columns=["worker"]).column("worker").to_pylist())
    assert len(workers) == 3, workers          # 2 local workers and the remote one
    assert "joined master" in (work / "worker.log").read_text()


@pytest.mark.slow
def test_kubernetes_block(work, distributed_run):
    lines = commands(block("docker build -f deploy/kubernetes/Dockerfile").text)
    kubectl = shutil.which("kubectl")
    for line in lines:
        cmd = line.split("#")[0].strip()
        for path in re.findall(r"deploy/kubernetes[\w./-]*", cmd):
            assert (REPO / path).exists(), f"{path} (in `{cmd}`)"
        if cmd.startswith("kubectl kustomize") and kubectl:
            sh(cmd, REPO, timeout=60)
        if cmd.startswith("kubectl cp"):
            shutil.copytree(distributed_run, work / cmd.split()[-1])
        if cmd.startswith("replay "):
            sh(cmd, work, timeout=120)
    assert any(line.startswith("kubectl apply -k deploy/kubernetes") for line in lines)
