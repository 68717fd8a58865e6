"""Fuzzing readers and importers: random bytes, wrong types, extreme values. Every input
either imports or raises TraceError (the CLI prints it and exits 2); nothing else escapes."""
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_cli
from llm_replay.traces import Trace, TraceError
from llm_replay.traces.importers import FORMATS, import_trace

FIX = Path(__file__).parent / "fixtures"
SETTINGS = settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", 40)), deadline=None, suppress_health_check=list(HealthCheck))
SOURCES = {"azure": "azure_2024_conv.csv", "burstgpt": "burstgpt_3.csv", "mooncake": "mooncake.jsonl",
           "qwen-bailian": "qwen_bailian.jsonl", "vidur": "vidur.csv", "sharegpt": "sharegpt.json",
           "aibrix": "aibrix.jsonl", "csv": "vidur.csv", "jsonl": "mooncake.jsonl",
           "weka": "agentic/weka_corpus.jsonl", "sglang-agentic": "agentic/sglang_agentic.json"}
MAPS = {"csv": "arrival=arrived_at:s,input_tokens=num_prefill_tokens,output_tokens=num_decode_tokens",
        "jsonl": "arrival=timestamp:ms,input_tokens=input_length,output_tokens=output_length"}


def _try_import(fmt: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / ("in" + Path(SOURCES[fmt]).suffix)
        src.write_bytes(data)
        try:
            import_trace(fmt, src, Path(d) / "out.parquet", map=MAPS.get(fmt))
        except TraceError as e:
            assert str(e) and "Traceback" not in str(e)
            return
        Trace.read(Path(d) / "out.parquet")  # whatever was written must be a valid trace


@SETTINGS
@given(fmt=st.sampled_from(sorted(FORMATS)), data=st.binary(max_size=300))
def test_random_bytes(fmt, data):
    _try_import(fmt, data)


@SETTINGS
@given(fmt=st.sampled_from(sorted(FORMATS)), cut=st.integers(0, 400), junk=st.binary(max_size=20))
def test_truncated_and_spliced_sources(fmt, cut, junk):
    good = (FIX / SOURCES[fmt]).read_bytes()
    cut = min(cut, len(good))
    _try_import(fmt, good[:cut] + junk + good[cut:])


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.integers(-5, 2**64), max_size=3), st.just({}))


@SETTINGS
@given(rows=st.lists(st.fixed_dictionaries({"timestamp": VALUES, "input_length": VALUES, "output_length": VALUES,
                                            "hash_ids": VALUES, "chat_id": VALUES, "parent_chat_id": VALUES,
                                            "turn": VALUES}), min_size=1, max_size=4),
       fmt=st.sampled_from(["mooncake", "qwen-bailian", "jsonl"]))
def test_json_wrong_types_and_extremes(rows, fmt):
    _try_import(fmt, "\n".join(json.dumps(r) for r in rows).encode())


CELLS = st.one_of(st.integers(-2**70, 2**70).map(str), st.floats().map(repr), st.sampled_from(
    ["", "nan", "inf", "1e400", "-0", "2024-02-30 00:00:00", "2024-01-01T00:00:00Z", "9999-12-31 23:59:59.9999999",
     "0001-01-01 00:00:00", "\"", "a,b", "1.0000000001"]))


@SETTINGS
@given(rows=st.lists(st.tuples(CELLS, CELLS, CELLS), min_size=1, max_size=4),
       fmt=st.sampled_from(["azure", "burstgpt", "vidur", "csv"]))
def test_csv_wrong_types_and_extremes(rows, fmt):
    header = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
              "burstgpt": "Timestamp,Request tokens,Response tokens",
              "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens",
              "csv": "arrived_at,num_prefill_tokens,num_decode_tokens"}[fmt]
    body = "\n".join(",".join(f'"{c}"' if "," in c or '"' in c else c for c in r) for r in rows)
    _try_import(fmt, (header + "\n" + body).encode())


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".parquet", ".csv", ".jsonl"]))
def test_trace_read_random_bytes(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("t" + suffix)
        p.write_bytes(data)
        try:
            Trace.read(p)
        except TraceError:
            pass


def test_cli_never_prints_a_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n\xff\xfe\x00,1,2\r\n")
    pq = tmp_path / "bad.parquet"
    pq.write_bytes(b"PAR1garbagePAR1")
    for args in (["trace", "import", "azure", bad, "-o", tmp_path / "o.parquet"],
                 ["trace", "describe", pq], ["trace", "validate", tmp_path / "missing.parquet"],
                 ["trace", "transform", pq, "--speed", "2", "-o", tmp_path / "u.parquet"]):
        p = run_cli("replay", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error: ")


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(fmt=st.sampled_from(sorted(FORMATS)), data=st.binary(max_size=200),
       cmd=st.sampled_from(["import", "describe", "validate", "transform"]))
def test_cli_entry_point_random_input(fmt, data, cmd):
    """The real entry point (`replay.cli.main`, in process): exit 0 or 2, never an exception."""
    from llm_replay.replay.cli import main
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / ("in" + Path(SOURCES[fmt]).suffix)
        src.write_bytes(data)
        out = Path(d) / "o.parquet"
        argv = {"import": ["trace", "import", fmt, str(src), "-o", str(out)] + (["--map", MAPS[fmt]] if fmt in MAPS else []),
                "describe": ["trace", "describe", str(src)], "validate": ["trace", "validate", str(src)],
                "transform": ["trace", "transform", str(src), "--speed", "2", "-o", str(out)]}[cmd]
        assert main(argv) in (0, 2)


def test_cli_os_errors_are_user_errors(tmp_path):
    from llm_replay.replay.cli import main
    assert main(["trace", "import", "vidur", str(FIX / "vidur.csv"), "-o", str(tmp_path)]) == 2  # a directory
    assert main(["trace", "validate", str(tmp_path)]) == 2
