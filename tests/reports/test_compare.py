"""`replay compare`: detects an injected 20% TTFT regression; no change between two runs drawn
from the same distribution; --fail-on-regression exit codes; the side-by-side HTML."""
from __future__ import annotations

import json

import pytest

from llm_replay.reports import compare_runs
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.reports.synth import synth_records, write_run
    root = tmp_path_factory.mktemp("cmp")
    return {"base": write_run(root / "base", synth_records(3000, seed=100)),
            "same": write_run(root / "same", synth_records(3000, seed=200)),
            "slow": write_run(root / "slow", synth_records(3000, seed=300, ttft_factor=1.2))}


def test_injected_ttft_regression_is_detected(runs, tmp_path):
    html = tmp_path / "cmp.html"
    r = run_cli("replay", "compare", runs["base"], runs["slow"], "--fail-on-regression", "10",
                "--json", "--html", html)
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    rows = {row["metric"]: row for row in out["rows"]}
    assert out["verdict"] == "regressed"
    for key in ("ttft_ms.p50", "ttft_ms.mean", "ttft_ms rank test P(cand>base)"):
        assert rows[key]["verdict"] == "regressed", key
    assert 12 < rows["ttft_ms.p50"]["delta_pct"] < 30
    lo, hi = rows["ttft_ms.p50"]["ci_pct"]
    assert 0 < lo < rows["ttft_ms.p50"]["delta_pct"] < hi
    # TPOT and ICL did not change
    assert all(rows[f"{m}.{s}"]["verdict"] == "no significant change"
               for m in ("tpot_ms", "icl_ms") for s in ("p50", "p90", "p99", "mean"))
    page = html.read_text()
    assert "<svg" in page and "regressed" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_same_distribution_reports_no_change(runs):
    res = compare_runs(runs["base"], runs["same"], fail_on_regression_pct=5)
    assert res.verdict == "no significant change", res.table()
    assert res.exit_code == 0
    r = run_cli("replay", "compare", runs["base"], runs["same"])
    assert r.returncode == 0 and "NO SIGNIFICANT CHANGE" in r.stdout


def test_regression_below_the_threshold_does_not_fail(runs):
    res = compare_runs(runs["base"], runs["slow"], fail_on_regression_pct=50)
    assert res.verdict == "regressed" and res.exit_code == 0
    assert compare_runs(runs["base"], runs["slow"]).exit_code == 0    # informational without the flag


def test_run_without_successes_cannot_be_compared(runs, tmp_path):
    from tests.reports.synth import synth_records, write_run
    dead = write_run(tmp_path / "dead", synth_records(50, seed=1, fail_share=1.0))
    assert compare_runs(runs["base"], dead).exit_code == 2
