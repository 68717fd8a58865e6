"""docs/agentic.md, every block as written (mdblocks.py: how): engine-stub on a free port."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.docs.mdblocks import DOCS, Page, commands, serve, sh, stop, substitute

PAGE = Page(DOCS / "agentic.md", {
    "# agents.yaml": "test_agents_spec_yaml",
    "replay trace generate --preset agentic": "test_agentic_block",
    "per_task: {task_s: 120}": "test_agentic_block",
})
PAGES = [PAGE]
block = PAGE.block


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-agentic")


def test_agents_spec_yaml(work):
    (work / "agents.yaml").write_text("duration: 600\nseed: 1\n" + block("# agents.yaml").text)
    sh("replay trace generate --spec agents.yaml -o agents-spec.parquet", work)
    d = json.loads(sh("replay trace describe agents-spec.parquet --json", work).stdout)
    assert d["requests"] > 1000 and d["agents"]["tasks"] > 10


@pytest.mark.slow
def test_agentic_block(work):
    """The worked example: generate, describe, engine-stub with a prefix-cache TTL, run with chat
    histories, report with the task SLO."""
    pytest.importorskip("torch")
    (work / "agents-slo.yaml").write_text(block("per_task: {task_s: 120}").text)
    generate, describe, engine, run, report = commands(block("replay trace generate --preset agentic").text)
    sh(generate, work)
    sh(describe, work)
    proc, url = serve(engine, work, work / "engine.log")
    try:
        sh(substitute(run, {"http://127.0.0.1:8000": url}), work, timeout=300)
        out = sh(report, work, ok=(0, 1)).stdout
    finally:
        stop(proc)
    rows = pq.read_metadata(work / "agents.parquet").num_rows
    recs = pq.read_table(work / "runs" / "agents" / "records.parquet").to_pandas()
    assert len(recs) == rows and recs.task_id.notna().all()
    # histories cut exactly at the context (8192) fit: no prompt is counted over its input_tokens
    assert (recs.status == "ok").all(), recs.error.dropna().value_counts().head()
    assert (recs.prompt_tokens <= recs.input_tokens).all()
    assert "Agentic tasks" in out and "task_s.p90 <= 120" in out
    s = json.loads((work / "runs" / "agents" / "summary.json").read_text())
    assert s["tasks"]["tasks"] >= 2 and s["tasks"]["by_depth"][1]["requests"] > 0
