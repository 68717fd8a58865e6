"""TinyGPT: a decoder-only transformer (RMSNorm, RoPE, SwiGLU, GQA) with seeded random weights.

The forward pass runs over one flat batch of tokens from many requests (no padding); attention
goes through a backend (paged by default) that reads the per-step AttentionMetadata. Seeded LoRA
adapters (rank r, on the QKV and output projections) can be mixed per token in one batch.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelSpec


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, hd]; cos/sin: [T, hd/2] (rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class LoRASet(nn.Module):
    """Stacked adapters for one projection: delta(x) = x @ A[a] @ B[a] for the tokens of adapter a."""

    def __init__(self, n: int, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(n, d_in, rank))
        self.B = nn.Parameter(torch.empty(n, rank, d_out))

    def add_to(self, y: torch.Tensor, x: torch.Tensor, groups: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        for a, rows in groups:
            y = y.index_add(0, rows, x[rows] @ self.A[a] @ self.B[a])
        return y


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, n_loras: int, lora_rank: int) -> None:
        super().__init__()
        hd = spec.head_dim
        self.heads, self.kv_heads, self.hd = spec.heads, spec.kv_heads, hd
        self.attn_norm = nn.RMSNorm(spec.hidden, eps=1e-6)
        self.qkv = nn.Linear(spec.hidden, (spec.heads + 2 * spec.kv_heads) * hd, bias=False)
        self.o = nn.Linear(spec.heads * hd, spec.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(spec.hidden, eps=1e-6)
        self.gate_up = nn.Linear(spec.hidden, 2 * spec.ffn, bias=False)
        self.down = nn.Linear(spec.ffn, spec.hidden, bias=False)
        self.lora_qkv = LoRASet(n_loras, spec.hidden, self.qkv.out_features, lora_rank) if n_loras else None
        self.lora_o = LoRASet(n_loras, spec.heads * hd, spec.hidden, lora_rank) if n_loras else None

    def forward(self, x, cos, sin, layer, attn, meta, lora_groups):
        T = x.shape[0]
        h = self.attn_norm(x)
        qkv = self.qkv(h)
        if lora_groups:
            qkv = self.lora_qkv.add_to(qkv, h, lora_groups)
        q, k, v = qkv.split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = apply_rope(q.view(T, self.heads, self.hd), cos, sin)
        k = apply_rope(k.view(T, self.kv_heads, self.hd), cos, sin)
        a = attn(layer, q, k, v.view(T, self.kv_heads, self.hd), meta).reshape(T, -1)
        o = self.o(a)
        if lora_groups:
            o = self.lora_o.add_to(o, a, lora_groups)
        x = x + o
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyGPT(nn.Module):
    def __init__(self, spec: ModelSpec, n_loras: int = 0, lora_rank: int = 8) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden)
        self.layers = nn.ModuleList(Block(spec, n_loras + 1 if n_loras else 0, lora_rank) for _ in range(spec.layers))
        self.norm = nn.RMSNorm(spec.hidden, eps=1e-6)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        half = spec.head_dim // 2  # RoPE tables, computed in float64
        inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.arange(spec.max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        self._seeded_init(spec.seed)

    @torch.no_grad()
    def _seeded_init(self, seed: int) -> None:
        # base weights first, adapters from their own stream: adding adapters never changes the base
        g, g_lora = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
        params = sorted(self.named_parameters(), key=lambda kv: ".lora_" in kv[0])
        for name, p in params:
            if "norm" in name:
                p.fill_(1.0)
            elif ".lora_" in name:
                p.normal_(0.0, 0.05, generator=g_lora)
                if name.endswith(".B"):
                    p[0].zero_()  # adapter slot 0 is the base model
            elif name == "lm_head.weight":
                # logits with a std of ~4: peaked next-token distributions, so greedy decoding is
                # stable under batched-matmul rounding, yet sampling still varies
                p.normal_(0.0, 0.35, generator=g)
            else:  # 1/sqrt(fan_in): every layer moves the residual stream
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn, meta,
                logits_indices: torch.Tensor, lora_ids: list[int] | None = None) -> torch.Tensor:
        """Returns float32 logits [len(logits_indices), vocab] for the tokens that sample."""
        x = self.embed(input_ids)
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        groups = _lora_groups(lora_ids, x.device)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attn, meta, groups)
        return self.lm_head(self.norm(x[logits_indices])).float()


def _lora_groups(lora_ids: list[int] | None, device) -> list[tuple[int, torch.Tensor]]:
    if not lora_ids or not any(lora_ids):
        return []
    t = torch.tensor(lora_ids, device=device)
    return [(a, (t == a).nonzero().squeeze(1)) for a in sorted(set(lora_ids)) if a]
