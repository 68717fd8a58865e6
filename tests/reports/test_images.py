"""Images in the reports: the breakdown by image count, the TTFT-vs-images plot, and the input
length check that leaves image requests out (the server counts image tokens, the trace does not)."""
from __future__ import annotations

import pyarrow.parquet as pq

from llm_replay.reports import summarize_run
from tests.reports.conftest import records


def rows():
    out = []
    for i, n in enumerate([0, 0, 1, 1, 2, 4, 12]):
        ttft = 0.05 + 0.1 * n
        out.append(dict(request_id=str(i), status="ok", scheduled_s=float(i), sent_s=float(i),
                        first_token_s=i + ttft, last_token_s=i + ttft + 0.2, token_times=[ttft, ttft + 0.2],
                        input_tokens=100, prompt_tokens=100 + 300 * n, completion_tokens=2, output_tokens=2,
                        num_images=n))
    return out


def test_breakdown_by_image_count_plot_and_length_check(tmp_path):
    pq.write_table(records(rows()), tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    by = {r["key"]: r for r in s["breakdowns"]["num_images"]}
    assert {k: r["issued"] for k, r in by.items()} == {"0": 2, "1": 2, "2": 1, "4": 1, "9+": 1}
    assert by["0"]["ttft_ms"]["p50"] < by["1"]["ttft_ms"]["p50"] < by["4"]["ttft_ms"]["p50"] < by["9+"]["ttft_ms"]["p50"]
    # prompt_tokens exceed input_tokens by the image tokens: not a length mismatch
    assert s["length_mismatch"]["input"]["checked"] == 2 and s["length_mismatch"]["input"]["mismatched"] == 0
    assert "TTFT vs images per request" in (tmp_path / "report.html").read_text()
    assert "Per image count" in __import__("reports").format_summary(s)


def test_no_image_breakdown_without_images(tmp_path):
    pq.write_table(records([dict(r, num_images=None) for r in rows()[:2]]), tmp_path / "records.parquet")
    s = summarize_run(tmp_path)
    assert "num_images" not in s["breakdowns"] and "TTFT vs images" not in (tmp_path / "report.html").read_text()
