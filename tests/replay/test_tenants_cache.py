"""Issue 42, the replay side of controlled experiments: each record keeps its row's tenant
(`client_id`), sent to the server as the body's `user`; `--reset-cache` empties the targets'
prefix caches after the last probe and before T0, and run.json `cache_state` says whether the
run started cold, warm or uncontrolled."""
from __future__ import annotations

import json
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq

from llm_replay.reports.records import load_run
from llm_replay.reports.schema import RECORD_SCHEMA
from llm_replay.replay import plan
from llm_replay.replay.prompts import PromptBuilder
from tests.conftest import run_cli
from tests.replay.runkit import popen_run, records, replay_run, run_info, sse_server, wait_t0, write_trace

TENANTS = ["a", "b", None, "a"]


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_tenant_goes_in_the_body_as_user_and_leaves_the_prompt_as_it_was():
    b = PromptBuilder(plan.RunConfig(trace="t", target="http://x", run_dir="r", block_size=4))
    row = [None] * plan.ROW_LEN
    row[plan.IDX], row[plan.RID], row[plan.IN], row[plan.OUT], row[plan.HASH] = 3, "r3", 12, 4, [7, 8]
    for api in ("completions", "chat"):
        plain = json.loads(b.body(tuple(row), "m", api)[1])
        row[plan.CLIENT] = "tenant-1"
        tagged = json.loads(b.body(tuple(row), "m", api)[1])
        row[plan.CLIENT] = None
        assert tagged.pop("user") == "tenant-1" and "user" not in plain
        assert tagged == plain, api   # the same prompt bytes: the prefix cache sees the same blocks


def test_client_id_reaches_the_server_and_every_record_sent_or_not(tmp_path):
    n = 40
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.1, client_id=(TENANTS * n)[:n])
    log = tmp_path / "requests.jsonl"
    with sse_server("--request-log", str(log), "--interval", "0.01") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--grace", "0.5")
        t0 = wait_t0(tmp_path / "run")
        time.sleep(max(0.0, t0 + 1.0 - time.time()))
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "not_sent").sum() > 10 and (df.status == "ok").sum() > 3
    want = dict(zip(map(str, range(n)), (TENANTS * n)[:n]))
    assert [want[r] for r in df.request_id] == df.client_id.replace({float("nan"): None}).tolist()
    sent = [e["user"] for e in _log(log)]
    assert sent == [want[r] for r in df[df.sent_s.notna()].sort_values("sent_s").request_id]


def test_records_without_client_id_still_load(tmp_path):
    old = pa.schema([f for f in RECORD_SCHEMA if f.name != "client_id"])
    table = pa.Table.from_pylist([{"request_id": "0", "status": "ok", "sent_s": 0.1}], schema=old)
    pq.write_table(table, tmp_path / "records.parquet")
    run = load_run(tmp_path)
    assert run.records.column("client_id").to_pylist() == [None]


def test_reset_cache_comes_after_the_probes_and_the_warmup_and_before_the_first_request(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 4, gap_s=0.01, client_id=["a", "b", "c", "d"])
    for route in ("/reset_prefix_cache", "/flush_cache"):   # vLLM's, else SGLang's
        log = tmp_path / f"requests{route.replace('/', '-')}.jsonl"
        with sse_server("--request-log", str(log), "--reset-route", route) as url:
            p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / route[1:], "--no-progress",
                        "--reset-cache", "--warmup", "2", timeout=120)
        assert p.returncode == 0, p.stderr
        assert run_info(tmp_path / route[1:])["cache_state"]["state"] == "cold"
        assert run_info(tmp_path / route[1:])["cache_state"]["reset"] == route
        # the server's log in order: resets, the trace's requests (with a user), the others (probes, warm-up)
        kinds = ["reset" if "user" not in e else "other" if e["user"] is None else "trace" for e in _log(log)]
        first, last = kinds.index("reset"), len(kinds) - 1 - kinds[::-1].index("reset")
        assert kinds.count("reset") == 2, kinds   # after the probes, and again after the warm-up
        assert "other" in kinds[:first] and "other" in kinds[first:last] and "other" not in kinds[last:], kinds
        assert kinds[last + 1:] == ["trace"] * 4, kinds


def test_reset_cache_without_an_endpoint_is_refused_before_any_request(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 4, gap_s=0.01, client_id=TENANTS)
    log = tmp_path / "requests.jsonl"
    with sse_server("--request-log", str(log)) as url:
        p = replay_run(trace, url, tmp_path / "run", "--reset-cache", check=False)
    assert p.returncode == 2 and p.stderr.count("error:") == 1, p.stderr
    assert "no cache reset endpoint" in p.stderr and "drop --reset-cache to run uncontrolled" in p.stderr, p.stderr
    assert "POST /reset_prefix_cache -> HTTP 400" in p.stderr and "POST /flush_cache -> HTTP 400" in p.stderr, p.stderr
    assert not [e for e in _log(log) if e.get("user")], "a trace row was sent"
    assert not (tmp_path / "run").exists()


def test_cache_state_cold_warm_uncontrolled_per_target(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 4, gap_s=0.01, model=["x", "y", "x", "y"])
    with sse_server("--metrics") as url, sse_server() as plain:
        replay_run(trace, url, tmp_path / "fresh", "--target", f"y={plain}")   # nothing served before it
        replay_run(trace, url, tmp_path / "served", "--target", f"y={plain}")   # the first run's prompts before it
    fresh, served = run_info(tmp_path / "fresh"), run_info(tmp_path / "served")
    assert fresh["cache_state"]["state"] == "cold" and fresh["cache_state"]["reset"] is None
    assert 0 <= fresh["cache_state"]["uptime_s"] < 300
    assert served["cache_state"]["state"] == "warm" and served["targets"][url]["cache_state"]["state"] == "warm"
    assert served["targets"][plain]["cache_state"] == {"state": "uncontrolled", "reset": None, "uptime_s": None}
