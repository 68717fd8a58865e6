"""A slice of benchmarks/gate_calibration.py: gates of `p99 <= limit` on runs drawn from known
distributions, judged by the gate's own verdict (reports/gate.py), are rarely wrong at 95 %."""
from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "gate_calibration", Path(__file__).resolve().parents[2] / "benchmarks" / "gate_calibration.py")
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def test_false_pass_and_false_fail_stay_within_five_percent():
    res = calibration.campaign(reps=4, seed=7, conf=0.95, grid=(150, 1000), fixed=(100,))
    assert len(res["gates"]) >= 150
    false_pass, false_fail, undecided = calibration.rates(res["gates"])
    assert false_pass <= 0.05 and false_fail <= 0.05, (false_pass, false_fail)
    # the point estimate on 100 requests, judged the same way, is wrong far more often
    fp100, ff100, _ = calibration.rates(res["fixed"])
    assert fp100 + ff100 > false_pass + false_fail + 0.2, (fp100, ff100)
