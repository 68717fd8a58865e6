"""Server options on real subprocesses: several models and a LoRA adapter, --api-key (401),
--max-waiting (429 + Retry-After), --max-body-bytes (413), KV pressure (preemption), and every
--fault-* flag observable from the client side."""
import concurrent.futures as cf
import contextlib
import subprocess
import sys
import time

import httpx
import openai
import pytest

from llm_replay.engine_stub.faults import FaultConfig, Faults
from tests.conftest import Engine, free_port, repo_env, run_cli, start_engine, wait_s

pytest.importorskip("torch")
KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
IDS = list(range(2000, 2030))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    eng = start_engine("--model", "tiny", "--model", "m2=micro", "--lora", "ad1", "--api-key-file", key_file,
                       "--max-waiting", "2", "--max-num-seqs", "2", "--num-blocks", "40",
                       "--max-body-bytes", "4096")
    yield eng.url
    eng.stop()


def post(url, body, headers=AUTH, **kw):
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=wait_s(60), **kw)


def metric_value(url, name, model="tiny"):
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f'{name}{{model_name="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_api_key(url):
    assert post(url, {"prompt": IDS, "max_tokens": 1}, headers={}).status_code == 401
    r = post(url, {"prompt": IDS, "max_tokens": 1}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert post(url, {"prompt": IDS, "max_tokens": 1}).status_code == 200
    for auth in [f"bearer {KEY}", f"BEARER {KEY}", f"Bearer {KEY}"]:   # the scheme is case-insensitive
        assert post(url, {"prompt": IDS, "max_tokens": 1}, headers={"Authorization": auth}).status_code == 200
    for auth in [f"Basic {KEY}", f"Bearer{KEY}", f"Bearer {KEY.upper()}", KEY, f"Bearer {KEY}x"]:
        assert post(url, {"prompt": IDS, "max_tokens": 1}, headers={"Authorization": auth}).status_code == 401
    assert httpx.get(url + "/health").status_code == 200  # health and metrics stay open
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_models_and_adapters(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "m2", "ad1"}
    assert models["ad1"].model_extra["parent"] == "tiny" and models["tiny"].model_extra["parent"] is None
    outs = {}
    for name in models:
        r = client.completions.create(model=name, prompt=IDS, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.model == name and r.usage.completion_tokens == 8
        outs[name] = r.choices[0].text
    assert len(set(outs.values())) == 3  # three different models
    assert metric_value(url, "vllm:generation_tokens_total", "m2") >= 8


def test_body_too_large(url):
    r = post(url, {"prompt": list(range(1000, 2000)), "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_kv_pressure_preempts_and_still_completes(url):
    # 40 blocks of 16 tokens; two requests growing to 30 + 450 tokens (30 blocks) each cannot both
    # fit: unless the second starts ~280 steps after the first, one of them must be preempted
    before = metric_value(url, "vllm:num_preemptions_total")
    body = {"prompt": IDS, "max_tokens": 450, "ignore_eos": True}
    with cf.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: post(url, body), range(2)))
    assert [r.json()["usage"]["completion_tokens"] for r in results] == [450, 450]
    assert metric_value(url, "vllm:num_preemptions_total") > before


def test_full_waiting_queue_is_429_with_retry_after(url):
    body = {"prompt": IDS, "max_tokens": 500, "ignore_eos": True, "stream": True}
    with contextlib.ExitStack() as stack:
        # two running (max-num-seqs 2), two waiting (max-waiting 2): the fifth is refused
        for _ in range(4):
            r = stack.enter_context(httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH,
                                                 timeout=wait_s(60)))
            assert r.status_code == 200
        r = post(url, {"prompt": IDS, "max_tokens": 1})
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        assert r.json()["error"]["type"] == "RateLimitError"
    deadline = time.monotonic() + wait_s(30)
    while metric_value(url, "vllm:kv_cache_usage_perc") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric_value(url, "vllm:kv_cache_usage_perc") == 0


def test_faults_are_observable():
    """Each request shows the client exactly the faults that --fault-seed drew for it, in arrival order.
    A stall is judged from when the request was sent: the server cannot end the stream sooner than the
    pause after it, however late a busy client reads the events before the pause. (The gap between two
    events the client reads shrinks by that lateness: beside 3 busy pytest workers it fell under the
    pause, and every stall went unseen.) Load can only hide a missing stall, never fail this test."""
    eng = start_engine("--fault-error-rate", "0.2", "--fault-reject-rate", "0.2", "--fault-drop-rate", "0.25",
                       "--fault-malformed-rate", "0.25", "--fault-stall-ms", "400", "--fault-stall-rate", "0.25",
                       "--fault-seed", "1")
    schedule = Faults(FaultConfig(error_rate=0.2, reject_rate=0.2, stall_ms=400, stall_rate=0.25, drop_rate=0.25,
                                  malformed_rate=0.25, seed=1))
    seen = {"500": 0, "429": 0, "drop": 0, "malformed": 0, "stall": 0, "clean": 0}
    try:
        for n in range(30):
            want = schedule.draw()
            body = {"prompt": IDS, "max_tokens": 6, "ignore_eos": True, "stream": True}
            sent = time.monotonic()
            with httpx.stream("POST", eng.url + "/v1/completions", json=body, timeout=wait_s(30)) as r:
                if want.error or want.reject:
                    code = 500 if want.error else 429
                    assert r.status_code == code and r.read() and r.json()["error"]["code"] == code, n
                    seen[str(code)] += 1
                    continue
                assert r.status_code == 200, n
                events, dropped = [], False
                try:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                except httpx.RemoteProtocolError:
                    dropped = True
                took = time.monotonic() - sent
            bad = [e for e in events if e != "[DONE]" and not _is_json(e)]
            assert (dropped, bool(bad), events[-1] == "[DONE]") == (want.drop, want.malformed, not want.drop), n
            assert took >= want.stall_s, (n, took)
            seen["drop"] += dropped
            seen["malformed"] += bool(bad)
            seen["stall"] += bool(want.stall_s)
            seen["clean"] += not (dropped or bad or want.stall_s)
    finally:
        eng.stop()
    assert all(seen.values()), seen   # the seed draws every fault at least once


def _is_json(s):
    import json
    try:
        json.loads(s)
        return True
    except ValueError:
        return False


def test_api_key_sources(tmp_path, monkeypatch, capsys):
    from llm_replay.engine_stub.cli import api_key, build_parser
    parse = build_parser().parse_args
    monkeypatch.setenv("ENGINE_STUB_API_KEY", "from-env")
    assert api_key(parse(["serve"])) == "from-env"
    (tmp_path / "k").write_text("from-file\n")
    assert api_key(parse(["serve", "--api-key-file", str(tmp_path / "k")])) == "from-file"
    assert api_key(parse(["serve", "--api-key", "from-argv"])) == "from-argv"
    monkeypatch.setenv("ENGINE_STUB_API_KEY", "")
    assert api_key(parse(["serve"])) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        api_key(parse(["serve", "--api-key-file", str(tmp_path / "empty")]))
    with pytest.raises(SystemExit):
        parse(["serve", "--help"])
    assert "ENGINE_STUB_API_KEY" in capsys.readouterr().out


def test_bad_flags_exit_2_with_a_message():
    r = run_cli("engine_stub", "serve", "--model", "x=nosuch", "--port", "0", "--api-key", "k", timeout=60)
    assert r.returncode == 2 and "unknown preset 'nosuch'" in r.stderr and "Traceback" not in r.stderr
    # a key on the command line shows in `ps`: warned, with the way out
    assert "--api-key shows the key" in r.stderr and "ENGINE_STUB_API_KEY" in r.stderr


def test_engine_process_mode_503_while_starting_then_serves_and_frees_blocks():
    # the HTTP socket listens before the engine process is up: 503 + Retry-After until then
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llm_replay.engine_stub", "serve", "--port", str(port), "--engine-process",
                             "--model", "m=micro"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=repo_env(), start_new_session=True)
    eng = Engine(proc, f"http://127.0.0.1:{port}")
    try:
        statuses, deadline = [], time.monotonic() + wait_s(90)
        while time.monotonic() < deadline and 200 not in statuses:
            try:
                r = httpx.get(eng.url + "/v1/models", timeout=5)
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.headers["Retry-After"] == "1" and r.json()["error"]["code"] == 503
                time.sleep(0.05)
        assert 503 in statuses and statuses[-1] == 200, statuses
        lines = iter(proc.stdout.readline, "")
        assert f"engine-stub ready: {eng.url}" in (line.strip() for line in lines)
        client = openai.OpenAI(base_url=eng.url + "/v1", api_key="x", max_retries=0)
        chunks = list(client.completions.create(model="m", prompt=IDS, max_tokens=5, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        assert len(chunks) == 6 and chunks[-1].usage.completion_tokens == 5
        body = {"model": "m", "prompt": IDS, "max_tokens": 600, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", eng.url + "/v1/completions", json=body, timeout=wait_s(30)) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + wait_s(30)
        while metric_value(eng.url, "vllm:kv_cache_usage_perc", "m") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric_value(eng.url, "vllm:kv_cache_usage_perc", "m") == 0
        assert metric_value(eng.url, "vllm:generation_tokens_total", "m") < 600
        # the child answers a prefix-cache reset (idle now) and reports its own process start
        assert httpx.post(eng.url + "/reset_prefix_cache", timeout=wait_s(10)).json() == {"success": True}
        assert "\nprocess_start_time_seconds " in httpx.get(eng.url + "/metrics").text
    finally:
        eng.stop()
