"""Issue 36: the life cycle of `replay run`. Nothing is sent to a target that does not serve the
mapped model; the run directory is claimed atomically (two runs with one -o: one runs, the other
is refused); a run that cannot write its records (a full disk) stops with one `error:` line and a
run.json that says so, and its reports and gates say the run did not finish, as they do for a
SIGKILLed run; the exit code says when more requests failed than --max-error-rate allows;
--realtime beside a local target is warned about."""
from __future__ import annotations

import json
import resource
import signal
import time

import pytest

from tests.conftest import free_port, run_cli, wait_s
from tests.replay.runkit import popen_run, records, replay_run, run_info, sse_server, wait_t0, write_trace

SLO = "objectives: ['error_rate <= 0.5', 'ttft_ms.p50 <= 60000']\n"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_wrong_model_is_refused_before_any_request_is_sent(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 10, gap_s=0.01)
    log = tmp_path / "requests.jsonl"     # every completion request for the served model
    with sse_server("--strict-model", "--model", "served-a", "--request-log", str(log)) as url:
        p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "run", "--no-progress",
                    "--model-map", "*=nope", timeout=120)
        assert p.returncode == 2 and "does not serve 'nope'" in p.stderr, p.stderr
        assert log.read_text() == "", "the refused run sent requests"
        assert not (tmp_path / "run").exists(), "a refused run leaves no run directory"
        # the log sees the probe's requests where the mapping is right
        ok = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "ok", "--no-progress",
                     "--model-map", "*=served-a", "--max-requests", "1", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(log.read_text().splitlines()) > 1


def test_two_runs_with_one_directory_one_runs_the_other_is_refused(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 40, gap_s=0.01)
    with sse_server() as url:
        for trial in range(2):   # one trial showed the race on the old code (both exit 0, or one crashed)
            out = tmp_path / f"run{trial}"
            procs = [popen_run(trace, url, out, "--model-map", "*=m") for _ in range(2)]
            done = [p.communicate(timeout=wait_s(120)) + (p.returncode,) for p in procs]
            codes = sorted(d[2] for d in done)
            assert codes == [0, 2], done
            loser = next(d for d in done if d[2] == 2)
            assert _errors(loser[1]) == [loser[1].strip()], loser[1]
            assert str(out) in loser[1] and "already holds a run" in loser[1], loser[1]
            assert run_info(out)["status"] == "completed" and len(records(out)) == 40


def test_out_naming_a_file_is_one_error_line(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 5, gap_s=0.01)
    (tmp_path / "file").write_text("x")
    with sse_server() as url:
        for out in (tmp_path / "file", tmp_path / "file" / "run"):
            p = replay_run(trace, url, out, "--model-map", "*=m", check=False)
            assert p.returncode == 2 and _errors(p.stderr) == [p.stderr.strip()], p.stderr
            assert str(tmp_path / "file") in p.stderr and "a bug" not in p.stderr, p.stderr
    assert (tmp_path / "file").read_text() == "x"


