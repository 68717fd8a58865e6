"""docs/reports.md, every block as written (mdblocks.py: how), in a folder laid out as a clone
(`examples/` copied in). What a user brings is made first: their two runs to compare (copies of
the page's own `runs/demo`) and other tools' result files (the importers' fixtures)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, wait_s
from tests.docs.mdblocks import DOCS, Page, commands, env, sh
from tests.replay.runkit import sse_server, write_trace

PAGE = Page(DOCS / "reports.md", {
    "replay demo -o runs/demo": "test_report_block",
    "per_request:            # defines a good request": "test_slo_spec_blocks",
    "[tool.replay.slo]": "test_slo_spec_blocks",
    "requests: ok 15, http_error 5": "test_gate_errors_block",
    "from llm_replay import reports": "test_python_api_block",
})
PAGES = [PAGE]
block = PAGE.block
REPORT_FIX = REPO / "tests" / "reports" / "fixtures"


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs-reports")
    shutil.copytree(REPO / "examples", folder / "examples")
    (folder / "artifacts" / "run").mkdir(parents=True)
    shutil.copy(REPORT_FIX / "profile_export.jsonl", folder / "artifacts" / "run")
    shutil.copy(REPORT_FIX / "vllm_detailed.json", folder / "vllm-result.json")
    return folder


@pytest.fixture(scope="module")
def demo_run(work):
    """The page's first block: `replay demo -o runs/demo`, then every command on that run."""
    pytest.importorskip("torch")
    demo, *rest = commands(block("replay demo -o runs/demo").text)
    sh(demo, work, timeout=420)
    for name in ("base", "cand"):
        shutil.copytree(work / "runs" / "demo", work / "runs" / name)
    for cmd in rest:
        sh(cmd, work, ok=(0, 1, 2) if cmd.startswith("replay gate") else (0,))
    return work / "runs" / "demo"


@pytest.mark.slow
def test_report_block(work, demo_run):
    assert [p.name for p in demo_run.glob("summary.warmup-10s*.json")]   # beside the run's own summary
    assert (work / "compare.html").exists()
    for name in ("vllm-bench", "aiperf-bench"):
        assert (work / "runs" / name / "records.parquet").exists()


@pytest.mark.slow
def test_summary_json_table(demo_run):
    """The summary.json table names every top-level key of a real summary (one with an SLO: a gate)."""
    text = PAGE.path.read_text()
    table = text[text.index("## summary.json"):text.index("## report.html")]
    named = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        named |= {k.split(".")[0] for k in re.findall(r"`([\w.<>]+)`", cell)}
    real = set(json.loads(next(demo_run.glob("summary.warmup-10s*.json")).read_text()))
    assert "gate" in real and named == real, (named - real, real - named)


def test_slo_spec_blocks(work):
    from llm_replay import reports
    for name, snippet in (("full.yaml", "per_request:            # defines"), ("pyproject.toml", "[tool.replay.slo]")):
        (work / name).write_text(block(snippet).text + "\n")
        assert reports.load_slo(work / name).objectives, name


def test_gate_errors_block(work):
    shown = block("requests: ok 15, http_error 5").text
    write_trace(work / "e.parquet", 20, gap_s=0.01)
    with sse_server("--fault", "http500", "--fault-every", "4") as url:
        sh(f"replay run --trace e.parquet --target {url} -o runs/errors --no-check --no-progress", work)
    (work / "errors-slo.yaml").write_text("objectives: ['error_rate <= 0.01']\n")
    out = sh("replay gate runs/errors --slo errors-slo.yaml", work, ok=(1,)).stdout
    assert "requests: ok 15, http_error 5" in out and "first errors:" in out, out
    assert re.search(r"^  http_error x5: HTTP 500", out, re.M), out
    assert [line.split(":")[0] for line in shown.splitlines()] == ["requests", "first errors", "  http_error x5"]


@pytest.mark.slow
def test_python_api_block(work, demo_run):
    if not (work / "pyproject.toml").exists():     # the page's [tool.replay.slo] block, as a project's
        (work / "pyproject.toml").write_text(block("[tool.replay.slo]").text + "\n")
    code = block("from llm_replay import reports").text + "\nprint('verdict', gate.exit_code, cmp.exit_code)\n"
    p = subprocess.run([sys.executable, "-c", code], cwd=work, env=env(), capture_output=True, text=True, timeout=wait_s(120))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "verdict" in p.stdout
