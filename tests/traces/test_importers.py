"""Importers on small fixtures that reproduce each format's quirks: exact values, metadata,
and the round trip import -> Parquet -> export in the source format giving the same values."""
import csv
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from llm_replay.traces import Trace, TraceError
from llm_replay.traces.importers import import_trace, module

FIX = Path(__file__).parent / "fixtures"


def _imp(fmt, name, tmp_path, **kw):
    out = tmp_path / (name + ".parquet")
    meta = import_trace(fmt, FIX / name, out, **kw)
    t = Trace.read(out)
    assert t.metadata == meta
    return t


def _col(t, name):
    return t.table.column(name).to_pylist()


def test_azure_2023_crlf_seven_digits_no_final_newline(tmp_path):
    t = _imp("azure", "azure_2023_code.csv", tmp_path)
    # 18:15:46.6805900 -> 18:15:50.9951690 is 4.3145790 s: exact to the 100 ns digit
    assert _col(t, "arrival_ns") == [0, 4_314_579_000, 4_729_746_000, 4_729_746_000, 5_319_410_000]
    assert _col(t, "input_tokens") == [374, 396, 879, 91, 1554]
    assert _col(t, "output_tokens") == [44, 109, 32, 9, 1]
    m = t.metadata
    assert m["source"]["line_terminator"] == "\r\n" and m["source"]["final_newline"] is False
    assert m["original_time_format"] == {"kind": "iso8601", "sep": [" "], "fraction_digits": [7], "zones": [""]}
    assert m["time_origin_ns"] == 1_700_158_546_680_590_000 and m["timestamp_quantum_ns"] == 100


def test_azure_2024_mixed_fraction_formats(tmp_path):
    t = _imp("azure", "azure_2024_conv.csv", tmp_path)
    assert _col(t, "arrival_ns") == [0, 9_930_200, 1_000_000_000, 1_500_000_100]
    assert t.metadata["original_time_format"]["fraction_digits"] == [0, 7]
    assert t.metadata["original_time_format"]["zones"] == ["+00:00"]


def test_azure_2025_z_suffix_and_num_images(tmp_path):
    t = _imp("azure", "azure_2025_multimodal.csv", tmp_path)
    assert _col(t, "arrival_ns") == [0, 76_543_300, 1_876_543_300]
    assert _col(t, "num_images") == [1, 3, 0]  # a schema column now, no longer in `extra`
    assert t.table.schema.field("num_images").type == pa.int16()
    assert "extra" not in t.table.column_names


@pytest.mark.parametrize("name", ["azure_2023_code.csv", "azure_2024_conv.csv", "azure_2025_multimodal.csv",
                                  "burstgpt_1.csv"])
def test_csv_round_trip_is_byte_exact(name, tmp_path):
    fmt = name.split("_")[0]
    t = _imp(fmt, name, tmp_path)
    module(fmt).export(t, tmp_path / name)
    assert (tmp_path / name).read_bytes() == (FIX / name).read_bytes()


def test_burstgpt_failed_rows_flagged_not_dropped(tmp_path):
    t = _imp("burstgpt", "burstgpt_1.csv", tmp_path)
    assert t.num_rows == 5
    assert _col(t, "failed_in_source") == [False, True, False, False, True]
    assert _col(t, "arrival_ns") == [0, 40 * 10**9, 113 * 10**9, 113 * 10**9, 185_250_000_000]
    assert _col(t, "model") == ["ChatGPT", "ChatGPT", "GPT-4", "ChatGPT", "GPT-4"]
    assert _col(t, "client_id")[2] == "API log"
    d = _imp("burstgpt", "burstgpt_1.csv", tmp_path / "d", drop_failed=True)
    assert d.num_rows == 3 and d.metadata["rows"] == {"source": 5, "written": 3, "dropped_failed": 2}
    assert not any(_col(d, "failed_in_source"))


def test_burstgpt_3_sessions_latency_and_total_mismatch(tmp_path):
    t = _imp("burstgpt", "burstgpt_3.csv", tmp_path)
    assert _col(t, "session_id") == ["s-0001", "s-0001", "s-0002", "s-0001"]
    assert _col(t, "observed_latency_s") == [3.21, 2.5, 0.0, 1.0]
    # 300 + 12 != 313 in the source: kept verbatim, not silently "fixed"
    assert _col(t, "extra") == [None, None, None, '{"Total tokens": 313}']
    module("burstgpt").export(t, tmp_path / "b3.csv")
    assert _csv_values(tmp_path / "b3.csv") == _csv_values(FIX / "burstgpt_3.csv")


