"""Named generator specs (`replay trace generate --preset NAME`), each stressing one side of
a serving system; docs/synthetic.md (Presets) says which. A preset is just a spec dict: dump it
with `--dump-spec`, edit it, generate from the file.

`preset_spec(name, duration, rate)` is the API `replay demo` uses: `rate` is the total mean
request rate over all clients, and `length_scale`/`max_*_tokens` shrink lengths for tiny
CPU engines.

Every request of every preset fits CONTEXT tokens: prompt + output (+ its images at a
Qwen2-VL-like 28-px cell each: 512x512 costs 363 tokens, 1280x720 1198, 1024x1024 1371), the
context of engine-stub's default engine and of most served models. Each length
distribution's `max` keeps input + output within it (clipping below 1 % of a preset's rows),
and conversations are cut to their last CONTEXT - output tokens, as chat front-ends do.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

from .errors import TraceError
from .spec_types import Arrival, onoff_mean_rate


def _ln(median: float, sigma: float, hi: float, lo: float = 1) -> dict[str, Any]:
    return {"dist": "lognormal", "median": median, "sigma": sigma, "min": lo, "max": hi}


CONTEXT = 8192
CHAT_IN, CHAT_OUT = _ln(350, 1.0, 6144), _ln(220, 0.8, 2048)


def _chat(d: float) -> dict[str, Any]:
    return {"clients": [{"name": "chat", "rate": 1.0, "arrival": {"process": "poisson"},
                         "input": CHAT_IN, "output": CHAT_OUT, "rho": 0.2}]}


def _bursty(d: float) -> dict[str, Any]:
    models = {"small": 0.7, "large": 0.3}
    return {"clients": [
        {"name": "api", "rate": 0.6, "arrival": {"process": "gamma", "cv": 3.0}, "models": dict(models),
         "input": CHAT_IN, "output": CHAT_OUT, "rho": 0.2},
        {"name": "batch-jobs", "rate": 0.4, "models": dict(models),
         "arrival": {"process": "onoff", "burst_rate": 10.0, "idle_rate": 0.5, "on_s": 10.0, "off_s": 60.0},
         "input": _ln(600, 0.8, 6144), "output": _ln(150, 0.7, 2048)}]}


def _multi_model(d: float) -> dict[str, Any]:
    return {"clients": [
        {"name": "small", "rate": 0.6, "models": "small", "arrival": {"process": "gamma", "cv": 1.5},
         "input": _ln(200, 0.8, 7168), "output": _ln(80, 0.7, 1024), "rho": 0.3},
        {"name": "medium", "rate": 0.3, "models": "medium", "arrival": {"process": "gamma", "cv": 2.0},
         "input": _ln(800, 0.9, 6144), "output": _ln(250, 0.8, 2048), "rho": 0.2},
        {"name": "large", "rate": 0.1, "models": "large", "arrival": {"process": "poisson"},
         "input": _ln(1500, 0.7, 5632), "output": _ln(700, 0.6, 2560), "rho": 0.1}]}


def _long_context(d: float) -> dict[str, Any]:
    return {"clients": [{"name": "rag", "rate": 1.0, "arrival": {"process": "gamma", "cv": 1.5},
                         "input": _ln(3500, 0.3, CONTEXT - 1024, lo=256), "output": _ln(120, 0.6, 1024),
                         "prefix": {"system_blocks": 32, "system_share": 0.95, "apps": 20,
                                    "app_blocks": 128, "app_share": 0.8}}]}


def _multi_turn(d: float) -> dict[str, Any]:
    # the history grows by each answer and user turn: cut to the context left for the answer
    return {"max_input_tokens": CONTEXT - 2048,
            "clients": [{"name": "assistant", "rate": 1.0, "arrival": {"process": "poisson"},
                         "input": _ln(400, 0.9, 6144), "output": _ln(250, 0.8, 2048), "rho": 0.1,
                         "sessions": {"turns": {"dist": "zipf", "a": 1.5, "min": 1, "max": 20},
                                      "think_s": _ln(15, 0.8, 600, lo=0), "user_tokens": _ln(80, 0.8, 4096)},
                         "prefix": {"system_blocks": 8, "system_share": 1.0}}]}


# a weekday's shape: trough around 04:00, peak early afternoon (hourly multipliers)
DAY = [0.45, 0.35, 0.3, 0.28, 0.27, 0.3, 0.4, 0.6, 0.85, 1.1, 1.3, 1.45,
       1.5, 1.55, 1.6, 1.55, 1.45, 1.35, 1.25, 1.15, 1.0, 0.85, 0.7, 0.55]


def _diurnal(d: float) -> dict[str, Any]:
    # one day compressed into the trace (shorter than a day) or a real 24 h period
    return {"clients": [{"name": "chat", "rate": 1.0, "arrival": {"process": "gamma", "cv": 1.5},
                         "profile": {"kind": "diurnal", "hourly": DAY, "period": min(d, 86400.0)},
                         "input": CHAT_IN, "output": CHAT_OUT, "rho": 0.2}]}


def _multi_lora(d: float) -> dict[str, Any]:
    zipf = sum(1 / i for i in range(1, 16))  # Zipf-popular adapters, each a small bursty tenant
    tenants = [{"name": f"tenant-{i}", "rate": 0.6 * (1 / i) / zipf, "models": f"lora-{i}",
                "arrival": {"process": "gamma", "cv": 2.0}, "input": _ln(150 * (1 + i % 4), 0.8, 6144),
                "output": _ln(60 * (1 + i % 3), 0.7, 2048)} for i in range(1, 16)]
    return {"clients": [{"name": "base", "rate": 0.4, "models": "base", "arrival": {"process": "poisson"},
                         "input": CHAT_IN, "output": CHAT_OUT, "rho": 0.2}, *tenants]}


def _vision(d: float) -> dict[str, Any]:
    # a vision-language model (70% of requests) beside a text-only model: 42% of its chat
    # requests carry one or two images (up to 2 x 1371 tokens beside 3584 + 1536 of text), and
    # 5% of all requests are documents, batches of 4-8 scanned pages at 512x512 (8 x 363 tokens)
    images = {"count": {0: 0.58, 1: 0.33, 2: 0.09}, "px": {"512x512": 0.5, "1024x1024": 0.3, "1280x720": 0.2}}
    pages = {"count": {4: 0.7, 8: 0.3}, "px": "512x512"}
    return {"clients": [{"name": "vision-chat", "rate": 0.95, "arrival": {"process": "gamma", "cv": 1.5},
                         "models": [{"name": "vlm", "weight": 0.68, "images": images,
                                     "input": _ln(350, 1.0, 3584), "output": _ln(220, 0.8, 1536)},
                                    {"name": "text", "weight": 0.32}],
                         "input": CHAT_IN, "output": CHAT_OUT, "rho": 0.2},
                        {"name": "documents", "rate": 0.05, "arrival": {"process": "gamma", "cv": 2.0},
                         "models": [{"name": "vlm", "weight": 1.0, "images": pages}],
                         "input": _ln(150, 0.8, 2048), "output": _ln(300, 0.7, 2048), "rho": 0.2}]}


def _agentic(d: float) -> dict[str, Any]:
    # a coding agent: each arrival starts a task of 10-30 chained calls (traces.agents) on a
    # shared 2560-token system prompt + tool definitions; tool calls take ~2 s (lognormal, long
    # tail), 10 % of steps fan out to 2-4 subagents; histories are cut to CONTEXT - output
    return {"clients": [{"name": "coder", "rate": 1.0, "arrival": {"process": "poisson"}, "exact_count": True,
                         "input": _ln(250, 0.8, 2048), "output": _ln(100, 0.7, 1024), "rho": 0.1,
                         "agent": {"steps": {"dist": "uniform", "low": 10, "high": 30},
                                   "tool_delay_s": _ln(2.0, 1.0, 300, lo=0), "growth": _ln(80, 0.9, 2048, lo=0),
                                   "fanout": {"p": 0.1, "width": {"dist": "uniform", "low": 2, "high": 4},
                                              "input": _ln(300, 0.7, 2048)},
                                   "system_blocks": 96, "tools_blocks": 64, "context": CONTEXT}}]}


PRESETS: dict[str, tuple[Callable[[float], dict[str, Any]], float, float]] = {
    # name: (builder, default duration s, default total rate req/s)
    "chat": (_chat, 600.0, 5.0), "bursty": (_bursty, 600.0, 5.0), "multi-model": (_multi_model, 600.0, 5.0),
    "long-context": (_long_context, 600.0, 1.0), "multi-turn": (_multi_turn, 600.0, 3.0),
    "diurnal": (_diurnal, 3600.0, 5.0), "multi-lora": (_multi_lora, 600.0, 5.0), "vision": (_vision, 600.0, 3.0),
    "agentic": (_agentic, 600.0, 3.0)}


def scale_rate(spec: dict[str, Any], rate: float) -> dict[str, Any]:
    """Scale every client's rate so that they sum to `rate` (the shares are kept)."""
    if not rate > 0:
        raise TraceError(f"--rate must be > 0, got {rate}")
    spec = copy.deepcopy(spec)
    clients = spec.get("clients") or []
    for c in clients:
        a = c.get("arrival", {})
        if "rate" not in c and a.get("process") == "onoff":
            c["rate"] = onoff_mean_rate(Arrival("onoff", 1, a.get("burst_rate", 0), a.get("idle_rate", 0),
                                                a.get("on_s", 1), a.get("off_s", 1)))
    rates = [float(c.get("rate", 0)) for c in clients]
    total = sum(rates)
    for c, r in zip(clients, rates):
        c["rate"] = rate * r / total if total > 0 else rate / len(clients)
    return spec


def preset_spec(name: str, duration: float | None = None, rate: float | None = None, *,
                length_scale: float | None = None, max_input_tokens: int | None = None,
                max_output_tokens: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The spec dict of preset `name` for `duration` s at `rate` req/s in total."""
    if name not in PRESETS:
        raise TraceError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    build, d0, r0 = PRESETS[name]
    d = float(duration or d0)
    # exact_count: --rate is the rate a user gets, round(rate x duration) requests on every seed
    spec = {"name": name, "duration": d, "seed": seed, "block_size": 16, "exact_count": True, **build(d)}
    spec = scale_rate(spec, float(rate or r0))
    kw = {"length_scale": length_scale, "max_input_tokens": max_input_tokens, "max_output_tokens": max_output_tokens}
    return {**spec, **{k: v for k, v in kw.items() if v is not None}}
