"""`replay sweep`'s search with the SLO gate's three verdicts: a rate that cannot be evaluated
(gate exit 2) bounds the capacity neither from below nor from above.

`Sweeper.measure` (replay the trace at a rate, gate the run) is replaced by a rule of the rate,
so that these tests drive the search algorithm itself; tests/integration/test_sweep_*.py run
real sweeps end to end."""
from __future__ import annotations

import json

import pytest

from llm_replay.replay import sweep
from llm_replay.replay.cli import main
from llm_replay.replay.sweep import Point, Sweeper
from llm_replay.reports.gate import GateResult, GateRow
from tests.replay.runkit import write_trace

WHY = "tainted: the replay fell behind its schedule (client CPU saturated)"


def rule(rate: float) -> str:
    """Passes below 4 req/s, cannot be evaluated from 4 to 6, fails above 6."""
    return "pass" if rate < 4 else "cannot evaluate" if rate <= 6 else "fail"


@pytest.fixture
def tried(monkeypatch):
    """The rates measured, in order; `Sweeper.measure` answers by `rule`."""
    rates = []

    def measure(self, rate):
        rates.append(rate)
        verdict = rule(rate)
        code = {"pass": 0, "fail": 1, "cannot evaluate": 2}[verdict]
        return Point(rate, rate / self.native, code == 0, code, 0.99 if code == 0 else 0.5, min(rate, 4.0),
                     100.0 * rate, 20.0, str(self.out / f"rate-{rate:g}"), verdict,
                     WHY if verdict == "cannot evaluate" else None)

    monkeypatch.setattr(Sweeper, "measure", measure)
    return rates


def sweep_cli(tmp_path, *args, gap_s=1.0):
    """`replay sweep` in process (its runs answered by `rule`): exit code, sweep.json."""
    trace = write_trace(tmp_path / "t.parquet", 6, gap_s=gap_s)   # native rate 1 / gap_s
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - error_rate <= 0.01\n")
    out = tmp_path / "sweep"
    code = main(["sweep", "--trace", str(trace), "--target", "http://127.0.0.1:9", "--slo", str(slo),
                 "-o", str(out), *map(str, args)])
    return code, json.loads((out / "sweep.json").read_text())


def verdicts(result):
    return {p["rate"]: p["verdict"] for p in result["points"]}


