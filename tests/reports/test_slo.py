"""SLO spec parsing: YAML, TOML, pyproject.toml, and errors that name the field."""
from __future__ import annotations

import json

import pytest

from llm_replay.reports.errors import SloSpecError
from llm_replay.reports.slo import load_slo

YAML = """
per_request:
  ttft_ms: 500
  tpot_ms: 50
objectives:
  - ttft_ms.p99 <= 800
  - tpot_ms.p90 < 40
  - attainment >= 0.95
  - error_rate <= 0.01
  - e2e_sched_ms.p99.9 <= 1e4
classes:
  batch: {per_request: {e2e_s: 60}, objectives: ["e2e_ms.p50 <= 30000"]}
"""


def test_yaml_toml_and_pyproject_give_the_same_spec(tmp_path):
    y = tmp_path / "slo.yaml"
    y.write_text(YAML)
    t = tmp_path / "slo.toml"
    t.write_text('objectives = ["ttft_ms.p99 <= 800", "attainment >= 0.95"]\n'
                 '[per_request]\nttft_ms = 500\n[classes.batch.per_request]\ne2e_s = 60\n')
    pp = tmp_path / "pyproject.toml"
    pp.write_text('[project]\nname = "x"\n[tool.replay.slo]\nobjectives = ["ttft_ms.p99 <= 800"]\n'
                  '[tool.replay.slo.per_request]\nttft_ms = 500\n')
    spec = load_slo(y)
    assert spec.per_request == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert [(o.metric, o.stat, o.op, o.limit) for o in spec.objectives] == [
        ("ttft_ms", "p99", "<=", 800.0), ("tpot_ms", "p90", "<", 40.0), ("attainment", None, ">=", 0.95),
        ("error_rate", None, "<=", 0.01), ("e2e_sched_ms", "p99.9", "<=", 1e4)]
    assert spec.classes["batch"].per_request == {"e2e_ms": 60000.0}
    assert load_slo(t).classes["batch"].per_request == {"e2e_ms": 60000.0}
    assert load_slo(pp).per_request == {"ttft_ms": 500.0}
    assert load_slo(tmp_path).objectives[0].text == "ttft_ms.p99 <= 800"   # a directory: its pyproject


@pytest.mark.parametrize("spec, field, words", [
    ({"objectives": ["ttft.p99 <= 800"]}, "objectives[0]", "unknown metric 'ttft'"),
    ({"objectives": ["ttft_ms <= 800"]}, "objectives[0]", "did you mean 'ttft_ms.p99'"),
    ({"objectives": ["ttft_sm.p95 <= 800"]}, "objectives[0]", "did you mean 'ttft_ms.p95'?"),
    ({"objectives": ["attainmnet >= 0.9"]}, "objectives[0]", "did you mean 'attainment'?"),
    ({"objectives": ["ttft_ms.p98 <= 800"]}, "objectives[0]", "cannot parse"),
    ({"objectives": ["ttft_ms.p99 == 800"]}, "objectives[0]", "cannot parse"),
    ({"objectives": [800]}, "objectives[0]", "is a string"),
    ({"per_request": {"ttft_ms": -1}}, "per_request.ttft_ms", "must be greater than 0, got -1"),
    ({"per_request": {"ttft": 5}}, "per_request.ttft", "unknown per-request threshold"),
    ({"per_request": {"tpot_sm": 5}}, "per_request.tpot_sm", "did you mean 'tpot_ms'?"),
    ({"objectives": ["attainment >= 0.9"], "budget": 3}, "budget", "unknown key"),
    ({"classes": {"batch": {"per_request": {"e2e_s": "a"}}}}, "classes.batch.per_request.e2e_s", "must be a valid number"),
    ({"classes": {"batch": {"objectives": ["nope"]}}}, "classes.batch.objectives[0]", "cannot parse"),
    ({"classes": {"batch": 3}}, "classes.batch", "mapping"),
    ({"classes": {"batch": {"objectivs": []}}}, "classes.batch.objectivs", "did you mean 'objectives'?"),
    ({}, None, "neither per_request thresholds nor objectives"),
])
def test_invalid_specs_name_the_field(spec, field, words):
    with pytest.raises(SloSpecError) as e:
        load_slo(spec)
    assert e.value.exit_code == 2 and words in str(e.value)
    if field:
        assert f"field {field!r}" in str(e.value)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "slo.yaml"
    bad.write_text("objectives: [unclosed\n")
    with pytest.raises(SloSpecError, match="slo.yaml: invalid YAML"):
        load_slo(bad)
    pp = tmp_path / "pyproject.toml"
    pp.write_text("[project]\nname='x'\n")
    with pytest.raises(SloSpecError, match=r"no \[tool.replay.slo\] table"):
        load_slo(pp)
    with pytest.raises(SloSpecError, match="cannot read SLO spec"):
        load_slo(tmp_path / "missing.yaml")


@pytest.mark.parametrize("body", [
    "objectives:\n  - ttft_ms.p95 <= 800\n    attainment >= 0.9\n",     # continued: one string
    "objectives:\n  - ttft_ms.p95 <= 800\n   - attainment >= 0.9\n",    # a dash indented past the first
    "objectives:\n  ttft_ms.p95 <= 800\n  attainment >= 0.9\n",        # no dashes
])
def test_a_list_folded_by_indentation_is_named(tmp_path, body):
    """Issue 36 item 8: YAML folds mis-indented list items into one string, which was only
    'cannot parse'; the error now says it holds two objectives and why."""
    (tmp_path / "slo.yaml").write_text(body)
    with pytest.raises(SloSpecError) as e:
        load_slo(tmp_path / "slo.yaml")
    msg = str(e.value)
    assert "field 'objectives[0]'" in msg and "2 objectives in one string" in msg and "indent" in msg, msg


def test_the_dict_form_loads_back_into_the_same_spec(tmp_path):
    """slo.json (`replay run --slo`) is `to_dict` without the source: it must load back unchanged."""
    (tmp_path / "slo.yaml").write_text(YAML + "per_task: {task_s: 60}\nconfidence: 0.9\nname: demo\n")
    spec = load_slo(tmp_path / "slo.yaml")
    (tmp_path / "slo.json").write_text(json.dumps({k: v for k, v in spec.to_dict().items() if k != "source"}))
    again = load_slo(tmp_path / "slo.json")
    assert again.to_dict() == {**spec.to_dict(), "source": str(tmp_path / "slo.json")}
    assert again.classes["batch"].per_request == {"e2e_ms": 60000.0} and again.objectives == spec.objectives
