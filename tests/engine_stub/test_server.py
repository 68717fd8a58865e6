"""The OpenAI-compatible server through the official `openai` SDK and raw HTTP: conformance,
error envelopes, metrics, and client disconnects freeing their KV blocks. One engine subprocess."""
import asyncio
import json
import socket
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_replay.engine_stub.tokenizer import Tokenizer
from tests.conftest import start_engine, wait_s

pytest.importorskip("torch")
TOK = Tokenizer(8192)
IDS = list(range(1000, 1040))


@pytest.fixture(scope="module")
def url():
    eng = start_engine()
    yield eng.url
    eng.stop()


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=wait_s(30))


def scrape(url) -> dict:
    """{(sample name, frozenset(labels)): value} and the family types under key 'types'."""
    text = httpx.get(url + "/metrics").text
    out, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    out["types"] = types
    return out


def metric(url, name, **labels) -> float:
    return scrape(url)[(name, frozenset({"model_name": "tiny", **labels}.items()))]


def test_completion_text_prompt_and_usage(client):
    r = client.completions.create(model="tiny", prompt="Hello there, engine", max_tokens=5,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].finish_reason == "length" and isinstance(r.choices[0].text, str)
    assert r.usage.prompt_tokens == len(TOK.encode("Hello there, engine"))
    assert r.usage.completion_tokens == 5 and r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_token_id_prompts_and_vllm_extensions(client):
    r = client.completions.create(model="tiny", prompt=IDS, max_tokens=9, temperature=0.8,
                                  extra_body={"ignore_eos": True, "min_tokens": 9})
    assert r.usage.prompt_tokens == len(IDS) and r.usage.completion_tokens == 9
    # token ids passed the way a client does it for SDK-typed text fields: through extra_body
    r = client.completions.create(model="tiny", prompt="", max_tokens=2, extra_body={"prompt": IDS[:5]})
    assert r.usage.prompt_tokens == 5
    r = client.completions.create(model="tiny", prompt=[IDS, IDS[:7]], max_tokens=3, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.choices[0].text == client.completions.create(model="tiny", prompt=IDS, max_tokens=3,
                                                          temperature=0).choices[0].text
    assert r.usage.prompt_tokens == len(IDS) + 7


def test_streaming_completion_one_event_per_token_then_usage(client):
    stream = client.completions.create(model="tiny", prompt=IDS, max_tokens=12, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    content, final = chunks[:-1], chunks[-1]
    assert len(content) == 12 and all(c.choices[0].text for c in content)
    assert [c.choices[0].finish_reason for c in content] == [None] * 11 + ["length"]
    assert final.choices == [] and final.usage.completion_tokens == 12 and final.usage.prompt_tokens == len(IDS)


def test_chat_completion_and_template_counted(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=4,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(TOK.chat_prompt(messages)) and r.usage.completion_tokens == 4


def test_async_concurrent_chat_streams(url):
    async def one(client, i):
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"stream number {i}"}], max_tokens=7,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        return [c async for c in stream]

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client, i) for i in range(6)))

    for chunks in asyncio.run(main()):
        assert chunks[0].choices[0].delta.role == "assistant"
        texts = [c.choices[0].delta.content for c in chunks[1:-1]]
        assert len(texts) == 7 and all(texts)
        assert chunks[-2].choices[0].finish_reason == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7


def test_stop_string_cuts_text(client):
    full = client.completions.create(model="tiny", prompt=IDS, max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[10:13]
    r = client.completions.create(model="tiny", prompt=IDS, max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]


def test_models_health_version(client, url):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/version").json()["version"]


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b'{"max_tokens": 5}', 400, "prompt"),
    (b'{"prompt": "x", "max_tokens": "many"}', 400, "max_tokens"),
    (b'{"prompt": [1000, 99999]}', 400, "prompt"),
    (b'{"prompt": [1000], "max_tokens": 100000}', 400, "max_tokens"),
    (b'{"prompt": "x", "model": "nope"}', 404, "model"),
])
def test_error_envelopes(url, body, status, param):
    r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    assert err["param"] == param


