"""vLLM --save-detailed JSON and AIPerf profile_export.jsonl -> records, checked by hand."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llm_replay.reports import ReportError, load_records, summarize_run
from llm_replay.reports.importers import import_results
from tests.conftest import run_cli

FIX = Path(__file__).parent / "fixtures"


def test_vllm_detailed_json(tmp_path):
    r = run_cli("replay", "import-results", "vllm", FIX / "vllm_detailed.json", "-o", tmp_path / "v")
    assert r.returncode == 0, r.stderr
    assert "missing in the source" in r.stdout and "output_tokens" in r.stdout
    t = load_records(tmp_path / "v").to_pylist()
    assert [x["status"] for x in t] == ["ok", "ok", "ok", "http_error"]
    assert [x["sent_s"] for x in t] == [0.0, 0.5, 0.75, 0.875]
    assert t[0]["first_token_s"] == pytest.approx(0.05) and t[0]["last_token_s"] == pytest.approx(0.10)
    assert t[2]["token_times"] == pytest.approx([0.2, 0.21, 0.22, 0.24])
    assert t[3]["first_token_s"] is None and t[3]["error"] == "Bad Request"
    assert t[0]["model"] == "meta-llama/Llama-3.1-8B-Instruct" and t[1]["input_tokens"] == 200
    s = summarize_run(tmp_path / "v", write=False)
    # TPOT by hand: a (0.05 s over 2 gaps of 3 tokens) = 25 ms; c = 40 ms / 3; b has one token
    assert s["latency"]["tpot_ms"]["n"] == 2
    assert s["latency"]["tpot_ms"]["max"] == pytest.approx(25.0)
    assert s["latency"]["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["counts"]["failed"] == 1 and s["dispatch_lag"]["n"] == 0
    run = json.loads((tmp_path / "v" / "run.json").read_text())
    assert run["imported_from"]["tool"] == "vllm" and "scheduled_s" in run["missing"]
    assert run["source_config"]["request_rate"] == "inf"


def test_vllm_without_start_times_places_requests_at_zero(tmp_path):
    data = json.loads((FIX / "vllm_detailed.json").read_text())
    del data["start_times"]
    src = tmp_path / "old.json"
    src.write_text(json.dumps(data))
    info = import_results("vllm", src, tmp_path / "old")
    assert any("no start_times" in n for n in info["notes"])
    assert {x["sent_s"] for x in load_records(tmp_path / "old").to_pylist()} == {0.0}


def test_aiperf_profile_export(tmp_path):
    info = import_results("aiperf", FIX / "profile_export.jsonl", tmp_path / "a", model="gpt-oss-20b")
    assert info["rows"] == 4 and "scheduled_s" in info["missing"] and "model" not in info["missing"]
    t = load_records(tmp_path / "a").to_pylist()
    assert [x["status"] for x in t] == ["ok", "ok", "http_error", "cancelled"]
    assert [x["sent_s"] for x in t] == pytest.approx([0.0, 0.5, 1.0, 1.2])
    assert t[0]["token_times"] == pytest.approx([0.1, 0.15, 0.2, 0.3])
    assert t[0]["last_token_s"] == pytest.approx(0.3) and t[0]["completion_tokens"] == 4
    assert t[0]["request_id"] == "7609a2e7-0001" and t[0]["session_id"] == "32ee4f33-0001"
    assert t[2]["http_status"] == 500 and "InternalServerError" in t[2]["error"]
    assert t[2]["input_tokens"] == 550 and t[1]["completion_tokens"] == 1
    s = summarize_run(tmp_path / "a", write=False)
    assert s["latency"]["tpot_ms"]["mean"] == pytest.approx(200 / 3)     # (300 - 100) / (4 - 1)
    assert s["latency"]["icl_ms"]["n"] == 3 and math.isclose(s["latency"]["icl_ms"]["max"], 100, rel_tol=1e-4)
    assert s["errors"]["by_status"] == {"http_error": 1, "cancelled": 1}


def test_aiperf_013_prefers_server_usage_and_carries_reasoning(tmp_path):
    """AIPerf 0.13 records (fixtures/aiperf_0.13): output_sequence_length is AIPerf re-tokenizing the
    text (14, 6, 12) while the server's usage says 10, 5, 8 = the chunks streamed; the model is in
    profile_export_aiperf.json under input_config.models.items[].name."""
    info = import_results("aiperf", FIX / "aiperf_0.13" / "profile_export.jsonl", tmp_path / "q")
    assert info["rows"] == 4 and "model" not in info["missing"] and "first_answer_s" not in info["missing"]
    t = load_records(tmp_path / "q").to_pylist()
    assert [x["status"] for x in t] == ["ok", "ok", "ok", "http_error"]
    assert {x["model"] for x in t} == {"Qwen/Qwen3-8B"}
    assert [x["completion_tokens"] for x in t] == [10, 5, 8, None]          # usage, not 14, 6, 12
    assert [x["prompt_tokens"] for x in t] == [563, 133, 313, None]
    assert [x["input_tokens"] for x in t] == [550, 120, 300, 550]      # AIPerf's ISL: the request side
    assert [x["reasoning_tokens"] for x in t] == [4, None, 4, None]     # usage's 4 over AIPerf's 5; fallback
    assert [x["reasoning_chunks"] for x in t[:3]] == [4, 0, 3]
    assert t[0]["first_answer_s"] == pytest.approx(0.28) and t[2]["first_answer_s"] == pytest.approx(1.24)
    s = summarize_run(tmp_path / "q", write=False)
    tp = s["throughput"]
    assert tp["output_tokens_per_s"] == pytest.approx(23 / tp["duration_s"])  # 10 + 5 + 8, not 14 + 6 + 12
    assert s["itl_source"]["several_tokens"] == 0 and s["itl_source"]["one_token_usage"] == 3
    assert not any("several tokens" in w for w in s["warnings"])
    lat = s["latency"]                    # TTFA from time_to_first_output_token; TTFT stays the first chunk
    assert lat["ttfa_ms"]["max"] == pytest.approx(280.0) and lat["ttfa_ms"]["p50"] == pytest.approx(240.0)
    assert lat["ttft_ms"]["max"] == pytest.approx(200.0)
    assert s["reasoning"]["requests"] == 2 and s["reasoning"]["no_answer"] == 0


@pytest.mark.parametrize("fmt, content, words", [
    ("vllm", '{"duration": 3}', "no per-request 'ttfts'"),
    ("vllm", '{"ttfts": [0.1], "errors": ["", ""]}', "has 2 entries"),
    ("vllm", "{nope", "cannot read vLLM result JSON"),
    ("aiperf", '{"metrics": {}}\n', "no 'metadata'"),
    ("aiperf", '{"metadata": {}}\n', "request_start_ns"),
])
def test_bad_sources_are_explained(tmp_path, fmt, content, words):
    src = tmp_path / "src"
    src.write_text(content)
    with pytest.raises(ReportError, match=words):
        import_results(fmt, src, tmp_path / "out")
