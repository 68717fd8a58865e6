"""`replay gate`: exit 0 pass, 1 fail, 2 cannot evaluate, through the real CLI and the API."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from llm_replay.reports import evaluate_slo
from tests.conftest import run_cli
from tests.reports.conftest import records
from tests.reports.test_metrics import HAND


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from tests.reports.synth import synth_records, write_run
    return write_run(tmp_path_factory.mktemp("gate") / "run", synth_records(3000, seed=2))


def _slo(tmp_path, text: str):
    p = tmp_path / "slo.yaml"
    p.write_text(text)
    return p


def test_gate_cli_pass_fail_and_cannot_evaluate(run_dir, tmp_path):
    ok = _slo(tmp_path, "objectives: ['ttft_ms.p99 <= 5000', 'error_rate <= 0.05', 'attainment >= 0.9']\n")
    r = run_cli("replay", "gate", run_dir, "--slo", ok)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "ttft_ms.p99 <= 5000" in r.stdout

    fail = tmp_path / "fail.yaml"
    fail.write_text("per_request: {ttft_ms: 100}\nobjectives: ['ttft_ms.p50 <= 5000', 'attainment >= 0.99']\n")
    r = run_cli("replay", "gate", run_dir, "--slo", fail, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert [row["verdict"] for row in out["rows"]] == ["pass", "fail"]
    assert out["rows"][1]["measured"] < 0.99 and out["rows"][1]["ci"][0] <= out["rows"][1]["measured"]

    r = run_cli("replay", "gate", run_dir / "nope", "--slo", ok)
    assert r.returncode == 2 and "no such file or run directory" in r.stderr and "Traceback" not in r.stderr
    bad = _slo(tmp_path, "objectives: ['ttft_ms.p99 <= fast']\n")
    r = run_cli("replay", "gate", run_dir, "--slo", bad)
    assert r.returncode == 2 and "objectives[0]" in r.stderr


def test_too_few_samples_for_a_percentile_bound_is_undecided(tmp_path):
    t = records(HAND)   # two successful requests
    res = evaluate_slo(t, {"objectives": ["ttft_ms.p99 <= 10000"]})
    assert res.exit_code == 2 and res.rows[0].verdict == "undecided" and res.rows[0].more > 100, res.table()
    assert "UNDECIDED" in res.table() and "more requests" in res.table()
    res = evaluate_slo(t, {"objectives": ["ttft_ms.max <= 10000"]})   # max: as measured
    assert res.exit_code == 0 and "pass (as measured)" in res.table()
    # a definite failure outranks an undecided
    res = evaluate_slo(t, {"objectives": ["ttft_ms.p99 <= 10000", "error_rate <= 0.01"]})   # 1 of 3 failed
    assert res.exit_code == 1
    # an empty window cannot be evaluated
    res = evaluate_slo(t, {"objectives": ["attainment >= 0.5"]}, warmup="100s")
    assert res.exit_code == 2 and "no requests" in res.rows[0].note
    # no objectives at all: nothing to gate on
    assert evaluate_slo(t, {"per_request": {"ttft_ms": 100}}).exit_code == 2
    # --as-measured: the point estimate, labelled
    res = evaluate_slo(t, {"objectives": ["ttft_ms.p99 <= 10000"]}, as_measured=True)
    assert res.exit_code == 0 and "pass (as measured)" in res.table() and "--as-measured" in res.table()


def test_a_p90_passes_once_the_samples_prove_it():
    """29 samples under the limit prove a p90 at 95 % (0.9**29 < 0.05); 28 do not."""
    rows = [dict(HAND[1], request_id=f"r{i}", scheduled_s=2.0 + i, sent_s=2.0 + i, first_token_s=2.5 + i,
                 last_token_s=2.5 + i) for i in range(29)]
    res = evaluate_slo(records(rows), {"objectives": ["ttft_ms.p90 <= 10000"]})
    assert res.rows[0].verdict == "pass" and res.rows[0].n == 29 and "pass (95%)" in res.table(), res.table()
    res = evaluate_slo(records(rows[:28]), {"objectives": ["ttft_ms.p90 <= 10000"]})
    assert res.rows[0].verdict == "undecided" and res.rows[0].more == 1, res.table()
    res = evaluate_slo(records(rows[:28]), {"objectives": ["ttft_ms.p90 <= 10000"], "confidence": 0.9})
    assert res.rows[0].verdict == "pass" and "pass (90%)" in res.table(), res.table()


def test_class_objectives_gate_their_subset():
    t = records(HAND)
    spec = {"objectives": ["ttft_ms.max <= 1000"],
            "classes": {"m1": {"objectives": ["ttft_ms.max <= 200"]},
                        "batch": {"objectives": ["ttft_ms.max <= 200"]}}}
    res = evaluate_slo(t, spec)
    assert [(r.scope, r.measured, r.verdict) for r in res.rows] == [
        ("all", pytest.approx(500.0), "pass"), ("m1", pytest.approx(100.0), "pass"),
        ("batch", pytest.approx(500.0), "fail")]
    assert res.exit_code == 1 and "FAIL" in res.table()


@pytest.fixture(scope="module")
def refused_run(tmp_path_factory):
    """A real run on engine-stub with a 256-token context: every 4th of 20 rows is too long (HTTP 400)."""
    pytest.importorskip("torch")
    import numpy as np
    from tests.conftest import start_engine
    from tests.replay.runkit import replay_run, write_trace
    tmp = tmp_path_factory.mktemp("refused")
    trace = write_trace(tmp / "t.parquet", 20, gap_s=0.02, input_tokens=40)
    from llm_replay.traces.trace import Trace
    tb = Trace.read(trace).table
    tb = tb.set_column(tb.column_names.index("input_tokens"), "input_tokens",
                       pa.array(np.where(np.arange(20) % 4 == 3, 300, 40).astype("int32")))
    Trace(tb).write(trace)
    with start_engine("--max-model-len", "256") as engine:
        replay_run(trace, engine.url, tmp / "run", check=True)
    return tmp / "run"


def test_failing_gate_names_the_errors(refused_run, tmp_path):
    slo = _slo(tmp_path, "objectives: ['error_rate <= 0.01', 'ttft_ms.p50 <= 60000']\n")
    r = run_cli("replay", "gate", refused_run, "--slo", slo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "requests: ok 15, http_error 5" in r.stdout
    assert "first errors:\n  http_error x5: HTTP 400: This model's maximum context length is 256 tokens" in r.stdout
    out = json.loads(run_cli("replay", "gate", refused_run, "--slo", slo, "--json").stdout)
    assert out["statuses"] == {"ok": 15, "http_error": 5}
    assert [(e["http_status"], e["count"]) for e in out["first_errors"]] == [(400, 5)]
    # cannot evaluate (exit 2) says so too; a pass does not
    r = run_cli("replay", "gate", refused_run, "--slo", _slo(tmp_path, "objectives: ['ttft_ms.p99 <= 60000']\n"))
    assert r.returncode == 2 and "http_error 5" in r.stdout
    r = run_cli("replay", "gate", refused_run, "--slo", _slo(tmp_path, "objectives: ['error_rate <= 0.5']\n"))
    assert r.returncode == 0 and "first errors" not in r.stdout


def test_first_errors_are_distinct_and_in_schedule_order():
    from llm_replay.reports.gate import FIRST_ERRORS
    rows = [{"status": "ok", "sent_s": 0.0, "first_token_s": 0.1, "last_token_s": 0.2},
            {"status": "http_error", "http_status": 503, "error": "HTTP 503: busy"},
            {"status": "timeout", "error": "no answer in 5 s"},
            {"status": "http_error", "http_status": 503, "error": "HTTP 503: busy"},
            {"status": "connection_error", "error": "reset"}, {"status": "http_error", "http_status": 500}]
    order = [5, 0, 1, 3, 2, 4]   # written out of schedule order (as records finish)
    tb = records([{"request_id": str(i), "scheduled_s": float(i), **rows[i]} for i in order])
    g = evaluate_slo(tb, {"objectives": ["error_rate <= 0.01"]})
    assert g.statuses == {"ok": 1, "http_error": 3, "timeout": 1, "connection_error": 1}
    assert [(e["status"], e["count"]) for e in g.first_errors] == [("http_error", 2), ("timeout", 1),
                                                                    ("connection_error", 1)][:FIRST_ERRORS]
    assert "timeout x1: no answer in 5 s" in g.table()


def _ttft_run(ttft_ms) -> pa.Table:
    """One successful request per TTFT (ms), sent 1 s apart."""
    return records([dict(HAND[1], request_id=f"r{i}", scheduled_s=1.0 + i, sent_s=1.0 + i,
                         first_token_s=1.0 + i + t / 1000, last_token_s=1.0 + i + t / 1000)
                    for i, t in enumerate(ttft_ms)])


def test_a_p99_near_its_limit_never_passes_on_150_requests():
    """Issue 37: lognormal TTFT (median 100 ms, sigma 0.6: true p99 404 ms), 150 requests, limit 368
    (the true p98.5): the point estimate passed 7 of 12 runs; a 95 % bound never passes."""
    import numpy as np
    verdicts = []
    for seed in range(12):
        x = np.random.default_rng(seed).lognormal(np.log(100), 0.6, 150)
        res = evaluate_slo(_ttft_run(x), {"objectives": ["ttft_ms.p99 <= 368"]})
        verdicts.append(res.rows[0].verdict)
        assert res.exit_code != 0, res.table()
    assert "undecided" in verdicts, verdicts


def test_forty_of_forty_above_the_limit_prove_a_p99_fails(tmp_path):
    """40 requests all above 40 ms against `ttft_ms.p99 <= 1`: 40 of 40 beyond the limit prove it."""
    from tests.reports.synth import write_run
    run = write_run(tmp_path / "run", _ttft_run([41 + i for i in range(40)]))
    r = run_cli("replay", "gate", run, "--slo", _slo(tmp_path, "objectives: ['ttft_ms.p99 <= 1']\n"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "fail (95%)" in r.stdout


def test_confidence_and_as_measured_options(tmp_path):
    """`--confidence` sets every verdict's confidence; `--as-measured` judges point estimates."""
    from tests.reports.synth import write_run
    run = write_run(tmp_path / "run", _ttft_run([100.0] * 28))
    slo = _slo(tmp_path, "objectives: ['ttft_ms.p90 <= 200']\n")
    r = run_cli("replay", "gate", run, "--slo", slo)
    assert r.returncode == 2 and "undecided: ~1 more requests" in r.stdout, r.stdout + r.stderr
    r = run_cli("replay", "gate", run, "--slo", slo, "--confidence", "0.9")
    assert r.returncode == 0 and "pass (90%)" in r.stdout and "90% bounds" in r.stdout, r.stdout
    r = run_cli("replay", "gate", run, "--slo", slo, "--as-measured")
    assert r.returncode == 0 and "pass (as measured)" in r.stdout, r.stdout
    r = run_cli("replay", "gate", run, "--slo", slo, "--confidence", "1")
    assert r.returncode == 2 and "confidence" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli("replay", "report", run, "--slo", slo, "--confidence", "0.9", "--json", "--no-write")
    assert r.returncode == 0 and json.loads(r.stdout)["gate"]["rows"][0]["verdict"] == "pass", r.stdout
    from tests.replay.runkit import write_trace
    r = run_cli("replay", "run", "--trace", write_trace(tmp_path / "t.parquet", 2), "--target", "http://127.0.0.1:9",
                "--slo", slo, "--confidence", "95", "-o", tmp_path / "r")
    assert r.returncode == 2 and "confidence" in r.stderr and not (tmp_path / "r").exists(), r.stderr


def test_min_tail_samples_is_refused_but_an_old_runs_own_spec_still_loads(tmp_path):
    from llm_replay.reports import load_slo
    from llm_replay.reports.errors import SloSpecError
    with pytest.raises(SloSpecError, match="min_tail_samples is gone"):
        load_slo(_slo(tmp_path, "objectives: ['ttft_ms.p99 <= 800']\nmin_tail_samples: 10\n"))
    old = tmp_path / "slo.json"   # written by `replay run --slo` before confidence bounds
    old.write_text(json.dumps({"name": None, "objectives": ["ttft_ms.p99 <= 800"], "min_tail_samples": 1.0}))
    assert load_slo(old).confidence == 0.95


def test_proportions_take_exact_bounds():
    """12 requests without an error prove an error rate <= 0.3 (Clopper-Pearson upper bound 0.22),
    not <= 0.01: that takes ~300 requests, and the gate says so."""
    res = evaluate_slo(_ttft_run([50.0] * 12), {"objectives": ["error_rate <= 0.01", "error_rate <= 0.3"]})
    assert [r.verdict for r in res.rows] == ["undecided", "pass"], res.table()
    assert 280 <= 12 + res.rows[0].more <= 320 and res.rows[0].ci[1] > 0.2
