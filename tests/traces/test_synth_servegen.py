"""ServeGen client data imports as a spec that generates its windowed rates and length PMFs."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import run_cli
from llm_replay.traces.errors import TraceError
from llm_replay.traces.generate import generate
from llm_replay.traces.servegen import import_servegen, servegen_spec

SRC = Path(__file__).parent / "fixtures" / "synth" / "servegen" / "m-test"


def test_import_writes_a_spec_that_generates(tmp_path):
    out = tmp_path / "sg.yaml"
    import_servegen(SRC, out)
    spec = yaml.safe_load(out.read_text())
    assert [c["name"] for c in spec["clients"]] == ["client-0", "client-1"]  # client-2 is idle
    c0 = spec["clients"][0]
    assert c0["profile"] == {"kind": "table", "window": 600.0, "values": [1.0, 0.0, 2.0, 1.0]}
    assert c0["arrival"]["process"] == "weibull"  # most requests came in Weibull windows
    # PMF "0" served windows 0-1200 (1200 requests), PMF "1200" the rest (3600)
    assert dict(zip(c0["input"]["values"], c0["input"]["weights"])) == {100: 0.125, 200: 0.125, 1000: 0.75}
    spec["duration"] = 2400 * 20  # the 4-window table repeats
    t = generate(spec, seed=1).table.to_pandas()
    c0 = t[t.client_id == "client-0"]
    per_window = np.bincount(((c0.arrival_ns // 10**9) // 600 % 4).astype(int), minlength=4) / (20 * 600)
    np.testing.assert_allclose(per_window, [2, 0, 4, 2], atol=0.25)
    assert (c0.input_tokens == 1000).mean() == pytest.approx(0.75, abs=0.03)
    assert set(t[t.client_id == "client-1"].output_tokens) == {30}
    assert set(t.model) == {"m-test"}


def test_bad_servegen_input_is_reported(tmp_path):
    with pytest.raises(TraceError, match="no chunk-<i>-trace.csv"):
        servegen_spec(tmp_path)
    d = tmp_path / "m"
    shutil.copytree(SRC, d)
    (d / "chunk-1-trace.csv").write_text("0,1.0,1.2,Pareto,1,1\n")
    with pytest.raises(TraceError, match=r"chunk-1-trace.csv: line 1: unknown pattern 'Pareto'"):
        servegen_spec(d)
    (d / "chunk-1-trace.csv").write_text("0,1.0,1.2\n")
    with pytest.raises(TraceError, match="expected 6 fields"):
        servegen_spec(d)
    (d / "chunk-1-trace.csv").write_text("0,1.0,1.2,Gamma,1,1\n")
    (d / "chunk-1-dataset.json").write_text('{"0": {"input_tokens": "__import__(\'os\')"}}')
    with pytest.raises(TraceError, match="not a Python dict literal"):
        servegen_spec(d)


def test_servegen_missing_pieces_are_named(tmp_path):
    """A directory without a client's dataset.json, or one without a length PMF, says what is
    missing in one line (issue 16 item 4)."""
    d = tmp_path / "m"
    shutil.copytree(SRC, d)
    (d / "chunk-0-dataset.json").unlink()
    p = run_cli("replay", "trace", "import", "servegen", d, "-o", tmp_path / "s.yaml")
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "client 0: chunk-0-dataset.json is missing" in p.stderr and "input_tokens/output_tokens PMFs" in p.stderr
    (d / "chunk-0-dataset.json").write_text('{"0": {"input_tokens": "{100: 1.0}"}, "600": {"other": "{}"}}')
    p = run_cli("replay", "trace", "import", "servegen", d, "-o", tmp_path / "s.yaml")
    assert p.returncode == 2 and "no output_tokens PMF in any window (fields with a PMF: input_tokens)" in p.stderr
