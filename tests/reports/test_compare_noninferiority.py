"""`replay compare --not-worse-by`: a clearly better candidate passes (exit 0), a clearly worse one
fails (1), a tiny one is inconclusive (2); bad input is one error line; and a seeded slice of
benchmarks/ab_calibration.py keeps false pass and false fail within 5 %."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

spec = importlib.util.spec_from_file_location(
    "ab_calibration", Path(__file__).resolve().parents[2] / "benchmarks" / "ab_calibration.py")
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.reports.synth import synth_records, write_run
    root = tmp_path_factory.mktemp("ni")
    return {"base": write_run(root / "base", synth_records(5000, seed=100)),
            "better": write_run(root / "better", synth_records(5000, seed=200, ttft_factor=0.8, tpot_ms=16)),
            "worse": write_run(root / "worse", synth_records(5000, seed=300, ttft_factor=1.5, tpot_ms=30)),
            "tiny": write_run(root / "tiny", synth_records(40, seed=400))}


def test_better_candidate_passes(runs):
    r = run_cli("replay", "compare", runs["base"], runs["better"], "--not-worse-by", "5%", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "pass" and out["confidence"] == 0.95
    rows = {row["metric"]: row for row in out["rows"]}
    assert set(rows) == {"ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p99", "error_rate"}
    assert all(row["verdict"] == "pass" for row in rows.values()), rows
    p50 = rows["ttft_ms.p50"]
    assert p50["lower"] < p50["effect"] < p50["upper"] <= 0.05 and -0.3 < p50["effect"] < -0.1
    assert rows["error_rate"]["margin"] == 0.01


def test_worse_candidate_fails_and_the_table_says_so(runs):
    r = run_cli("replay", "compare", runs["base"], runs["worse"], "--not-worse-by", "5",
                "--metrics", "ttft_ms.p50,tpot_ms.p99", "--confidence", "0.9")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL (exit 1)" in r.stdout and "fail" in r.stdout and "<= +5%" in r.stdout
    # the confidence, split over the 2 metrics (Bonferroni), is in the header and the caption
    assert "95.00% bounds" in r.stdout and "90% over the 2 metrics (Bonferroni)" in r.stdout


def test_tiny_sample_is_inconclusive(runs):
    r = run_cli("replay", "compare", runs["base"], runs["tiny"], "--not-worse-by", "50%", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "inconclusive"
    assert {row["verdict"] for row in out["rows"]} <= {"pass", "inconclusive"}
    p99 = next(row for row in out["rows"] if row["metric"] == "ttft_ms.p99")
    assert p99["upper"] is None       # 40 requests bound no p99 from above


@pytest.mark.parametrize("args, said", [
    (("--not-worse-by", "abc"), "--not-worse-by"),
    (("--not-worse-by=-5%",), "--not-worse-by"),
    (("--not-worse-by", "5", "--metrics", "ttft_ms.p42"), "ttft_ms.p42"),
    (("--not-worse-by", "5", "--error-margin", "x"), "--error-margin"),
    (("--not-worse-by", "5", "--confidence", "1"), "confidence"),
    (("--not-worse-by", "5", "--fail-on-regression", "5"), "--fail-on-regression"),
    (("--metrics", "ttft_ms.p99"), "--not-worse-by"),
])
def test_bad_input_is_one_error_line(runs, args, said):
    r = run_cli("replay", "compare", runs["base"], runs["tiny"], *args)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and said in lines[0], r.stderr


def test_calibration_slice_keeps_false_pass_and_false_fail_within_five_percent():
    # 20 pairs per distribution and d of 1,000 requests each (p50, p99), the truth -5 % to +5 % off
    # the margin and the clear +-20 %; error rates 0.2 and 0.5 point off a 1-point margin on 20,000.
    # The point-estimate rule is wrong 13 % (pass) / 22 % (fail) of the time here, and passing on
    # the point estimate alone 13 %; 8 %: what a few hundred pairs can tell from 5 %.
    rows = calibration.campaign(reps=20, seed=11, conf=0.95, margin=0.05, error_margin=0.01, ns=(1000,),
                                ds=(-0.2, -0.05, -0.02, 0.0, 0.02, 0.05, 0.2), error_ns=(20_000,),
                                error_ds=(-0.5, -0.2, 0.0, 0.2, 0.5))
    ours = [r for r in rows if r[4] == "bounds"]
    assert len(ours) == 940
    false_pass, false_fail, _ = calibration.rates(ours)
    assert false_pass <= 0.08 and false_fail <= 0.08, (false_pass, false_fail)
    # and it decides: the p50 20 % off the margin, and error rates 0.5 point off it, mostly rightly
    clear = [r[5] == ("pass" if r[3] < 0 else "fail") for r in ours
             if (r[0] == "p50" and abs(r[3]) == 0.2) or (r[0] == "error_rate" and abs(r[3]) == 0.5)]
    assert sum(clear) >= 0.6 * len(clear), sum(clear) / len(clear)
