"""The fitter: generate with known parameters, fit, recover them; fit -> generate reproduces
realistic fixtures (including one built without our generator) within compare's tolerances."""
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from scipy import special, stats

from tests.conftest import run_cli
from llm_replay.traces import Trace
from llm_replay.traces.compare import compare_traces, format_table
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.generate import generate
from llm_replay.traces.sampling import finish, sample_from_normal
from llm_replay.traces.spec_fields import _Reader, parse_dist


def dist_from_dict(d: dict):  # a validated distribution from its spec dict
    return parse_dist(_Reader(d, "dist", None))


FIXTURES = Path(__file__).parent / "fixtures" / "synth"
QS = np.array([0.5, 0.9, 0.99])


def _quantiles(d: dict) -> np.ndarray:
    dist = dist_from_dict(d)
    return finish(sample_from_normal(dist, special.ndtri(QS)), dist)


@pytest.mark.parametrize("seed, process, cv, length", [
    (1, "poisson", 1.0, {"dist": "lognormal", "median": 400, "sigma": 1.0}),
    (2, "gamma", 3.0, {"dist": "gamma", "shape": 1.5, "scale": 300}),
    (3, "weibull", 2.0, {"dist": "weibull", "shape": 1.2, "scale": 500}),
    (4, "gamma", 0.5, {"dist": "lognormal", "median": 2000, "sigma": 0.5}),
    (5, "weibull", 6.0, {"dist": "gamma", "shape": 0.8, "scale": 800}),
])
def test_recovers_known_parameters(seed, process, cv, length):
    arrival = {"process": process} if process == "poisson" else {"process": process, "cv": cv}
    rows = 60_000 if cv <= 3 else 150_000
    spec = {"duration": rows / 20, "clients": [{
        "name": "c", "rate": 20, "arrival": arrival, "input": {**length, "max": 100000},
        "output": {"dist": "lognormal", "median": 150, "sigma": 0.7, "max": 100000}, "rho": 0.4}]}
    c = fit_trace(generate(spec, seed=seed))["clients"][0]
    assert c["rate"] == pytest.approx(20, rel=0.02)
    assert c["arrival"]["process"] == process
    assert c["arrival"].get("cv", 1.0) == pytest.approx(cv, rel=0.1)
    assert c["profile"]["kind"] == "constant"
    np.testing.assert_allclose(_quantiles(c["input"]), _quantiles(spec["clients"][0]["input"]), rtol=0.1)
    np.testing.assert_allclose(_quantiles(c["output"]), _quantiles(spec["clients"][0]["output"]), rtol=0.1)
    assert c["rho"] == pytest.approx(0.4, abs=0.1)


@pytest.mark.parametrize("arrival", [
    {"process": "onoff", "burst_rate": 10, "idle_rate": 0.5, "on_s": 10, "off_s": 60},
    {"process": "onoff", "burst_rate": 20, "idle_rate": 5, "on_s": 30, "off_s": 30},
])
def test_recovers_on_off_bursts(arrival):
    c = {"dist": "constant", "value": 5}
    fitted = fit_trace(generate({"duration": 40000, "clients": [{"arrival": arrival, "input": c, "output": c}]},
                                seed=7))["clients"][0]["arrival"]
    assert fitted["process"] == "onoff"
    for key in ("burst_rate", "idle_rate", "on_s", "off_s"):
        assert fitted[key] == pytest.approx(arrival[key], rel=0.2), key


def test_recovers_rate_profile_batches_and_failures():
    c = {"dist": "constant", "value": 5}
    spec = {"duration": 6000, "clients": [{
        "rate": 10, "profile": {"kind": "table", "window": 600, "values": [1, 1, 3, 3, 1, 0.5, 0.5, 2, 2, 1]},
        "arrival": {"process": "batch", "size": {"dist": "uniform", "low": 2, "high": 6}},
        "input": c, "output": c, "failures": 0.05}]}
    fitted = fit_trace(generate(spec, seed=3), window=600)["clients"][0]
    v = np.array(fitted["profile"]["values"][:10])
    np.testing.assert_allclose(v / v.mean(), np.array(spec["clients"][0]["profile"]["values"]) / 1.5, rtol=0.15)
    assert fitted["arrival"]["process"] == "batch"
    assert fitted["arrival"]["size"]["dist"] == "empirical"
    assert fitted["arrival"]["size"]["values"] == [2, 3, 4, 5, 6]
    assert fitted["failures"] == pytest.approx(0.05, abs=0.01)


