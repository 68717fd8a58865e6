"""Issue 14's realism targets on the public traces (tests/traces/fixtures/public/): import ->
fit -> generate (seeds 1, 2, 3) -> compare, via benchmarks/realism.py (run it for the table).

Every (fixture, target metric) is one test. It passes when every seed is within the target's
tolerance. Metrics that miss today are `xfail(strict=True)` with the reason measured, so they
turn into XPASS failures the moment a fitter change fixes them: then move them to passing
(delete their line from MISSES). All four fixtures together take ~15 s (the Mooncake fits
simulate every candidate with its sessions).
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # import, fit and 3 seeds of generate per fixture: minutes
ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)


def _load_realism():
    if "realism_bench" in sys.modules:
        return sys.modules["realism_bench"]
    spec = importlib.util.spec_from_file_location("realism_bench", ROOT / "benchmarks" / "realism.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["realism_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


realism = _load_realism()
TARGETS = [m for m, (_, _, target) in realism.TOL.items() if target]

# Rows in each public file (the importers read every row).
ROWS = {"azure_code": 8819, "azure_conv": 19366, "mooncake_conv": 12031, "mooncake_conv_dq": 12031}

# Targets NOT met today, measured with the working tree of the end of issue 14's evidence pass
# (source -> generated on seed 1; worst diff over seeds 1-3). `python3 benchmarks/realism.py
# --misses` prints this table from the current code. Everything else in TARGETS passes on
# every seed.
MISSES: dict[str, dict[str, str]] = {
    "azure_code": {
        # 88 requests above p99 in 8.8k rows; seeds 2 and 3 pass
        "output.p99": "251.5 -> 222.8 on seed 1 (11.4 % vs 10 %); seeds 2, 3 within",
    },
    "azure_conv": {},
    # Later turns run long: the p99 of the generated continuations is ~40 % above the source's
    # (sessions grow by every answer and new tokens; the source's long conversations do not
    # reach as far), mean p99 +6 % over 8 seeds (sd 5 %), as before the shared-prefix pool;
    # seed 1 lands over, seeds 2, 3 within. The prefix hit ratio, +0.04 before sessions.branch
    # (15 % of the source's continuations keep only part of the history), is now +0.025.
    "mooncake_conv": {  # rate and IDC 1/10/60 s pass since timestamp_quantum_s (see below)
        "input.p99": "85,400 -> 95,777 on seed 1 (12.2 % vs 10 %); seeds 2, 3 within",
    },
    "mooncake_conv_dq": {
        # rate and IDC 1/10/60 s pass (timestamp_quantum_s + timestamp_spread: generate floors
        # to the 3-s buckets and spreads them as the import did; arrival models judged on every
        # row, starts and turns; the rows' count exact)
        "input.p99": "85,400 -> 94,991 on seed 1 (11.2 % vs 10 %); seeds 2, 3 within",
    },
    "bucketed_burst": {},   # synthetic (a known spec, 1-s buckets): every target on every seed
}


@functools.lru_cache(maxsize=None)
def _result(name: str) -> dict:
    return realism.run_fixture(realism.FIXTURES[name], SEEDS)


def _cases():
    for fx, misses in MISSES.items():
        for metric in TARGETS:
            marks = [pytest.mark.xfail(strict=True, reason=misses[metric])] if metric in misses else []
            yield pytest.param(fx, metric, marks=marks, id=f"{fx}-{metric}")


def test_public_fixtures_import_every_row():
    for name, rows in ROWS.items():
        res = _result(name)
        assert res["rows"] == rows, name
        # the fixtures' own span in trace time (the timestamps in the files), not a measured time
        assert 3400 < res["duration_s"] < 3600, name   # one hour of traffic each
    assert set(MISSES) == set(realism.DEFAULT)
    assert set(ROWS) == {n for n in realism.DEFAULT if realism.FIXTURES[n].fmt != "synthetic"}


@pytest.mark.parametrize("fixture, metric", list(_cases()))
def test_realism_target(fixture, metric):
    res = _result(fixture)
    rows = [next((r for r in res["per_seed"][s]["rows_judged"] if r["metric"] == metric), None) for s in SEEDS]
    if all(r is None for r in rows):
        pytest.skip(f"{metric} does not apply to {fixture}")   # e.g. prefix_hit without hash_ids
    bad = [(s, r["source"], r["generated"], r["diff"]) for s, r in zip(SEEDS, rows) if r["verdict"] != "pass"]
    assert not bad, f"{fixture} {metric} outside {rows[0]['kind']} {rows[0]['tolerance']:g}: " + \
        "; ".join(f"seed {s}: {a} -> {b} (diff {d})" for s, a, b, d in bad)
