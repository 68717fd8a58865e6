"""The generator spec's typed view: plain dataclasses that `generate` works from, built and
validated from the spec dict by `traces.spec.parse_spec`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

LENGTH_FAMILIES = ("lognormal", "gamma", "weibull", "zipf", "uniform", "constant", "empirical")
PROCESSES = ("poisson", "gamma", "weibull", "onoff", "batch")
PROFILES = ("constant", "ramp", "table", "diurnal", "sinusoid")
MODULATIONS = ("lognormal",)
MAX_CV = 20.0          # renewal processes: CV up to ~15 must work, beyond 20 is not realistic
MIN_SHAPE = 0.05       # weibull shape floor (CV ~ 10^5); gamma's floor follows from MAX_CV


@dataclass
class Dist:
    """A length (or count, or seconds) distribution, sampled by inverse CDF so that a copula
    can couple two of them. Integer families round; `lo`/`hi` are inclusive caps."""
    family: str
    params: dict[str, Any]
    lo: float = 1.0
    hi: float = 1_000_000.0


@dataclass
class Arrival:
    process: str = "poisson"
    cv: float = 1.0                     # of the renewal process (gamma/weibull) or of batch events
    burst_rate: float = 0.0             # onoff: req/s while bursting / idle; mean sojourns in s
    idle_rate: float = 0.0
    on_s: float = 0.0
    off_s: float = 0.0
    batch_size: Dist | None = None      # batch: requests per instant


@dataclass
class Profile:
    kind: str = "constant"
    start: float = 1.0                  # ramp multipliers at t=0 and t=duration
    end: float = 1.0
    window: float = 600.0               # table: seconds per value (the table repeats)
    values: list[float] = field(default_factory=lambda: [1.0])
    period: float = 86400.0             # sinusoid
    peak_to_trough: float = 1.0
    peak_at: float = 0.5                # fraction of the period where the peak lies
    cv: list[float] | None = None       # table: a renewal CV per value (arrivals.window_points)


@dataclass
class Modulation:
    """A doubly stochastic rate: r(t) is multiplied by M_j = exp(sigma X_j - sigma^2 / 2) on
    consecutive windows j of `window` seconds, X a stationary Gaussian AR(1) with unit variance
    and lag-1 correlation `corr`; E[M] = 1, and each realisation is renormalised so that
    `rate` stays the mean over the trace. Drawn anew for every seed."""
    kind: str = "lognormal"
    window: float = 60.0
    sigma: float = 0.0
    corr: float = 0.0


@dataclass
class Images:
    """Images per request: a count distribution over 0..MAX_IMAGES (drawn per request,
    independent of the lengths) and the image sizes `WxH` -> weight (keys sorted)."""
    count: Dist
    px: dict[str, float]


@dataclass
class ModelSpec:
    name: str
    weight: list[float]                 # one weight, or one per `mix_window`
    input: Dist | None = None           # per-model lengths override the client's
    output: Dist | None = None
    rho: float | None = None
    images: Images | None = None        # per-model images override the client's
    reasoning_share: Dist | None = None  # per-model reasoning share overrides the client's


@dataclass
class Sessions:
    turns: Dist
    think_s: Dist
    user_tokens: Dist | None            # new tokens per later turn (default: the input dist)
    branch: float = 0.0                 # share of later turns that keep only part of the history


@dataclass
class Pool:
    """Application prefixes shared by unrelated sessions (after the system prompt): `size`
    prefixes, prefix i `blocks[i]` blocks long (a Dist: each length drawn per seed), picked
    per session by `popularity` weights (else Zipf: rank k weighs k^-zipf); a session opens
    with one with probability `share`. `tail`: the tokens after the prefix on its first turn
    (None: the prompt length is the client's input and the prefix is cut to fit it)."""
    share: float
    size: int
    blocks: list[int] | Dist
    popularity: list[float] | None = None
    zipf: float = 0.0
    tail: Dist | None = None


@dataclass
class Prefix:
    system_blocks: int = 0
    system_share: float = 0.0
    pool: Pool | None = None


@dataclass
class Agent:
    """Agentic tasks (`traces.agents`): each arrival starts a task of `steps` chained calls;
    a step fans out with probability `fanout_p` to `fanout_width` parallel subagent calls
    (fresh prompts of `fanout_input` new tokens) that the next step joins."""
    steps: Dist
    tool_delay_s: Dist
    growth: Dist
    fanout_p: float = 0.0
    fanout_width: Dist | None = None
    fanout_input: Dist | None = None    # None: the client's input distribution
    system_blocks: int = 0
    tools_blocks: int = 0
    context: int | None = None          # prompt + output of every call within it


@dataclass
class Client:
    name: str
    rate: float
    arrival: Arrival
    profile: Profile
    models: list[ModelSpec]
    mix_window: float
    slo_class: dict[str, float]
    input: Dist
    output: Dist
    rho: float
    failures: float
    sessions: Sessions | None
    prefix: Prefix | None
    bootstrap: str | None
    images: Images | None = None        # None: no images (unless a model sets its own)
    modulation: Modulation | None = None  # doubly stochastic rate on top of the profile
    exact_count: bool = False           # exactly round(rate * span) arrivals (arrivals.arrival_times)
    agent: Agent | None = None          # arrivals are task starts, expanded by traces.agents
    # lengths by arrival time: (from_s, input, output), each until the next; None: input/output
    length_windows: list[tuple[float, Dist, Dist]] | None = None
    # share of each request's output tokens that is reasoning (0..1), drawn per request
    # (ServeGen's reason_ratio); None: the trace says nothing (reasoning_tokens null)
    reasoning_share: Dist | None = None


@dataclass
class Spec:
    duration: float
    seed: int
    block_size: int
    length_scale: float
    max_input_tokens: int | None
    max_output_tokens: int | None
    clients: list[Client]
    # the source's timestamp buckets (fit: stats.timestamp_buckets): every arrival is floored
    # to a multiple of it (generate._arrival_order); None: exact times, as before
    timestamp_quantum_s: float | None = None
    # with the quantum: each bucket's rows are then spread evenly over it (transform.dequantize),
    # as in a source imported with --dequantize uniform
    timestamp_spread: bool = False


def weibull_cv(shape: float) -> float:
    g1, g2 = math.lgamma(1 + 1 / shape), math.lgamma(1 + 2 / shape)
    return math.sqrt(max(math.exp(g2 - 2 * g1) - 1, 0.0))


def onoff_mean_rate(a: Arrival) -> float:
    return (a.burst_rate * a.on_s + a.idle_rate * a.off_s) / (a.on_s + a.off_s)
