"""`replay trace import | validate | export | describe | transform` as real subprocesses."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from llm_replay.traces import Trace

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.slow
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


@pytest.mark.slow
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


def _err(p):
    """One `error: ...` line on stderr, exit 2, no traceback."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in p.stderr, \
        p.stderr
    return lines[0]


def test_lengths_only_files_import_with_synthesized_arrivals(tmp_path):
    """Vidur length files (no arrived_at) and any lengths-only CSV import with seeded arrivals
    from --rate/--arrivals, recorded in the metadata (issue 16 item 4)."""
    import numpy as np
    src = tmp_path / "lengths.csv"
    n = 4000
    src.write_text("num_prefill_tokens,num_decode_tokens\n"
                   + "".join(f"{100 + i % 900},{1 + i % 300}\n" for i in range(n)))
    out = tmp_path / "v.parquet"
    p = run_cli("replay", "trace", "import", "vidur", src, "-o", out, "--rate", "5", "--seed", "7", check=True)
    assert f"{n} requests" in p.stdout
    t = Trace.read(out)
    a = t.table.column("arrival_ns").to_numpy()
    assert t.num_rows == n and a[0] == 0 and (np.diff(a) >= 0).all()
    assert (n - 1) / (a[-1] / 1e9) == pytest.approx(5, rel=0.05)
    assert t.table.column("input_tokens").to_pylist()[:2] == [100, 101]
    assert t.metadata["source"]["arrivals"] == {"synthesized": True, "process": "poisson", "rate": 5.0, "seed": 7}
    assert t.metadata["time_origin_kind"] == "synthetic"
    same = tmp_path / "same.parquet"
    run_cli("replay", "trace", "import", "vidur", src, "-o", same, "--rate", "5", "--seed", "7", check=True)
    assert Trace.read(same).table.column("arrival_ns").equals(t.table.column("arrival_ns"))  # seeded
    # csv --map, a gamma process: the CV of the gaps is the one asked for
    out = tmp_path / "c.parquet"
    run_cli("replay", "trace", "import", "csv", src, "-o", out, "--map",
            "input_tokens=num_prefill_tokens,output_tokens=num_decode_tokens", "--rate", "20",
            "--arrivals", "gamma:3", "--seed", "1", check=True)
    t = Trace.read(out)
    g = np.diff(t.table.column("arrival_ns").to_numpy()) / 1e9
    assert t.num_rows == n and 1 / g.mean() == pytest.approx(20, rel=0.15)
    assert g.std() / g.mean() == pytest.approx(3, rel=0.2)
    assert t.metadata["source"]["arrivals"]["process"] == "gamma" and t.metadata["source"]["arrivals"]["cv"] == 3.0
    assert "extra" not in t.table.column_names or t.table.column("extra").null_count == n
    # a Vidur length file keeps its other columns, and exports with the synthesized arrived_at
    out = tmp_path / "f.parquet"
    run_cli("replay", "trace", "import", "vidur", FIX / "vidur_lengths.csv", "-o", out, "--rate", "2",
            "--arrivals", "weibull:1.5", check=True)
    run_cli("replay", "trace", "export", out, "-o", tmp_path / "back.csv", check=True)
    head, first = (tmp_path / "back.csv").read_text().splitlines()[:2]
    assert head == "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"
    assert first == "0,6147,211,6358,29.13270142180095"


def test_arrival_options_are_never_ignored(tmp_path):
    """Without --rate a lengths-only file says how to import it; an importer whose source has
    times refuses --rate/--arrivals (and --dequantize where it has no buckets)."""
    o = tmp_path / "o.parquet"
    line = _err(run_cli("replay", "trace", "import", "vidur", FIX / "vidur_lengths.csv", "-o", o))
    assert "vidur_lengths.csv: no arrived_at column" in line and "--rate R" in line
    line = _err(run_cli("replay", "trace", "import", "csv", FIX / "vidur_lengths.csv", "-o", o, "--map",
                        "input_tokens=num_prefill_tokens,output_tokens=num_decode_tokens"))
    assert "no arrival column" in line and "--rate R" in line
    for fmt, src in (("vidur", "vidur.csv"), ("azure", "azure_2023_code.csv"), ("burstgpt", "burstgpt_1.csv"),
                     ("mooncake", "mooncake.jsonl"), ("qwen-bailian", "qwen_bailian.jsonl"), ("aibrix", "aibrix.jsonl")):
        line = _err(run_cli("replay", "trace", "import", fmt, FIX / src, "-o", o, "--rate", "3"))
        assert "--rate/--arrivals synthesize arrivals for lengths-only files" in line and "transform" in line, fmt
    line = _err(run_cli("replay", "trace", "import", "csv", FIX / "vidur.csv", "-o", o, "--rate", "3",
                        "--map", "arrival=arrived_at:s,input_tokens=num_prefill_tokens,output_tokens=num_decode_tokens"))
    assert "has an arrival column (arrived_at)" in line
    line = _err(run_cli("replay", "trace", "import", "servegen", FIX / "synth" / "servegen" / "m-test", "-o",
                        tmp_path / "s.yaml", "--rate", "3"))
    assert "generate --spec SPEC --rate R" in line
    line = _err(run_cli("replay", "trace", "import", "vidur", FIX / "vidur_lengths.csv", "-o", o,
                        "--arrivals", "gamma:2"))
    assert "--arrivals needs --rate" in line
    line = _err(run_cli("replay", "trace", "import", "vidur", FIX / "vidur_lengths.csv", "-o", o, "--rate", "1",
                        "--arrivals", "pareto:2"))
    assert "expected poisson, gamma:CV or weibull:CV" in line
    line = _err(run_cli("replay", "trace", "import", "azure", FIX / "azure_2023_code.csv", "-o", o,
                        "--dequantize", "uniform"))
    assert "--dequantize applies to bucketed formats" in line
    assert not o.exists()


