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
    assert rows and all(r["diff"] == 0 for r in rows)
    # an hour is 6 windows of 600 s: shown, but too few to judge a variance
    assert all(r["verdict"] == ("n/a" if r["metric"] == "idc_600s" else "pass") for r in rows)
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


def _write_model_less(path, kind, n=6000, rate=2.0, seed=4):
    """An Azure-like CSV or a Mooncake-like JSONL without a model column (Poisson arrivals)."""
    import datetime as dt
    import numpy as np
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    inp = rng.lognormal(6.5, 0.9, n).astype(int) + 1
    out = rng.lognormal(4.0, 0.8, n).astype(int) + 1
    if kind == "azure":
        t0 = dt.datetime(2024, 5, 10)
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
            f"{(t0 + dt.timedelta(seconds=float(s))):%Y-%m-%d %H:%M:%S.%f}0+00:00,{i},{o}\n"
            for s, i, o in zip(t, inp, out)))
    else:
        blocks = np.cumsum(np.concatenate([[0], -(-inp // 512)]))  # every block unique: no reuse
        path.write_text("".join(json.dumps({"timestamp": int(s * 1000), "input_length": int(i), "output_length": int(o),
                                            "hash_ids": list(range(blocks[k], blocks[k + 1]))}) + "\n"
                                for k, (s, i, o) in enumerate(zip(t, inp, out))))


def test_model_less_import_matches_its_fitted_copy(tmp_path):
    """A trace without a model column is one model: fit -> generate (labelled `default`) ->
    compare passes instead of failing on model_share.default (issue 16 item 3)."""
    for kind, src in (("azure", "a.csv"), ("mooncake", "m.jsonl")):
        _write_model_less(tmp_path / src, kind)
        t, spec, gen = (tmp_path / f"{kind}{s}" for s in (".parquet", ".yaml", ".gen.parquet"))
        run_cli("replay", "trace", "import", kind, tmp_path / src, "-o", t, check=True)
        run_cli("replay", "trace", "fit", t, "-o", spec, check=True)
        run_cli("replay", "trace", "generate", "--spec", spec, "--seed", "1", "-o", gen, check=True)
        p = run_cli("replay", "trace", "compare", t, gen, "--json")
        rows = json.loads(p.stdout)
        assert p.returncode == 0, (kind, [r for r in rows if r["verdict"] == "fail"])
        assert not [r for r in rows if r["metric"].startswith("model_share")]
    # several models on one side, or two different single labels, are still compared
    one, two = _trace(), _trace(models={"a": 0.5, "b": 0.5})
    no_model = one.table.drop_columns(["model"])
    assert _verdicts(no_model, two)["model_share.a"] == "fail"
    assert _verdicts(one, _trace(models={"x": 1}))["model_share.m"] == "fail"
    assert not any(m.startswith("model_share") for m in _verdicts(no_model, one))
