"""Block manager invariants after every operation: free + held == total, ref counts equal the
number of block tables holding a block, the prefix cache maps hashes to blocks that hold them."""
from collections import Counter

from hypothesis import given, settings, strategies as st

from llm_replay.engine_stub.block_manager import BlockManager
from llm_replay.engine_stub.request import EngineRequest, SamplingParams

BS = 4


def check(bm: BlockManager, live: list[EngineRequest]) -> None:
    held = Counter(b for r in live for b in r.block_ids)
    assert len(bm.free) + sum(1 for c in bm.ref_count if c > 0) == bm.num_blocks
    for b in range(bm.num_blocks):
        assert bm.ref_count[b] == held[b], b
        assert (bm.ref_count[b] == 0) == (b in bm.free), b
    for h, b in bm.cached.items():
        assert bm.block_hash[b] == h
    for r in live:  # a request's computed full blocks carry the hash of its own tokens
        bm.compute_hashes(r)
        for i in range(r.num_computed_tokens // BS):
            h = bm.block_hash[r.block_ids[i]]
            assert h is None or h == r.block_hashes[i]


ops = st.lists(st.tuples(st.sampled_from(["add", "grow", "free"]), st.integers(0, 10 ** 6)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(4, 24))
def test_invariants_hold_after_every_operation(ops, num_blocks):
    bm = BlockManager(num_blocks, BS)
    live: list[EngineRequest] = []
    for op, x in ops:
        if op == "add":
            # few distinct prompts with shared prefixes, so the prefix cache gets hits
            prefix = [1000 + (x % 3)] * (BS * (x % 4))
            prompt = prefix + [2000 + x % 5] * (1 + x % 7)
            r = EngineRequest(str(x), prompt, SamplingParams(), 0.0)
            hits = bm.match_prefix(r)
            r.num_computed_tokens = len(hits) * BS
            if bm.allocate(r, r.num_tokens - r.num_computed_tokens, hits):
                r.num_computed_tokens = r.num_tokens
                bm.cache_full_blocks(r)
                live.append(r)
            else:
                assert r.block_ids == []
        elif op == "grow" and live:
            r = live[x % len(live)]
            before = list(r.block_ids)
            if bm.allocate(r, 1):
                r.token_ids.append(3000 + x % 2)
                r.num_computed_tokens += 1
                bm.cache_full_blocks(r)
            else:
                assert r.block_ids == before
        elif op == "free" and live:
            r = live.pop(x % len(live))
            bm.free_request(r)
            bm.free_request(r)  # idempotent
        check(bm, live)


def test_prefix_hit_reuses_blocks_and_lru_evicts_tail_first():
    bm = BlockManager(8, BS)
    a = EngineRequest("a", list(range(1000, 1010)), SamplingParams(), 0.0)  # 2 full blocks + 2
    assert bm.allocate(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.cache_full_blocks(a)
    first_two = a.block_ids[:2]
    b = EngineRequest("b", list(range(1000, 1009)) + [7], SamplingParams(), 0.0)
    assert bm.match_prefix(b) == first_two
    bm.free_request(a)
    assert bm.usage == 0.0
    # the cached blocks survive freeing and are found again
    c = EngineRequest("c", list(range(1000, 1012)), SamplingParams(), 0.0)
    assert bm.match_prefix(c) == first_two
    # filling the pool evicts free blocks, least recently freed first, tail blocks before head blocks
    d = EngineRequest("d", [5] * (6 * BS), SamplingParams(), 0.0)
    assert bm.allocate(d, d.num_tokens)
    assert bm.match_prefix(c) == first_two
    e = EngineRequest("e", [6] * BS, SamplingParams(), 0.0)
    assert bm.allocate(e, e.num_tokens)
    assert bm.match_prefix(c) == first_two[:1]
