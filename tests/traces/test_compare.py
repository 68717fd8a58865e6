"""`trace compare`: per-metric verdicts against tolerances and sampling error, missing
statistics, too few windows, table and JSON output, exit codes."""
import json

import pytest

import pyarrow as pa

from tests.conftest import run_cli
from llm_replay.traces import Trace
from llm_replay.traces.compare import compare_traces, format_table
from llm_replay.traces.generate import generate


def _trace(rate=5.0, median=300, cv=None, models=None, seed=0, duration=3600):
    arrival = {"process": "gamma", "cv": cv} if cv else {"process": "poisson"}
    return generate({"duration": duration, "clients": [{
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
    assert all(r["verdict"] == ("not judged" if r["metric"] == "idc_600s" else "pass") for r in rows)
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
    assert rows["idc_60s"]["verdict"] == "not judged" and rows["idc_60s"]["reason"] == "only 0 windows"
    assert rows["spearman_input_output"]["verdict"] == "n/a"      # neither side has it: not a pass
    table = format_table(list(rows.values()))
    assert "N/A" in table and "judged metrics within tolerance; 4 not judged (too few windows); 1 not applicable" in table


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


@pytest.mark.slow
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


def _reuse_trace(seed=0):
    """Conversations whose prompts share a system prompt and their history (hash_ids)."""
    return generate({"duration": 1800, "block_size": 16, "clients": [{
        "rate": 2.0, "input": {"dist": "lognormal", "median": 600, "sigma": 0.8, "max": 20000},
        "output": {"dist": "lognormal", "median": 200, "sigma": 0.6, "max": 2000},
        "sessions": {"turns": {"dist": "zipf", "a": 1.8, "max": 12},
                     "think_s": {"dist": "lognormal", "median": 40, "sigma": 0.6}},
        "prefix": {"system_blocks": 2, "system_share": 0.9}}]}, seed=seed)


def test_a_lost_statistic_fails_with_the_reason(tmp_path):
    """Issue 22 item 4: a generated trace without hash_ids (or sessions) against a source with
    prefix reuse passed ('19 of 19', the prefix rows N/A). Now each lost row fails and says why."""
    a, b, c = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    src = _reuse_trace()
    src.write(a)
    Trace(_reuse_trace(seed=1).table.drop_columns(["hash_ids"]), src.metadata).write(b)
    p = run_cli("replay", "trace", "compare", a, b)
    assert p.returncode == 1
    line = next(x for x in p.stdout.splitlines() if x.startswith("prefix_block_hit_ratio"))
    assert "FAIL (B has no hash_ids)" in line
    rows = {r["metric"]: r for r in compare_traces(src, Trace.read(b))}
    assert rows["prefix_block_hit_ratio"]["a"] > 0.3 and rows["prefix_block_hit_ratio"]["b"] == 0.0
    assert rows["reuse_distance_requests.p50"]["verdict"] == "fail"
    assert rows["reuse_distance_requests.p50"]["reason"] == "B has no hash_ids"
    # sessions lost too: every request becomes a conversation of its own
    Trace(src.table.drop_columns(["hash_ids", "session_id", "turn", "parent_id"])).write(c)
    rows = {r["metric"]: r for r in json.loads(run_cli("replay", "trace", "compare", a, c, "--json").stdout)}
    assert rows["turns_per_session.mean"]["verdict"] == "fail" and rows["turns_per_session.mean"]["b"] == 1.0
    assert rows["turn_gap_s.p50"]["reason"] == "B has no session_id or hash_ids"
    assert rows["turn_gap_s.p50"]["verdict"] == "fail" and rows["turn_gap_s.p50"]["b"] is None
    # ... the other way round too; and neither side having it is not applicable, not a pass
    rows = {r["metric"]: r for r in compare_traces(Trace.read(c), src)}
    assert rows["prefix_block_hit_ratio"]["reason"] == "A has no hash_ids" and rows["prefix_block_hit_ratio"]["verdict"] == "fail"
    rows = compare_traces(Trace.read(c), Trace.read(c))
    assert not any(r["metric"].startswith(("prefix", "reuse", "turn")) for r in rows)


def test_two_seeds_of_one_spec_pass(tmp_path):
    """Two seeds of one 4-hour Poisson spec: the old fixed 20 % on the 600-s IDC (24 windows,
    sampling sd 29 % each) and 2 % on the rate (sd 0.8 % each) failed 7 pairs in 10. The
    sampling bands are Bonferroni-sized for <= 5 % failures per pair (measured: 1.3 % over 1000
    pairs), so >= 9 of 10 pairs pass with probability > 0.9 even at that bound; these seeds: 10."""
    passed, bad = 0, []
    for i in range(10):
        pair = []
        for seed in (2 * i, 2 * i + 1):
            path = tmp_path / f"s{seed}.parquet"
            _trace(rate=1.0, seed=seed, duration=4 * 3600).write(path)
            pair.append(Trace.read(path))
        fails = [r for r in compare_traces(*pair) if r["verdict"] == "fail"]
        passed += not fails
        bad += [(i, r["metric"], r["diff"], r["tolerance"]) for r in fails]
    assert passed >= 9, bad


def test_too_few_windows_are_not_judged(tmp_path):
    """An IDC from fewer than MIN_WINDOWS windows says so and cannot fail the comparison, even
    when its values differ by far more than the tolerance (3 windows of 600 s here)."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _trace(duration=1900, seed=3).write(a)
    _trace(duration=1900, seed=6).write(b)     # the same spec: 600-s IDC 0.25 vs 3.1
    p = run_cli("replay", "trace", "compare", a, b)
    line = next(x for x in p.stdout.splitlines() if x.startswith("idc_600s"))
    assert p.returncode == 0 and "NOT JUDGED (only 3 windows)" in line, p.stdout
    assert p.stdout.rstrip().endswith("1 not judged (too few windows)")
    rows = {r["metric"]: r for r in compare_traces(Trace.read(a), _trace(duration=1900, seed=4, cv=4.0))}
    assert rows["idc_600s"]["diff"] > 1 and rows["idc_600s"]["verdict"] == "not judged"
    assert rows["idc_60s"]["verdict"] == "fail"            # 31 windows: judged, and far apart