def test_context_length_message_and_sdk_errors(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        client.completions.create(model="tiny", prompt=IDS, max_tokens=8160)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])


def test_metrics_names_types_labels(url, client):
    client.completions.create(model="tiny", prompt=IDS, max_tokens=3)
    m = scrape(url)
    types = m["types"]
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]:
        assert types[name] == "gauge"
    for name in ["vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"]:
        assert types[name] == "counter", name
    for name in ["vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds"]:
        assert types[name] == "histogram", name
    assert metric(url, "vllm:request_success_total", finished_reason="length") >= 1
    assert metric(url, "vllm:generation_tokens_total") >= 3
    prompt_before = metric(url, "vllm:prompt_tokens_total")
    gen_before = metric(url, "vllm:generation_tokens_total")
    client.completions.create(model="tiny", prompt=IDS[:7], max_tokens=4, extra_body={"ignore_eos": True})
    assert metric(url, "vllm:prompt_tokens_total") == prompt_before + 7
    assert metric(url, "vllm:generation_tokens_total") == gen_before + 4
    assert metric(url, "vllm:inter_token_latency_seconds_bucket", le="0.001") >= 0  # finer than 10 ms
    assert metric(url, "vllm:time_to_first_token_seconds_count") >= 1
    # the same prompt twice: the second is a prefix-cache hit
    before = metric(url, "vllm:prefix_cache_hits_total")
    client.completions.create(model="tiny", prompt=IDS * 2, max_tokens=1)
    client.completions.create(model="tiny", prompt=IDS * 2, max_tokens=1)
    assert metric(url, "vllm:prefix_cache_hits_total") >= before + 64


def wait_idle(url, timeout=30):
    deadline = time.monotonic() + wait_s(timeout)
    while time.monotonic() < deadline:
        if metric(url, "vllm:num_requests_running") == 0 and metric(url, "vllm:kv_cache_usage_perc") == 0:
            return True
        time.sleep(0.05)
    return False


def test_stream_disconnect_aborts_and_frees_blocks(url):
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    body = {"model": "tiny", "prompt": IDS * 10, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=wait_s(30)) as r:
        lines = r.iter_lines()
        events = []
        for ln in lines:
            if ln.startswith("data:"):
                events.append(ln)
                if len(events) == 3:
                    break
        assert metric(url, "vllm:kv_cache_usage_perc") > 0
    assert wait_idle(url)
    assert metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_non_stream_disconnect_aborts_and_frees_blocks(url):
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    host, port = url.split("//")[1].split(":")
    payload = json.dumps({"prompt": IDS * 10, "max_tokens": 1500, "ignore_eos": True}).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    deadline = time.monotonic() + wait_s(20)
    while metric(url, "vllm:num_requests_running") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    s.close()
    assert wait_idle(url)
    assert metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def post_raw(url, body: bytes, path="/v1/completions", ctype: str | None = "application/json"):
    return httpx.post(url + path, content=body, headers={"content-type": ctype} if ctype else {}, timeout=wait_s(60))


