"""Hardware emulation: pace each step as if a bigger model ran on a real accelerator.

step time = max(FLOPs / (peak * MFU), bytes / (bandwidth * MBU)) + overhead, where FLOPs are
2 * params per token plus attention (4 * layers * hidden * q_len * kv_len) and bytes are the
weights plus the KV cache read by the step. The KV block budget comes from the emulated memory
(capacity * 0.9 - weights). The tiny model still computes the real tokens; if the CPU is slower
than the emulated step, the step simply takes longer (the engine never runs faster than real).
"""
from __future__ import annotations

from dataclasses import dataclass

MFU, MBU, MEMORY_UTILIZATION = 0.6, 0.8, 0.9


@dataclass(frozen=True)
class Profile:
    name: str
    params_b: float         # emulated model: billions of parameters
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    peak_tflops: float      # dense bf16
    bandwidth_tbs: float    # HBM TB/s
    memory_gb: float        # total accelerator memory (summed over the GPUs of a TP group)
    overhead_ms: float      # scheduler + launch overhead per step
    bytes_per_param: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param


PROFILES = {p.name: p for p in [
    Profile("llama3-8b-h100", 8.0, 32, 4096, 8, 128, 989.0, 3.35, 80, 2.0),
    Profile("llama3-8b-a100", 8.0, 32, 4096, 8, 128, 312.0, 2.04, 80, 2.5),
    Profile("llama3-8b-l4", 8.0, 32, 4096, 8, 128, 121.0, 0.30, 24, 3.0),
    Profile("qwen2.5-7b-a10g", 7.6, 28, 3584, 4, 128, 125.0, 0.60, 24, 3.0),
    Profile("llama3-70b-4xh100", 70.6, 80, 8192, 8, 128, 4 * 989.0, 4 * 3.35, 320, 4.0),
]}


class Pacer:
    def __init__(self, profile: Profile) -> None:
        self.p = profile

    def num_blocks(self, block_size: int) -> int:
        free = self.p.memory_gb * 1e9 * MEMORY_UTILIZATION - self.p.weight_bytes
        if free <= 0:
            raise ValueError(f"emulated model does not fit in {self.p.memory_gb} GB")
        return int(free // (self.p.kv_bytes_per_token * block_size))

    def step_seconds(self, chunks: list[tuple[int, int]]) -> float:
        """chunks: (new tokens, context length after the step) per scheduled request."""
        p = self.p
        tokens = sum(n for n, _ in chunks)
        flops = 2 * p.params_b * 1e9 * tokens + sum(4 * p.layers * p.hidden * n * kv for n, kv in chunks)
        bytes_moved = p.weight_bytes + p.kv_bytes_per_token * sum(kv for _, kv in chunks)
        compute = flops / (p.peak_tflops * 1e12 * MFU)
        memory = bytes_moved / (p.bandwidth_tbs * 1e12 * MBU)
        return max(compute, memory) + p.overhead_ms / 1e3