def _mooncake_buckets(path, tie_jitter, seed=0, buckets=300):
    """Mooncake-like JSONL: 1 + Poisson(6) requests per 3 s bucket; each bucket starts up to 2 ms
    late and, with `tie_jitter`, its requests differ by up to 3 ms more."""
    import numpy as np
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(buckets):
        start = k * 3000 + int(rng.integers(0, 3))
        rows += [start + (int(rng.integers(0, 4)) if tie_jitter else 0) for _ in range(1 + rng.poisson(6))]
    path.write_text("".join(json.dumps({"timestamp": ts, "input_length": 600, "output_length": 20,
                                        "hash_ids": [i, i + 1]}) + "\n" for i, ts in enumerate(sorted(rows))))


@pytest.mark.slow
def test_bucketed_mooncake_is_detected_dequantized_and_described(tmp_path):
    """--dequantize uniform finds ~3 s buckets behind jittered ms timestamps and says what it
    did; describe warns while timestamps are bucketed and about absurd shapes (issue 16 item 9)."""
    src, raw, deq = tmp_path / "m.jsonl", tmp_path / "raw.parquet", tmp_path / "deq.parquet"
    _mooncake_buckets(src, tie_jitter=True)
    run_cli("replay", "trace", "import", "mooncake", src, "-o", raw, check=True)
    d = json.loads(run_cli("replay", "trace", "describe", raw, "--json", check=True).stdout)
    assert any(w.startswith("timestamps look bucketed") and "multiples of 3000 ms" in w for w in d["warnings"])
    assert "warning          timestamps look bucketed" in run_cli("replay", "trace", "describe", raw, check=True).stdout
    p = run_cli("replay", "trace", "import", "mooncake", src, "-o", deq, "--dequantize", "uniform", check=True)
    assert "evenly over their 3000 ms buckets (ties within 3 ms)" in p.stdout
    assert Trace.read(deq).metadata["transforms"][0]["quantum_ns"] == 3 * 10**9
    assert json.loads(run_cli("replay", "trace", "describe", deq, "--json", check=True).stdout)["warnings"] == []
    p = run_cli("replay", "trace", "transform", raw, "--dequantize", "", "-o", tmp_path / "t.parquet", check=True)
    assert "3000 ms buckets" in p.stdout
    # every request of a bucket on one timestamp, bucket starts jittered: a gamma shape in the
    # millions, which describe flags as well as the buckets
    _mooncake_buckets(src, tie_jitter=False)
    run_cli("replay", "trace", "import", "mooncake", src, "-o", raw, check=True)
    d = json.loads(run_cli("replay", "trace", "describe", raw, "--json", check=True).stdout)
    assert d["interarrival_fit"]["gamma_shape"] > 1e5
    assert len(d["warnings"]) >= 2 and any("gamma shape" in w and "implausible" in w for w in d["warnings"])


def test_bucketed_warning_names_a_fix_that_works(tmp_path):
    """BurstGPT's whole-second timestamps: describe warns and suggests the transform (its importer
    has no --dequantize, which it refuses with the same transform); the suggested command, run as
    printed, spreads the buckets and the warning goes."""
    import re
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{i // 24},ChatGPT,{100 + i},{20 + i % 7},{120 + i + i % 7},Conversation log" for i in range(120)]
    src = tmp_path / "burst.csv"
    src.write_text("\n".join(rows) + "\n")
    refused = run_cli("replay", "trace", "import", "burstgpt", src, "-o", tmp_path / "b.parquet",
                      "--dequantize", "uniform")
    assert refused.returncode == 2 and "replay trace transform b.parquet --dequantize ''" in refused.stderr
    assert run_cli("replay", "trace", "import", "burstgpt", src, "-o", tmp_path / "b.parquet").returncode == 0
    out = run_cli("replay", "trace", "describe", tmp_path / "b.parquet").stdout
    assert "timestamps look bucketed" in out and "replay trace import burstgpt" not in out
    cmd = re.search(r"`(replay trace transform [^`]+)`", out).group(1).replace("OUT.parquet", str(tmp_path / "s.parquet"))
    import shlex
    assert run_cli("replay", *shlex.split(cmd)[1:]).returncode == 0
    assert "timestamps look bucketed" not in run_cli("replay", "trace", "describe", tmp_path / "s.parquet").stdout


def test_azure_export_of_a_trace_whose_source_time_was_not_iso(tmp_path):
    # mooncake's time is decimal ms: the Azure file gets ISO text at the default precision, and reads back
    src, out = tmp_path / "m.parquet", tmp_path / "m.csv"
    run_cli("replay", "trace", "import", "mooncake", FIX / "mooncake.jsonl", "-o", src, check=True)
    run_cli("replay", "trace", "export", src, "--format", "azure", "-o", out, check=True)
    back = tmp_path / "back.parquet"
    run_cli("replay", "trace", "import", "azure", out, "-o", back, check=True)
    a, b = Trace.read(src).table, Trace.read(back).table
    assert b.column("arrival_ns").to_pylist() == a.column("arrival_ns").to_pylist()
    assert b.column("input_tokens").to_pylist() == a.column("input_tokens").to_pylist()