def envelope(r, status=400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    return err


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize("body,param", [
    ({"prompt": IDS, "top_k": 10**9}, "top_k"), ({"prompt": IDS, "top_k": -2}, "top_k"),
    ({"prompt": IDS, "top_k": 2**80}, "top_k"),
    ({"prompt": IDS, "seed": 2**80}, "seed"), ({"prompt": IDS, "seed": 2**63}, "seed"),
    ({"prompt": IDS, "stop": ["x"] * 100_000}, "stop"), ({"prompt": IDS, "stop": "x" * 1025}, "stop"),
    ({"prompt": IDS, "stop": ["ok", ""]}, "stop"), ({"prompt": IDS, "stop": 5}, "stop"),
    ({"prompt": IDS, "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": IDS, "stop_token_ids": [8192]}, "stop_token_ids"),
    ({"prompt": IDS, "n": 2}, "n"), ({"prompt": IDS, "max_tokens": 0}, "max_tokens"),
    ({"prompt": IDS, "min_tokens": -1}, "min_tokens"), ({"prompt": IDS, "min_tokens": 2**80}, "min_tokens"),
    ({"prompt": IDS, "temperature": 2.5}, "temperature"), ({"prompt": IDS, "temperature": float("nan")}, "temperature"),
    ({"prompt": IDS, "top_p": 0}, "top_p"), ({"prompt": IDS, "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": IDS, "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": IDS, "repetition_penalty": 0}, "repetition_penalty"), ({"prompt": IDS, "min_p": 2}, "min_p"),
    ({"prompt": IDS, "stream": "maybe"}, "stream"), ({"prompt": IDS, "model": 7}, "model"),
    ({"prompt": ["hi"] * 257}, "prompt"), ({"prompt": [[1000]] * 257}, "prompt"),
    ({**CHAT, "tools": "x"}, "tools"), ({**CHAT, "tools": [{"type": "function", "function": "x"}]}, "tools"),
    ({**CHAT, "tools": [{"function": {"description": "no name"}}]}, "tools"),
    ({**CHAT, "tool_choice": {"type": "function", "function": "x"}}, "tool_choice"),
    ({**CHAT, "tool_choice": "sometimes"}, "tool_choice"),
    ({**CHAT, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
])
def test_hostile_fields_are_400(url, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = post_raw(url, json.dumps(body).encode(), path)  # json.dumps writes NaN, as some clients do
    assert envelope(r)["param"] == param and "choices" not in r.json()


def test_hostile_bodies_are_400_and_the_server_still_serves(url, client):
    prompts, generated = metric(url, "vllm:prompt_tokens_total"), metric(url, "vllm:generation_tokens_total")
    for body in [b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}",
                 b'{"prompt": [1000], "x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}"]:
        assert "valid JSON" in envelope(post_raw(url, body))["message"]
    # 10,000 token lists: refused before anything is tokenized or generated (vLLM has no cap; engine-stub 256)
    r = httpx.post(url + "/v1/completions", json={"prompt": [IDS[:2]] * 10_000, "max_tokens": 1}, timeout=wait_s(60))
    assert envelope(r)["param"] == "prompt" and "256" in r.json()["error"]["message"]
    ok = json.dumps({"prompt": IDS[:3], "max_tokens": 1}).encode()
    for ctype in ["text/plain", "application/x-www-form-urlencoded", None]:   # vLLM: 400, not 415
        assert "application/json" in envelope(post_raw(url, ok, ctype=ctype))["message"]
    assert metric(url, "vllm:prompt_tokens_total") == prompts
    assert metric(url, "vllm:generation_tokens_total") == generated
    for ctype in ["application/json; charset=utf-8", "Application/JSON"]:
        assert post_raw(url, ok, ctype=ctype).status_code == 200
    # the edges that stay accepted, as vLLM: seed -1 (= no seed) and the int64 range, top_k -1 / 0 / vocab
    for extra in [{"seed": -1}, {"seed": 2**63 - 1}, {"seed": -2**63}, {"top_k": -1}, {"top_k": 8192},
                  {"stop": ["x" * 1024] * 64, "stop_token_ids": [0, 8191, 8191]}, {"prompt": [IDS[:2]] * 256}]:
        r = httpx.post(url + "/v1/completions", json={"prompt": IDS[:3], "max_tokens": 1, **extra}, timeout=wait_s(60))
        assert r.status_code == 200, (extra, r.text)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto",
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    body = {**CHAT, "tools": [{"function": {"name": "f", "parameters": {"required": 5}}}], "tool_choice": "required"}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=wait_s(60)).status_code == 200  # schemas: unchecked
