"""Issue 25 item 4: short bucketed traces keep their rate and bucket-scale dispersion, a rate
table that copies the recording says so (with the modelled alternative), small samples are
flagged, and `--rate` (presets included) is the rate a user gets: round(R x duration) rows."""
import json
import re

import numpy as np
import pyarrow as pa
import pytest
import yaml

from tests.conftest import run_cli
from llm_replay.traces import Trace
from llm_replay.traces import stats as tstats
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.fit_dists import COPY, SMALL
from llm_replay.traces.generate import generate
from llm_replay.traces.presets import preset_spec

LN = {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 8192}
CONST = {"dist": "constant", "value": 5}


def _bucketed(spec: dict, seed: int, q_ns: int = 1_000_000_000) -> Trace:
    """A trace from `spec` whose clock floors every arrival to q_ns (1-s buckets)."""
    g = generate(spec, seed=seed)
    a = g.table.column("arrival_ns").to_numpy()
    return Trace(g.table.set_column(0, "arrival_ns", pa.array(a // q_ns * q_ns)), {})


def _short_window() -> Trace:
    """The issue's shape: 120 rows over 5 s in 1-s buckets (gamma CV 0.65 under the clock)."""
    return _bucketed({"duration": 5, "exact_count": True, "clients": [
        {"rate": 24, "arrival": {"process": "gamma", "cv": 0.65}, "input": LN, "output": CONST}]}, seed=3)


def test_short_bucketed_window_keeps_rate_and_bucket_dispersion():
    """Before: duration span + mean gap put the last generated row a bucket early (+33 % rate
    on every seed) and the rows spread over their buckets made a gamma CV 0.1 (1-s IDC
    0.01 for a source's 0.2-0.4); no why:, no warning."""
    src = _short_window()
    spec = fit_trace(src)
    c = spec["clients"][0]
    assert spec["duration"] == 5.0 and spec["timestamp_quantum_s"] == 1.0 and c["rate"] == 24.0
    assert c["arrival"]["process"] == "poisson" or c["arrival"]["cv"] > 0.25, c["arrival"]
    assert f"only {src.num_rows} arrivals" in c["why"] and SMALL in c["why"] and "1-s buckets" in c["why"]
    for seed in (1, 2, 3):
        g = generate(spec, seed=seed)
        a = g.table.column("arrival_ns").to_numpy()
        assert g.num_rows == 120 and (a % 1_000_000_000 == 0).all()
        assert tstats.mean_rate(g) == pytest.approx(tstats.mean_rate(src), rel=0.02)
    # 4 windows of 1 s: one seed's IDC is noise; the mean over seeds is the model's
    want = tstats.index_of_dispersion(src, (1.0,))["1s"]
    got = np.mean([tstats.index_of_dispersion(generate(spec, seed=s), (1.0,))["1s"] for s in range(10, 50)])
    assert got == pytest.approx(want, rel=0.3)


def test_cli_fit_warns_on_a_small_sample_and_generate_prints_both_rates(tmp_path):
    src = _short_window()
    src.write(tmp_path / "t.parquet")
    fit = run_cli("replay", "trace", "fit", tmp_path / "t.parquet", "-o", tmp_path / "s.yaml", check=True)
    assert "warning" in fit.stderr and "only 120 arrivals (fewer than 200)" in fit.stderr and SMALL in fit.stderr
    assert SMALL in yaml.safe_load((tmp_path / "s.yaml").read_text())["clients"][0]["why"]
    gen = run_cli("replay", "trace", "generate", "--spec", tmp_path / "s.yaml", "-o", tmp_path / "g.parquet",
                  check=True)
    # rows / duration, and compare's (n - 1) / (last - first) on the 1-s clock
    assert "(24 req/s; " in gen.stdout and f"{tstats.mean_rate(src):.4g} req/s from the first" in gen.stdout


BURST = {"duration": 300, "exact_count": True, "clients": [{
    "name": "burst", "rate": 24, "arrival": {"process": "gamma", "cv": 0.65},
    "profile": {"kind": "table", "window": 60, "values": [1, 1, 1.5, 1, 1]}, "input": LN, "output": CONST}]}


def test_bucketed_burst_fits_its_window_and_cv_and_a_copied_table_says_so(tmp_path):
    """5 min at 24 req/s in 1-s buckets with a 1-min burst. Before: a 150-value 2-s table (a
    copy of the bucket counts) + gamma CV 0.12 (the spread's); now a table at >= 10 s and
    the CV read off the bucket counts, and why: calls the table a copy, names the modulated
    alternative with its error and the keys that select it (which generate)."""
    src = _bucketed(BURST, seed=7)
    spec = fit_trace(src)
    c = spec["clients"][0]
    assert c["profile"]["kind"] == "table" and c["profile"]["window"] >= 10, c["why"]
    assert c["arrival"]["cv"] == pytest.approx(0.65, rel=0.25)
    assert COPY in c["why"] and "The modelled alternative" in c["why"] and "misses the source's IDC by" in c["why"]
    mod = json.loads(re.search(r"modulation: (\{.*?\})\.", c["why"]).group(1))
    arrival = json.loads(re.search(r"arrival: (\{.*?\}), modulation", c["why"]).group(1))
    alt = {**spec, "clients": [{**c, "profile": {"kind": "constant"}, "arrival": arrival, "modulation": mod}]}
    assert generate(alt, seed=1).num_rows == src.num_rows
    src.write(tmp_path / "t.parquet")
    fit = run_cli("replay", "trace", "fit", tmp_path / "t.parquet", "-o", tmp_path / "s.yaml", check=True)
    assert COPY in fit.stderr and "modulated alternative" in fit.stderr


def test_fewer_than_200_arrivals_get_a_why():
    spec = {"duration": 100, "clients": [{"rate": 1.5, "arrival": {"process": "gamma", "cv": 2},
                                          "input": LN, "output": CONST}]}
    c = fit_trace(generate(spec, seed=4))["clients"][0]
    assert SMALL in c["why"] and "fewer than 200" in c["why"]


@pytest.mark.parametrize("name, duration, rate", [("bursty", 600, 5), ("bursty", 60, 2), ("agentic", 60, 2),
                                                  ("multi-lora", 60, 2), ("multi-turn", 120, 3)])
def test_preset_rate_is_the_rate_a_user_gets(name, duration, rate):
    """Before: --preset bursty --rate 5 gave 4.27 req/s on one seed, agentic --duration 60
    --rate 2 about 0.6 of it (the tasks in flight were cut with the warm-up)."""
    spec = preset_spec(name, duration, rate)
    for seed in (1, 2, 3):
        g = generate(spec, seed=seed)
        assert g.num_rows == round(rate * duration), seed
        a = g.table.column("arrival_ns").to_numpy()
        assert (a == 0).sum() <= 1  # several clients do not all arrive at once at 0
        assert tstats.mean_rate(g) == pytest.approx(rate, rel=0.06)


def test_agentic_window_holds_the_count_without_rescaling_delays():
    """A stationary agent client holds its exact count by sliding the window over longer
    drawn tasks, so each dependant still arrives its dependency's call time + delay_s later."""
    from llm_replay.traces.agents import call_s
    for seed in (5, 6):
        g = generate(preset_spec("agentic", 60, 2), seed=seed).table
        assert g.num_rows == 120
        col = {k: g.column(k).to_pylist() for k in ("request_id", "arrival_ns", "input_tokens", "output_tokens",
                                                    "depends_on", "delay_s")}
        row = {r: i for i, r in enumerate(col["request_id"])}
        one = [(i, row[d[0]]) for i, d in enumerate(col["depends_on"]) if d and len(d) == 1]
        assert one
        for i, j in one:  # a single dependency: arrival = its arrival + its call time + delay_s
            gap = (col["arrival_ns"][i] - col["arrival_ns"][j]) / 1e9 - col["delay_s"][i]
            assert gap == pytest.approx(float(call_s(col["input_tokens"][j], col["output_tokens"][j])), abs=1e-6)


def test_cli_rate_on_a_hand_written_spec_is_exact(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"duration": 100, "clients": [
        {"rate": 1, "arrival": {"process": "gamma", "cv": 3}, "input": CONST, "output": CONST}]}))
    out = run_cli("replay", "trace", "generate", "--spec", tmp_path / "s.yaml", "--rate", "7", "--seed", "2",
                  "-o", tmp_path / "g.parquet", check=True)
    assert "wrote 700 requests over 100 s (7 req/s" in out.stdout
    assert Trace.read(tmp_path / "g.parquet").num_rows == 700
