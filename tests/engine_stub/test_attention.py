"""Paged attention equals a dense reference (fp32, 1e-5): ragged batches, random block
permutations, chunked prefill, prefix hits (shared blocks)."""
import random

import pytest
import torch

from llm_replay.engine_stub.attention import PagedAttention, PagedKVCache
from llm_replay.engine_stub.request import EngineRequest, SamplingParams
from llm_replay.engine_stub.engine import ModelRunner

BS, KVH, H, HD, NBLOCKS = 4, 2, 6, 8, 160


def dense_reference(q, k, v, kv_len):
    """q: [q_len, H, hd] for the last q_len positions; k, v: [kv_len, kvh, hd]. Bottom-right causal."""
    q_len = q.shape[0]
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / HD ** 0.5
    qpos = torch.arange(kv_len - q_len, kv_len)[:, None]
    scores = scores.masked_fill(torch.arange(kv_len)[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_case(seed, seqs, share_prefix_blocks=0):
    """seqs: (tokens already in cache, new tokens) per request. The second request may share its
    first `share_prefix_blocks` physical blocks with the first (a prefix-cache hit)."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    cache = PagedKVCache(1, NBLOCKS, BS, KVH, HD, torch.float32, torch.device("cpu"))
    attn = PagedAttention(cache, HD ** -0.5)
    runner = ModelRunner(None, attn, None, BS, torch.device("cpu"))
    pool = list(range(NBLOCKS))
    rnd.shuffle(pool)  # random block permutation
    reqs, full_k, full_v = [], [], []
    for i, (before, new) in enumerate(seqs):
        total = before + new
        nb = -(-total // BS)
        if i == 1 and share_prefix_blocks:
            table = reqs[0].block_ids[:share_prefix_blocks] + [pool.pop() for _ in range(nb - share_prefix_blocks)]
        else:
            table = [pool.pop() for _ in range(nb)]
        r = EngineRequest(str(i), [1] * total, SamplingParams(), 0.0, block_ids=table, num_computed_tokens=before)
        k = torch.randn(total, KVH, HD, generator=g)
        v = torch.randn(total, KVH, HD, generator=g)
        if i == 1 and share_prefix_blocks:  # the shared prefix holds the first request's K/V
            shared = share_prefix_blocks * BS
            k[:shared], v[:shared] = full_k[0][:shared], full_v[0][:shared]
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(before)], dtype=torch.long)
        if before:
            cache.store(0, slots, k[:before], v[:before])
        reqs.append(r)
        full_k.append(k)
        full_v.append(v)
    items = [(r, n) for r, (_, n) in zip(reqs, seqs)]
    ids, pos, meta, logits_idx, sampling, lora = runner.prepare(items)
    order = sorted(range(len(items)), key=lambda i: items[i][1] != 1)  # the runner's flat order
    qs, ks, vs = [], [], []
    for i in order:
        before, new = seqs[i]
        qs.append(torch.randn(new, H, HD, generator=g))
        ks.append(full_k[i][before:])
        vs.append(full_v[i][before:])
    out = attn(0, torch.cat(qs), torch.cat(ks), torch.cat(vs), meta)
    offset = 0
    for j, i in enumerate(order):
        before, new = seqs[i]
        ref = dense_reference(qs[j], full_k[i], full_v[i], before + new)
        torch.testing.assert_close(out[offset:offset + new], ref, atol=1e-5, rtol=1e-5)
        offset += new
    assert pos.tolist() == [p for i in order for p in range(seqs[i][0], sum(seqs[i]))]


@pytest.mark.parametrize("seed", range(3))
def test_ragged_decode_batch(seed):
    rnd = random.Random(seed)
    run_case(seed, [(rnd.randrange(0, 40), 1) for _ in range(7)])


def test_full_prefill_is_causal():
    run_case(10, [(0, 13), (0, 5), (0, 1)])


@pytest.mark.parametrize("seed", range(3))
def test_chunked_prefill_continuation(seed):
    # q_len < kv_len: the mask must be bottom-right aligned
    run_case(seed, [(9, 7), (4, 12), (15, 1), (0, 6)])


def test_prefix_hit_shares_physical_blocks():
    # request 1 reuses request 0's first 3 blocks and computes only its tail
    run_case(20, [(12, 5), (12, 6), (3, 1)], share_prefix_blocks=3)


def test_mixed_batch_with_all_shapes():
    rnd = random.Random(5)
    seqs = [(rnd.randrange(0, 30), rnd.choice([1, 1, 2, 9])) for _ in range(12)]
    run_case(5, seqs)
