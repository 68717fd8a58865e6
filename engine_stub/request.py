"""EngineRequest: one generation request as the engine sees it, plus its sampling params."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0              # 0 or -1: off
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # time.perf_counter() (CLOCK_MONOTONIC: one clock for the server and an --engine-process child)
    # when the server submitted it, after parsing and tokenizing the body (as vLLM's arrival_time)
    arrival_time: float
    seq: int = 0                              # arrival order, ties broken by the engine
    lora_id: int = 0                          # 0: base model
    tenant: str = ""                          # the body's OpenAI `user` ("" when absent): --tenant-policy fair
    token_ids: list[int] = field(default_factory=list)   # prompt + output
    num_computed_tokens: int = 0              # tokens whose K/V are in the cache
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the full blocks of token_ids
    num_cached_tokens: int = 0                # prefix-cache hit at the last admission
    status: Status = Status.WAITING
    finish_reason: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    queued_time: float | None = None          # when the engine core took it (vLLM's queued_ts)
    # (gen_ai.request.id, trace id hex | None, parent span id hex | None) when a span is wanted
    trace: tuple[str, str | None, str | None] | None = None
    detok: object = None                      # IncrementalDetokenizer, set by the engine

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)