def test_recovers_sessions_and_prefixes():
    spec = yaml.safe_load((FIXTURES / "realistic-mix.yaml").read_text())
    spec["duration"] = 7200
    fitted = {c["name"]: c for c in fit_trace(generate(spec, seed=1))["clients"]}
    chat, rag = fitted["chat"], fitted["rag"]
    assert set(fitted) == {"chat", "batch", "rag"}
    assert _quantiles(chat["sessions"]["think_s"])[0] == pytest.approx(20, rel=0.1)
    turns = np.array(chat["sessions"]["turns"]["weights"], float)
    true = np.arange(1, 13) ** -1.6
    np.testing.assert_allclose(turns / turns.sum(), true / true.sum(), atol=0.02)
    assert chat["prefix"]["system_blocks"] == 6 and chat["prefix"]["system_share"] == pytest.approx(0.9, abs=0.03)
    # apps: 12, app_blocks: 96, app_share: 0.7 (a pool of 12 equally popular prefixes); the
    # prefix is cut from short prompts, so a few sessions open with a part of one
    pool = rag["prefix"]["pool"]
    assert rag["prefix"]["system_blocks"] == 4 and pool["blocks"][:12] == [96] * 12
    assert max(pool["popularity"][:12]) < 1.4 * min(pool["popularity"][:12])
    assert sum(pool["popularity"][12:]) < 0.1 * sum(pool["popularity"]) and 0.6 < pool["share"] <= 0.72
    assert {m["name"] for m in chat["models"]} == {"llama-70b", "llama-8b"}
    assert fitted["batch"]["slo_class"] == {"batch": fitted["batch"]["slo_class"]["batch"]}


def _assert_all_pass(a, b):
    rows = compare_traces(a, b)
    assert all(r["verdict"] != "fail" for r in rows), format_table(rows)
    return rows


@pytest.mark.slow
def test_fixture_round_trip_passes_compare():
    src = generate(yaml.safe_load((FIXTURES / "realistic-mix.yaml").read_text()))
    Trace(src.table)  # mixed clients (with and without sessions, prefixes) still conform
    rows = _assert_all_pass(src, generate(fit_trace(src), seed=1))
    names = {r["metric"] for r in rows}
    assert {"idc_60s", "prefix_block_hit_ratio", "model_share.llama-8b", "llama-70b.output_tokens.p99"} <= names


def _independent_trace(seed: int = 0) -> Trace:
    """A realistic trace made without our generator: a thinned non-homogeneous Poisson
    stream with a daily-like cycle, bimodal input lengths (chat + documents), outputs tied to
    inputs by ranks, and two models with different shares."""
    rng = np.random.default_rng(seed)
    dur, peak = 36000.0, 6.0
    t = np.sort(rng.uniform(0, dur, rng.poisson(peak * dur)))
    t = t[rng.random(len(t)) < 0.55 + 0.45 * np.sin(2 * np.pi * t / dur)]
    n = len(t)
    doc = rng.random(n) < 0.3
    inp = np.where(doc, rng.lognormal(np.log(3000), 0.4, n), rng.lognormal(np.log(200), 0.8, n))
    noise = rng.lognormal(np.log(150), 0.6, n)
    out = np.sort(noise)[stats.rankdata(inp + rng.normal(0, inp.std(), n), method="ordinal").astype(int) - 1]
    model = np.where(rng.random(n) < 0.7, "small", "large")
    return Trace(pa.table({"arrival_ns": (t * 1e9).astype(np.int64), "input_tokens": np.ceil(inp).astype(np.int32),
                           "output_tokens": np.ceil(out).astype(np.int32), "model": model}))


def test_independent_trace_round_trip_passes_compare():
    src = _independent_trace()
    spec = fit_trace(src)
    c = spec["clients"][0]
    assert c["profile"]["kind"] == "table" and c["arrival"]["process"] == "poisson"
    assert all(m["input"]["dist"] == "empirical" for m in c["models"])  # bimodal: no family fits
    _assert_all_pass(src, generate(spec, seed=3))


@pytest.mark.slow
def test_cli_fit_generate_compare(tmp_path):
    src, spec, again = tmp_path / "src.parquet", tmp_path / "spec.yaml", tmp_path / "again.parquet"
    _independent_trace(1).write(src)
    out = run_cli("replay", "trace", "fit", src, "-o", spec, check=True).stdout
    assert "fitted 1 client" in out and "profile table" in out
    run_cli("replay", "trace", "generate", "--spec", spec, "-o", again, check=True)
    proc = run_cli("replay", "trace", "compare", src, again)
    assert proc.returncode == 0, proc.stdout
    assert "metrics within tolerance" in proc.stdout
    proc = run_cli("replay", "trace", "fit", tmp_path / "missing.parquet", "-o", spec)
    assert proc.returncode == 2 and "file not found" in proc.stderr
