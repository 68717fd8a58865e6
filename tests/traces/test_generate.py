"""Synthetic generation: bit-for-bit reproducibility, embedded spec, and the structure each
spec feature promises (rates under r(t), CV kept, sessions, prefixes, lengths, mixes)."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.conftest import run_cli
from llm_replay.traces import Trace
from llm_replay.traces import stats as tstats
from llm_replay.traces.generate import generate
from llm_replay.traces.presets import PRESETS, preset_spec

CONST = {"dist": "constant", "value": 10}


def _client(**kw):
    c = {"rate": 10, "input": CONST, "output": CONST, **kw}
    return {k: v for k, v in c.items() if v is not None}


def _gen(duration=600, seed=1, **client):
    return generate({"duration": duration, "clients": [_client(**client)]}, seed=seed)


def test_same_seed_same_bytes_and_embedded_spec_recreates(tmp_path):
    spec = preset_spec("multi-turn", duration=120, rate=4)
    a, b = generate(spec, seed=3), generate(spec, seed=3)
    assert a.table.equals(b.table)
    assert not a.table.equals(generate(spec, seed=4).table)
    first, again, copy = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    run_cli("replay", "trace", "generate", "--preset", "bursty", "--duration", "120", "--rate", "3",
            "--seed", "5", "-o", first, check=True)
    run_cli("replay", "trace", "generate", "--spec", first, "-o", again, check=True)
    assert first.read_bytes() == again.read_bytes()
    meta = Trace.read(first).metadata["generator"]
    assert meta["seed"] == 5 and meta["spec"]["duration"] == 120
    # the embedded spec also works as a YAML file
    import yaml
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump(meta["spec"]))
    run_cli("replay", "trace", "generate", "--spec", spec_file, "-o", copy, check=True)
    assert copy.read_bytes() == first.read_bytes()


def test_streamed_file_equals_the_in_memory_trace(tmp_path, monkeypatch):
    """generate_to builds and writes row groups one at a time (rows gathered per group, block
    ids numbered by trace row); tiny row groups put many boundaries inside sessions."""
    import llm_replay.traces.generate as gen_mod
    import llm_replay.traces.trace as trace_mod
    from llm_replay.traces.generate import generate_to
    monkeypatch.setattr(gen_mod, "ROW_GROUP", 500)
    monkeypatch.setattr(trace_mod, "ROW_GROUP", 500)
    chat = _client(name="chat", rate=4, sessions={"turns": {"dist": "uniform", "low": 1, "high": 5},
                                                  "think_s": {"dist": "constant", "value": 20}},
                   input={"dist": "lognormal", "median": 300, "sigma": 1}, failures=0.1,
                   prefix={"system_blocks": 2, "system_share": 0.5, "apps": 3, "app_blocks": 1, "app_share": 0.5})
    batch = _client(name="batch", rate=3, slo_class={"batch": 1}, input={"dist": "uniform", "low": 1, "high": 100})
    spec = {"duration": 600, "block_size": 16, "clients": [chat, batch]}
    whole = generate(spec, seed=2)
    assert whole.num_rows > 2000 and whole.table.column("parent_id").null_count < whole.num_rows
    streamed, written = tmp_path / "s.parquet", tmp_path / "w.parquet"
    assert generate_to(spec, streamed, seed=2) == (whole.num_rows, 2)
    whole.write(written)
    assert streamed.read_bytes() == written.read_bytes()
    back = Trace.read(streamed)  # full validation, block ids included
    assert back.table.equals(whole.table) and back.metadata == whole.metadata


def test_every_preset_conforms_to_the_schema():
    for name in PRESETS:
        t = generate(preset_spec(name, duration=300, rate=4), seed=0)
        Trace(t.table)  # full validation: types, order, unique ids
        assert abs(t.num_rows / 300 - 4) < 4 * 0.25, name


def test_poisson_rate_and_cv():
    t = _gen(duration=2000)
    assert tstats.mean_rate(t) == pytest.approx(10, rel=0.03)
    assert tstats.interarrival_cv(t) == pytest.approx(1.0, abs=0.05)
    assert tstats.index_of_dispersion(t)["10s"] == pytest.approx(1.0, abs=0.2)


@pytest.mark.parametrize("process, cv", [("gamma", 3.0), ("weibull", 2.0), ("gamma", 0.5), ("gamma", 12.0)])
def test_renewal_cv_is_kept_under_a_rate_table(process, cv):
    # rate alternates 1x / 3x every 500 s; inside each window the gaps keep the process's CV
    t = _gen(duration=20000 if cv > 5 else 4000, seed=2, rate=20, arrival={"process": process, "cv": cv},
             profile={"kind": "table", "window": 500, "values": [1, 3]})
    a = tstats.arrivals_ns(t) / 1e9
    win = (a // 500).astype(int)
    counts = np.bincount(win)
    assert counts[1::2].sum() / counts[0::2].sum() == pytest.approx(3, rel=0.25 if cv > 5 else 0.1)
    same = np.diff(win) == 0
    tol = 0.25 if cv > 5 else 0.12
    slow, fast = np.diff(a)[same & (win[1:] % 2 == 0)], np.diff(a)[same & (win[1:] % 2 == 1)]
    for gaps in (slow, fast):
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=tol)
    assert slow.mean() == pytest.approx(3 * fast.mean(), rel=tol)


def test_ramp_and_sinusoid_profiles():
    t = _gen(duration=1000, rate=20, profile={"kind": "ramp", "start": 1, "end": 3})
    a = tstats.arrivals_ns(t) / 1e9
    assert (a < 500).sum() / (a >= 500).sum() == pytest.approx(0.75 / 1.25, rel=0.05)
    t = _gen(duration=1000, rate=20, profile={"kind": "sinusoid", "period": 1000, "peak_to_trough": 4, "peak_at": 0.25})
    counts = np.bincount((tstats.arrivals_ns(t) // 10**11).astype(int))  # 100 s windows
    assert counts.argmax() in (2, 3) and counts.argmin() in (7, 8)
    assert counts.max() / counts.min() > 2.5


def test_onoff_is_bursty_at_long_windows_and_keeps_its_mean():
    t = _gen(duration=4000, rate=None, arrival={"process": "onoff", "burst_rate": 20, "idle_rate": 1,
                                                    "on_s": 20, "off_s": 60})
    assert t.num_rows / 4000 == pytest.approx((20 * 20 + 60) / 80, rel=0.15)
    idc = tstats.index_of_dispersion(t)
    assert idc["1s"] < idc["10s"] < idc["60s"] and idc["60s"] > 20


def test_batch_arrivals_share_instants():
    t = _gen(duration=1000, arrival={"process": "batch", "size": {"dist": "constant", "value": 4}})
    a = tstats.arrivals_ns(t)
    _, counts = np.unique(a, return_counts=True)
    assert np.all(counts % 4 == 0) and t.num_rows / 1000 == pytest.approx(10, rel=0.1)


@pytest.mark.parametrize("dist, check", [
    ({"dist": "lognormal", "median": 500, "sigma": 1.0}, lambda x: np.median(x) == pytest.approx(500, rel=0.05)),
    ({"dist": "gamma", "shape": 2, "scale": 100}, lambda x: np.mean(x) == pytest.approx(200, rel=0.05)),
    ({"dist": "weibull", "shape": 1.5, "scale": 300},
     lambda x: np.percentile(x, 90) == pytest.approx(stats.weibull_min.ppf(0.9, 1.5, scale=300), rel=0.05)),
    ({"dist": "zipf", "a": 1.5, "min": 1, "max": 100}, lambda x: np.mean(x == 1) == pytest.approx(
        1 / np.sum(np.arange(1, 101) ** -1.5), abs=0.03)),
    ({"dist": "uniform", "low": 10, "high": 20}, lambda x: x.min() >= 10 and x.max() <= 20 and len(np.unique(x)) == 11),
    ({"dist": "empirical", "pmf": {"16": 0.25, "64": 0.75}}, lambda x: np.mean(x == 64) == pytest.approx(0.75, abs=0.03)),
    ({"dist": "lognormal", "median": 500, "sigma": 2.0, "min": 100, "max": 1000},
     lambda x: x.min() == 100 and x.max() == 1000),
])
def test_length_families(dist, check):
    t = _gen(duration=300, input=dist)
    assert check(t.table.column("input_tokens").to_numpy())


@pytest.mark.parametrize("rho", [-0.5, 0.0, 0.7])
def test_spearman_target(rho):
    t = _gen(duration=300, input={"dist": "lognormal", "median": 500, "sigma": 1},
             output={"dist": "gamma", "shape": 1.2, "scale": 200}, rho=rho)
    assert tstats.spearman_io(t) == pytest.approx(rho, abs=0.06)


def test_mix_over_time_failures_and_slo_classes():
    t = _gen(duration=1200, models=[{"name": "a", "weight": [1, 0]}, {"name": "b", "weight": [0, 1],
                                                                       "input": {"dist": "constant", "value": 99}}],
             mix_window=600, failures=0.1, slo_class={"interactive": 3, "batch": 1}).table.to_pandas()
    early, late = t[t.arrival_ns < 600e9], t[t.arrival_ns >= 600e9]
    assert set(early.model) == {"a"} and set(late.model) == {"b"}
    assert set(late.input_tokens) == {99} and set(early.input_tokens) == {10}
    assert t.failed_in_source.mean() == pytest.approx(0.1, abs=0.02)
    assert (t.output_tokens[t.failed_in_source] == 0).all()
    assert (t.slo_class == "interactive").mean() == pytest.approx(0.75, abs=0.03)


def test_sessions_grow_context_and_link_parents():
    t = _gen(duration=600, rate=5, sessions={"turns": {"dist": "uniform", "low": 1, "high": 6},
                                             "think_s": {"dist": "constant", "value": 7},
                                             "user_tokens": {"dist": "constant", "value": 3}},
             output={"dist": "uniform", "low": 1, "high": 50}, prefix={"system_blocks": 2, "system_share": 1.0})
    df = t.table.to_pandas()
    assert t.num_rows / 600 == pytest.approx(5, rel=0.1)  # sessions started before 0 keep it stationary
    assert (df.turn > 0).any() and (df[df.turn == 0].input_tokens == 10).all()
    byid = df.set_index("request_id")
    child = df[df.parent_id.notna()]
    parent = byid.loc[child.parent_id]
    assert (parent.session_id.values == child.session_id.values).all()
    assert (parent.turn.values + 1 == child.turn.values).all()
    assert np.allclose((child.arrival_ns.values - parent.arrival_ns.values) / 1e9, 7)
    assert (child.input_tokens.values == parent.input_tokens.values + parent.output_tokens.values + 3).all()
    # the parent's full blocks are a prefix of the child's blocks (prefix caching works)
    system_id = pd.Series([h[0] for h in df.hash_ids]).mode()[0]
    for (_, c), (_, p) in list(zip(child.iterrows(), parent.iterrows()))[:200]:
        full = p.input_tokens // 16
        assert list(c.hash_ids[:full]) == list(p.hash_ids[:full])
        if full >= 2:
            assert p.hash_ids[0] == c.hash_ids[0] == system_id  # the shared system prompt
    # turns whose parent fell before t=0 have no parent row
    assert df[(df.turn > 0) & df.parent_id.isna()].arrival_ns.min() < 60e9


def test_prefix_shares_and_hit_ratio():
    t = _gen(duration=600, input={"dist": "constant", "value": 160},
             prefix={"system_blocks": 2, "system_share": 0.5, "apps": 3, "app_blocks": 4, "app_share": 1.0})
    ids = t.table.column("hash_ids").to_pylist()
    assert all(len(h) == 10 for h in ids)
    first = pd.Series([h[0] for h in ids])
    assert first.value_counts().iloc[0] / len(ids) == pytest.approx(0.5, abs=0.05)
    # 2 system + 4 app blocks shared: hits = (0.5*2 + 4) / 10 of the blocks, minus first sightings
    assert tstats.prefix_cache_hits(t, 16)["block_hit_ratio"] == pytest.approx(0.5, abs=0.02)


def test_bootstrap_lengths_from_a_trace_file(tmp_path):
    src = tmp_path / "src.parquet"
    _gen(duration=200, input={"dist": "uniform", "low": 100, "high": 110},
         output={"dist": "uniform", "low": 1, "high": 5}, rho=0.9).write(src)
    pairs = set(zip(*(Trace.read(src).table.column(c).to_pylist() for c in ("input_tokens", "output_tokens"))))
    joint = _gen(duration=100, bootstrap=str(src)).table
    got = set(zip(joint.column("input_tokens").to_pylist(), joint.column("output_tokens").to_pylist()))
    assert got <= pairs  # whole (input, output) pairs are resampled
    per_col = _gen(duration=100, input={"dist": "empirical", "file": str(src), "column": "output_tokens"}).table
    assert set(per_col.column("input_tokens").to_pylist()) <= {1, 2, 3, 4, 5}