def test_unjudged_rate_is_no_upper_bound_and_the_listed_rates_go_on(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--rates", "1,2,4,8", "--max-runs", "10")
    out = capsys.readouterr().out
    assert code == 0
    # 4 could not be judged: 8 is still tried, and only its failure bounds the capacity
    assert tried[:4] == [1, 2, 4, 8]
    assert len(tried) == 10 == len(set(tried))
    # bisection fills the gap below the unjudged rate first, then the one between it and the failure
    assert tried[4:7] == [2.828, 3.363, 3.668]
    assert all(4 < r < 8 for r in tried[7:])
    assert result["capacity_rps"] == 3.668
    assert result["capacity_bracketed"] is True and result["upper_rps"] == 8
    assert result["inconclusive_rps"] == sorted(r for r in tried if 4 <= r <= 6)
    assert result["inconclusive_rps"][0] == 4
    v = verdicts(result)
    assert v[4] == "cannot evaluate" and v[8] == "fail" and v[3.668] == "pass"
    p4 = next(p for p in result["points"] if p["rate"] == 4)
    assert p4["passed"] is False and p4["exit_code"] == 2 and p4["reason"] == WHY  # `passed` kept
    assert all(p["reason"] is None for p in result["points"] if p["verdict"] != "cannot evaluate")
    # the per-point line, the table and the capacity line tell unjudged rates from failing ones
    assert f"-> cannot evaluate ({WHY})" in out
    assert "-> FAIL" in out and "-> pass" in out
    rows = {line.split("|")[0].strip(): line.split("|")[1].strip()
            for line in out.splitlines() if line.count("|") == 5}
    assert rows["rate req/s"] == "verdict"
    assert rows["4"] == "cannot evaluate" and rows["8"] == "FAIL" and rows["3.67"] == "pass"
    assert "highest rate meeting the SLO" not in out
    assert (f"capacity: at least 3.67 req/s (8 req/s failed); 4, 4.36, 4.76 and 5.66 req/s could not "
            f"be evaluated ({WHY})") in out
    page = (tmp_path / "sweep" / "capacity.html").read_text()
    assert 'class="unjudged"' in page and "cannot evaluate" in page and "at least 3.668 req/s" in page


def test_doubling_stops_at_an_unjudged_rate_which_bounds_nothing(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--max-runs", "10")   # starts at the trace's rate, 1 req/s
    out = capsys.readouterr().out
    assert code == 0
    # 4 could not be judged: the search goes lower, as after a failure, and bisects below it
    assert tried == [1, 2, 4, 2.828, 3.363, 3.668]
    assert result["capacity_rps"] == 3.668
    assert result["capacity_bracketed"] is False and result["upper_rps"] is None  # no rate failed
    assert result["inconclusive_rps"] == [4]
    assert f"capacity: at least 3.67 req/s; 4 req/s could not be evaluated ({WHY})" in out


def test_halving_passes_over_unjudged_rates(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--max-runs", "10", gap_s=0.2)   # starts at 5 req/s
    out = capsys.readouterr().out
    assert code == 0
    assert tried[:2] == [5, 2.5]        # unjudged: halve, as after a failure
    assert tried[2:5] == [3.536, 4.205, 3.856]
    assert result["capacity_rps"] == 3.856 and result["capacity_bracketed"] is False
    assert set(result["inconclusive_rps"]) >= {4.205, 5}
    assert "capacity: at least 3.86 req/s; " in out and "highest rate meeting the SLO" not in out


def test_unjudged_midpoint_does_not_end_the_bisection(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--rates", "1,8", "--max-runs", "10")
    assert code == 0
    assert tried[:4] == [1, 8, 2.828, 4.756]
    # 4.756 could not be judged: next, the midpoint between the highest pass and it
    assert tried[4] == 3.667
    assert len(tried) == 10
    v = verdicts(result)
    # a real failure below 8 was still found, above every unjudged rate
    fails = [r for r, x in v.items() if x == "fail"]
    assert result["upper_rps"] == min(fails) < 8 and result["capacity_bracketed"] is True
    cap = result["capacity_rps"]
    assert v[cap] == "pass" and cap == max(r for r, x in v.items() if x == "pass") < 4
    assert result["inconclusive_rps"] == sorted(r for r, x in v.items() if x == "cannot evaluate")
    assert all(cap < r < result["upper_rps"] for r in result["inconclusive_rps"])


def test_bracketed_capacity_without_unjudged_rates_is_the_highest_passing_rate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Sweeper, "measure", lambda self, rate: Point(
        rate, rate, rate < 3, 0 if rate < 3 else 1, None, None, None, None, "r"))
    code, result = sweep_cli(tmp_path, "--rates", "1,2,4", "--max-runs", "4")
    out = capsys.readouterr().out
    assert code == 0 and result["capacity_bracketed"] is True and result["inconclusive_rps"] == []
    assert verdicts(result) == {1: "pass", 2: "pass", 2.828: "pass", 4: "fail"}   # verdict from exit_code
    assert "capacity (highest rate meeting the SLO): 2.83 req/s" in out


def test_nothing_judged_exits_2(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--rates", "4,5", "--max-runs", "5")
    out = capsys.readouterr().out
    assert code == 2                    # the gate's convention: cannot evaluate
    assert result["capacity_rps"] is None and result["capacity_bracketed"] is False
    assert tried == [4, 5]
    assert f"capacity: unknown; 4 and 5 req/s could not be evaluated ({WHY})" in out
    assert "no tried rate meets the SLO" not in out


def test_unjudged_rates_are_halved_within_the_budget(tmp_path, monkeypatch, capsys):
    tried = []
    monkeypatch.setattr(Sweeper, "measure", lambda self, rate: tried.append(rate) or Point(
        rate, rate, False, 2, None, None, None, None, "r", reason="ttft_ms.p99 needs n >= 100"))
    code, result = sweep_cli(tmp_path, "--max-runs", "3")
    assert code == 2 and tried == [1, 0.5, 0.25]
    assert {p["verdict"] for p in result["points"]} == {"cannot evaluate"}
    assert ("capacity: unknown; 0.25, 0.5 and 1 req/s could not be evaluated (ttft_ms.p99 needs n >= 100)"
            in capsys.readouterr().out)


def test_no_passing_rate_but_a_failure_exits_1(tmp_path, tried, capsys):
    code, result = sweep_cli(tmp_path, "--rates", "5,7", "--max-runs", "5")
    out = capsys.readouterr().out
    assert code == 1
    assert tried == [5, 7]
    assert f"capacity: no tried rate meets the SLO; 5 req/s could not be evaluated ({WHY})" in out


def test_gate_reason_is_the_notes_of_the_rows_that_could_not_be_evaluated():
    rows = [GateRow("ttft_ms.p99 <= 500", "all", 80.0, 500, 20, None, "undecided", more=279),
            GateRow("e2e_ms.p99 <= 900", "all", None, 900, 20, None, "cannot evaluate", WHY),
            GateRow("error_rate <= 0.01", "all", 0.0, 0.01, 20, None, "pass", "limit inside the CI"),
            GateRow("tpot_ms.p50 <= 50", "all", None, 50, 0, None, "cannot evaluate", WHY)]
    assert sweep.gate_reason(GateResult(rows, 1.0, 2.0)) == f"ttft_ms.p99 <= 500 undecided: ~279 more requests; {WHY}"
    assert sweep.gate_reason(GateResult([], None, None, ["the SLO spec has no objectives to gate on"])) \
        == "the SLO spec has no objectives to gate on"


def test_a_target_that_died_mid_sweep_gives_no_capacity_that_passed(tmp_path, monkeypatch, capsys):
    """Issue 36 item 3: the target answered up to 5 req/s, then died: the later rates, where every
    request failed, measured nothing; the capacity is a lower bound and the sweep exits 2."""
    def measure(self, rate):
        dead = rate > 5
        return Point(rate, rate / self.native, not dead, 1 if dead else 0, 0.0 if dead else 0.99, None, None, None,
                     str(self.out / f"rate-{rate:g}"), "cannot evaluate" if dead else "pass",
                     "every request failed (connection_error x20: refused)" if dead else None, dead)
    monkeypatch.setattr(Sweeper, "measure", measure)
    code, result = sweep_cli(tmp_path, "--rates", "5,10", "--max-runs", "4")
    out = capsys.readouterr().out
    assert code == 2, out
    assert result["capacity_rps"] == 5 and not result["capacity_bracketed"]
    assert "capacity: at least 5 req/s" in out and "every request failed" in out, out
