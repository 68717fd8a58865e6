"""Agentic trace importers (weka, sglang-agentic) through the real CLI: the graph columns row by
row against the fixtures in fixtures/agentic/ (see its README.md for where the shapes come from),
`replay trace validate` on the output, and one-line errors for malformed sources."""
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from llm_replay.traces import Trace

FIX = Path(__file__).parent / "fixtures" / "agentic"
S = 10**9

# request_id: (task_id, depends_on, delay_s, arrival s, input_tokens, output_tokens)
WEKA_CORPUS = {
    "chain-1:0": ("chain-1", None, None, 0, 150, 20),                       # chain
    "chain-1:1": ("chain-1", ["chain-1:0"], 0.5, 1.5, 300, 30),
    "chain-1:2": ("chain-1", ["chain-1:1"], 0.5, 4, 420, 10),
    "fan-2:0": ("fan-2", None, None, 0, 200, 40),
    "fan-2/agent_a:0": ("fan-2", ["fan-2:0"], 0.5, 2.5, 100, 20),          # fan-out: two subagents
    "fan-2/agent_b:0": ("fan-2", ["fan-2:0"], 0.75, 2.75, 90, 15),         # (t 0.5 counts from the spawn, 2.25)
    "fan-2/agent_a:1": ("fan-2", ["fan-2/agent_a:0"], 0.5, 4, 160, 10),
    "fan-2:1": ("fan-2", ["fan-2/agent_b:0", "fan-2/agent_a:1"], 1.0, 6, 400, 50),  # fan-in
    "fan-2:2": ("fan-2", ["fan-2:1"], 1.0, 9, 460, 5),
    "async-3:0": ("async-3", None, None, 0, 100, 10),
    "async-3/bg:0": ("async-3", ["async-3:0"], 0.5, 1.5, 80, 10),         # async_launched: nobody waits for it
    "async-3:1": ("async-3", ["async-3:0"], 1.0, 2, 130, 10),
    "async-3:2": ("async-3", ["async-3:1"], 5.0, 8, 200, 10),
    "async-3:3": ("async-3", ["async-3:2"], None, 8.5, 210, 5),            # its dependency has no api_time
}
SGLANG = {  # request_id: (task_id, depends_on, input_tokens, output_tokens, new messages)
    "0:0": ("0", None, 1200, 85, "ride tiger lamp orbit"),
    "0:1": ("0", ["0:0"], 1350, 40, "stone river"),
    "0:2": ("0", ["0:1"], 1460, 310, "quiet harbor"),
    "1:0": ("1", None, 73821, None, "Fix the failing test."),
    "1:1": ("1", ["1:0"], 74894, None, "Observation: 2 tests failed."),  # the turn without messages is skipped
    "2:0": ("2", None, 512, 64, "summarise the diff"),
}


def _import(fmt, src, out, *extra):
    p = run_cli("replay", "trace", "import", fmt, src, "-o", out, *extra, check=True)
    assert p.stdout.startswith(f"wrote {out}")
    v = run_cli("replay", "trace", "validate", out, check=True)
    assert v.stdout.startswith("ok:")
    return Trace.read(out)


def _rows(t):
    return {r["request_id"]: r for r in t.table.to_pylist()}


def _in_dependency_order(t):
    seen = set()
    arrivals = t.table.column("arrival_ns").to_pylist()
    assert arrivals == sorted(arrivals)
    for r in t.table.to_pylist():
        assert set(r["depends_on"] or ()) <= seen, r["request_id"]
        seen.add(r["request_id"])


def _err(p):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def test_weka_corpus_chain_fan_out_fan_in(tmp_path):
    t = _import("weka", FIX / "weka_corpus.jsonl", tmp_path / "w.parquet")
    rows = _rows(t)
    assert set(rows) == set(WEKA_CORPUS)
    for rid, (task, deps, delay, at, isl, osl) in WEKA_CORPUS.items():
        r = rows[rid]
        assert (r["task_id"], r["depends_on"], r["arrival_ns"], r["input_tokens"], r["output_tokens"]) == \
            (task, deps, round(at * S), isl, osl), rid
        assert r["delay_s"] == (pytest.approx(delay) if delay is not None else None), rid
        assert r["session_id"] == rid.rsplit(":", 1)[0] and r["turn"] == int(rid.rsplit(":", 1)[1])
    _in_dependency_order(t)
    assert t.metadata["block_size"] == 64 and t.metadata["source"]["traces"] == 3
    # per-trace ("local") hash ids renumbered file-wide: prefixes kept, traces never share a block
    assert rows["chain-1:2"]["hash_ids"] == [0, 1, 2, 3, 4, 5] and rows["chain-1:1"]["hash_ids"] == [0, 1, 2, 3]
    assert rows["fan-2/agent_a:1"]["hash_ids"][:1] == rows["fan-2/agent_a:0"]["hash_ids"]
    assert not set(rows["async-3:2"]["hash_ids"]) & set(rows["chain-1:2"]["hash_ids"])
    assert rows["async-3/bg:0"]["model"] == "claude-haiku-4-5-20251001"
    extra = json.loads(rows["fan-2/agent_a:0"]["extra"])
    assert extra["api_time"] == 1.0 and extra["subagent.status"] == "completed" and extra["stop"] == "tool_use"
    assert json.loads(rows["fan-2:0"]["extra"])["trace.tool_tokens"] == 1200
    assert json.loads(rows["chain-1:1"]["extra"])["ttft"] == 0.5


