"""The scheduler: which requests run in the next step, and how many tokens each.

`chunked` (vLLM V1): one token budget per step. Running requests go first, oldest first (a decode
takes 1 token, a prefill continuation takes what is left of its prompt, capped by the budget);
waiting requests are admitted with whatever budget is left, their prompts chunked. When the pool
runs out of blocks the newest running request is preempted by recompute (its blocks are freed,
it goes back to the front of the queue) and nothing new is admitted in that step.
`prefill-first` (vLLM V0 / nano-vllm): a step is either whole prompts or decodes; prompts win,
so decodes stall behind prompt bursts. `reserve`: a request is admitted only when blocks for its
prompt plus max_tokens are free (counting what running requests may still need); no preemption.

The tenant policy picks which waiting request is admitted next. `fcfs`: the oldest. `fair`: the
oldest of the tenant (the body's `user`) that has been served the fewest tokens (prefill chunks
and decodes scheduled), a virtual token counter as VTC ("Fairness in Serving Large Language
Models", OSDI '24): a tenant that arrives with nothing in the engine starts at the least counter
of the tenants in it, so idle time banks no credit. Preemption still takes the newest request.
"""
from __future__ import annotations

import bisect
from collections import Counter, deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .config import EngineConfig
from .request import EngineRequest, Status


@dataclass
class SchedulerOutput:
    items: list[tuple[EngineRequest, int]] = field(default_factory=list)  # (request, new tokens)
    preempted: list[EngineRequest] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager) -> None:
        self.cfg, self.blocks = cfg, blocks
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []   # sorted by arrival (seq)
        self.num_preemptions = 0
        self.served: Counter[str] = Counter()   # tokens scheduled per tenant (the `fair` counters)
        self.in_engine: Counter[str] = Counter()  # waiting + running requests per tenant

    def add(self, req: EngineRequest) -> None:
        if not self.in_engine[req.tenant] and self.in_engine.total():  # back from idle: no banked credit
            least = min(self.served[t] for t, n in self.in_engine.items() if n)
            self.served[req.tenant] = max(self.served[req.tenant], least)
        self.in_engine[req.tenant] += 1
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.cfg.policy == "prefill-first":
            self._admit(out, budget=max(self.cfg.max_num_batched_tokens, self.cfg.max_model_len), whole_prompts=True)
            if not out.items:
                self._schedule_running(out, budget=self.cfg.max_num_seqs)
            return out
        budget = self._schedule_running(out, self.cfg.max_num_batched_tokens)
        if not out.preempted:
            self._admit(out, budget, whole_prompts=False)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.blocks.allocate(req, n):
                victim = self.running.pop()  # the newest request, preempted by recompute
                self.blocks.free_request(victim)
                victim.num_computed_tokens = 0
                victim.status = Status.WAITING
                self.num_preemptions += 1
                self.waiting.appendleft(victim)
                out.preempted.append(victim)
                if victim is req:
                    return budget
            out.items.append((req, n))
            self.served[req.tenant] += n
            budget -= n
            i += 1
        return budget

    def _admit(self, out: SchedulerOutput, budget: int, whole_prompts: bool) -> None:
        adapters = {r.lora_id for r in self.running if r.lora_id}
        req = None
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self._next_waiting()
            if req.lora_id and req.lora_id not in adapters and len(adapters) >= self.cfg.max_loras:
                break  # at most max_loras distinct adapters per step (FCFS: no overtaking)
            hits = self.blocks.match_prefix(req)
            req.num_computed_tokens = len(hits) * self.blocks.block_size
            n = req.num_tokens - req.num_computed_tokens
            if whole_prompts and n > budget:
                break
            n = min(n, budget)
            if self.cfg.policy == "reserve" and not self._reservation_fits(req, hits):
                break
            if not self.blocks.allocate(req, n, hits):
                break
            self.waiting.remove(req)  # the head under fcfs: O(1)
            if req.lora_id:
                adapters.add(req.lora_id)
            req.status = Status.RUNNING
            req.num_cached_tokens = req.num_computed_tokens
            out.prefix_queries += req.num_tokens
            out.prefix_hits += req.num_computed_tokens
            bisect.insort(self.running, req, key=lambda r: r.seq)
            out.items.append((req, n))
            self.served[req.tenant] += n
            budget -= n
        if req is not None and req.status is Status.WAITING:
            req.num_computed_tokens = 0  # not admitted: forget the tentative hits

    def _next_waiting(self) -> EngineRequest:
        if self.cfg.tenant_policy == "fcfs":
            return self.waiting[0]
        heads: dict[str, EngineRequest] = {}  # each tenant's oldest, in queue order (ties: FCFS)
        for r in self.waiting:  # a scan per admission: queues here are thousands at most
            heads.setdefault(r.tenant, r)
        return min(heads.values(), key=lambda r: self.served[r.tenant])

    def _max_blocks(self, req: EngineRequest) -> int:
        total = min(req.num_prompt_tokens + req.params.max_tokens, self.cfg.max_model_len)
        return -(-total // self.blocks.block_size)

    def _reservation_fits(self, req: EngineRequest, hits: list[int]) -> bool:
        reserved = sum(self._max_blocks(r) - len(r.block_ids) for r in self.running)
        revived = sum(1 for b in hits if self.blocks.ref_count[b] == 0)
        return self._max_blocks(req) - len(hits) + revived <= self.blocks.num_free - reserved

    def finish(self, req: EngineRequest, reason: str) -> None:
        """Remove a request (finished or aborted) and free its blocks; idempotent."""
        if req.status is Status.FINISHED:
            return
        (self.running if req.status is Status.RUNNING else self.waiting).remove(req)
        self.in_engine[req.tenant] -= 1
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.blocks.free_request(req)