def _file_size_limit(n_bytes: int):
    """The child may write files of at most `n_bytes`: a longer write fails (EFBIG), as one on a
    full disk (ENOSPC) does; Python ignores SIGXFSZ, so the write raises OSError."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, n_bytes))


def test_a_full_disk_stops_the_run_with_one_error_line_and_reports_say_it_did_not_finish(tmp_path):
    n = 2000
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.002, output_tokens=4)
    run = tmp_path / "run"
    with sse_server() as url:
        p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", run, "--no-check", "--no-progress",
                    "--model-map", "*=m", timeout=180, preexec_fn=_file_size_limit(96 * 1024))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "a bug" not in p.stderr, p.stderr
    errors = _errors(p.stderr)
    assert len(errors) == 1 and "File too large" in errors[0] and str(run) in errors[0], p.stderr
    info = run_info(run)
    assert info["status"] == "failed" and "File too large" in info["error"], info
    _assert_unfinished(run, n, "failed")


def _assert_unfinished(run, n: int, status: str) -> None:
    r = run_cli("replay", "report", run, "--no-write")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert f"the run did not finish (run.json status {status})" in text, text
    got = int(text.split("the run did not finish")[1].split(" of ")[0].split()[-1].replace(",", ""))
    assert 0 < got < n and f"of {n:,} trace rows have records" in text, text
    slo = run.parent / "slo.yaml"
    slo.write_text(SLO)
    g = run_cli("replay", "gate", run, "--slo", slo)
    assert g.returncode == 2 and "did not finish" in " ".join(g.stdout.split()), g.stdout + g.stderr
    g = json.loads(run_cli("replay", "gate", run, "--slo", slo, "--json").stdout)
    assert g["exit_code"] == 2 and g["unfinished"].startswith("the run did not finish"), g


def test_a_killed_run_reports_that_it_did_not_finish(tmp_path):
    n = 2000
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.005, output_tokens=4)
    run = tmp_path / "run"
    with sse_server() as url:
        proc = popen_run(trace, url, run, "--model-map", "*=m")
        try:
            t0 = wait_t0(run)
            deadline = time.monotonic() + wait_s(120)   # until some records are flushed, far from the end
            while time.monotonic() < deadline and (not (run / "records.arrows").exists()
                                                   or (run / "records.arrows").stat().st_size < 20_000):
                time.sleep(0.05)
            assert time.time() - t0 < n * 0.005 * 0.8, "the trace was nearly done before any record was flushed"
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=wait_s(60))
        finally:
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + wait_s(60)   # the runner dies with its parent
        while time.monotonic() < deadline and _runner_alive(run):
            time.sleep(0.1)
    assert run_info(run)["status"] == "running"
    _assert_unfinished(run, n, "running")


def _runner_alive(run) -> bool:
    import psutil
    want = ["llm_replay.replay.runner", str(run)]
    return any((p.info["cmdline"] or [])[-2:] == want for p in psutil.process_iter(["cmdline"]))


@pytest.mark.parametrize("args, code", [((), 1), (("--max-error-rate", "0.8"), 0)])
def test_most_requests_failed_exits_1_above_the_error_rate(tmp_path, args, code):
    trace = write_trace(tmp_path / "t.parquet", 40, gap_s=0.01, model=["bad", "bad", "bad", "good"] * 10)
    with sse_server() as url:
        p = replay_run(trace, url, tmp_path / "run", "--model-map", "bad=fault:http500",
                       "--model-map", "good=m", *args, check=False)
    assert p.returncode == code, p.stdout + p.stderr
    limit = "80%" if args else "50%"
    assert f"30 of 40 requests failed (75%" in p.stdout and f"--max-error-rate {limit}" in p.stdout, p.stdout
    assert run_info(tmp_path / "run")["status"] == "completed"


def test_a_few_failures_exit_0_by_default(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 40, gap_s=0.01, model=["bad", "good", "good", "good"] * 10)
    with sse_server() as url:
        p = replay_run(trace, url, tmp_path / "run", "--model-map", "bad=fault:http500",
                       "--model-map", "good=m", check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "10 of 40 requests failed (25%" in p.stdout and "--max-error-rate 50%" in p.stdout, p.stdout
        p = replay_run(trace, url, tmp_path / "strict", "--model-map", "bad=fault:http500",
                       "--model-map", "good=m", "--max-error-rate", "0", check=False)
    assert p.returncode == 1, p.stdout + p.stderr


def test_realtime_beside_a_local_target_is_warned_about(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 5, gap_s=0.01)
    with sse_server() as url:
        p = replay_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--realtime", check=False)
    assert p.returncode == 0, p.stderr
    assert "warning: --realtime with a target on this host" in " ".join(p.stderr.split()), p.stderr
    p = run_cli("replay", "run", "--help")
    assert "same host" in " ".join(p.stdout.split()), p.stdout


def test_a_sweep_point_where_every_request_failed_is_not_a_measured_rate(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 20, gap_s=0.05)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives: ['attainment >= 0.9']\n")
    dead = f"http://127.0.0.1:{free_port()}"
    p = run_cli("replay", "sweep", "--trace", trace, "--target", dead, "--slo", slo, "--rates", "20",
                "--max-runs", "1", "-o", tmp_path / "sweep", "--", "--no-check", "--model-map", "*=m",
                timeout=180)
    assert p.returncode == 2, p.stdout + p.stderr
    point = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["points"][0]
    assert point["verdict"] == "cannot evaluate" and "every request failed" in point["reason"], point
    assert "no tried rate meets the SLO" not in p.stdout, p.stdout
