"""Engine configuration: model presets and the knobs of the serving engine.

Presets are tiny seeded random-weight decoders; their vocab is always >= 8192 so that
clients may send token-id prompts drawn from [1000, 8000).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    vocab_size: int = 8192
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 512
    max_position: int = 8192
    rope_theta: float = 10000.0
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS: dict[str, ModelSpec] = {
    # ~3M params (1M of them the LM head): a decode step at batch 32 takes a few ms on one CPU thread.
    "tiny": ModelSpec("tiny"),
    # ~5M params: the same shape, wider.
    "tiny-wide": ModelSpec("tiny-wide", hidden=192, heads=6, ffn=768, seed=3),
    # ~32M params: slower steps, for heavier CPU rehearsals or a GPU.
    "small": ModelSpec("small", hidden=512, layers=8, heads=8, kv_heads=4, ffn=1408, seed=1),
    # ~1.1M params: for unit tests.
    "micro": ModelSpec("micro", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=2),
}

POLICIES = ("chunked", "prefill-first", "reserve")
TENANT_POLICIES = ("fcfs", "fair")


@dataclass
class EngineConfig:
    model: ModelSpec = field(default_factory=lambda: PRESETS["tiny"])
    block_size: int = 16
    num_blocks: int | None = None        # None: from kv_cache_bytes or the default
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 8192            # every replay preset's requests fit
    policy: str = "chunked"
    tenant_policy: str = "fcfs"          # which waiting request is admitted next (scheduler.py)
    enable_prefix_caching: bool = True
    prefix_cache_ttl: float | None = None  # seconds a free cached block stays a hit; None: until reused
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    lora_names: tuple[str, ...] = ()
    lora_rank: int = 8
    max_loras: int = 2
    otlp_traces_endpoint: str | None = None  # OTLP/HTTP URL for llm_request spans (tracing.py)

    # 16384 tokens, two requests of the default max_model_len: queueing and preemption appear
    # at modest load (chat at ~2 req/s ran 17 preemptions in 40 requests with half of it)
    DEFAULT_NUM_BLOCKS = 1024

    def resolved(self) -> "EngineConfig":
        """Fix device, dtype, block count and max_model_len; raise ValueError on nonsense."""
        import torch
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.tenant_policy not in TENANT_POLICIES:
            raise ValueError(f"--tenant-policy must be fcfs or fair, got {self.tenant_policy!r}")
        check_range(self, "", "block_size max_num_seqs max_num_batched_tokens max_model_len", 1)
        check_range(self, "", "prefix_cache_ttl", 0)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device is available (use --device cpu)")
        dtype = ("bfloat16" if _native_bf16(device) else "float32") if self.dtype == "auto" else self.dtype
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
        m, elem = self.model, 4 if dtype == "float32" else 2
        num_blocks = self.num_blocks if self.num_blocks is not None else (  # a block: K and V of every layer
            self.kv_cache_bytes // (2 * m.layers * m.kv_heads * m.head_dim * self.block_size * elem)
            if self.kv_cache_bytes else self.DEFAULT_NUM_BLOCKS)
        if self.otlp_traces_endpoint:
            from .tracing import traces_url
            traces_url(self.otlp_traces_endpoint)
        if num_blocks < 2:
            raise ValueError(f"KV cache too small: {num_blocks} blocks of {self.block_size} tokens")
        # one request must always fit in the whole pool, or preemption could never make room
        max_len = min(self.max_model_len, num_blocks * self.block_size, self.model.max_position)
        return replace(self, device=device, dtype=dtype, num_blocks=num_blocks, max_model_len=max_len)


def check_range(obj, prefix: str, names: str, low: float, high: float | None = None) -> None:
    """ValueError naming the first option `--PREFIX-NAME` (NAME a field of obj) outside [low, high]; None is unset."""
    for name in names.split():
        value = getattr(obj, name)
        if value is not None and not (low <= value and (high is None or value <= high)):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ValueError(f"--{prefix}{name.replace('_', '-')} must be {bound}, got {value}")


def _native_bf16(device: str) -> bool:
    import torch
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