def _csv_values(path):
    def norm(v):
        try:
            return Decimal(v)
        except ArithmeticError:
            return v
    with open(path, newline="") as f:
        return [[norm(v) for v in row] for row in csv.reader(f)]


def _jsonl_values(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_mooncake_blocks_and_round_trip(tmp_path):
    t = _imp("mooncake", "mooncake.jsonl", tmp_path)
    assert t.metadata["block_size"] == 512
    assert _col(t, "arrival_ns") == [0, 0, 0, 3 * 10**9, 3 * 10**9, 6 * 10**9]
    assert _col(t, "hash_ids")[2] == [0]
    assert json.loads(_col(t, "extra")[5]) == {"session": "x"}
    module("mooncake").export(t, tmp_path / "m.jsonl")
    assert _jsonl_values(tmp_path / "m.jsonl") == _jsonl_values(FIX / "mooncake.jsonl")


def test_mooncake_dequantize_spreads_buckets(tmp_path):
    t = _imp("mooncake", "mooncake.jsonl", tmp_path, dequantize="uniform", quantum_ms=1000)
    assert _col(t, "arrival_ns") == [0, 333_333_333, 666_666_666, 3 * 10**9, 3_500_000_000, 6 * 10**9]
    assert t.metadata["transforms"] == [{"op": "dequantize", "quantum_ns": 10**9, "quantum_from": "given", "spread": 3}]


def test_qwen_bailian_conversation_tree(tmp_path):
    t = _imp("qwen-bailian", "qwen_bailian.jsonl", tmp_path)
    assert _col(t, "request_id") == ["101", "102", "103", "104"]
    assert _col(t, "parent_id") == [None, None, "101", "103"]
    assert _col(t, "session_id") == ["101", "102", "101", "101"]
    assert _col(t, "arrival_ns") == [0, 875_000_000, 3_208_333_333, 9_375_000_000]  # exact decimals
    assert t.metadata["block_size"] == 16 and t.metadata["time_origin_ns"] == 125_000_000
    module("qwen-bailian").export(t, tmp_path / "q.jsonl")
    assert _jsonl_values(tmp_path / "q.jsonl") == _jsonl_values(FIX / "qwen_bailian.jsonl")


@pytest.mark.parametrize("name", ["aibrix.jsonl", "aibrix_old.jsonl"])
def test_aibrix_groups_round_trip(name, tmp_path):
    t = _imp("aibrix", name, tmp_path)
    module("aibrix").export(t, tmp_path / name)
    src = [g for g in _jsonl_values(FIX / name) if g.get("requests", g.get("Requests"))]  # empty groups hold no rows
    assert _jsonl_values(tmp_path / name) == src


def test_aibrix_values(tmp_path):
    t = _imp("aibrix", "aibrix.jsonl", tmp_path)
    assert _col(t, "arrival_ns") == [0, 0, 250_000_000, 1_500_000_000]
    assert _col(t, "prompt")[3] == 'été "quoted"'
    assert _col(t, "session_id") == ["7", None, "7", None]


def test_vidur_round_trip(tmp_path):
    t = _imp("vidur", "vidur.csv", tmp_path)
    assert _col(t, "arrival_ns") == [0, 62_500_000, 1_100_000_000]
    module("vidur").export(t, tmp_path / "v.csv")
    assert _csv_values(tmp_path / "v.csv") == _csv_values(FIX / "vidur.csv")


def test_sharegpt_turns_and_estimated_lengths(tmp_path):
    t = _imp("sharegpt", "sharegpt.json", tmp_path, rate=2.0, seed=3)
    assert _col(t, "request_id") == ["conv-a:0", "conv-a:1", "conv-b:0", "conv-c:0"]
    assert _col(t, "parent_id") == [None, "conv-a:0", None, None]
    assert _col(t, "prompt")[2] == "Été — unicode ✓"
    assert _col(t, "input_tokens")[0] == 5  # ceil(19 bytes / 4)
    assert _col(t, "output_tokens")[3] is None
    assert t.metadata["tokenizer"]["kind"] == "estimate"
    again = _imp("sharegpt", "sharegpt.json", tmp_path / "2", rate=2.0, seed=3)
    assert _col(again, "arrival_ns") == _col(t, "arrival_ns")  # seeded


def test_generic_csv_with_map(tmp_path):
    src = tmp_path / "x.csv"
    src.write_text("ts,prompt_len,gen_len,who,note\n1.5,10,3,alice,hi\n2.25,20,,bob,\n")
    import_trace("csv", src, tmp_path / "o.parquet",
                 map="arrival=ts:s,input_tokens=prompt_len,output_tokens=gen_len,client_id=who")
    t = Trace.read(tmp_path / "o.parquet")
    assert _col(t, "arrival_ns") == [0, 750_000_000]
    assert _col(t, "output_tokens") == [3, None]
    assert _col(t, "client_id") == ["alice", "bob"]
    assert [json.loads(e) for e in _col(t, "extra")] == [{"note": "hi"}, {"note": ""}]
    with pytest.raises(TraceError, match="no arrival column"):
        import_trace("csv", src, tmp_path / "p.parquet", map="input_tokens=prompt_len")


def test_generic_jsonl_iso_times(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text('{"t": "2024-01-01T00:00:00Z", "i": 5, "o": 1, "k": [1]}\n'
                   '{"t": "2024-01-01T00:00:00.25Z", "i": 6, "o": 2}\n')
    import_trace("jsonl", src, tmp_path / "o.parquet", map="arrival=t:iso,input_tokens=i,output_tokens=o")
    t = Trace.read(tmp_path / "o.parquet")
    assert _col(t, "arrival_ns") == [0, 250_000_000]
    assert _col(t, "extra") == ['{"k": [1]}', None]


def test_unsorted_source_needs_sort(tmp_path):
    src = tmp_path / "v.csv"
    src.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n2,1,1\n1,2,2\n3,3,3\n")
    with pytest.raises(TraceError, match=r"non-decreasing \(use --sort.*rows 1"):
        import_trace("vidur", src, tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.partial").exists()
    import_trace("vidur", src, tmp_path / "o.parquet", sort=True)
    t = Trace.read(tmp_path / "o.parquet")
    assert _col(t, "arrival_ns") == [0, 10**9, 2 * 10**9] and _col(t, "input_tokens") == [2, 1, 3]


def test_streaming_many_batches_matches_single_read(tmp_path, monkeypatch):
    from llm_replay.traces.importers import common
    monkeypatch.setattr(common, "CSV_BLOCK", 1 << 12)  # force many small blocks
    src = tmp_path / "big.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2024-05-10 00:{i // 600:02d}:{(i // 10) % 60:02d}.{i % 10}000000+00:00,{i + 1},{i % 7}" for i in range(3000)]
    src.write_text("\n".join(lines))
    import_trace("azure", src, tmp_path / "big.parquet")
    t = Trace.read(tmp_path / "big.parquet")
    assert t.num_rows == 3000 and _col(t, "request_id")[-1] == "2999"
    assert _col(t, "arrival_ns")[:3] == [0, 100_000_000, 200_000_000] and _col(t, "arrival_ns")[-1] == 299_900_000_000
    assert _col(t, "input_tokens") == list(range(1, 3001))


@pytest.mark.parametrize("content, needle", [
    ("TIMESTAMP,ContextTokens\n2024-01-01 00:00:00,5\n", "missing column(s) GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,5,x\n", "column 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "not an ISO-8601 timestamp"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,-5,1\n", "input_tokens must be >= 0: rows 0"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,99999999999,1\n", "overflows int32"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-13-01 00:00:00,5,1\n", "invalid date"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
    ("", "empty"),
])
def test_azure_bad_input_is_actionable(content, needle, tmp_path):
    src = tmp_path / "bad.csv"
    src.write_text(content)
    with pytest.raises(TraceError) as e:
        import_trace("azure", src, tmp_path / "o.parquet")
    assert needle in str(e.value) and str(src) in str(e.value)


def test_hash_ids_longer_than_input_allows_is_rejected(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\n')
    with pytest.raises(TraceError, match=r"more blocks than ceil\(input_tokens / 512\).*rows 0"):
        import_trace("mooncake", src, tmp_path / "o.parquet")


def test_extra_appearing_in_a_later_batch_is_kept(tmp_path, monkeypatch):
    from llm_replay.traces.importers import common
    monkeypatch.setattr(common, "CSV_BLOCK", 1 << 10)
    rows = [f"{i},ChatGPT,10,5,15,API log" for i in range(300)] + ["300,ChatGPT,10,5,99,API log"]
    src = tmp_path / "b.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(rows) + "\n")
    import_trace("burstgpt", src, tmp_path / "b.parquet")
    extra = Trace.read(tmp_path / "b.parquet").table.column("extra").to_pylist()
    assert extra[:-1] == [None] * 300 and extra[-1] == '{"Total tokens": 99}'
