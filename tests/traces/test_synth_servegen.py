"""ServeGen client data imports as a spec that generates its windowed rates and length PMFs."""
import ast
import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import run_cli
from llm_replay.traces.cli import parse_span
from llm_replay.traces.errors import TraceError
from llm_replay.traces.generate import generate
from llm_replay.traces.servegen import import_servegen, servegen_spec
from llm_replay.traces.spec import SpecError, parse_spec
from llm_replay.traces.window import slice_spec

SRC = Path(__file__).parent / "fixtures" / "synth" / "servegen" / "m-test"


def test_import_writes_a_spec_that_generates(tmp_path):
    out = tmp_path / "sg.yaml"
    import_servegen(SRC, out)
    spec = yaml.safe_load(out.read_text())
    assert [c["name"] for c in spec["clients"]] == ["client-0", "client-1"]  # client-2 is idle
    c0 = spec["clients"][0]
    # the windows' own rates (req/s) and CVs (an idle window's CV is moot: 1)
    assert c0["profile"] == {"kind": "table", "window": 600.0, "values": [2.0, 0.0, 4.0, 2.0],
                             "cv": [3.0, 1.0, 2.5, 3.5]}
    assert c0["arrival"] == {"process": "weibull", "cv": 2.5}  # most requests in Weibull windows; weighted median
    # each dataset window's PMFs, exact: "0" serves windows 0-1200, "1200" the rest
    lw = c0["length_windows"]
    assert [w["from_s"] for w in lw] == [0.0, 1200.0]
    assert dict(zip(lw[0]["input"]["values"], lw[0]["input"]["weights"])) == {100: 0.5, 200: 0.5}
    assert dict(zip(lw[1]["input"]["values"], lw[1]["input"]["weights"])) == {1000: 1.0}
    t = generate(spec, seed=1).table.to_pandas()
    c0 = t[t.client_id == "client-0"]
    win = (c0.arrival_ns // 10**9 // 600).astype(int)
    assert np.bincount(win, minlength=4).tolist() == [1200, 0, 2400, 1200]  # every window's count, as ServeGen
    assert set(c0.input_tokens[win < 2]) == {100, 200} and set(c0.input_tokens[win >= 2]) == {1000}
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


# ------------------------------------------------------------------ windows of a long profile (issue 25 item 1)
DAYS = Path(__file__).parent / "fixtures" / "synth" / "servegen" / "m-days"   # make_days.py: 3 days, known drift


def _realism():
    import importlib.util
    import sys
    from tests.conftest import REPO
    if "realism_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("realism_bench", REPO / "benchmarks" / "realism.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["realism_bench"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["realism_bench"]


def _source_counts(cid: int, lo: float, hi: float) -> int:
    """Requests of client cid's 600 s windows in [lo, hi), from its trace CSV (rate x 600)."""
    rows = [line.split(",") for line in (DAYS / f"chunk-{cid}-trace.csv").read_text().split()]
    return round(sum(float(r[1]) * 600 for r in rows if lo <= float(r[0]) < hi))


def test_one_hour_window_matches_its_source_on_three_seeds():
    """`generate --start 1d14h --duration 1h`: every client's rate and the total within 10 % of
    that hour's source windows, lengths p50/p90/p99 within 10 % of the PMFs in force then."""
    realism = _realism()
    res = realism.run_servegen_window(realism.FIXTURES["servegen_window"], (1, 2, 3))
    rows = [r for s in (1, 2, 3) for r in res["per_seed"][s]["rows_judged"] if r["target"]]
    assert {r["metric"] for r in rows} >= {"rate", "rate.client-0", "rate.client-1", "rate.client-2",
                                           "input.p50", "input.p99", "output.p50", "output.p99"}
    assert [(r["metric"], r["source"], r["generated"]) for r in rows if r["verdict"] != "pass"] == []
    # the test can fail: this hour is far from the three days' mean rates and lengths
    hour = realism.servegen_window_truth(DAYS, 86400 + 14 * 3600, 3600)
    days = realism.servegen_window_truth(DAYS, 0, 3 * 86400)
    assert hour["rate.client-0"] / days["rate.client-0"] > 1.5 and "rate.client-2" in hour
    assert days["rate.client-2"] < 0.2 * hour["rate.client-2"]
    assert abs(hour["output.p50"] / days["output.p50"] - 1) > 0.25


def _main(capsys, *argv) -> tuple[int, str, str]:
    """The real entry point in process (`replay ...`): exit code, stdout, stderr."""
    from llm_replay.replay.cli import main
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_window_cli_first_hour_rate_and_errors(tmp_path, capsys):
    spec = tmp_path / "days.json"
    run_cli("replay", "trace", "import", "servegen", DAYS, "-o", spec, check=True)
    # --duration alone: the first hour at its own rates (not the 3 days' mean)
    run_cli("replay", "trace", "generate", "--spec", spec, "--duration", "1h", "-o", tmp_path / "h0.parquet",
            check=True)
    t = pq.read_table(tmp_path / "h0.parquet").to_pandas()
    assert t.groupby("client_id").size().to_dict() == {"client-0": _source_counts(0, 0, 3600),
                                                       "client-1": _source_counts(1, 0, 3600)}
    # --rate on a window: that window's total, its client mix kept
    code, out, _ = _main(capsys, "trace", "generate", "--spec", spec, "--start", "1d14h", "--duration", "3600",
                         "--rate", "2", "-o", tmp_path / "r.parquet")
    assert code == 0 and "from 136800 s of the spec's time" in out
    t = pq.read_table(tmp_path / "r.parquet").to_pandas()
    src = {c: _source_counts(c, 136800, 140400) for c in (0, 1, 2)}
    assert len(t) / 3600 == pytest.approx(2, rel=0.01)
    share = t.client_id.value_counts(normalize=True)
    for c, n in src.items():
        assert share[f"client-{c}"] == pytest.approx(n / sum(src.values()), abs=0.01)
    # the window's spec is small: 6 table values, only the length windows in force in that hour
    code, out, _ = _main(capsys, "trace", "generate", "--spec", spec, "--start", "1d14h", "--duration", "1h",
                         "--dump-spec")
    w = yaml.safe_load(out)
    assert w["duration"] == 3600 and [len(c["profile"]["values"]) for c in w["clients"]] == [6, 6, 6]
    assert [[x["from_s"] for x in c["length_windows"]] for c in w["clients"]] == [[0.0], [0.0], [0.0]]
    for args, msg in [(["--start", "1000"], "--start 1000 s is not on a window edge of clients[0].profile "
                                            "(600 s windows); use a multiple of 600 s, e.g. 600"),
                      (["--start", "3d"], "--start 259200 s is at or past the end of the spec"),
                      (["--start", "1d1x"], "argument --start: not a time: '1d1x'"),
                      (["--start", "0d3h", "--duration", "10m", "--rate", "0"], "--rate must be > 0"),
                      (["--start", "1h", "--preset", "chat"], "error: --start cuts a window of a --spec's own time; "
                                                              "a preset starts at 0 (use --duration)")]:
        argv = args if "--preset" in args else ["--spec", spec, *args]
        code, _, err = _main(capsys, "trace", "generate", *argv, "-o", tmp_path / "x.parquet")
        assert code == 2 and "Traceback" not in err and msg in err, (args, err)


def test_length_pmfs_are_exact_and_follow_their_window():
    """Every support point kept (window 6 of client 0 has ~1,600), total-variation distance to
    the source ~0; a window with empty PMFs keeps the one before it, as ServeGen's loader."""
    spec = servegen_spec(DAYS)
    assert [c["name"] for c in spec["clients"]] == ["client-0", "client-1", "client-2"]  # client-3 idle
    lw = spec["clients"][0]["length_windows"]
    assert [w["from_s"] for w in lw] == [i * 21600.0 for i in range(12) if i != 9]
    src = ast.literal_eval(json.loads((DAYS / "chunk-0-dataset.json").read_text())["129600"]["input_tokens"])
    got = dict(zip(lw[6]["input"]["values"], lw[6]["input"]["weights"]))
    assert len(src) > 1000 and set(got) == set(src)
    assert 0.5 * sum(abs(got[k] - src[k]) for k in src) < 1e-5
    # client 2 has PMFs only on day 1: its first serves from 0 (its windows before are idle)
    assert [w["from_s"] for w in spec["clients"][2]["length_windows"]] == [0.0, 129600.0]
    t = generate(slice_spec(spec, 129600, 3600), seed=2).table.to_pandas()
    c0 = t[t.client_id == "client-0"]
    assert set(c0.input_tokens) <= set(src) and len(set(c0.input_tokens)) > 500


def test_window_cv_is_each_windows_own():
    """A day of client 0: the median 600 s window CV of the generated gaps is the source's
    median (1.3), not the rate-weighted mean that every 20th window's CV 6-10 drags up."""
    spec = slice_spec(servegen_spec(DAYS), 0, 86400)
    spec["clients"] = spec["clients"][:1]
    cvs = np.array(spec["clients"][0]["profile"]["cv"])
    rate = np.array(spec["clients"][0]["profile"]["values"])
    assert np.average(cvs, weights=rate) > 1.2 * np.median(cvs)  # one CV per client would be 20 % off
    t = generate(spec, seed=3).table.column("arrival_ns").to_numpy() / 1e9
    got = [np.std(np.diff(x)) / np.mean(np.diff(x)) for x in np.split(t, np.searchsorted(t, np.arange(600, 86400, 600)))]
    assert np.median(got) == pytest.approx(np.median(cvs), rel=0.1)


def test_length_windows_and_window_cvs_are_validated():
    base = {"duration": 60, "clients": [{"rate": 1, "arrival": {"process": "gamma", "cv": 2},
                                         "profile": {"kind": "table", "window": 30, "values": [1, 2], "cv": [1, 3]},
                                         "length_windows": [{"from_s": 0, "input": {"dist": "constant", "value": 5},
                                                             "output": {"dist": "constant", "value": 7}},
                                                            {"from_s": 30, "input": {"dist": "constant", "value": 50},
                                                             "output": {"dist": "constant", "value": 70}}]}]}
    t = generate(base, seed=1).table.to_pandas()
    late = t.arrival_ns >= 30e9
    assert set(t.input_tokens[~late]) == {5} and set(t.output_tokens[late]) == {70}
    assert late.sum() == 40 and (~late).sum() == 20  # windows of 2/3 and 4/3 req/s: counts exact
    for path, value, msg in [
            ("length_windows.0.from_s", 5, "length_windows[0].from_s: the first window starts at 0"),
            ("length_windows.1.from_s", 0, "length_windows[1].from_s: must be > 0"),
            ("input", {"dist": "constant", "value": 1}, "clients[0].input: is given per window in length_windows"),
            ("profile.cv", [1], "clients[0].profile.cv: must be a list of 2 CVs (one per value), each in 0.01..20"),
            ("arrival", {"process": "poisson"}, "a table with a cv per window needs arrival process gamma or weibull")]:
        bad = copy.deepcopy(base)
        node, *keys = bad["clients"][0], *path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        node[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
        with pytest.raises(SpecError, match=re.escape(msg)):
            parse_spec(bad)


@pytest.mark.parametrize("text, seconds", [("5400", 5400), ("90m", 5400), ("1h30m", 5400), ("1.5h", 5400),
                                           ("2d", 172800), ("1d14h", 136800), ("45s", 45), ("1x", None),
                                           ("-5", None), ("", None), ("h", None)])
def test_parse_span(text, seconds):
    got = parse_span(text)
    assert (got == seconds) if seconds is not None else np.isnan(got)


def test_window_of_a_fitted_style_spec_cuts_model_weights_and_refuses_ramps():
    """A table with per-window model weights (what fit writes): the window from 1200 s has that
    window's rate and model mix; a ramp has no own time to cut at --start."""
    spec = {"duration": 2400, "exact_count": True, "clients": [{
        "rate": 2.5, "profile": {"kind": "table", "window": 600, "values": [1, 2, 4, 3]}, "mix_window": 600,
        "models": [{"name": "a", "weight": [1, 1, 0.2, 0.9]}, {"name": "b", "weight": [0, 0, 0.8, 0.1]}],
        "input": {"dist": "constant", "value": 10}, "output": {"dist": "constant", "value": 5}}]}
    w = slice_spec(spec, 1200, 600)
    assert w["clients"][0]["rate"] == pytest.approx(4.0) and [m["weight"] for m in w["clients"][0]["models"]] == [
        [0.2], [0.8]]
    t = generate(w, seed=4).table.to_pandas()
    assert len(t) == 2400 and (t.model == "b").mean() == pytest.approx(0.8, abs=0.03)
    spec["clients"][0]["profile"] = {"kind": "ramp", "start": 1, "end": 3}
    with pytest.raises(TraceError, match=r"clients\[0\].profile: a ramp is drawn relative to the spec's duration"):
        slice_spec(spec, 1200, 600)
