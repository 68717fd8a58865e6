"""Per-model targets: `--target MODEL=URL` sends each trace model's rows to its own deployment
(real HTTP, one test server per deployment, each logging what it received)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tests.conftest import run_cli

pytest_plugins = ["pytester"]
from tests.replay.runkit import assert_well_formed, records, run_info, sse_server, write_trace

# rows of model a ask 3 tokens, b 5, rows without a model 7: a server's log says whose rows it got
TOKENS = {"a": 3, "b": 5, None: 7}


def fleet_trace(path, n: int = 30):
    labels = [("a", "b", None)[i % 3] for i in range(n)]
    return write_trace(path, n, gap_s=0.01, model=pa.array(labels, pa.string())), labels


def write_output_tokens(path, labels):
    import pyarrow.parquet as pq
    tab = pq.read_table(path)
    tab = tab.set_column(tab.schema.get_field_index("output_tokens"), "output_tokens",
                         pa.array([TOKENS[m] for m in labels], pa.int32()))
    from llm_replay.traces.trace import Trace
    Trace(tab).write(path)


def logged(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_each_model_goes_to_its_own_deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("KEY_A", "ka")
    monkeypatch.setenv("KEY_B", "kb")
    trace, labels = fleet_trace(tmp_path / "t.parquet")
    write_output_tokens(trace, labels)
    logs = {k: tmp_path / f"{k}.log" for k in ("default", "a", "b")}
    with sse_server("--model", "served-default", "--request-log", str(logs["default"])) as d, \
            sse_server("--model", "served-a", "--request-log", str(logs["a"]), "--api-key", "ka") as a, \
            sse_server("--model", "served-b", "--request-log", str(logs["b"]), "--api-key", "kb") as b:
        out = tmp_path / "run"
        p = run_cli("replay", "run", "--trace", trace, "--target", d, "--target", f"a={a}", "--target", f"b={b}",
                    "--api-key-env", "a=KEY_A", "--api-key-env", "b=KEY_B", "-o", out, "--no-progress",
                    "--scrape", f"b={b}/metrics", timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = records(out)
    assert len(df) == len(labels) and (df.status == "ok").all(), df[["model", "status", "error"]]
    assert_well_formed(df)
    urls = {"a": a, "b": b, None: d}
    served = {"a": "served-a", "b": "served-b", None: "served-default"}
    for _, r in df.iterrows():
        m = r.model if isinstance(r.model, str) else None
        assert r.target == urls[m] and r.target_model == served[m]
    # each deployment received exactly its own rows, with its own model name (and key)
    for name, label in (("default", None), ("a", "a"), ("b", "b")):
        got = logged(logs[name])
        completions = [g for g in got if g["max_tokens"] in TOKENS.values()]   # rows, not probes
        assert len(completions) == labels.count(label)
        assert {g["max_tokens"] for g in completions} == {TOKENS[label]}
        assert {g["model"] for g in completions} == {served[label]}
    info = run_info(out)
    assert set(info["targets"]) == {d, a, b} and info["targets"][a]["models"] == ["a"]
    assert info["config"]["targets"] == {"a": a, "b": b}
    # the report breaks the run down per target
    summary = json.loads((out / "summary.json").read_text())
    per = {r["key"]: r["issued"] for r in summary["breakdowns"]["target"]}
    assert per == {d: labels.count(None), a: labels.count("a"), b: labels.count("b")}
    assert "Per target" in p.stdout


def test_a_model_without_target_is_an_error_before_the_run(tmp_path):
    trace, labels = fleet_trace(tmp_path / "t.parquet")
    with sse_server() as a:
        p = run_cli("replay", "run", "--trace", trace, "--target", f"a={a}", "-o", tmp_path / "run", timeout=60)
    assert p.returncode == 2, p.stderr
    err = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "Traceback" not in p.stderr
    assert "'b' (10 rows)" in err[0] and "(none) (10 rows)" in err[0] and "--target MODEL=URL" in err[0]
    assert not (tmp_path / "run" / "records.parquet").exists()


@pytest.mark.parametrize("targets, message", [
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], "two default targets"),
    (["a=127.0.0.1:9"], "expected an http:// or https:// URL or MODEL=URL"),
    (["a=http://127.0.0.1:9", "a=http://127.0.0.1:10"], "given twice"),
])
def test_bad_target_values(tmp_path, targets, message):
    trace = write_trace(tmp_path / "t.parquet", 3)
    args = [x for t in targets for x in ("--target", t)]
    p = run_cli("replay", "run", "--trace", trace, *args, "-o", tmp_path / "run", timeout=60)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_wrong_key_for_one_deployment_fails_only_its_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("KEY_A", "wrong")
    trace, labels = fleet_trace(tmp_path / "t.parquet", 12)
    with sse_server("--model", "served-default") as d, sse_server("--model", "served-a", "--api-key", "right") as a:
        p = run_cli("replay", "run", "--trace", trace, "--target", d, "--target", f"a={a}", "--no-check",
                    "--model-map", "*=m", "--api-key-env", "a=KEY_A", "-o", tmp_path / "run", "--no-progress",
                    timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    df = records(tmp_path / "run")
    bad = df[df.model == "a"]
    assert (bad.status == "http_error").all() and (bad.http_status == 401).all()
    assert (df[df.model != "a"].status == "ok").all()


@pytest.mark.slow
def test_locustfile_takes_per_model_targets(tmp_path):
    from tests.replay.test_locustfile import LOCUSTFILE
    trace, labels = fleet_trace(tmp_path / "t.parquet", 12)
    with sse_server("--model", "served-default") as d, sse_server("--model", "served-a") as a:
        p = run_cli("locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1", "--host", d,
                    "--target", f"a={a}", "--trace", trace, "--run-dir", tmp_path / "run", "--no-progress",
                    timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    df = records(tmp_path / "run")
    assert len(df) == 12 and (df.status == "ok").all()
    assert set(df[df.model == "a"].target) == {a} and set(df[df.model != "a"].target) == {d}
    assert set(df[df.model == "a"].target_model) == {"served-a"}


PLUGIN_TEST = """
def test_fleet(replay):
    r = replay(TRACE, no_progress=True)
    assert r.metrics["ok"] == 12
    per = {row["key"]: row["issued"] for row in r.summary["breakdowns"]["target"]}
    assert per == {DEFAULT: 8, A: 4}, per
