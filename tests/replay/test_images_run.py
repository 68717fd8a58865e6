"""Multimodal rows end to end: `replay run` sends each row's images to engine-stub, which counts
their tokens by patches, and to a text-only server, which refuses them: one record per row."""
from __future__ import annotations

import pytest

from tests.conftest import start_engine
from tests.replay.runkit import assert_well_formed, records, replay_run, sse_server, write_trace

PROMPT = "Describe what you see in these pictures, please."


def image_trace(path, counts, sizes):
    n = len(counts)
    return write_trace(path, n, gap_s=0.05, output_tokens=4, num_images=[int(c) for c in counts],
                       image_px=sizes, prompt=[PROMPT] * n, api=["chat"] * n)


def test_images_prompt_tokens_grow_by_the_documented_image_tokens(tmp_path):
    pytest.importorskip("torch")
    from llm_replay.engine_stub.images import image_tokens
    counts = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    sizes = ["64x64"] * 5 + ["100x30"] * 5
    trace = image_trace(tmp_path / "t.parquet", counts, sizes)
    eng = start_engine()
    try:
        replay_run(trace, eng.url, tmp_path / "run", "--model-map", "*=tiny", timeout=120)
    finally:
        eng.stop()
    df = records(tmp_path / "run").sort_values("scheduled_s")
    assert_well_formed(df)
    assert (df.status == "ok").all(), df[["status", "error"]]
    assert df.num_images.tolist() == counts
    text_only = df[df.num_images == 0].prompt_tokens
    assert text_only.nunique() == 1                      # the same verbatim text on every row
    per_image = [image_tokens(64, 64)] * 5 + [image_tokens(100, 30)] * 5
    assert (df.prompt_tokens - text_only.iloc[0]).tolist() == [c * k for c, k in zip(counts, per_image)]


def test_refused_images_are_http_error_records_and_text_rows_still_run(tmp_path):
    counts = [0, 2, 0, 1, 0, 3]
    trace = image_trace(tmp_path / "t.parquet", counts, [None] * len(counts))
    with sse_server("--no-images", "--interval", "0.001") as url:
        replay_run(trace, url, tmp_path / "run", "--model-map", "*=m")
    df = records(tmp_path / "run").sort_values("scheduled_s")
    assert len(df) == len(counts) and df.num_images.tolist() == counts
    assert (df[df.num_images == 0].status == "ok").all()
    bad = df[df.num_images > 0]
    assert (bad.status == "http_error").all() and (bad.http_status == 400).all()
    assert bad.error.str.contains("does not support image inputs").all()
