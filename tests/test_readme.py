"""Every code block of README.md, executed as written.

The blocks are read from the README itself (not copied here), so a README edit is a test edit.
Each block is claimed by exactly one check below, found by a snippet of its first line; a block
that no check claims fails `test_every_block_is_checked`. Commands run in one working folder, as
a user following the README top to bottom would, with only these substitutions (each asserted to
occur in its block, so they cannot go stale): a free local port for `8000`/`5557` and the hosts the
README names, and this checkout's path for files the README names relative to a clone. Files a
user brings (their CSV log, a trace of theirs) are made here from the test fixtures first.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, free_port
from tests.replay.runkit import sse_server, write_trace

README = REPO / "README.md"
FIX = REPO / "tests" / "traces" / "fixtures"


@dataclass
class Block:
    lang: str
    line: int          # 1-based line of the opening fence
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def readme_blocks() -> list[Block]:
    blocks, lines = [], README.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            blocks.append(Block(m.group(1), i + 1, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


# snippet of a block's first line -> the check that runs it (README order)
CHECKS: dict[str, str] = {
    "pip install torch==2.13.0 -e '.[engine]' && replay demo": "test_quick_start",
    "engine-stub: http://127.0.0.1:": "test_demo_output",
    "replay trace import azure AzureLLMInferenceTrace_code.csv": "test_trace_import_block",
    "replay trace import csv my_log.csv": "test_csv_map_block",
    "replay trace import vidur tests/traces/fixtures/vidur_lengths.csv": "test_lengths_only_block",
    "replay trace import mooncake tests/traces/fixtures/mooncake.jsonl": "test_describe_mooncake",
    "mooncake.parquet: 6 requests": "test_describe_mooncake",
    "replay trace generate --preset bursty": "test_synthetic_block",
    "duration: 3600": "test_spec_yaml",
    "clients:": "test_images_spec_yaml",
    "engine-stub serve --port 8000 &": "test_first_run",
    "replay: trace models -> 'tiny'": "test_first_run",
    "runs/<id>/run.json": "test_first_run",
    "replay run --trace fleet.parquet --target http://10.0.0.5:8000": "test_fleet_block",
    "replay run --trace t.parquet --target http://10.0.0.5:8000": "test_distributed_block",
    "locust -f replay/locustfile.py --host": "test_locust_block",
    "# agents.yaml": "test_agents_spec_yaml",
    "replay trace generate --preset agentic": "test_agentic_block",
    "per_task: {task_s: 120}": "test_agentic_block",
    "replay check --target http://127.0.0.1:8000": "test_check_block",
    "per_request: {ttfa_ms: 2000, tpot_ms: 40}": "test_slo_yamls",
    '{"role": "user", "content": [{"type": "text"': "test_image_content_json",
    "# inside a gevent-patched process": "test_client_python_block",
    "python3 -m pytest -q tests/replay/test_sse.py": "test_verify_block",
    "replay report runs/demo ": "test_report_block",
    "requests: ok 15, http_error 5": "test_gate_errors_block",
    "per_request:            # defines a good request": "test_slo_yamls",
    "[tool.replay.slo]": "test_slo_yamls",
    "from llm_replay import reports": "test_python_api_block",
    "replay sweep --trace t.parquet --target": "test_sweep_block",
    "# test_slo.py": "test_pytest_blocks",
    "pytest test_slo.py --replay-target": "test_pytest_blocks",
    "engine-stub serve                          # tiny model": "test_engine_stub_block",
    "curl -s localhost:8000/v1/completions": "test_engine_stub_block",
    "docker build -f deploy/kubernetes/Dockerfile": "test_kubernetes_block",
}


def block(snippet: str) -> Block:
    found = [b for b in readme_blocks() if snippet in b.first]
    assert len(found) == 1, f"README blocks whose first line has {snippet!r}: {[b.line for b in found]}"
    return found[0]


def test_every_block_is_checked():
    unclaimed = [(b.line, b.first) for b in readme_blocks() if not any(s in b.first for s in CHECKS)]
    assert not unclaimed, f"README code blocks no test runs: {unclaimed}"
    for snippet in CHECKS:
        block(snippet)  # each snippet names exactly one block
    assert set(CHECKS.values()) <= set(globals()), set(CHECKS.values()) - set(globals())


# ---------------------------------------------------------------- running shell lines

def commands(text: str) -> list[str]:
    """The block's shell commands: continuations joined, blank lines dropped (comments stay: bash reads them)."""
    return [c for c in text.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def substitute(text: str, subs: dict[str, str]) -> str:
    for old, new in subs.items():
        assert old in text, f"substitution {old!r} no longer occurs in the README block:\n{text}"
        text = text.replace(old, new)
    return text


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user: the installed package
    e["PYTHONUNBUFFERED"] = "1"
    return e


def sh(cmd: str, cwd: Path, timeout: float = 240, ok=(0,)) -> subprocess.CompletedProcess:
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env(), capture_output=True, text=True,
                       timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode in ok, f"`{cmd}` exited {p.returncode} (expected {ok}):\n{out[-4000:]}"
    assert "Traceback" not in out, f"`{cmd}`:\n{out[-4000:]}"
    return p


def background(cmd: str, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env(), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_http(url: str, timeout: float = 120, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read()
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout} s:\n{log.read_text()[-3000:] if log else ''}")


def same_shape(shown: str, real: str) -> None:
    """Each line shown in the README starts a line of the real output with the same first word;
    header lines (no digits) appear verbatim, spacing aside."""
    norm = [" ".join(line.split()) for line in real.splitlines()]
    for line in shown.splitlines():
        words = line.split()
        if not words or line.strip() == "...":
            continue
        if not re.search(r"\d", line):
            assert " ".join(words) in norm, f"README line {line!r} not in the real output:\n{real[-3000:]}"
        else:
            assert any(n.startswith(words[0]) for n in norm), f"README line {line!r}: no real line starts " \
                                                                f"with {words[0]!r}:\n{real[-3000:]}"


# ---------------------------------------------------------------- shared state: one working folder

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One working folder for the whole README. The quick start's `replay demo` (a 45 s trace)
    starts here in the background at once, so the other blocks run while it replays; the tests
    that read its output come late in this file."""
    folder = tmp_path_factory.mktemp("readme")
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
    folder_demo[folder] = proc
    yield folder
    if proc is not None:
        stop(proc)


folder_demo: dict = {}


@pytest.fixture(scope="module")
def engine(work):
    """The README's `engine-stub serve --port 8000 &`, on a free port; yields its URL."""
    torch = pytest.importorskip("torch")  # noqa: F841
    first = commands(block("engine-stub serve --port 8000 &").text)[0]
    port = free_port()
    cmd = substitute(first, {"8000": str(port)}).split("#")[0].strip().rstrip("&").strip()
    proc = background(cmd, work, work / "engine.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc=proc, log=work / "engine.log")
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def demo(work):
    """The quick start's main job, `replay demo`, exactly as written (after its install): its
    stdout once it has finished."""
    pytest.importorskip("torch")
    proc = folder_demo[work]
    proc.wait(timeout=420)
    out, err = (work / "demo.out").read_text(), (work / "demo.err").read_text()
    assert proc.returncode == 0, f"replay demo exited {proc.returncode}:\n{(out + err)[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    run = Path(re.search(r"^report: (\S+)/report\.html$", out, re.M).group(1))
    (work / "runs" / "demo").symlink_to((work / run).resolve())
    return out + "\n" + err


@pytest.fixture(scope="module")
def first_run(work, engine):
    """The README's first `replay run`, against the README's engine, on a small trace."""
    write_trace(work / "trace.parquet", 24, gap_s=0.05, input_tokens=40, output_tokens=8)
    run = commands(block("engine-stub serve --port 8000 &").text)[1]
    p = sh(substitute(run, {"http://127.0.0.1:8000": engine}), work, timeout=240)
    return p.stdout + p.stderr


# ---------------------------------------------------------------- the checks, in README order

def test_trace_import_block(work):
    shutil.copy(FIX / "azure_2023_code.csv", work / "AzureLLMInferenceTrace_code.csv")
    shutil.copy(FIX / "burstgpt_1.csv", work / "BurstGPT_1.csv")
    for cmd in commands(block("replay trace import azure AzureLLMInferenceTrace_code.csv").text):
        sh(cmd, work)
    assert (work / "back.csv").read_text().splitlines()[0].startswith("TIMESTAMP")
    assert (work / "burst-tiny.parquet").exists() and (work / "hour.parquet").exists()


def test_csv_map_block(work):
    (work / "my_log.csv").write_text("ts,prompt_len,gen_len,engine\n0,120,30,a\n250,800,12,b\n1500,64,200,a\n")
    for cmd in commands(block("replay trace import csv my_log.csv").text):
        sh(cmd, work)
    out = sh("replay trace describe t.parquet --json", work).stdout
    assert json.loads(out)["requests"] == 3


def test_lengths_only_block(work):
    for cmd in commands(block("replay trace import vidur tests/traces/fixtures/vidur_lengths.csv").text):
        sh(substitute(cmd, {"tests/traces/fixtures/": f"{FIX}/"}), work)
    for name in ("lengths", "lengths2"):
        d = json.loads(sh(f"replay trace describe {name}.parquet --json", work).stdout)
        assert d["requests"] == 6 and d["source"]["arrivals"]["synthesized"]


def test_describe_mooncake(work):
    cmds = commands(block("replay trace import mooncake tests/traces/fixtures/mooncake.jsonl").text)
    sh(substitute(cmds[0], {"tests/traces/fixtures/": f"{FIX}/"}), work)
    real = sh(cmds[1], work).stdout
    shown = block("mooncake.parquet: 6 requests").text
    assert shown.splitlines()[0].split(" (")[0] == real.splitlines()[0].split(" (")[0]
    same_shape(shown, real)


def test_synthetic_block(work):
    cmds = commands(block("replay trace generate --preset bursty").text)
    sh("replay trace generate --preset chat --duration 300 --rate 2 -o prod.parquet", work)  # "the user's trace"
    (work / "ServeGen" / "data" / "language").mkdir(parents=True)
    shutil.copytree(FIX / "synth" / "servegen" / "m-test", work / "ServeGen" / "data" / "language" / "m-large")
    for cmd in cmds:
        sh(cmd, work, ok=(0, 1) if "trace compare" in cmd else (0,))     # compare: exit 1 = differs (x4 rate)
    assert (work / "again.parquet").read_bytes() == (work / "bursty.parquet").read_bytes()
    assert (work / "m-large.yaml").exists() and (work / "prod-x4.parquet").exists()


def _generate_from(work: Path, spec_text: str, name: str) -> dict:
    (work / f"{name}.yaml").write_text(spec_text)
    sh(f"replay trace generate --spec {name}.yaml --duration 600 -o {name}.parquet", work)
    return json.loads(sh(f"replay trace describe {name}.parquet --json", work).stdout)


def test_spec_yaml(work):
    d = _generate_from(work, block("duration: 3600").text, "spec")
    assert d["requests"] > 100


def test_images_spec_yaml(work):
    d = _generate_from(work, "duration: 600\nseed: 1\n" + block("clients:").text.replace(
        "  - name: chat\n", "  - name: chat\n    rate: 2\n    input: {dist: lognormal, median: 200, sigma: 0.5}\n"
                             "    output: {dist: lognormal, median: 50, sigma: 0.5}\n", 1), "vision")  # the fragment's rest
    assert d["requests"] > 100 and d["images"]


def test_agents_spec_yaml(work):
    d = _generate_from(work, "duration: 600\nseed: 1\n" + block("# agents.yaml").text, "agents-spec")
    assert d["requests"] > 1000 and d["agents"]["tasks"] > 10


def test_agentic_block(work):
    """The worked agentic example as written: generate, describe, engine-stub with a prefix-cache
    TTL (on a free port), run with chat histories, report with the task SLO."""
    pytest.importorskip("torch")
    (work / "agents-slo.yaml").write_text(block("per_task: {task_s: 120}").text)
    cmds = commands(block("replay trace generate --preset agentic").text)
    for cmd in cmds[:2]:
        sh(cmd, work)
    port = free_port()
    serve = substitute(cmds[2], {"8000": str(port)}).rstrip("&").strip()
    proc = background(serve, work, work / "agents-engine.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc, log=work / "agents-engine.log")
        sh(substitute(cmds[3], {"http://127.0.0.1:8000": url}), work, timeout=300)
        out = sh(cmds[4], work, ok=(0, 1)).stdout
    finally:
        stop(proc)
    rows = pq.read_metadata(work / "agents.parquet").num_rows
    recs = pq.read_table(work / "runs" / "agents" / "records.parquet").to_pandas()
    assert len(recs) == rows and recs.task_id.notna().all()
    assert "Agentic tasks" in out and "task_s.p90 <= 120" in out
    s = json.loads((work / "runs" / "agents" / "summary.json").read_text())
    assert s["tasks"]["tasks"] >= 2 and s["tasks"]["by_depth"][1]["requests"] > 0


def test_first_run(work, engine, first_run):
    shown = block("replay: trace models -> 'tiny'").text
    for line in shown.splitlines():
        if line.startswith("replay: "):  # the choices the run announces
            assert line.split("(")[0].strip() in first_run, first_run[-3000:]
    assert "status: completed  ok 24" in first_run and "run directory: runs/first" in first_run
    listed = re.findall(r"^runs/<id>/(\S+)", block("runs/<id>/run.json").text, re.M)
    present = {p.name for p in (work / "runs" / "first").iterdir()}
    assert set(listed) - {"server_metrics.parquet"} <= present, (listed, present)  # that one only with --scrape


def test_fleet_block(work, monkeypatch):
    import pyarrow as pa
    cmd = commands(block("replay run --trace fleet.parquet --target http://10.0.0.5:8000").text)[0]
    write_trace(work / "fleet.parquet", 20, gap_s=0.01, model=pa.array(["llama-70b", "llama-8b"] * 10))
    monkeypatch.setenv("KEY_70B", "k")
    with sse_server("--model", "small") as small, sse_server("--model", "big") as big:
        sh(substitute(cmd, {"http://10.0.0.5:8000": small, "http://10.0.0.7:8000": big}), work)
    import pyarrow.parquet as pq
    df = pq.read_table(work / "runs" / "fleet" / "records.parquet").to_pandas()
    assert (df.status == "ok").all() and len(df) == 20
    assert set(df[df.model == "llama-70b"].target) == {big} and set(df[df.model == "llama-8b"].target) == {small}


def test_distributed_block(work, engine, first_run):
    master, worker = commands(block("replay run --trace t.parquet --target http://10.0.0.5:8000").text)
    write_trace(work / "t.parquet", 30, gap_s=0.05, input_tokens=30, output_tokens=6)
    port = free_port()
    master = substitute(master, {"http://10.0.0.5:8000": engine, "0.0.0.0:5557": f"127.0.0.1:{port}"})
    worker = substitute(worker, {"master-host:5557": f"127.0.0.1:{port}"}).split("#")[0].strip()
    m = background(master, work, work / "master.log")
    time.sleep(2)
    w = background(worker, work, work / "worker.log")
    try:
        assert m.wait(240) == 0, (work / "master.log").read_text()[-3000:]
        assert w.wait(60) == 0, (work / "worker.log").read_text()[-3000:]
    finally:
        stop(m), stop(w)
    info = json.loads((work / "runs" / "d" / "run.json").read_text())
    assert info["status"] == "completed" and info["status_counts"] == {"ok": 30}


def test_locust_block(work, engine):
    ui, headless, master, worker = commands(block("locust -f replay/locustfile.py --host").text)
    write_trace(work / "t.parquet", 20, gap_s=0.05, input_tokens=30, output_tokens=6)
    lf = {"replay/locustfile.py": str(REPO / "replay" / "locustfile.py")}
    web = free_port()
    ui = substitute(ui, {**lf, "http://127.0.0.1:8000": engine}).split("#")[0].strip() + f" --web-port {web}"
    proc = background(ui, work, work / "locust-ui.log")
    try:
        assert b"locust" in wait_http(f"http://127.0.0.1:{web}/", timeout=60, proc=proc, log=work / "locust-ui.log").lower()
    finally:
        stop(proc, signal.SIGINT)
    sh(substitute(headless, {**lf, "http://127.0.0.1:8000": engine}), work, timeout=120)
    mport = free_port()
    master = substitute(master, {**lf, "--host URL": f"--host {engine}"}) + f" --master-bind-port {mport}"
    worker = substitute(worker, lf).split("#")[0].strip() + f" --master-port {mport}"
    m = background(master, work, work / "locust-master.log")
    ws = [background(worker, work, work / f"locust-worker{i}.log") for i in range(2)]  # "twice"
    try:
        assert m.wait(180) == 0, (work / "locust-master.log").read_text()[-3000:]
    finally:
        for p in (m, *ws):
            stop(p)


def test_check_block(work, engine):
    cmd = commands(block("replay check --target http://127.0.0.1:8000").text)[0]
    out = sh(substitute(cmd, {"http://127.0.0.1:8000": engine}), work).stdout
    assert "stream" in out


def test_slo_yamls(work):
    from llm_replay import reports
    texts = {"reasoning.yaml": block("per_request: {ttfa_ms: 2000, tpot_ms: 40}").text,
             "full.yaml": block("per_request:            # defines a good request").text,
             "pyproject.toml": block("[tool.replay.slo]").text}
    for name, text in texts.items():
        (work / name).write_text(text + "\n")
        spec = reports.load_slo(work / name)
        assert spec.objectives, name


def test_image_content_json():
    from llm_replay.replay.images import Images
    shown = block('{"role": "user", "content": [{"type": "text"').text
    parts = json.loads(b"[" + b"".join(Images().parts(2, "64x64", key=0)) + b"]")
    assert len(parts) == 2 and parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith(
        re.search(r'"url": "([^"]+?)\.\.\."', shown).group(1))


def test_client_python_block(work):
    code = block("# inside a gevent-patched process").text
    prelude = ("from gevent import monkey; monkey.patch_all()\nkey = 'k'\n"
               "body_bytes = b'{\"model\": \"m\", \"prompt\": \"hi\", \"max_tokens\": 5, \"stream\": true}'\n")
    with sse_server("--tokens", "5") as url:
        script = prelude + substitute(code, {"http://127.0.0.1:8000": url}) + "\nprint('status', res.status, len(res.token_times))\n"
        p = subprocess.run([sys.executable, "-c", script], cwd=work, env=env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "status ok 5" in p.stdout, p.stdout


def test_verify_block():
    for cmd in commands(block("python3 -m pytest -q tests/replay/test_sse.py").text):
        args = cmd.split("#")[0].split()
        if args[:3] == ["python3", "-m", "pytest"]:
            assert all((REPO / a).exists() for a in args[4:])       # those files run in this suite
        else:
            assert (REPO / args[1]).exists()
            sh(f"{sys.executable} {REPO / args[1]} --help", REPO, timeout=60)
def test_engine_stub_block(work):
    pytest.importorskip("torch")
    lines = commands(block("engine-stub serve                          # tiny model").text)
    procs = []
    try:
        for i, line in enumerate(lines):
            cmd, port = line.split("#")[0].strip(), free_port()
            cmd = (substitute(cmd, {"--port 0": f"--port {port}"}) if "--port 0" in cmd
                   else f"{cmd} --port {port}")
            log = work / f"engine{i}.log"
            procs.append(background(cmd, work, log))
            wait_http(f"http://127.0.0.1:{port}/v1/models", proc=procs[-1], log=log)
            if i == 0:  # the curl block, against the first (tiny) engine
                curl = commands(block("curl -s localhost:8000/v1/completions").text)[0]
                out = sh(substitute(curl, {"localhost:8000": f"127.0.0.1:{port}"}), work, timeout=60).stdout
                assert out.rstrip().endswith("data: [DONE]") and '"text"' in out
            stop(procs[-1])
    finally:
        for p in procs:
            stop(p)
def test_kubernetes_block(work, first_run):
    """No cluster here: every file the block names exists, the kustomization builds (where kubectl
    is installed; tests/test_deploy.py validates what it builds), and its `replay` line runs on a
    run directory collected as the block collects it."""
    lines = commands(block("docker build -f deploy/kubernetes/Dockerfile").text)
    kubectl = shutil.which("kubectl")
    for line in lines:
        cmd = line.split("#")[0].strip()
        for path in re.findall(r"deploy/kubernetes[\w./-]*", cmd):
            assert (REPO / path).exists(), f"{path} (in `{cmd}`)"
        if cmd.startswith("kubectl kustomize") and kubectl:
            sh(cmd, REPO, timeout=60)
        if cmd.startswith("kubectl cp"):
            dest = cmd.split()[-1]
            shutil.copytree(work / "runs" / "first", work / dest)
        if cmd.startswith("replay "):
            sh(cmd, work, timeout=120)
    assert any(line.startswith("kubectl apply -k deploy/kubernetes") for line in lines)

def test_gate_errors_block(work):
    shown = block("requests: ok 15, http_error 5").text
    write_trace(work / "e.parquet", 20, gap_s=0.01)
    with sse_server("--fault", "http500", "--fault-every", "4") as url:
        sh(f"replay run --trace e.parquet --target {url} -o runs/errors --no-check --no-progress", work)
    (work / "errors-slo.yaml").write_text("objectives: ['error_rate <= 0.01']\n")
    out = sh("replay gate runs/errors --slo errors-slo.yaml", work, ok=(1,)).stdout
    assert "requests: ok 15, http_error 5" in out and "first errors:" in out, out
    assert re.search(r"^  http_error x5: HTTP 500", out, re.M), out
    assert [line.split(":")[0] for line in shown.splitlines()] == ["requests", "first errors", "  http_error x5"]


def test_quick_start(work, demo):
    install_demo, install_test = commands(block("pip install torch==2.13.0 -e '.[engine]'").text)
    ci = (REPO / ".ci" / "run").read_text()
    # the install half is what .ci/run does (torch pinned first, then the extras); the test half is its last line
    assert "pip install -q torch==2.13.0" in ci and '-e ".[engine,test]"' in ci
    assert install_test.startswith("pip install torch==2.13.0 -e '.[engine,test]' && ")
    assert install_test.split("&&", 1)[1].strip() == ci.strip().splitlines()[-1].strip() == "python3 -m pytest -q"
    assert "headline:" in demo and "SLO gate (exit " in demo
    # the demo closes the loop: engine, trace, replay (one record per row), scrape, report
    run_dir = (work / "runs" / "demo").resolve()
    trace = pq.read_table(f"{run_dir}-trace.parquet")
    records = pq.read_table(run_dir / "records.parquet")
    assert records.num_rows == trace.num_rows > 0
    assert set(records.column("model").to_pylist()) == set(trace.column("model").to_pylist())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["goodput"]["per_request_slo"] and summary["gate"]["rows"]
    assert (run_dir / "server_metrics.parquet").exists()       # the engine's /metrics were scraped
    assert (run_dir / "report.html").stat().st_size > 10_000
    assert "trace models" not in demo       # every trace model is mapped to its own engine model


def test_demo_output(demo):
    same_shape(block("engine-stub: http://127.0.0.1:").text, demo)


def test_report_block(work, demo, first_run):
    shutil.copy(REPO / "examples" / "slo.yaml", work / "slo.yaml")
    for name in ("base", "cand", "a", "b"):
        if not (work / "runs" / name).exists():
            shutil.copytree(work / "runs" / "first", work / "runs" / name)
    (work / "artifacts" / "run").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "reports" / "fixtures" / "profile_export.jsonl", work / "artifacts" / "run")
    shutil.copy(REPO / "tests" / "reports" / "fixtures" / "vllm_detailed.json", work / "vllm-result.json")
    for cmd in commands(block("replay report runs/demo ").text):
        sh(cmd, work, ok=(0, 1, 2) if cmd.startswith("replay gate") else (0,))
    assert (work / "compare.html").exists() and (work / "runs" / "aiperf-bench" / "records.parquet").exists()




def test_python_api_block(work, demo, first_run):
    if not (work / "slo.yaml").exists():
        shutil.copy(REPO / "examples" / "slo.yaml", work / "slo.yaml")
    if not (work / "pyproject.toml").exists():
        (work / "pyproject.toml").write_text(block("[tool.replay.slo]").text + "\n")
    for name in ("a", "b"):
        if not (work / "runs" / name).exists():
            shutil.copytree(work / "runs" / "first", work / "runs" / name)
    code = block("from llm_replay import reports").text + "\nprint('verdict', gate.exit_code, cmp.exit_code)\n"
    p = subprocess.run([sys.executable, "-c", code], cwd=work, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "verdict" in p.stdout


def test_sweep_block(work, engine):
    with_target, no_target = commands(block("replay sweep --trace t.parquet --target").text)
    write_trace(work / "t.parquet", 6, gap_s=0.5, input_tokens=30, output_tokens=6)
    # an SLO that flips with the offered rate, so the search brackets quickly
    (work / "slo.yaml").write_text("objectives:\n  - requests_per_s <= 3\n  - error_rate <= 0.01\n")
    # the two sweeps wait on their traces' schedules, not on the CPU: run them side by side, the
    # second in a folder of its own (both write the default runs/sweep)
    other = work / "sweep-no-target"
    other.mkdir()
    for name in ("t.parquet", "slo.yaml"):
        shutil.copy(work / name, other / name)
    procs = [(cmd, subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for cmd, cwd in ((substitute(with_target, {"http://127.0.0.1:8000": engine}), work),
                              (no_target, other))]
    for cmd, proc in procs:
        out = proc.communicate(timeout=420)[0]
        assert proc.returncode == 0 and "Traceback" not in out, f"`{cmd}`:\n{out[-4000:]}"
        assert "capacity" in out
    assert json.loads((work / "runs" / "sweep" / "sweep.json").read_text())["points"]


def test_pytest_blocks(work):
    pytest.importorskip("torch")
    proj = work / "project"
    (proj / "traces").mkdir(parents=True)
    (proj / "test_slo.py").write_text(block("# test_slo.py").text + "\n")
    shutil.copy(REPO / "examples" / "slo.yaml", proj / "slo.yaml")
    # the user's trace: >= 100 rows, so that p99 objectives can be evaluated (n * (1 - 0.99) >= 1)
    write_trace(proj / "traces" / "chat.parquet", 110, gap_s=0.1, input_tokens=64, output_tokens=8)
    with_target, no_target = commands(block("pytest test_slo.py --replay-target").text)
    # side by side (each waits on its traces' schedules), the second in a copy of the project
    other = work / "project-local-engine"
    shutil.copytree(proj, other)
    with sse_server("--tokens", "8") as url:
        procs = [_pytest(substitute(with_target, {"https://my-deployment.example/": url}), proj),
                 _pytest(no_target, other)]
        for p, _ in procs:
            p.wait(timeout=420)
    for p, log in procs:
        out = log.read_text()
        assert "Traceback" not in out.split("short test summary")[0] or p.returncode == 0, out[-4000:]
        assert p.returncode == 0 and "2 passed" in out, out[-4000:]


def _pytest(cmd: str, cwd: Path) -> tuple[subprocess.Popen, Path]:
    log = cwd / "pytest.log"
    with open(log, "w") as f:
        return subprocess.Popen(["bash", "-c", cmd.split("#")[0] + " -p no:cacheprovider"], cwd=cwd, env=env(),
                                stdout=f, stderr=subprocess.STDOUT), log