"""


@pytest.mark.slow
def test_pytest_plugin_takes_per_model_targets(tmp_path, pytester, monkeypatch):
    from tests.conftest import repo_env
    trace, labels = fleet_trace(tmp_path / "t.parquet", 12)
    for k, v in repo_env().items():
        monkeypatch.setenv(k, v)
    with sse_server("--model", "served-default") as d, sse_server("--model", "served-a") as a:
        pytester.makepyfile(test_fleet=PLUGIN_TEST.replace("TRACE", repr(str(trace)))
                            .replace("DEFAULT", repr(d)).replace("A:", repr(a) + ":"))
        res = pytester.runpytest_subprocess("--replay-target", d, "--replay-target", f"a={a}",
                                            "-p", "no:cacheprovider", timeout=180)
    res.assert_outcomes(passed=1)


def test_sweep_takes_per_model_targets(tmp_path):
    trace, labels = fleet_trace(tmp_path / "t.parquet", 12)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - error_rate <= 0.5\n")
    with sse_server("--model", "served-default") as d, sse_server("--model", "served-a") as a:
        p = run_cli("replay", "sweep", "--trace", trace, "--target", d, "--target", f"a={a}", "--slo", slo,
                    "--rates", "20", "--max-runs", "1", "-o", tmp_path / "sweep", "--", "--no-progress",
                    timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    point = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["points"][0]
    df = records(point["run_dir"])   # the point ran until decided: passes of the trace, the rest not sent
    sent = df[df.status != "not_sent"]
    assert len(df) == run_info(point["run_dir"])["until_decided"]["rows"] and len(sent) >= 12
    assert (sent.status == "ok").all() and set(sent.model.dropna()) == {"a", "b"}
    assert set(df[df.model == "a"].target) == {a} and set(df[df.model != "a"].target) == {d}
