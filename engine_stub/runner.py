"""ModelRunner: turns a SchedulerOutput into one flat batch, runs the model, samples.

Decodes (one new token) come first in the flat batch so attention can batch them; prefill
chunks follow. Only requests whose chunk reaches the end of their known tokens sample.
"""
from __future__ import annotations

import torch

from .attention import AttentionMetadata, PagedAttention, PrefillChunk, bottom_right_causal_mask
from .model import TinyGPT
from .request import EngineRequest
from .sampler import Sampler
from .scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: TinyGPT, attn: PagedAttention, sampler: Sampler, block_size: int,
                 device: torch.device) -> None:
        self.model, self.attn, self.sampler = model, attn, sampler
        self.block_size, self.device = block_size, device
        self._arange = torch.arange(1 << 16, device=device)

    def prepare(self, items: list[tuple[EngineRequest, int]]):
        """Flat inputs and attention metadata for the scheduled (request, num_new_tokens) items."""
        bs, dev = self.block_size, self.device
        items = sorted(items, key=lambda it: it[1] != 1)  # decodes first (stable)
        ids, pos, slots, logits_idx, sampling = [], [], [], [], []
        n_dec = 0
        dec_tables, dec_lens, prefills = [], [], []
        for req, n in items:
            start = req.num_computed_tokens
            end = start + n
            table = req.block_ids
            offset = len(ids)
            ids.extend(req.token_ids[start:end])
            pos.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            nb = -(-end // bs)
            if n == 1:
                n_dec += 1
                dec_tables.append(table[:nb])
                dec_lens.append(end)
            else:
                mask = None if start == 0 else bottom_right_causal_mask(n, end, dev)
                prefills.append(PrefillChunk(offset, n, end, torch.tensor(table[:nb], device=dev), mask))
            if end == req.num_tokens:
                logits_idx.append(offset + n - 1)
                sampling.append(req)
        dec_bt = dec_mask = None
        if n_dec:
            width = max(len(t) for t in dec_tables)
            dec_bt = torch.tensor([t + [0] * (width - len(t)) for t in dec_tables], device=dev)
            lens = torch.tensor(dec_lens, device=dev)
            valid = self._arange[: width * bs][None, :] < lens[:, None]
            dec_mask = torch.zeros(valid.shape, device=dev).masked_fill_(~valid, float("-inf"))[None, :, None, :]
        meta = AttentionMetadata(torch.tensor(slots, device=dev), n_dec, dec_bt, dec_mask, prefills)
        lora = [req.lora_id for req, n in items for _ in range(n)] if any(r.lora_id for r, _ in items) else None
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta,
                torch.tensor(logits_idx, device=dev, dtype=torch.long), sampling, lora)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[EngineRequest], list[int]]:
        """Run one step; returns the requests that sampled and their new tokens."""
        ids, pos, meta, logits_idx, sampling, lora = self.prepare(out.items)
        if not sampling:
            logits_idx = logits_idx[:0]
        logits = self.model(ids, pos, self.attn, meta, logits_idx, lora)
        if not sampling:
            return [], []
        return sampling, self.sampler(logits, sampling)
