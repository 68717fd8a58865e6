"""Generator spec validation: every bad field is named by its path, CLI exits 2 without a traceback."""
import copy

import pytest
import yaml

from tests.conftest import run_cli
from llm_replay.traces.generate import generate
from llm_replay.traces.presets import PRESETS, preset_spec, scale_rate
from llm_replay.traces.errors import TraceError
from llm_replay.traces.spec import SpecError, load_spec_file, parse_spec

BASE = {"duration": 60, "clients": [
    {"name": "a", "rate": 2, "input": {"dist": "constant", "value": 10}, "output": {"dist": "constant", "value": 5}},
    {"name": "b", "rate": 1, "arrival": {"process": "gamma", "cv": 2},
     "input": {"dist": "lognormal", "median": 100, "sigma": 1}, "output": {"dist": "uniform", "low": 1, "high": 9}},
]}


def _with(path, value):
    spec = copy.deepcopy(BASE)
    *head, last = path
    d = spec
    for k in head:
        d = d[k]
    d[last] = value
    return spec


@pytest.mark.parametrize("path, value, needle", [
    (["clients", 1, "arrival", "cv"], 50, "clients[1].arrival.cv: CV 50 is impossible for gamma"),
    (["clients", 1, "arrival"], {"process": "poisson", "cv": 3}, "clients[1].arrival.cv: poisson arrivals have CV 1"),
    (["clients", 1, "arrival"], {"process": "weibull", "shape": 0.01}, "clients[1].arrival.shape: must be >= 0.05"),
    (["clients", 1, "arrival"], {"process": "hawkes"}, "clients[1].arrival.process: unknown process 'hawkes'"),
    (["clients", 0, "rate"], -1, "clients[0].rate: must be > 0, got -1"),
    (["clients", 0, "input"], {"dist": "pareto"}, "clients[0].input.dist: unknown dist 'pareto'"),
    (["clients", 1, "output"], {"dist": "uniform", "low": 1, "high": 9, "min": 20, "max": 10}, "clients[1].output.max: caps inverted: min 20 > max"),
    (["clients", 1, "input", "max"], 0, "caps inverted"),
    (["clients", 0, "input"], {"dist": "zipf", "a": 1.2}, "clients[0].input.max: zipf needs a max"),
    (["clients", 0, "speed"], 3, "clients[0].speed: unknown field"),
    (["clients", 0, "profile"], {"kind": "diurnal", "hourly": [1, 2]}, "clients[0].profile.hourly: needs 24"),
    (["clients", 0, "profile"], {"kind": "table", "values": [1, -1], "window": 10}, "clients[0].profile.values"),
    (["clients", 0, "models"], [{"name": "x", "weight": [1, 2]}, {"name": "y", "weight": [1, 2, 3]}],
     "clients[0].models: per-window weight lists"),
    (["clients", 0, "models"], [{"name": "x", "weight": -1}], "clients[0].models[0].weight[0]: must be >= 0"),
    (["clients", 0, "sessions"], {"turns": {"dist": "constant", "value": 3}}, "clients[0].sessions.think_s: is required"),
    (["clients", 0, "rho"], 1.5, "clients[0].rho: must be <= 1"),
    (["clients", 0, "arrival"], {"process": "onoff", "burst_rate": 1, "idle_rate": 5, "on_s": 1, "off_s": 1},
     "clients[0].arrival.idle_rate: idle_rate 5 exceeds burst_rate 1"),
    (["clients", 0, "arrival"], {"process": "batch"}, "clients[0].arrival.size: batch needs a size"),
    (["duration"], 0, "duration: must be > 0"),
    (["clients"], [], "clients: must be a non-empty list"),
])
def test_invalid_spec_names_field(path, value, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(_with(path, value))
    assert needle in str(e.value)
    assert e.value.exit_code == 2


def test_valid_spec_parses_and_cli_reports_bad_field(tmp_path):
    parse_spec(BASE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_with(["clients", 1, "arrival", "cv"], 99)))
    proc = run_cli("replay", "trace", "generate", "--spec", bad, "-o", tmp_path / "t.parquet")
    assert proc.returncode == 2, proc.stderr
    assert "error: " in proc.stderr and "clients[1].arrival.cv" in proc.stderr
    assert "Traceback" not in proc.stderr
    notyaml = tmp_path / "x.yaml"
    notyaml.write_text("clients: [unclosed")
    with pytest.raises(TraceError, match="not valid YAML"):
        load_spec_file(notyaml)
    with pytest.raises(TraceError, match="unknown preset 'nope'; choose one of chat, bursty"):
        preset_spec("nope")


def test_presets_are_valid_and_scale():
    for name in PRESETS:
        spec = preset_spec(name, duration=120, rate=3)
        parsed = parse_spec(spec)
        assert parsed.duration == 120
        assert sum(c.rate for c in parsed.clients) == pytest.approx(3)
    # onoff clients without an explicit rate are scaled by their implied mean rate
    spec = {"duration": 10, "clients": [
        {"rate": 1, "input": BASE["clients"][0]["input"], "output": BASE["clients"][0]["output"]},
        {"arrival": {"process": "onoff", "burst_rate": 9, "idle_rate": 1, "on_s": 1, "off_s": 1},
         "input": BASE["clients"][0]["input"], "output": BASE["clients"][0]["output"]}]}
    scaled = scale_rate(spec, 12)
    assert [c["rate"] for c in scaled["clients"]] == pytest.approx([2, 10])


def test_demo_api_is_small_and_scalable():
    spec = preset_spec("bursty", duration=60, rate=2, length_scale=0.1, max_input_tokens=256, max_output_tokens=32)
    t = generate(spec, seed=7).table
    assert 0 < t.num_rows < 600
    assert max(t.column("input_tokens").to_pylist()) <= 256
    assert max(t.column("output_tokens").to_pylist()) <= 32
    assert set(t.column("model").to_pylist()) == {"small", "large"}


@pytest.mark.parametrize("path, value, needle", [
    (["clients", 0, "models"], {"a": 0, "b": 0}, "clients[0].models: weights must have a positive sum"),
    (["clients", 0, "models"], [{"name": "a", "weight": [1, 0]}, {"name": "b", "weight": [0, 0]}],
     "clients[0].models: window 1 has no model"),
    (["clients", 1, "arrival", "cv"], 0.001, "clients[1].arrival.cv: must be >= 0.01"),
])
def test_invalid_weights_and_tiny_cv(path, value, needle):
    with pytest.raises(SpecError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(_with(path, value))
