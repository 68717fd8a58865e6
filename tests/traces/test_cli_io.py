"""`replay trace import | validate | export | describe | transform` as real subprocesses."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from llm_replay.traces import Trace

FIX = Path(__file__).parent / "fixtures"


def test_import_describe_export_round_trip(tmp_path):
    out = tmp_path / "b.parquet"
    p = run_cli("replay", "trace", "import", "burstgpt", FIX / "burstgpt_1.csv", "-o", out, check=True)
    assert "wrote" in p.stdout and "5 requests" in p.stdout
    p = run_cli("replay", "trace", "describe", out, "--json", check=True)
    d = json.loads(p.stdout)
    assert d["requests"] == 5 and d["failed_in_source"] == 2
    assert d["model_mix"] == {"ChatGPT": 0.6, "GPT-4": 0.4}
    assert d["duration_s"] == pytest.approx(185.25)
    assert set(d["index_of_dispersion"]) == {"1s", "10s", "60s"}
    text = run_cli("replay", "trace", "describe", out, check=True).stdout
    assert "mean rate" in text and "ChatGPT" in text and "failed in source" in text
    run_cli("replay", "trace", "export", out, "-o", tmp_path / "back.csv", check=True)
    assert (tmp_path / "back.csv").read_bytes() == (FIX / "burstgpt_1.csv").read_bytes()
    p = run_cli("replay", "trace", "import", "burstgpt", FIX / "burstgpt_1.csv", "-o", tmp_path / "d.parquet",
                "--drop-failed", check=True)
    assert "dropped 2 failed" in p.stdout


def test_validate_and_canonical_text_formats(tmp_path):
    out = tmp_path / "q.parquet"
    run_cli("replay", "trace", "import", "qwen-bailian", FIX / "qwen_bailian.jsonl", "-o", out, check=True)
    for fmt in ("csv", "jsonl"):
        run_cli("replay", "trace", "export", out, "--format", fmt, "-o", tmp_path / f"q.{fmt}", check=True)
        p = run_cli("replay", "trace", "validate", tmp_path / f"q.{fmt}", check=True)
        assert p.stdout.startswith("ok:") and "4 requests" in p.stdout
        back = Trace.read(tmp_path / f"q.{fmt}")
        orig = Trace.read(out)
        for col in ("arrival_ns", "request_id", "parent_id", "hash_ids", "turn", "extra"):
            assert back.table.column(col).to_pylist() == orig.table.column(col).to_pylist(), (fmt, col)
        assert back.metadata["block_size"] == 16
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_ns,input_tokens,output_tokens\n5,1,1\n3,1,1\n")
    p = run_cli("replay", "trace", "validate", bad)
    assert p.returncode == 2 and "non-decreasing (use --sort" in p.stderr and "rows 1" in p.stderr
    assert run_cli("replay", "trace", "validate", bad, "--sort").returncode == 0


def test_transform_chain_is_recorded(tmp_path):
    src = tmp_path / "m.parquet"
    run_cli("replay", "trace", "import", "mooncake", FIX / "mooncake.jsonl", "-o", src, check=True)
    out = tmp_path / "u.parquet"
    run_cli("replay", "trace", "transform", src, "--speed", "2", "--clip-input", ":1000", "--slice", "1:",
            "--merge", src, "-o", out, check=True)
    t = Trace.read(out)
    ops = [x["op"] for x in t.metadata["transforms"]]
    assert ops == ["speed", "clip_input_tokens", "slice", "merge"]
    # after speed 2 the source times 0,0,0,1.5,1.5,3 s; slice from 1 s keeps 3 rows (0.5,0.5,2 s)
    assert t.num_rows == 3 + 6
    rows = t.table.to_pylist()
    mine = [r for r in rows if not r["request_id"].startswith("m:")]  # merged copy's ids are prefixed
    assert len(mine) == 3 and all(r["input_tokens"] <= 1000 and len(r["hash_ids"]) <= 2 for r in mine)
    assert [r["arrival_ns"] for r in mine] == [500_000_000, 500_000_000, 2 * 10**9]


def test_import_servegen_dispatch(tmp_path):
    p = run_cli("replay", "trace", "import", "servegen", tmp_path, "-o", tmp_path / "s.yaml")
    if importlib.util.find_spec("llm_replay.traces.servegen") is None:
        assert p.returncode == 2 and "servegen importer (traces.servegen) is not available" in p.stderr
    else:  # built by the synthesis part: an empty directory is a clear error, not a traceback
        assert "Traceback" not in p.stderr


def test_bad_usage_exits_2(tmp_path):
    p = run_cli("replay", "trace", "import", "nosuch", "x", "-o", tmp_path / "o.parquet")
    assert p.returncode == 2 and "invalid choice" in p.stderr
    p = run_cli("replay", "trace", "import", "csv", FIX / "vidur.csv", "-o", tmp_path / "o.parquet",
                "--map", "arrival=arrived_at:fortnights")
    assert p.returncode == 2 and "unit 'fortnights'" in p.stderr and "Traceback" not in p.stderr
