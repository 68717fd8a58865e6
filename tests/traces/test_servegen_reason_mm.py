"""ServeGen reasoning and multimodal clients (issue 25 item 2): reason_ratio becomes the spec's
reasoning_share and the trace's reasoning_tokens; image_count / image_tokens become images.
Fixtures: tests/traces/fixtures/synth/servegen/{r1-test,mm-test} (make_reason_mm.py, known
parameters), judged by benchmarks/realism.py against what their PMFs give."""
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from llm_replay.traces.errors import TraceError
from llm_replay.traces.generate import generate
from llm_replay.traces.spec import parse_spec
from llm_replay.traces.trace import Trace
from llm_replay.traces.transform import clip
from tests.conftest import REPO, run_cli

SG = Path(__file__).parent / "fixtures" / "synth" / "servegen"
SEEDS = (1, 2, 3)
TARGETS = ("reasoning_share", "image_count_max_diff",
           *(f"{c}.{q}" for c in ("input", "output") for q in ("p50", "p90", "p99")))


def _realism():
    if "realism_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("realism_bench", REPO / "benchmarks" / "realism.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["realism_bench"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["realism_bench"]


@pytest.mark.parametrize("fixture", ["servegen_reason", "servegen_mm"])
def test_realism_targets_on_every_seed(fixture):
    """import -> generate against the PMFs: reasoning share +-0.05, image-count shares +-2
    points, lengths p50/p90/p99 +-10 %, seeds 1-3; a fit of the generated trace regenerates
    the reasoning share and the image counts within compare's tolerances."""
    realism = _realism()
    res = realism.run_servegen(realism.FIXTURES[fixture], SEEDS)
    judged = [r for s in SEEDS for r in res["per_seed"][s]["rows_judged"] if r["metric"] in TARGETS]
    assert {r["metric"] for r in judged} >= {"input.p50", "output.p99"}
    assert ("reasoning_share" if fixture == "servegen_reason" else "image_count_max_diff") in \
        {r["metric"] for r in judged if r["verdict"] == "pass"}
    bad = [(r["metric"], r["source"], r["generated"]) for r in judged if r["verdict"] != "pass"]
    assert not bad, bad
    fails = [m for s in SEEDS for m in res["compare_fails"][s] if m == "reasoning_share" or m.startswith("images.")]
    assert not fails, fails


def test_cli_import_keeps_reason_ratio_and_images(tmp_path):
    for name in ("r1-test", "mm-test"):
        run_cli("replay", "trace", "import", "servegen", SG / name, "-o", tmp_path / f"{name}.yaml", check=True)
    r1 = yaml.safe_load((tmp_path / "r1-test.yaml").read_text())
    share = r1["clients"][1]["reasoning_share"]   # Beta(40, 1.5): mean 0.964
    assert share["min"] == 0.0 and share["max"] == 1.0
    assert np.dot(share["values"], share["weights"]) == pytest.approx(40 / 41.5, abs=0.002)
    mm = yaml.safe_load((tmp_path / "mm-test.yaml").read_text())
    c0, c1 = mm["clients"]
    # window 0 (4 x 600 s at 2 req/s) {0: .2, 1: .5, 2: .2, 4: .1}, window 2400 (2 x 600 s) {1: .6, 3: .4}
    assert c0["images"]["count"] == pytest.approx({0: 0.2 * 2 / 3, 1: 0.5 * 2 / 3 + 0.6 / 3, 2: 0.2 * 2 / 3,
                                                   3: 0.4 / 3, 4: 0.1 * 2 / 3})
    assert c1["images"]["count"] == {1: 1.0}
    # image_tokens {256: .3, 1196: .5, 1280: .2}: 28-px cells about as many as the tokens
    px = c0["images"]["px"]
    assert sum(px.values()) == pytest.approx(1.0) and px["980x952"] == pytest.approx(0.5)   # 35 x 34 = 1190
    assert all(int(w) % 28 == 0 and int(h) % 28 == 0 for w, h in (s.split("x") for s in px))
    t = generate(mm, seed=3).table
    assert t.column("num_images").to_numpy().max() == 4 and "reasoning_tokens" not in t.column_names


def test_audio_or_video_is_refused_in_one_line(tmp_path):
    d = tmp_path / "mm"
    shutil.copytree(SG / "mm-test", d)
    data = json.loads((d / "chunk-1-dataset.json").read_text())
    data["0"]["audio_count"] = "{0: 0.5, 1: 0.5}"
    (d / "chunk-1-dataset.json").write_text(json.dumps(data))
    p = run_cli("replay", "trace", "import", "servegen", d, "-o", tmp_path / "s.yaml")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "chunk-1-dataset.json" in p.stderr and "audio_count" in p.stderr


def test_reasoning_tokens_round_trip_and_rules(tmp_path):
    spec = {"duration": 600, "seed": 1, "clients": [
        {"name": "r", "rate": 4, "input": {"dist": "constant", "value": 50},
         "output": {"dist": "lognormal", "median": 400, "sigma": 0.7},
         "models": [{"name": "thinker", "reasoning_share": {"dist": "empirical", "values": [0.25, 0.75],
                                                            "weights": [1, 1]}},
                    {"name": "plain", "weight": 1.0}]}]}
    t = generate(spec).table
    r, o = (t.column(c).to_numpy(zero_copy_only=False).astype(float) for c in ("reasoning_tokens", "output_tokens"))
    thinker = (t.column("model").cast(pa.string()).to_numpy(zero_copy_only=False) == "thinker")
    assert np.isnan(r[~thinker]).all() and (r[thinker] <= o[thinker]).all()
    assert set(np.round(r[thinker] / o[thinker], 1)) == {0.2, 0.3, 0.7, 0.8}   # 0.25 / 0.75 of each, rounded
    clipped = clip(Trace(t), "output_tokens", None, 100).table   # reasoning stays a part of the output
    assert pc.max(pc.subtract(clipped.column("reasoning_tokens"), clipped.column("output_tokens"))).as_py() <= 0
    # a count above the output is refused by validate, in one line naming the column and the row
    bad = t.set_column(t.column_names.index("reasoning_tokens"), "reasoning_tokens",
                       pa.array(np.where(np.arange(len(o)) == 3, o + 1, np.nan_to_num(r)).astype(np.int32)))
    Trace(bad, validate=False).write(tmp_path / "bad.parquet")
    p = run_cli("replay", "trace", "validate", tmp_path / "bad.parquet")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "reasoning_tokens must be <= output_tokens" in p.stderr and "row" in p.stderr and "3" in p.stderr
    for share, rule in ((1.5, "must be <= 1"), ({"dist": "uniform", "low": 0, "high": 2, "max": 2}, "0..1")):
        with pytest.raises(TraceError, match=rf"clients\[0\]\.reasoning_share: .*{rule}"):
            parse_spec({"duration": 1, "clients": [{"rate": 1, "input": {"dist": "constant", "value": 1},
                                                    "output": {"dist": "constant", "value": 1},
                                                    "reasoning_share": share}]})
