"""`trace compare`: per-metric verdicts against tolerances, table and JSON output, exit codes."""
import json

import pyarrow as pa

from tests.conftest import run_cli
from llm_replay.traces import Trace
from llm_replay.traces.compare import compare_traces, format_table
from llm_replay.traces.generate import generate


def _trace(rate=5.0, median=300, cv=None, models=None, seed=0):
    arrival = {"process": "gamma", "cv": cv} if cv else {"process": "poisson"}
    return generate({"duration": 3600, "clients": [{
        "rate": rate, "arrival": arrival, "models": models or {"m": 1},
        "input": {"dist": "lognormal", "median": median, "sigma": 0.8},
        "output": {"dist": "lognormal", "median": 100, "sigma": 0.5}}]}, seed=seed)


def _verdicts(a, b):
    return {r["metric"]: r["verdict"] for r in compare_traces(a, b)}


def test_identical_traces_pass_everything():
    t = _trace(models={"a": 0.5, "b": 0.5})
    rows = compare_traces(t, t)
    assert rows and all(r["verdict"] == "pass" and r["diff"] == 0 for r in rows)
    assert {"mean_rate", "interarrival_cv", "idc_1s", "idc_10s", "idc_60s", "input_tokens.p99",
            "a.output_tokens.p50", "spearman_input_output", "model_share.a"} <= {r["metric"] for r in rows}


def test_each_kind_of_difference_is_caught():
    base = _trace()
    assert _verdicts(base, _trace(rate=5.5))["mean_rate"] == "fail"
    v = _verdicts(base, _trace(cv=3.0))
    assert v["interarrival_cv"] == "fail" and v["idc_60s"] == "fail"
    v = _verdicts(base, _trace(median=450))
    assert v["input_tokens.p50"] == "fail" and v["output_tokens.p50"] == "pass"
    v = _verdicts(_trace(models={"a": 0.5, "b": 0.5}), _trace(models={"a": 0.6, "b": 0.4}))
    assert v["model_share.a"] == "fail" and v["model_share.b"] == "fail"


def test_missing_statistics_are_not_applicable():
    t = Trace(pa.table({"arrival_ns": [0, 10**9, 2 * 10**9], "input_tokens": [1, 2, 3], "output_tokens": [1, 1, 1]}))
    rows = {r["metric"]: r for r in compare_traces(t, t)}
    assert rows["idc_60s"]["verdict"] == "n/a" and rows["spearman_input_output"]["verdict"] == "n/a"
    assert "n/a" in format_table(list(rows.values())).lower()


def test_cli_table_json_and_exit_codes(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _trace().write(a)
    _trace(median=600).write(b)
    same = run_cli("replay", "trace", "compare", a, a)
    assert same.returncode == 0 and "PASS" in same.stdout and "FAIL" not in same.stdout
    diff = run_cli("replay", "trace", "compare", a, b, "--json")
    assert diff.returncode == 1
    rows = {r["metric"]: r for r in json.loads(diff.stdout)}
    assert rows["input_tokens.p50"]["verdict"] == "fail" and rows["input_tokens.p50"]["tolerance"] == "rel 0.1"
