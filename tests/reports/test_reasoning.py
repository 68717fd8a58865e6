"""Reasoning in the reports: TTFA, the answer-only metrics, reasoning tokens, ITL from one-token
chunks, gates on ttfa_ms, and records from before the columns existed, against hand-made records."""
from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from llm_replay.reports import summarize_run
from llm_replay.reports.analysis import analyze, good_requests
from llm_replay.reports.gate import gate
from llm_replay.reports.metrics import pooled_gaps, request_metrics
from llm_replay.reports.slo import load_slo
from tests.reports.conftest import records

# a: 3 reasoning chunks then 2 answer chunks, one token each (usage: 5, 3 reasoning)
# b: the same stream with reasoning counted (no usage): 2 reasoning chunks, then 3 answer chunks,
#    the second reasoning chunk and the first answer chunk in one read (same time)
# c: reasoning only, the budget ran out: no answer
# d: no reasoning at all
HAND = [
    dict(request_id="a", model="r1", status="ok", scheduled_s=0.0, sent_s=0.0, first_token_s=0.1,
         last_token_s=0.5, first_answer_s=0.4, token_times=[0.1, 0.2, 0.3, 0.4, 0.5], completion_tokens=5,
         reasoning_tokens=3, reasoning_chunks=3),
    dict(request_id="b", model="r1", status="ok", scheduled_s=1.0, sent_s=1.0, first_token_s=1.1,
         last_token_s=1.4, first_answer_s=1.2, token_times=[0.1, 0.2, 0.2, 0.3, 0.4], reasoning_tokens=2,
         reasoning_chunks=2),
    dict(request_id="c", model="r1", status="ok", scheduled_s=2.0, sent_s=2.0, first_token_s=2.1,
         last_token_s=2.3, token_times=[0.1, 0.2, 0.3], completion_tokens=3, reasoning_tokens=3,
         reasoning_chunks=3),
    dict(request_id="d", model="plain", status="ok", scheduled_s=3.0, sent_s=3.0, first_token_s=3.05,
         last_token_s=3.35, first_answer_s=3.05, token_times=[0.05, 0.15, 0.25, 0.35], completion_tokens=4),
]


def test_ttfa_answer_and_reasoning_times_by_hand():
    rm = request_metrics(records(HAND))
    c = rm.columns
    assert c["ttft_ms"] == pytest.approx([100, 100, 100, 50])
    assert c["ttfa_ms"][[0, 1, 3]] == pytest.approx([400, 200, 50]) and math.isnan(c["ttfa_ms"][2])
    assert c["reasoning_ms"][:3] == pytest.approx([300, 100, 200]) and math.isnan(c["reasoning_ms"][3])
    assert c["answer_ms"][[0, 1, 3]] == pytest.approx([100, 200, 300])
    # all tokens: (last - first) / (n - 1); answer only: (last - first answer) / (n_answer - 1)
    assert c["tpot_ms"][[0, 1, 3]] == pytest.approx([100, 75, 100])
    assert c["tpot_answer_ms"][[0, 1, 3]] == pytest.approx([100, 100, 100]) and math.isnan(c["tpot_answer_ms"][2])
    assert rm.reasoning[:3].tolist() == [3, 2, 3] and math.isnan(rm.reasoning[3]) and rm.has_reasoning


def test_answer_gaps_split_by_chunk_index_not_time():
    rm = request_metrics(records(HAND))
    pooled = pooled_gaps(records(HAND), None, rm.one_token, rm.reasoning_chunks)
    # a: 4 gaps of 100; b: 100, 0, 100, 100; c: 100, 100; d: 3 x 100
    assert sorted(pooled["icl_ms"]) == pytest.approx(sorted([100] * 4 + [100, 0, 100, 100] + [100] * 2 + [100] * 3), abs=1e-3)
    # answer phase: a's last gap; b's two gaps after its first answer chunk (the 0 gap is reasoning -> answer)
    assert sorted(pooled["icl_answer_ms"]) == pytest.approx([100] * 6, abs=1e-3)
    # ITL: one token per chunk, confirmed by the usage total (a, c, d) or assumed without usage (b)
    assert len(pooled["itl_ms"]) == 4 + 4 + 2 + 3 and len(pooled["itl_answer_ms"]) == 1 + 2 + 3


def test_itl_is_icl_when_every_chunk_carried_one_token():
    rows = [HAND[3], dict(HAND[3], request_id="e")]
    rm = request_metrics(records(rows))
    pooled = pooled_gaps(records(rows), None, rm.one_token, None)
    assert pooled["itl_ms"] is pooled["icl_ms"] and pooled["itl_answer_ms"] is pooled["icl_ms"]


