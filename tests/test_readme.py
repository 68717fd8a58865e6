"""Every code block of README.md, executed as written (the pages of docs/: tests/docs/).

The blocks are read from the README itself, so a README edit is a test edit; each is claimed by
one check below (tests/docs/mdblocks.py says how). Commands run in one working folder laid out as
a clone (`examples/` copied in), as a user following the README top to bottom would, with only
these substitutions: a free local port for `8000`, an SSE test server for the deployment URL, and
this checkout's path for the bundled fixtures. The quick start's `replay demo` starts at once in the background, so the other blocks
run while it replays.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, wait_s
from tests.replay.runkit import sse_server
from tests.docs.mdblocks import (FIX, Page, background, commands, env, same_shape, serve, sh, shown_run_output,
                                 stop, substitute)

README = Page(REPO / "README.md", {
    "pip install torch==2.13.0 -e '.[engine]' && replay demo": "test_quick_start",
    "engine-stub: http://127.0.0.1:": "test_demo_output",
    "engine-stub serve --port 8000 &": "test_load_test_block",
    "replay: trace models -> 'tiny'": "test_load_test_block",
    "per_request:            # a good request": "test_slo_excerpt",
    "replay gate runs/first --slo examples/slo.yaml": "test_gate_block",
    "SLO gate: PASS (exit 0)": "test_gate_block",
    "pytest examples/test_slo.py --replay-target": "test_pytest_example",
    "replay trace generate --preset bursty --duration 600": "test_synthetic_block",
    "metric                 azure-code.parquet": "test_synthetic_block",
})
PAGES = [README]
block = README.block


def test_every_block_is_checked():
    README.assert_checked(globals())


def test_readme_is_a_front_page():
    lines = README.path.read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    titles = [line for line in lines if line.startswith("#") and not line.startswith("#!")]
    titles = [t for t in titles if t not in {b.first for b in README.blocks()}]
    assert len(titles) == len(set(titles)), titles
    for link in re.findall(r"\]\((docs/[^)#]+)", README.path.read_text()):
        assert (REPO / link).exists(), link


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "examples", folder / "examples")
    line = commands(block("pip install torch==2.13.0 -e '.[engine]' && replay demo").text)[0]
    job = line.split("&&", 1)[1].strip()
    assert job == "replay demo"
    proc = None
    try:
        import torch  # noqa: F401
        with open(folder / "demo.out", "w") as out, open(folder / "demo.err", "w") as err:
            proc = subprocess.Popen(["bash", "-c", f"exec {job}"], cwd=folder, env=env(), stdout=out,
                                    stderr=err, start_new_session=True)
    except ImportError:
        pass
    _demo[folder] = proc
    yield folder
    if proc is not None:
        stop(proc)


_demo: dict = {}


@pytest.fixture(scope="module")
def demo(work):
    """The quick start's main job, `replay demo`, exactly as written (after its install): its
    output once it has finished, and its run directory."""
    pytest.importorskip("torch")
    proc = _demo[work]
    proc.wait(timeout=wait_s(420))
    out, err = (work / "demo.out").read_text(), (work / "demo.err").read_text()
    assert proc.returncode == 0, f"replay demo exited {proc.returncode}:\n{(out + err)[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    run = work / re.search(r"^report: (\S+)/report\.html$", out, re.M).group(1)
    return out + "\n" + err, run


@pytest.fixture(scope="module")
def load_test(work):
    """The 'Load-test a deployment' block: engine-stub in the background, then each command."""
    pytest.importorskip("torch")
    serve_line, *rest = commands(block("engine-stub serve --port 8000 &").text)
    proc, url = serve(serve_line, work, work / "engine.log")
    outs = {}
    try:
        for cmd in rest:
            p = sh(substitute(cmd, {"http://127.0.0.1:8000": url}) if "8000" in cmd else cmd, work, timeout=300)
            outs[cmd.split()[1]] = p.stdout + p.stderr
        yield url, outs
    finally:
        stop(proc)


@pytest.mark.slow
def test_load_test_block(work, load_test):
    _, outs = load_test
    assert "stream" in outs["check"]
    rows = pq.read_metadata(work / "chat.parquet").num_rows
    shown_run_output(block("replay: trace models -> 'tiny'").text, outs["run"], rows, "runs/first")
    assert pq.read_metadata(work / "runs" / "first" / "records.parquet").num_rows == rows
    assert "Latency" in outs["report"] and (work / "runs" / "first" / "report.html").exists()


def test_slo_excerpt():
    """The SLO shown is examples/slo.yaml without its per-class part."""
    import yaml
    from llm_replay import reports
    shown = reports.load_slo(yaml.safe_load(block("per_request:").text))
    full = reports.load_slo(REPO / "examples" / "slo.yaml")
    assert [o.text for o in shown.objectives] == [o.text for o in full.objectives]
    assert shown.per_request == full.per_request


@pytest.mark.slow
def test_gate_block(work, load_test):
    cmd = commands(block("replay gate runs/first --slo examples/slo.yaml").text)[0]
    out = sh(cmd, work).stdout
    same_shape(block("SLO gate: PASS (exit 0)").text, out)


@pytest.mark.slow
def test_pytest_example(work):
    """examples/test_slo.py against "your deployment": an SSE test server (the plugin without a
    target, which starts engine-stub, is run by docs/pytest.md's test)."""
    cmd = commands(block("pytest examples/test_slo.py --replay-target").text)[0]
    with sse_server("--tokens", "8") as url:
        p = sh(substitute(cmd.split("#")[0], {"https://my-deployment.example/": url}), work, timeout=400)
    assert "2 passed" in p.stdout, p.stdout[-3000:]


@pytest.mark.slow
def test_synthetic_block(work):
    cmds = commands(block("replay trace generate --preset bursty --duration 600").text)
    for cmd in cmds[:-1]:
        sh(substitute(cmd, {"tests/traces/fixtures/": f"{FIX}/"}) if "fixtures" in cmd else cmd, work)
    real = sh(cmds[-1], work).stdout       # exit 0: every judged metric within tolerance
    same_shape(block("metric                 azure-code.parquet").text, real)
    assert json.loads(sh("replay trace describe bursty.parquet --json", work).stdout)["requests"] > 1000


def test_quick_start(work, demo):
    out, run_dir = demo
    install_demo, install_test = commands(block("pip install torch==2.13.0 -e '.[engine]'").text)
    ci = (REPO / ".ci" / "run").read_text()
    # the install half is what .ci/run does (torch pinned first, then the extras); the test half is one of its
    # lines, followed only by the slow tests' run and the timing tests' own serial run
    assert "pip install -q torch==2.13.0" in ci
    extras = set(re.search(r'-e "\.\[([\w,]+)\]"', ci).group(1).split(","))
    assert {"engine", "test"} <= extras, extras
    assert install_test.startswith("pip install torch==2.13.0 -e '.[engine,test]' && ")
    lines = [ln.strip() for ln in ci.strip().splitlines()]
    assert install_test.split("&&", 1)[1].strip() == "python3 -m pytest -q" == lines[-6]
    assert lines[-4] == "python3 -m pytest -q -m slow" and lines[-1] == "python3 -m pytest -q -m timing -n 0"
    assert "headline:" in out and "SLO gate (exit " in out
    # the demo closes the loop: engine, trace, replay (one record per row), scrape, report
    run_dir = run_dir.resolve()
    trace = pq.read_table(f"{run_dir}-trace.parquet")
    records = pq.read_table(run_dir / "records.parquet")
    assert records.num_rows == trace.num_rows > 0
    assert set(records.column("model").to_pylist()) == set(trace.column("model").to_pylist())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["goodput"]["per_request_slo"] and summary["gate"]["rows"]
    assert (run_dir / "server_metrics.parquet").exists()       # the engine's /metrics were scraped
    assert (run_dir / "report.html").stat().st_size > 10_000
    assert "trace models" not in out       # every trace model is mapped to its own engine model


def test_demo_output(demo):
    same_shape(block("engine-stub: http://127.0.0.1:").text, demo[0])

