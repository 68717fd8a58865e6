"""The KV block pool: reference counts, hash-chained prefix cache, LRU eviction.

A block is free when its ref count is 0. Free blocks that hold a full, hashed block of tokens
stay in the prefix cache until they are reused; the free queue is in LRU order (blocks of a
finished request are queued tail-first, so its last blocks are evicted before its first ones,
as in vLLM). The hash of block i chains the hash of block i-1, so equal hashes mean equal
prefixes, not just equal blocks. With a `ttl` (seconds), a cached block that has been free longer
than that is evicted when a lookup reaches it (lazily: no scans), as under a server's cache pressure.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from .request import EngineRequest


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, ttl: float | None = None) -> None:
        self.num_blocks, self.block_size, self.enable_caching, self.ttl = num_blocks, block_size, enable_caching, ttl
        self.freed_at = [0.0] * num_blocks  # time.monotonic() when the ref count last fell to 0
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}   # hash -> block id

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def compute_hashes(self, req: EngineRequest) -> None:
        """Extend req.block_hashes over every full block of req.token_ids."""
        bs, toks, hashes = self.block_size, req.token_ids, req.block_hashes
        for i in range(len(hashes), len(toks) // bs):
            prev = hashes[-1] if hashes else (req.lora_id or None)
            hashes.append(hash((prev, tuple(toks[i * bs:(i + 1) * bs]))))

    def match_prefix(self, req: EngineRequest) -> list[int]:
        """Cached blocks for the longest computed prefix, leaving at least one token to compute
        (the last prompt token must run through the model to produce logits)."""
        if not self.enable_caching:
            return []
        self.compute_hashes(req)
        hits, now = [], time.monotonic()
        for h in req.block_hashes[: (req.num_tokens - 1) // self.block_size]:
            b = self.cached.get(h)
            if b is not None and self.ttl is not None and self.ref_count[b] == 0 and now - self.freed_at[b] > self.ttl:
                del self.cached[h]  # expired: evict its content (the block stays in the free queue)
                self.block_hash[b] = b = None
            if b is None:
                break
            hits.append(b)
        return hits

    def allocate(self, req: EngineRequest, num_new_tokens: int, hits: list[int] = ()) -> bool:
        """Give req blocks for num_computed + num_new_tokens tokens (taking the cache hits first).
        Returns False, changing nothing, when the pool is too small."""
        need_total = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        new = need_total - len(req.block_ids) - len(hits)
        revived = sum(1 for b in hits if self.ref_count[b] == 0)
        if max(new, 0) + revived > len(self.free):
            return False
        for b in hits:
            if self.ref_count[b] == 0:
                del self.free[b]
            self.ref_count[b] += 1
        req.block_ids.extend(hits)
        for _ in range(new):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None and self.cached.get(h) == b:  # evict its cached content
                del self.cached[h]
            self.block_hash[b] = None
            self.ref_count[b] = 1
            req.block_ids.append(b)
        return True

    def cache_full_blocks(self, req: EngineRequest) -> None:
        """Register the blocks that are full of computed tokens in the prefix cache."""
        if not self.enable_caching:
            return
        n_full = req.num_computed_tokens // self.block_size
        if n_full == 0 or self.block_hash[req.block_ids[n_full - 1]] is not None:
            return
        self.compute_hashes(req)
        for b, h in zip(req.block_ids[:n_full], req.block_hashes):
            if self.block_hash[b] is None:
                self.block_hash[b] = h
                self.cached.setdefault(h, b)

    def free_request(self, req: EngineRequest) -> None:
        """Drop req's references (idempotent: the table is emptied)."""
        now = time.monotonic()
        for b in reversed(req.block_ids):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free[b], self.freed_at[b] = None, now
        req.block_ids = []

    def reset_prefix_cache(self) -> None:
        """Forget the cached content of every free block."""
        for b in self.free:
            self.block_hash[b] = None
        self.cached = {h: b for h, b in self.cached.items() if self.ref_count[b] > 0}
