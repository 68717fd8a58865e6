"""Issue 22 item 2: a run in which every request failed is not a success. The trace is checked
against the target's /v1/models before anything is sent (a model it does not serve is an exit-2
error naming the served ones, and so are rows longer than max_model_len, with the way out);
after the run the server's own messages are on the terminal, and a run where nothing succeeded
exits 1 with a status that says so; `--exit-code-on-error N` as in Locust."""
from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.replay.runkit import records, run_info, sse_server, write_trace


def _run(trace, url, out, *args, check=True):
    return run_cli("replay", "run", "--trace", trace, "--target", url, "-o", out, "--no-progress", *args,
                   timeout=120, check=False)


def test_a_model_the_target_does_not_serve_is_an_error_before_sending(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 10, gap_s=0.01)
    with sse_server("--strict-model", "--model", "served-a") as url:
        p = _run(trace, url, tmp_path / "run", "--model-map", "*=nope")
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "does not serve 'nope'" in last and "served-a" in last, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run" / "records.parquet").exists()


def test_every_request_failed_exits_1_with_the_servers_words(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 12, gap_s=0.01)
    with sse_server("--strict-model", "--model", "served-a") as url:
        p = _run(trace, url, tmp_path / "run", "--no-check", "--model-map", "*=nope")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "x12: HTTP 404: The model `nope` does not exist." in p.stdout, p.stdout
    assert run_info(tmp_path / "run")["status"] == "all_failed" and "status: all_failed" in p.stdout
    assert len(records(tmp_path / "run")) == 12


def test_rows_longer_than_the_context_are_named_before_the_run(tmp_path):
    import pyarrow as pa
    from llm_replay.traces.trace import Trace
    trace = write_trace(tmp_path / "t.parquet", 20, gap_s=0.01, input_tokens=20, output_tokens=6)
    t = Trace.read(trace).table
    t = t.set_column(t.schema.get_field_index("input_tokens"), "input_tokens", pa.array([20] * 15 + [100] * 5, pa.int32()))
    Trace(t).write(trace)
    with sse_server("--max-model-len", "64") as url:
        p = _run(trace, url, tmp_path / "run")      # the server would refuse 5 rows: none is sent
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith(
            "error: 5 of 20 trace rows need more than 'sse-test''s context (max_model_len 64; input + output tokens "
            "up to 106; request ids 15, 16, 17, ...)") and "--clip-input" in p.stderr, p.stderr
        assert not (tmp_path / "run" / "records.parquet").exists()
        p = _run(trace, url, tmp_path / "sent", "--no-check", "--model-map", "*=m")   # sent as asked: refused
    assert p.returncode == 0, p.stderr
    assert (records(tmp_path / "sent").status == "http_error").sum() == 5
    assert "maximum context length is 64 tokens" in p.stdout


@pytest.mark.slow
def test_exit_code_on_error(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 12, gap_s=0.01)
    with sse_server("--fault", "http500", "--fault-every", "4") as url:
        p = _run(trace, url, tmp_path / "a", "--no-check", "--model-map", "*=m", "--exit-code-on-error", "3")
        assert p.returncode == 3, p.stderr
        p = _run(trace, url, tmp_path / "b", "--no-check", "--model-map", "*=m")
        assert p.returncode == 0, p.stderr
    with sse_server() as url:
        p = _run(trace, url, tmp_path / "c", "--no-check", "--model-map", "*=m", "--exit-code-on-error", "3")
    assert p.returncode == 0, p.stderr


def test_a_runner_that_dies_after_writing_its_records_keeps_them(tmp_path):
    # a stop signal that lands after the runner finalized records.parquet and wrote its status (the
    # decided look of --until-decided racing the run's own end) killed it on its way out; the parent
    # then "salvaged" the run and overwrote 64 ok records with 64 `cancelled: runner died` (seen in CI)
    import json

    from llm_replay.replay.parent import RunInfo, salvage_if_died
    from llm_replay.replay.plan import RunConfig
    from llm_replay.replay.recorder import salvage
    trace = write_trace(tmp_path / "t.parquet", 12, gap_s=0.01)
    with sse_server() as url:
        p = _run(trace, url, tmp_path / "run", "--no-check")
    assert p.returncode == 0, p.stdout + p.stderr
    run = tmp_path / "run"
    before = records(run)
    config = RunConfig.from_json(json.loads((run / "run.json").read_text())["config"])
    assert salvage_if_died(RunInfo(run), config, -2) == 0           # SIGINT's default action
    info = run_info(run)
    assert info["status"] == "completed" and info["runner_exit"] == -2
    assert records(run).equals(before)
    # a death between finalize and the status line: salvage keeps the finished file, adds nothing
    assert salvage(run, config, 1e9) == (12, 0) and (records(run)["status"] == "ok").all()
