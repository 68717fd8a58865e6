"""Every fault kind still yields exactly one record per trace row, with the right status."""
from __future__ import annotations

import json
import time

import pytest

from tests.conftest import free_port, wait_s
from tests.replay.runkit import (assert_well_formed, popen_run, records, replay_run, sse_server,
                                 start_sse, stop, wait_t0, write_trace)

# fault mode of the test server -> (status, http_status) of the faulty requests
FAULTS = {
    "http500": ("http_error", 500),
    "http429": ("http_error", 429),
    "stall": ("timeout", 200),
    "drop": (("connection_error", "protocol_error"), 200),
    "malformed": ("protocol_error", 200),
    "error_in_stream": ("http_error", 200),
    "empty": ("protocol_error", 200),       # no data event and no [DONE]: not a success
    "gzip": ("protocol_error", 200),        # a Content-Encoding the client did not ask for
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_kinds(tmp_path, fault):
    n = 60
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.005, output_tokens=8)
    with sse_server("--interval", "0.002", "--fault", fault, "--fault-every", "3") as url:
        # a stall never ends: any timeout catches it; a quiet host streams the rest well within 5 s
        replay_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--timeout", str(wait_s(5)))
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique
    assert_well_formed(df)
    status, http = FAULTS[fault]
    bad = df[df.status != "ok"]
    assert len(bad) == n // 3, df.status.value_counts()
    assert bad.status.isin([status] if isinstance(status, str) else status).all(), bad.status.value_counts()
    assert (bad.http_status == http).all() and bad.error.notna().all()
    assert (df[df.status == "ok"].completion_tokens == 8).all()


def test_connection_refused(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 20)
    p = replay_run(trace, f"http://127.0.0.1:{free_port()}", tmp_path / "run", "--model-map", "*=m", check=False)
    assert p.returncode == 1 and "status: all_failed" in p.stdout    # nothing succeeded: not a success
    df = records(tmp_path / "run")
    assert len(df) == 20 and (df.status == "connection_error").all()
    assert df.error.notna().all() and df.sent_s.isna().all() is not None


def test_target_killed_and_restarted_mid_run(tmp_path):
    # 10 s of trace at 20 req/s; the server is down from 0.8 s until its restart is ready (~1.6 s
    # quiet, several seconds on a busy host): the long tail keeps the verdict decisive either way
    n = 200
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.05, output_tokens=4)
    port = free_port()
    srv = start_sse("--interval", "0.002", port=port)
    url = srv.url
    run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--timeout", "2")
    try:
        t0 = wait_t0(tmp_path / "run", proc=run)
        time.sleep(max(0.0, t0 + 0.8 - time.time()))
        stop(srv)
        down = time.time() - t0
        time.sleep(0.8)
        srv = start_sse("--interval", "0.002", port=port)
        up = time.time() - t0
        out, err = run.communicate(timeout=wait_s(90))
    finally:
        stop(srv)
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert up < 8, f"the restarted server was ready only {up:.1f} s into a 10 s trace"
    df = records(tmp_path / "run").sort_values("scheduled_s")
    assert len(df) == n
    assert_well_formed(df)
    failed = df[df.status != "ok"]
    assert len(failed) > 0 and failed.status.isin(["connection_error", "protocol_error"]).all()
    # nothing fails before the kill or once the restarted server is up (a request in flight at the kill
    # may fail up to its --timeout later; one sent on a pooled dead connection fails at once)
    assert failed.scheduled_s.min() > down - 2.1 and failed.scheduled_s.max() < up + 0.2, \
        (down, up, failed[["scheduled_s", "status"]])
    after = df[df.scheduled_s > up + 0.2]
    assert len(after) > 10 and (after.status == "ok").all(), "requests succeed again after the restart"


