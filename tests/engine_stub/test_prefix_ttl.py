"""Agentic prefix reuse on a real engine: a later call that re-sends the earlier conversation as its
prompt prefix is a prefix-cache hit (usage.prompt_tokens_details.cached_tokens, as vLLM), and with
--prefix-cache-ttl a tool delay longer than the TTL loses the hit."""
import json
import random
import time

import httpx
import pytest

from llm_replay.engine_stub.block_manager import BlockManager
from llm_replay.engine_stub.cli import main
from llm_replay.engine_stub.request import EngineRequest, SamplingParams
from tests.conftest import start_engine, wait_s

pytest.importorskip("torch")
RNG = random.Random(7)


@pytest.fixture(scope="module")
def engines():
    plain, ttl = start_engine(), start_engine("--prefix-cache-ttl", "1")
    yield plain.url, ttl.url
    plain.stop()
    ttl.stop()


def call(url: str, prompt: list[int]) -> dict:
    """One streamed completion; returns the final usage chunk's usage."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=wait_s(30)) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert r.status_code == 200 and events[-1]["choices"] == []
    return events[-1]["usage"]


def agent_turns(url: str, pause: float) -> tuple[int, int]:
    """Turn 1 sends a fresh 160-token context; turn 2, `pause` s after turn 1 ends, re-sends it plus
    a tool result. -> (cached tokens of turn 1, of turn 2)."""
    context = [RNG.randrange(1000, 8000) for _ in range(160)]
    first = call(url, context)
    time.sleep(pause)
    second = call(url, context + [RNG.randrange(1000, 8000) for _ in range(20)])
    assert second["prompt_tokens"] == 180
    cached = lambda u: (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)  # noqa: E731
    return cached(first), cached(second)


def hits(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('vllm:prefix_cache_hits_total{model_name="tiny"}'):
            return float(line.split()[-1])
    raise AssertionError("no vllm:prefix_cache_hits_total")


@pytest.mark.timing
def test_later_turn_right_after_hits_the_cache(engines):
    for url in engines:  # with or without the TTL: 1 s is far longer than the gap between turns
        before = hits(url)
        assert agent_turns(url, 0.0) == (0, 160)  # every full block of the shared 160-token context
        assert hits(url) == before + 160


def test_tool_delay_past_the_ttl_loses_the_hit(engines):
    plain, ttl = engines
    assert agent_turns(plain, 1.6) == (0, 160)   # default: kept until the space is needed
    before = hits(ttl)
    assert agent_turns(ttl, 1.6) == (0, 0)       # free for 1.6 s > 1 s: evicted
    assert hits(ttl) == before


def test_block_manager_ttl_counts_from_the_free():
    bm = BlockManager(16, 4, ttl=0.05)
    req = lambda: EngineRequest("r", list(range(1000, 1013)), SamplingParams(), 0.0)  # noqa: E731
    a = req()
    assert bm.allocate(a, 13)
    a.num_computed_tokens = 13
    bm.cache_full_blocks(a)
    time.sleep(0.1)
    assert len(bm.match_prefix(req())) == 3   # held by a running request: never expires
    bm.free_request(a)
    assert len(bm.match_prefix(req())) == 3
    time.sleep(0.1)
    assert bm.match_prefix(req()) == [] and bm.block_hash[0] is None  # its first block evicted


def test_negative_ttl_is_rejected(capsys):
    assert main(["serve", "--prefix-cache-ttl", "-1"]) == 2
    assert "--prefix-cache-ttl must be >= 0" in capsys.readouterr().err
