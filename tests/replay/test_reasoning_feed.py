"""A trace's reasoning_tokens (issue 25 item 2): `replay run` asks engine-stub for that many
reasoning tokens (its `reasoning_tokens` request field, found by the capability probe); a
server that takes no count reasons as it decides. Records keep the asked count beside what
came, and the summary compares the generated reasoning share with the asked one."""
from __future__ import annotations

import pytest

from llm_replay.reports import summarize_run
from tests.conftest import run_cli, start_engine
from tests.replay.runkit import records, sse_server, write_trace

OUT = 12
ASKED = [0, 3, 6, 12, None, 9]       # share of the rows that ask: 30 / 60


def _run(tmp_path, url, *extra):
    trace = write_trace(tmp_path / "t.parquet", len(ASKED), gap_s=0.05, output_tokens=OUT, api=["chat"] * len(ASKED),
                        reasoning_tokens=[None if a is None else int(a) for a in ASKED])
    p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "run", "--no-progress", *extra,
                timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    df = records(tmp_path / "run").sort_values("scheduled_s")
    assert (df.status == "ok").all() and (df.completion_tokens == OUT).all()
    assert [None if v != v else int(v) for v in df.asked_reasoning_tokens] == ASKED
    return p, df, summarize_run(tmp_path / "run")


@pytest.mark.slow
def test_engine_stub_generates_the_asked_reasoning_tokens(tmp_path):
    pytest.importorskip("torch")
    eng = start_engine()
    try:
        p, df, s = _run(tmp_path, eng.url, "--model-map", "*=tiny")
    finally:
        eng.stop()
    assert "reasoning_tokens go in each chat request's reasoning_tokens field" in p.stderr
    # engine-stub reports a count it was given (0 counts as none); a row without one: no reasoning
    assert [None if v != v else int(v) for v in df.reasoning_tokens] == [None, 3, 6, 12, None, 9]
    assert (df.reasoning_chunks.fillna(0) == [0, 3, 6, 12, 0, 9]).all()
    assert s["reasoning"]["share"] == pytest.approx(0.5) and s["reasoning"]["asked_share"] == pytest.approx(0.5)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| reasoning share of output tokens | 50.0% (the trace asked 50.0%) |" in md


def test_a_server_that_decides_itself_is_compared_with_the_trace(tmp_path):
    with sse_server("--reasoning", "2", "--report-reasoning", "--interval", "0.001") as url:
        p, df, s = _run(tmp_path, url)
    assert "are not sent: the target takes no count" in p.stderr
    assert (df.reasoning_tokens == 2).all()
    # the rows that asked: 5 x 2 of 60 tokens came as reasoning, 30 were asked
    assert s["reasoning"]["share"] == pytest.approx(10 / 60) and s["reasoning"]["asked_share"] == pytest.approx(0.5)
    assert "reasoning share of output tokens" in p.stdout and "16.7% (the trace asked 50.0%)" in p.stdout
