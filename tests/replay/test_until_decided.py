"""Issue 37 item 2: `replay run --slo S --until-decided` replays until the gate is decided, at
looks whose confidences keep the run's error rates (reports/sequential.py), then stops sending;
the gate of the run directory judges the rows the deciding look judged."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm_replay.replay.until import UntilError, extend_trace
from llm_replay.reports.sequential import look_confidence, looks_for
from llm_replay.traces import Trace
from tests.conftest import run_cli
from tests.replay.runkit import records, run_info, sse_server, write_trace


def _run(tmp_path, url, slo: str, *extra, rows=40, gap_s=0.02, name="run"):
    trace = write_trace(tmp_path / "t.parquet", rows, gap_s=gap_s, output_tokens=5)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(slo)
    p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / name, "--slo", spec,
                "--until-decided", "--no-progress", *extra, timeout=120)
    return p, spec


def test_a_clear_pass_stops_at_the_first_look_and_the_gate_judges_that_look(tmp_path):
    with sse_server("--interval", "0.002") as url:
        p, spec = _run(tmp_path, url, "objectives: ['ttft_ms.p50 <= 2000']\n")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    info = run_info(tmp_path / "run")
    u = info["until_decided"]
    assert info["status"] == "decided" and u["decided"] and u["stopped"] and u["look"] == 1
    assert u["judged_rows"] == 16 and u["rows"] == 40 * 8 and u["passes"] == 8
    df = records(tmp_path / "run")
    assert len(df) == u["rows"] and df.request_id.is_unique   # one record per row of every pass
    judged = df[df.scheduled_s <= u["judged_until_s"]]
    assert len(judged) == 16 and (judged.status == "ok").all()
    left = df[df.status == "not_sent"]
    assert len(left) > 200 and (left.error == "decided: the SLO gate reached its verdict").all()
    assert "until decided: passed, decided at look 1" in p.stdout
    g = run_cli("replay", "gate", tmp_path / "run", "--slo", spec, "--json")
    row = json.loads(g.stdout)["rows"][0]
    assert g.returncode == 0 and row["n"] == 16 and row["confidence"] == pytest.approx(look_confidence(0.95, 1))


def test_a_look_waits_for_its_slow_requests_so_failures_are_not_left_out(tmp_path):
    """Every 4th request stalls until its 1.5 s timeout: a look that judged the requests finished so
    far would see only the fast ones; the look at 16 rows waits for all 16 (4 timeouts)."""
    with sse_server("--interval", "0.002", "--fault", "stall", "--fault-every", "4") as url:
        p, _ = _run(tmp_path, url, "objectives: ['error_rate <= 0.1']\n", "--timeout", "1.5", gap_s=0.05)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    u = run_info(tmp_path / "run")["until_decided"]
    df = records(tmp_path / "run")
    judged = df[df.scheduled_s <= u["judged_until_s"]]
    assert len(judged) == u["judged_rows"] and u["decided"]
    assert (judged.status == "timeout").sum() == pytest.approx(len(judged) / 4, abs=1)
    assert [look["rows"] for look in u["looks"]][:1] == [16]


def test_undecided_within_the_budget_exits_2_after_every_look(tmp_path):
    # every 2nd request fails: error_rate sits at its limit 0.5, no run length decides it
    with sse_server("--interval", "0.002", "--fault", "http500", "--fault-every", "2") as url:
        p, _ = _run(tmp_path, url, "objectives: ['error_rate <= 0.5']\n", "--max-requests", "50", "--no-check",
                    "--model-map", "*=sse-test", rows=20,
                    gap_s=0.01)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    info = run_info(tmp_path / "run")
    u = info["until_decided"]
    assert info["status"] == "completed" and not u["decided"] and not u["stopped"]
    assert u["rows"] == 50 and u["judged_rows"] == 50 and len(records(tmp_path / "run")) == 50
    assert [look["rows"] for look in u["looks"]] == [16, 32] and u["look"] == looks_for(50) == 3
    assert "not decided within the budget" in p.stdout


@pytest.mark.parametrize("extra, words", [
    ((), "needs --slo"),
    (("--slo", "S", "--sessions", "closed"), "--sessions closed"),
    (("--max-duration", "10s"), "budget of --until-decided"),
])
def test_refusals_are_one_line(tmp_path, extra, words):
    trace = write_trace(tmp_path / "t.parquet", 5)
    (tmp_path / "S").write_text("objectives: ['error_rate <= 0.5']\n")
    args = [a if a != "S" else str(tmp_path / "S") for a in extra]
    if "--max-duration" not in args:
        args.append("--until-decided")
    p = run_cli("replay", "run", "--trace", trace, "--target", "http://127.0.0.1:9", "-o", tmp_path / "r", *args)
    assert p.returncode == 2 and p.stderr.count("error:") == 1 and words in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r").exists()


def _args(trace, **kw):
    d = {"trace": str(trace), "sessions": "off", "start": 0.0, "duration": None, "max_requests": None,
         "max_duration": None, "speed": 1.0}
    return argparse.Namespace(**{**d, **kw})


def test_passes_of_a_recorded_trace_get_fresh_ids_and_prefix_blocks(tmp_path):
    t = write_trace(tmp_path / "t.parquet", 10, gap_s=0.5, session_id=[f"s{i % 3}" for i in range(10)],
                    hash_ids=[[1, 2, 3 + i] for i in range(10)])
    (tmp_path / "r").mkdir()
    u = extend_trace(_args(t, max_requests=25, speed=2.0), tmp_path / "r")
    out = pq.read_table(tmp_path / "r" / "trace.parquet").to_pandas()
    assert len(out) == u["rows"] == 25 and u["passes"] == 3 and u["how"].startswith("repeated")
    assert out.request_id.is_unique and list(out.request_id[10:12]) == ["0~1", "1~1"]
    assert np.all(np.diff(out.arrival_ns) > 0)                      # one mean gap between passes
    assert out.arrival_ns[10] - out.arrival_ns[9] == 500_000_000 and u["pass_s"] == pytest.approx(2.5)
    assert set(out.session_id[10:20]) == {"s0~1", "s1~1", "s2~1"}
    first, second = {h for x in out.hash_ids[:10] for h in x}, {h for x in out.hash_ids[10:20] for h in x}
    assert not first & second                                        # no pass hits another's cache
    short = extend_trace(_args(t, max_duration=6.0), tmp_path / "r")  # 6 s of trace time: the first 12 rows
    assert short["rows"] == 13 and short["budget"]["max_duration_s"] == 6.0


def test_passes_of_a_generated_trace_are_new_draws_of_its_spec(tmp_path):
    run_cli("replay", "trace", "generate", "--preset", "chat", "--duration", "20", "--seed", "3", "-o",
            tmp_path / "g.parquet", check=True)
    g = Trace.read(tmp_path / "g.parquet").table
    (tmp_path / "r").mkdir()
    u = extend_trace(_args(tmp_path / "g.parquet", max_requests=3 * g.num_rows), tmp_path / "r")
    out = pq.read_table(tmp_path / "r" / "trace.parquet")
    assert u["how"].startswith("regenerated") and out.num_rows == u["rows"] <= 3 * g.num_rows and u["passes"] >= 3
    first = out.column("input_tokens").to_numpy()[:g.num_rows]
    assert np.array_equal(first, g.column("input_tokens").to_numpy())
    nxt = out.column("input_tokens").to_numpy()[g.num_rows:2 * g.num_rows]
    assert not np.array_equal(nxt[:len(first)], first[:len(nxt)])   # seed + 1: another realisation


def test_task_graphs_are_refused(tmp_path):
    t = tmp_path / "g.parquet"
    Trace(pa.table({"arrival_ns": pa.array([0, 1, 2], pa.int64()), "input_tokens": pa.array([5, 5, 5], pa.int32()),
                    "output_tokens": pa.array([2, 2, 2], pa.int32()), "request_id": ["a", "b", "c"],
                    "task_id": ["t", "t", "t"], "depends_on": [None, ["a"], ["b"]]})).write(t)
    (tmp_path / "r").mkdir()
    with pytest.raises(UntilError, match="task-graph"):
        extend_trace(_args(t), tmp_path / "r")
