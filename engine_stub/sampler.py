"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

min_tokens / ignore_eos are applied as logit masks on EOS and the stop ids. A seeded request draws
its uniforms from its own generator, so it gets the same tokens whatever else is in the batch.
One host sync (.tolist()) per step.
"""
from __future__ import annotations

import torch

from .request import EngineRequest
from .tokenizer import EOS


class Sampler:
    def __init__(self, vocab_size: int, banned_ids: list[int], device: torch.device, seed: int = 0) -> None:
        self.bias = torch.zeros(vocab_size, device=device)
        self.bias[banned_ids] = float("-inf")
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._req_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._req_generators.pop(request_id, None)

    def _generator(self, req: EngineRequest) -> torch.Generator:
        g = self._req_generators.get(req.request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(req.params.seed)
            self._req_generators[req.request_id] = g
        return g

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, reqs: list[EngineRequest]) -> list[int]:
        logits.add_(self.bias)  # fresh float32 logits from the model: modified in place
        rows, cols = [], []
        for i, r in enumerate(reqs):
            p = r.params
            if p.ignore_eos or r.num_output_tokens < p.min_tokens:
                # ignore_eos: EOS would only add an empty event; min_tokens: not allowed yet
                stop = (EOS,) if r.num_output_tokens >= p.min_tokens else (EOS, *p.stop_token_ids)
                rows.extend([i] * len(stop))
                cols.extend(stop)
        if rows:
            logits[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)] = float("-inf")
        greedy = [r.params.greedy for r in reqs]
        if all(greedy):
            return logits.argmax(-1).tolist()
        best = logits.argmax(-1) if any(greedy) else None
        temps = torch.tensor([1.0 if g else r.params.temperature for g, r in zip(greedy, reqs)], device=self.device)
        logits.div_(temps[:, None])
        if any(r.params.top_k > 0 or r.params.top_p < 1.0 for r in reqs):
            logits = _top_k_top_p(logits, reqs)
        # inverse-CDF sampling: one uniform per row (a seeded request draws from its own generator,
        # so its tokens do not depend on the batch); far cheaper than a Gumbel/exponential race
        cdf = logits.softmax(-1).cumsum_(-1)
        u = torch.rand(len(reqs), 1, device=self.device, generator=self.generator)
        for i, r in enumerate(reqs):
            if r.params.seed is not None:
                u[i] = torch.rand(1, device=self.device, generator=self._generator(r))
        sampled = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze_(1).clamp_(max=cdf.shape[1] - 1)
        if best is not None:
            sampled = torch.where(torch.tensor(greedy, device=self.device), best, sampled)
        return sampled.tolist()


def _top_k_top_p(logits: torch.Tensor, reqs: list[EngineRequest]) -> torch.Tensor:
    vocab = logits.shape[-1]
    k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in reqs], device=logits.device)
    p = torch.tensor([r.params.top_p for r in reqs], device=logits.device)
    sorted_logits, order = logits.sort(-1, descending=True)
    drop = torch.arange(vocab, device=logits.device)[None, :] >= k[:, None]  # by rank
    probs = sorted_logits.softmax(-1)
    drop |= (probs.cumsum(-1) - probs) > p[:, None]  # keep the token that crosses p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