def test_ttfa_threshold_and_objective():
    rm = request_metrics(records(HAND))
    good = good_requests(rm, load_slo({"per_request": {"ttfa_ms": 300}}))
    assert good.tolist() == [False, True, False, True]     # a: 400 ms; c never answered
    an = analyze(records(HAND), slo=load_slo({"objectives": ["ttfa_ms.max <= 400", "reasoning_ms.p50 <= 150"]}))
    res = gate(an, an.slo)   # 3 samples cannot prove a p50 above 150 at 95 %: undecided (exit 2)
    assert [r.verdict for r in res.rows] == ["pass", "undecided"] and res.exit_code == 2
    res = gate(an, an.slo, as_measured=True)
    assert [r.verdict for r in res.rows] == ["pass", "fail"] and res.exit_code == 1


def test_summary_reasoning_section_and_warnings(tmp_path):
    pq.write_table(records(HAND), tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    r = s["reasoning"]
    assert (r["requests"], r["streamed"], r["hidden"], r["no_answer"], r["ok"]) == (3, 3, 0, 1, 4)
    assert r["tokens"]["n"] == 3 and r["tokens"]["p50"] == 3
    assert any("no answer" in w for w in s["warnings"])
    by = {row["key"]: row for row in s["breakdowns"]["model"]}
    assert by["r1"]["reasoning_tokens"]["n"] == 3 and by["plain"]["reasoning_tokens"]["n"] == 0
    assert by["r1"]["ttfa_ms"]["n"] == 2
    md = (tmp_path / "summary.md").read_text()
    assert "## Reasoning" in md and "ttfa_ms" in md
    assert "Reasoning (ms" in (tmp_path / "report.html").read_text()


def test_hidden_reasoning_is_told(tmp_path):
    rows = [dict(HAND[3], reasoning_tokens=120)]        # usage said 120 reasoning tokens, none streamed
    pq.write_table(records(rows), tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    assert s["reasoning"]["hidden"] == 1 and any("hidden reasoning" in w for w in s["warnings"])
    assert s["latency"]["ttfa_ms"]["p50"] == s["latency"]["ttft_ms"]["p50"]


def test_records_without_the_new_columns_read_as_without_reasoning(tmp_path):
    old = records([HAND[3]]).drop_columns(["first_answer_s", "reasoning_tokens", "reasoning_chunks"])
    pq.write_table(old, tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    assert s["latency"]["ttfa_ms"] == s["latency"]["ttft_ms"] and s["latency"]["ttfa_ms"]["n"] == 1
    assert s["reasoning"]["requests"] == 0 and "## Reasoning" not in (tmp_path / "summary.md").read_text()
    # without reasoning, the answer metrics are their all-token twins and the tables do not repeat them
    assert s["latency"]["tpot_answer_ms"] == s["latency"]["tpot_ms"]
    assert "ttfa_ms" not in (tmp_path / "summary.md").read_text()


def test_itl_source_counts_and_several_token_chunks(tmp_path):
    rows = [HAND[0], HAND[1], HAND[3],
            dict(HAND[3], request_id="e", completion_tokens=12)]     # 12 tokens in 4 chunks: several per chunk
    pq.write_table(records(rows), tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    src = s["itl_source"]
    assert (src["one_token_usage"], src["one_token_assumed"], src["several_tokens"], src["chunk_tokens"]) == (2, 1, 1, 0)
    assert src["used"] == "mixed" and any("several tokens" in w for w in s["warnings"])
    assert s["latency"]["itl_ms"]["n"] == 4 + 4 + 3 and s["latency"]["icl_ms"]["n"] == 4 + 4 + 3 + 3


def test_terminal_names_icl_itl_once_when_equal_and_says_where_itl_came_from(tmp_path):
    from llm_replay.reports.text import format_summary
    pq.write_table(records([HAND[0], HAND[3]]), tmp_path / "records.parquet")   # one token a chunk
    text = format_summary(summarize_run(tmp_path, write=False))
    assert "icl_ms = itl_ms" in text and "\n  itl_ms " not in text
    assert "ITL tokens from (requests)" in text and "1/chunk by usage 2" in text
    rows = [HAND[0], dict(HAND[3], request_id="e", completion_tokens=12)]   # several tokens a chunk
    pq.write_table(records(rows), tmp_path / "records.parquet")
    text = format_summary(summarize_run(tmp_path, write=False))
    assert "icl_ms = itl_ms" not in text and "several/chunk: left out 1" in text
