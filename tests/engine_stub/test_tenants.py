"""Tenants and the prefix cache under control: `--tenant-policy fair` admits a small tenant's requests
past a big tenant's burst (in-process, then through the HTTP `user` field), POST /reset_prefix_cache
and /flush_cache empty the prefix cache (refused while requests hold blocks), and /metrics carries
process_start_time_seconds."""
import concurrent.futures as cf
import statistics
import time

import httpx
import pytest

from tests.conftest import start_engine, wait_s

torch = pytest.importorskip("torch")

from llm_replay.engine_stub.config import PRESETS, EngineConfig  # noqa: E402
from llm_replay.engine_stub.engine import EngineCore  # noqa: E402
from llm_replay.engine_stub.request import EngineRequest, SamplingParams  # noqa: E402

IDS = list(range(3000, 3040))


def burst(tenant_policy: str) -> dict[str, list[tuple[float, int]]]:
    """Tenant a submits 40 requests, then tenant b 4, at once, into an engine of 2 sequences; each
    tenant's (queue seconds, admission rank) per request."""
    torch.set_num_threads(1)
    cfg = EngineConfig(model=PRESETS["micro"], dtype="float32", device="cpu", max_num_seqs=2,
                       tenant_policy=tenant_policy).resolved()
    core = EngineCore(cfg, "t", None)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    reqs = [EngineRequest(f"{t}{i}", [1000 + i] * 24, params, time.perf_counter(), tenant=t)
            for t, n in [("a", 40), ("b", 4)] for i in range(n)]
    for r in reqs:
        core.add(r)
    while core.scheduler.has_work():
        core.step()
    rank = {id(r): k for k, r in enumerate(sorted(reqs, key=lambda r: r.first_scheduled_time))}
    return {t: [(r.first_scheduled_time - r.arrival_time, rank[id(r)]) for r in reqs if r.tenant == t] for t in "ab"}


def test_fair_admits_the_small_tenant_past_the_burst():
    fcfs, fair = burst("fcfs"), burst("fair")
    assert [k for _, k in fcfs["b"]] == [40, 41, 42, 43]   # FCFS: b waits behind all of a's burst
    assert [k for _, k in fair["b"]] == [1, 3, 5, 7]        # fair: a and b alternate from the start
    b_fcfs, b_fair = (statistics.mean(q for q, _ in x["b"]) for x in (fcfs, fair))
    print(f"tenant b mean queue time: fcfs {b_fcfs * 1e3:.1f} ms, fair {b_fair * 1e3:.1f} ms")
    assert b_fair < b_fcfs / 4
    assert sorted(k for _, k in fair["a"] + fair["b"]) == list(range(44))  # nothing lost, FCFS inside a tenant
    assert [k for _, k in fair["a"]] == sorted(k for _, k in fair["a"])


@pytest.fixture(scope="module")
def fair_url():
    eng = start_engine("--model", "micro", "--tenant-policy", "fair", "--max-num-seqs", "1")
    yield eng.url
    eng.stop()


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def post(url: str, body: dict, path="/v1/completions") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=wait_s(60))


def test_user_field_is_the_tenant(fair_url):
    """20 requests of `a`, then 2 of `b`, one sequence at a time: `b` finishes among the first."""
    done: list[str] = []

    def one(user, i):
        body = {"prompt": [1000 + i] * 16, "max_tokens": 64, "ignore_eos": True, "user": user}
        assert post(fair_url, body).status_code == 200
        done.append(user)

    with cf.ThreadPoolExecutor(22) as pool:
        futures = [pool.submit(one, "a", i) for i in range(20)]
        deadline = time.monotonic() + wait_s(30)
        while metric(fair_url, "vllm:num_requests_waiting") < 15 and time.monotonic() < deadline:
            time.sleep(0.01)
        futures += [pool.submit(one, "b", 100 + i) for i in range(2)]
        for f in futures:
            f.result()
    last_b = max(i for i, u in enumerate(done) if u == "b")
    assert len(done) - 1 - last_b >= 8, done   # FCFS would finish every waiting `a` before them


@pytest.mark.parametrize("path", ["/reset_prefix_cache", "/flush_cache"])
def test_reset_endpoints_empty_the_prefix_cache(fair_url, path):
    body = {"prompt": IDS * 2, "max_tokens": 1}
    post(fair_url, body)
    hits = metric(fair_url, "vllm:prefix_cache_hits_total")
    post(fair_url, body)
    assert metric(fair_url, "vllm:prefix_cache_hits_total") >= hits + 64  # the repeat hits
    r = httpx.post(fair_url + path, timeout=wait_s(10))
    assert r.status_code == 200 and r.json() == {"success": True}
    hits = metric(fair_url, "vllm:prefix_cache_hits_total")
    post(fair_url, body)
    assert metric(fair_url, "vllm:prefix_cache_hits_total") == hits       # after the reset: a miss
    assert httpx.get(fair_url + path).status_code == 405


def test_reset_is_refused_while_a_request_holds_blocks(fair_url):
    body = {"prompt": IDS, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", fair_url + "/v1/completions", json=body, timeout=wait_s(30)) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the stream, which aborts the request
        next(ln for ln in lines if ln.startswith("data:"))
        for path, status in [("/reset_prefix_cache", 409), ("/flush_cache", 400)]:
            refused = httpx.post(fair_url + path, timeout=wait_s(10))
            assert refused.status_code == status and "running" in refused.json()["error"]["message"]
    deadline = time.monotonic() + wait_s(30)  # the disconnect frees the blocks: the other tests may reset again
    while metric(fair_url, "vllm:kv_cache_usage_perc") > 0 and time.monotonic() < deadline:
        time.sleep(0.02)


def test_process_start_time(fair_url):
    start = metric(fair_url, "process_start_time_seconds")
    assert time.time() - 600 < start <= time.time()