# malformed stream events (after two good ones) -> what the record's error must say
BAD_EVENTS = {
    "choices_number": ('{"choices":5}', "choices is 5, not an array"),
    "choices_true": ('{"choices":true}', "choices is true, not an array"),
    "choice_number": ('{"choices":[7]}', "choices[] is 7, not an object"),
    "delta_string": ('{"choices":[{"index":0,"delta":"x"}]}', 'delta is "x", not an object'),
    "tool_calls_object": ('{"choices":[{"index":0,"delta":{"tool_calls":{"a":1}}}]}',
                          'delta.tool_calls is {"a": 1}, not an array'),
    "truncated": ('{"choices":[{"index":0,"text":"', "Unterminated string starting at byte 30 of 31"),
    "not_json": ("garbage", "Expecting value at byte 0 of 7"),
    "array": ("[1,2]", "not a JSON object"),
}


def test_malformed_events_are_protocol_errors_that_say_what_was_wrong(tmp_path):
    names = list(BAD_EVENTS) + ["empty_choices", "empty_choice", "empty_object"]
    trace = write_trace(tmp_path / "t.parquet", len(names), gap_s=0.01, output_tokens=5, model=names)
    data = {**{k: v for k, (v, _) in BAD_EVENTS.items()},
            "empty_choices": '{"choices":[]}', "empty_choice": '{"choices":[{}]}', "empty_object": "{}"}
    mapping = [a for k, v in data.items() for a in ("--model-map", f"{k}=bad-event:{v}")]
    with sse_server() as url:
        replay_run(trace, url, tmp_path / "run", "--api", "completions", *mapping, "--model-map", "*=m",
                   "--max-error-rate", "1")   # 8 of 11 fail on purpose
    df = records(tmp_path / "run").set_index("model")
    assert len(df) == len(names)
    for name, (_, why) in BAD_EVENTS.items():
        r = df.loc[name]
        assert r.status == "protocol_error" and why in r.error, (name, r.status, r.error)
        assert "Error:" not in r.error and len(r.token_times) == 2, (name, r.error)  # not a Python exception's text
    for name in ("empty_choices", "empty_choice", "empty_object"):  # valid JSON without tokens: no fault
        assert df.loc[name].status == "ok" and len(df.loc[name].token_times) == 5, df.loc[name].error


@pytest.mark.slow
def test_empty_or_encoded_200s_fail_the_gate_and_zero_token_successes_are_flagged(tmp_path):
    """Issue 22 item 1: an empty 200 stream or an unrequested gzip body is a protocol error
    naming why, so `error_rate <= 0.001` fails (one failure of 20 proves > 0.0026 at 95 %); a stream of only [DONE] is ok but flagged."""
    from tests.conftest import run_cli
    trace = write_trace(tmp_path / "t.parquet", 20, gap_s=0.005, output_tokens=8)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives: ['error_rate <= 0.001']\n")
    why = {"empty": "no data event and no [DONE]", "gzip": "Content-Encoding gzip that the client did not ask for"}
    for fault, text in why.items():
        with sse_server("--fault", fault) as url:
            p = replay_run(trace, url, tmp_path / fault, "--model-map", "*=m", "--slo", slo, check=False)
        assert p.returncode == 1 and "status: all_failed" in p.stdout, p.stdout   # nothing succeeded
        assert json.loads((tmp_path / fault / "summary.json").read_text())["gate"]["exit_code"] == 1
        # `replay report RUN` writes summary.json again: judged by the run's own --slo, not without it
        (tmp_path / fault / "summary.json").unlink()
        assert run_cli("replay", "report", tmp_path / fault).returncode == 0
        assert json.loads((tmp_path / fault / "summary.json").read_text())["gate"]["exit_code"] == 1
        df = records(tmp_path / fault)
        assert (df.status == "protocol_error").all() and df.error.str.contains(text, regex=False).all(), df.error[0]
        g = run_cli("replay", "gate", tmp_path / fault, "--slo", slo)
        assert g.returncode == 1, g.stdout
    with sse_server("--fault", "done_only") as url:
        out = replay_run(trace, url, tmp_path / "done", "--model-map", "*=m")
    assert (records(tmp_path / "done").status == "ok").all()
    assert "20 of 20 successful requests streamed no token" in out.stdout
    slo.write_text("objectives: ['error_rate <= 0.2']\n")   # 0 of 20 failed proves <= 0.14 at 95 %
    g = run_cli("replay", "gate", tmp_path / "done", "--slo", slo)
    assert g.returncode == 0 and "streamed no token" in " ".join(g.stdout.split()), g.stdout  # rich wraps lines
