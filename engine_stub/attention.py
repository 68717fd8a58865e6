"""Paged attention in pure torch.

The KV cache is a pool of fixed-size blocks per layer; a request owns a block table. Each step
stores the new K/V by slot (block * block_size + offset), then gathers whole blocks into reused
buffers and runs SDPA. Decodes (one query token) are batched into one call with a padding mask;
each prefill chunk runs alone with a bottom-right causal mask, because a chunk after a prefix
hit or an earlier chunk has q_len < kv_len (`is_causal=True` would be top-left aligned, wrong).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int               # offset of the chunk's first token in the flat batch
    q_len: int
    kv_len: int              # tokens in context after this chunk (cached + earlier + this)
    block_ids: torch.Tensor  # [ceil(kv_len / block_size)] long
    mask: torch.Tensor | None  # [q_len, kv_len] bool, None when q_len == kv_len (plain causal)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor        # [T] long: where each new token's K/V goes
    num_decodes: int                  # the first num_decodes tokens are single-token queries
    decode_block_tables: torch.Tensor | None  # [D, max_blocks] long, padded with block 0
    decode_mask: torch.Tensor | None  # [1, D, 1, max_blocks * block_size] additive (0 / -inf)
    prefills: list[PrefillChunk]


def bottom_right_causal_mask(q_len: int, kv_len: int, device) -> torch.Tensor:
    """mask[i, j]: query i (absolute position kv_len - q_len + i) may attend key j."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]


class PagedKVCache:
    """K and V block pools for every layer, plus gather buffers reused across layers and steps.

    Layout [layer, kv_head, slot, head_dim]: gathered blocks come out as [kv_head, tokens, hd],
    which is what the attention matmuls want, so no transposed copy is made per layer.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, kv_heads, num_blocks * block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size, self.kv_heads, self.head_dim = block_size, kv_heads, head_dim
        self._kbuf = torch.empty(0, dtype=dtype, device=device)
        self._vbuf = torch.empty(0, dtype=dtype, device=device)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, kvh, hd] for the tokens at `slots`."""
        self.k[layer].index_copy_(1, slots, k.transpose(0, 1))
        self.v[layer].index_copy_(1, slots, v.transpose(0, 1))

    def gather(self, layer: int, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of whole blocks in block-table order: [kvh, len(block_ids) * block_size, hd]."""
        n = block_ids.numel()
        numel = self.kv_heads * n * self.block_size * self.head_dim
        if self._kbuf.numel() < numel:  # grow geometrically, then reuse
            size = max(numel, 2 * self._kbuf.numel())
            self._kbuf = torch.empty(size, dtype=self.k.dtype, device=self.k.device)
            self._vbuf = torch.empty(size, dtype=self.k.dtype, device=self.k.device)
        shape = (self.kv_heads, n, self.block_size, self.head_dim)
        kb, vb = self._kbuf[:numel].view(shape), self._vbuf[:numel].view(shape)
        pool_shape = (self.kv_heads, -1, self.block_size, self.head_dim)
        torch.index_select(self.k[layer].view(pool_shape), 1, block_ids, out=kb)
        torch.index_select(self.v[layer].view(pool_shape), 1, block_ids, out=vb)
        flat = (self.kv_heads, n * self.block_size, self.head_dim)
        return kb.view(flat), vb.view(flat)


class PagedAttention:
    """The attention backend the model calls once per layer."""

    def __init__(self, cache: PagedKVCache, scale: float) -> None:
        self.cache, self.scale = cache, scale

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, hd]; k, v: [T, kvh, hd] for the new tokens. Returns [T, H, hd]."""
        cache = self.cache
        cache.store(layer, meta.slot_mapping, k, v)
        out = torch.empty_like(q)
        H, hd = q.shape[1], q.shape[2]
        kvh, D = cache.kv_heads, meta.num_decodes
        if D:
            bt = meta.decode_block_tables
            kc, vc = cache.gather(layer, bt.view(-1))
            L = bt.shape[1] * cache.block_size
            # GQA without copies: the query heads of a KV group ride on the matmul's row axis.
            # Plain matmuls: SDPA's CPU kernels are slow for a handful of query rows.
            qd = q[:D].view(D, kvh, H // kvh, hd).transpose(0, 1)          # [kvh, D, G, hd]
            kd, vd = kc.view(kvh, D, L, hd), vc.view(kvh, D, L, hd)
            scores = torch.matmul(qd, kd.transpose(-1, -2)).mul_(self.scale).add_(meta.decode_mask)
            out[:D] = torch.matmul(scores.softmax(-1), vd).transpose(0, 1).reshape(D, H, hd)
        for p in meta.prefills:
            kc, vc = cache.gather(layer, p.block_ids)
            qp = q[p.start:p.start + p.q_len].transpose(0, 1).unsqueeze(0)      # [1, H, q, hd]
            o = F.scaled_dot_product_attention(qp, kc[None, :, :p.kv_len], vc[None, :, :p.kv_len],
                                               attn_mask=p.mask, is_causal=p.mask is None,
                                               scale=self.scale, enable_gqa=True)
            out[p.start:p.start + p.q_len] = o[0].transpose(0, 1)
        return out