def test_weka_single_json_directory_and_limit(tmp_path):
    t = _import("weka", FIX / "weka_trace.json", tmp_path / "one.parquet")
    got = {r["request_id"]: (r["depends_on"], r["delay_s"]) for r in t.table.to_pylist()}
    assert got == {"trace_sub_n2s1:0": (None, None),
                   "trace_sub_n2s1/agent_001:0": (["trace_sub_n2s1:0"], pytest.approx(0.4)),
                   "trace_sub_n2s1/agent_001:1": (["trace_sub_n2s1/agent_001:0"], pytest.approx(0.3)),
                   "trace_sub_n2s1:1": (["trace_sub_n2s1/agent_001:1"], pytest.approx(2.5))}
    d = tmp_path / "dir"
    d.mkdir()
    for i, line in enumerate((FIX / "weka_corpus.jsonl").read_text().splitlines()):
        (d / f"{i:02d}.json").write_text(json.dumps(json.loads(line), indent=1))
    corpus = _rows(_import("weka", FIX / "weka_corpus.jsonl", tmp_path / "c.parquet"))
    assert _rows(_import("weka", d, tmp_path / "d.parquet")) == corpus
    first = _import("weka", FIX / "weka_corpus.jsonl", tmp_path / "l.parquet", "--limit", "1")
    assert set(first.table.column("task_id").to_pylist()) == {"chain-1"}


def test_sglang_agentic_chains(tmp_path):
    t = _import("sglang-agentic", FIX / "sglang_agentic.json", tmp_path / "s.parquet")
    rows = _rows(t)
    assert set(rows) == set(SGLANG)
    for rid, (task, deps, isl, osl, text) in SGLANG.items():
        r = rows[rid]
        assert (r["task_id"], r["session_id"], r["depends_on"], r["input_tokens"], r["output_tokens"]) == \
            (task, task, deps, isl, osl), rid
        assert r.get("delay_s") is None and r["arrival_ns"] == 0
        assert json.loads(r["extra"])["messages"][-1]["content"] == text
    _in_dependency_order(t)
    assert t.metadata["source"]["metadata"]["generator"] == "sglang.test.agentic_trace_utils"
    r = _rows(_import("sglang-agentic", FIX / "sglang_agentic.json", tmp_path / "r.parquet", "--rate", "2"))
    starts = [r[f"{c}:0"]["arrival_ns"] for c in range(3)]
    assert starts[0] == 0 and starts[0] < starts[1] < starts[2]
    assert r["0:2"]["arrival_ns"] == r["0:0"]["arrival_ns"] and r["1:1"]["arrival_ns"] == starts[1]


def _weka(requests, **trace):
    return json.dumps({"id": "x", "models": ["m"], "block_size": 64, "requests": requests, **trace})


CALL = {"t": 0.0, "type": "s", "model": "m", "in": 100, "out": 5, "hash_ids": [1], "api_time": 1.0}
MALFORMED = [
    ("weka", _weka([CALL, {**CALL, "t": 2.0, "type": "x"}]), "unknown request type 'x'"),
    ("weka", _weka([{**CALL, "in": "100"}]), "'in' must be a whole number >= 0"),
    ("weka", _weka([{**CALL, "hash_ids": [1, 2.5]}]), "'hash_ids' must be a list of integers"),
    ("weka", _weka([CALL, {"t": 1, "type": "subagent", "requests": [CALL]}]), "needs an 'agent_id'"),
    ("weka", _weka([{**CALL, "hash_ids": [1, 2, 3]}]), "hash_ids has more blocks"),
    ("weka", _weka([CALL]) + "\n" + _weka([CALL], id="y", block_size=16), "must share one block_size"),
    ("weka", '{"id": "x", "requests": [', "invalid JSON"),
    ("sglang-agentic", json.dumps({"conversations": [[{"messages": [{"role": "user", "content": "hi"}]}]]}),
     "conversation 0, turn 0: 'prompt_tokens' must be a whole number"),
    ("sglang-agentic", json.dumps({"metadata": {}}), "non-empty 'conversations' list"),
    ("sglang-agentic", json.dumps({"conversations": [{"turns": []}]}), "conversation 0: expected a list of turns"),
]


@pytest.mark.parametrize("fmt,text,rule", MALFORMED)
def test_malformed_sources_one_line_error(fmt, text, rule, tmp_path):
    src = tmp_path / ("bad.jsonl" if fmt == "weka" else "bad.json")
    src.write_text(text)
    line = _err(run_cli("replay", "trace", "import", fmt, src, "-o", tmp_path / "o.parquet"))
    assert rule in line and not (tmp_path / "o.parquet").exists()


def test_cli_lists_the_formats():
    p = run_cli("replay", "trace", "import", "--help", check=True)
    assert "weka" in p.stdout and "sglang-agentic" in p.stdout
