"""Parse and validate a generator spec (YAML/JSON dict) into the dataclasses of
`spec_types`, with errors that name the field path (`clients[1].arrival.cv`) and the rule,
so a person can fix the file.

The dict form is the contract (it is what `generate` embeds in the trace metadata);
docs/synthetic.md (The spec) documents every field.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import TraceError
from .spec_fields import (SpecError, _Reader, _weights, parse_arrival, parse_dist, parse_images, parse_length_windows,
                          parse_modulation, parse_profile, parse_share)
from .spec_types import Agent, Arrival, Client, Dist, ModelSpec, Pool, Prefix, Profile, Sessions, Spec, onoff_mean_rate

MAX_DURATION_S = 9e9      # arrivals are int64 ns: 2^63 ns is 292 years
MAX_WINDOWS = 10_000_000  # profile table / modulation windows over the duration (one knot each)


def parse_models(r: _Reader) -> list[ModelSpec]:
    v = r.d.get("models", {"default": 1.0})
    if isinstance(v, (str, dict)):
        return [ModelSpec(k, [w]) for k, w in _weights(r, "models", v).items()]
    if not isinstance(v, list) or not v:
        raise r.err("models", "must be a name, a mapping name -> weight, or a list of models")
    out = []
    for i, m in enumerate(v):
        mr = _Reader(m, f"{r.at('models')}[{i}]", r.file)
        mr.check_keys({"name", "weight", "input", "output", "rho", "images", "reasoning_share"})
        w = mr.nums("weight", lo=0) if "weight" in m else [1.0]
        if not w:
            raise mr.err("weight", "must be a weight or a non-empty list of weights (one per mix_window)")
        out.append(ModelSpec(str(m.get("name", f"model-{i}")), w, mr.opt("input", parse_dist),
                             mr.opt("output", parse_dist), mr.num("rho", None, lo=-1, hi=1),
                             mr.opt("images", parse_images), parse_share(mr, "reasoning_share")))
    width = max(len(m.weight) for m in out)
    if any(len(m.weight) not in (1, width) for m in out):
        raise r.err("models", "per-window weight lists must all have the same length")
    for m in out:  # a single weight holds in every window
        m.weight *= width if len(m.weight) == 1 else 1
    empty = [j for j in range(width) if sum(m.weight[j] for m in out) <= 0]
    if empty:
        raise r.err("models", f"window {empty[0]} has no model with a positive weight")
    return out


CLIENT_KEYS = {"name", "rate", "arrival", "profile", "models", "mix_window", "slo_class", "input",
               "output", "rho", "failures", "sessions", "prefix", "bootstrap", "images", "modulation",
               "exact_count", "why", "agent", "reasoning_share", "length_windows"}
MAX_STEPS = 10_000        # calls per task / subagents per fan-out: a task is one graph in memory


def _count_caps(r: _Reader, d: Dist, rule: str) -> None:
    if d.lo < 1 or d.hi > MAX_STEPS:
        raise r.err("min" if d.lo < 1 else "max", rule.format(f"{MAX_STEPS:,}"))


def parse_agent(r: _Reader) -> Agent:
    """`agent: {steps, tool_delay_s, growth, fanout: {p, width, input}, system_blocks,
    tools_blocks, context}` (spec_types.Agent; semantics in traces.agents)."""
    r.check_keys({"steps", "tool_delay_s", "growth", "fanout", "system_blocks", "tools_blocks", "context"})
    r.need("steps", "tool_delay_s", "growth",
           rule="is required for agent (a distribution, e.g. {dist: uniform, low: 10, high: 30})")
    a = Agent(parse_dist(r.sub("steps"), 1, 100), parse_dist(r.sub("tool_delay_s"), 0, 3600),
              parse_dist(r.sub("growth"), 0), system_blocks=r.num("system_blocks", 0, lo=0, integer=True),
              tools_blocks=r.num("tools_blocks", 0, lo=0, integer=True),
              context=r.num("context", None, lo=2, integer=True))
    _count_caps(r.sub("steps"), a.steps, "a task has 1..{} steps")
    if "fanout" in r.d:
        fr = r.sub("fanout")
        fr.check_keys({"p", "width", "input"})
        a.fanout_p = fr.num("p", lo=0, hi=1)
        fr.need("width", rule="is required: subagent calls per fan-out (a distribution, min >= 1)")
        a.fanout_width, a.fanout_input = parse_dist(fr.sub("width"), 1, 16), fr.opt("input", parse_dist)
        _count_caps(fr.sub("width"), a.fanout_width, "a fan-out has 1..{} subagent calls")
    return a


MAX_POOL = 1_000_000       # shared prefixes per client (their lengths and weights are arrays)


def parse_prefix(r: _Reader) -> Prefix:
    """`prefix: {system_blocks, system_share, pool: {share, blocks, popularity | zipf, size,
    tail}}` (spec_types.Pool); `apps`, `app_blocks`, `app_share` are the older form of a pool
    of `apps` equally popular prefixes of `app_blocks` blocks."""
    r.check_keys({"system_blocks", "system_share", "pool", "apps", "app_blocks", "app_share"})
    p = Prefix(r.num("system_blocks", 0, lo=0, integer=True), r.num("system_share", 1.0, lo=0, hi=1))
    legacy = [k for k in ("apps", "app_blocks", "app_share") if k in r.d]
    if legacy and "pool" in r.d:
        raise r.err(legacy[0], "cannot be combined with pool (apps, app_blocks, app_share are its older form)")
    p.pool = r.opt("pool", _pool)
    if legacy:
        apps, n = r.num("apps", 0, lo=0, hi=MAX_POOL, integer=True), r.num("app_blocks", 0, lo=0, integer=True)
        p.pool = Pool(r.num("app_share", 1.0, lo=0, hi=1), apps, [n] * apps) if apps and n else None
    return p


def _pool(pr: _Reader) -> Pool:
    pr.check_keys({"share", "blocks", "popularity", "zipf", "size", "tail"})
    pr.need("blocks", rule="is required: prefix lengths in blocks, a list (most popular first) or a dist with size")
    if isinstance(pr.d["blocks"], list):
        blocks: list[int] | Dist = pr.nums("blocks", lo=1, integer=True)
        size = len(blocks)
        if "size" in pr.d and pr.num("size", integer=True) != size:
            raise pr.err("size", f"must match the {size} prefix lengths in blocks")
    else:
        blocks, size = parse_dist(pr.sub("blocks"), 1, 100_000), pr.num("size", lo=1, hi=MAX_POOL, integer=True)
    if not 1 <= size <= MAX_POOL:
        raise pr.err("blocks", f"a pool holds 1..{MAX_POOL:,} prefixes, got {size:,}")
    pool = Pool(pr.num("share", 1.0, lo=0, hi=1), size, blocks, zipf=pr.num("zipf", 0.0, lo=0),
                tail=pr.opt("tail", parse_dist))
    if "popularity" in pr.d:
        if "zipf" in pr.d:
            raise pr.err("zipf", "cannot be combined with popularity (give one)")
        if not isinstance(pr.d["popularity"], list) or len(pr.d["popularity"]) != size:
            raise pr.err("popularity", f"must be a list of {size} weights, one per prefix")
        pool.popularity = pr.nums("popularity", lo=0)
        if sum(pool.popularity) <= 0:
            raise pr.err("popularity", "weights must have a positive sum")
    return pool


def parse_client(r: _Reader, i: int, exact_count: bool = False) -> Client:
    r.check_keys(CLIENT_KEYS)
    arrival = r.opt("arrival", parse_arrival) or Arrival()
    onoff = arrival.process == "onoff" and "rate" not in r.d
    rate, models = onoff_mean_rate(arrival) if onoff else r.num("rate", lo=0, lo_open=True), parse_models(r)
    lw = parse_length_windows(r) if "length_windows" in r.d else None
    for key in ("input", "output"):
        if lw and key in r.d:
            raise r.err(key, "is given per window in length_windows; remove one of them")
        if key not in r.d and "bootstrap" not in r.d and not lw and any(getattr(m, key) is None for m in models):
            raise r.err(key, "is required (e.g. {dist: lognormal, median: 500, sigma: 1}) unless every model sets its own")
    inp, out = lw[0][1:] if lw else (r.opt(k, parse_dist) or Dist("constant", {"value": 1}) for k in ("input", "output"))
    sessions, prefix = r.opt("sessions", _sessions), r.opt("prefix", parse_prefix)
    if "why" in r.d and not isinstance(r.d["why"], str):  # fit's note on the arrival model
        raise r.err("why", "must be text")
    boot = r.d.get("bootstrap")
    agent = r.opt("agent", parse_agent)
    clash = [k for k in ("sessions", "prefix", "bootstrap") if k in r.d]
    if agent and clash:
        raise r.err("agent", f"cannot be combined with {clash[0]} (a task is one conversation with its own system_blocks)")
    if lw and (agent or boot is not None):
        raise r.err("length_windows", "cannot be combined with agent or bootstrap (they draw their own lengths)")
    if boot is not None and not Path(str(boot)).exists():
        raise r.err("bootstrap", f"trace file {boot} not found")
    if isinstance(r.d.get("profile"), dict) and "cv" in r.d["profile"] and arrival.process not in ("gamma", "weibull"):
        raise r.err("profile", "a table with a cv per window needs arrival process gamma or weibull")
    return Client(
        name=str(r.d.get("name", f"client-{i}")), rate=rate, arrival=arrival, models=models,
        profile=r.opt("profile", parse_profile) or Profile(), mix_window=r.num("mix_window", 600.0, lo=0, lo_open=True),
        slo_class=_weights(r, "slo_class", r.d["slo_class"]) if "slo_class" in r.d else {}, input=inp, output=out,
        rho=r.num("rho", 0.0, lo=-1, hi=1), failures=r.num("failures", 0.0, lo=0, hi=1), sessions=sessions,
        prefix=prefix, bootstrap=None if boot is None else str(boot), images=r.opt("images", parse_images),
        modulation=r.opt("modulation", parse_modulation), exact_count=r.flag("exact_count", exact_count),
        agent=agent, length_windows=lw, reasoning_share=parse_share(r, "reasoning_share"))


def _sessions(r: _Reader) -> Sessions:
    r.check_keys({"turns", "think_s", "user_tokens", "branch"})
    r.need("turns", "think_s", rule="is required for sessions")
    return Sessions(parse_dist(r.sub("turns"), 1, 1000), parse_dist(r.sub("think_s"), 0, 1e6),
                    r.opt("user_tokens", parse_dist), r.num("branch", 0.0, lo=0, hi=1))


def parse_spec(d: Any, file: str | None = None) -> Spec:
    """Validate a spec dict and return the typed view; SpecError names the first bad field."""
    r = _Reader(d, "", file)
    r.check_keys({"duration", "seed", "block_size", "length_scale", "max_input_tokens",
                  "max_output_tokens", "clients", "version", "name", "description", "exact_count",
                  "timestamp_quantum_s", "timestamp_spread", "prefix_reuse"})
    exact = r.flag("exact_count", False)
    reuse = r.num("prefix_reuse", None, lo=0)  # generate applies it (transform.prefix_reuse)
    if reuse is not None and reuse >= 1:
        raise r.err("prefix_reuse", f"must be < 1 (a prefix's first request always misses), got {reuse:g}")
    clients = d.get("clients")
    if not isinstance(clients, list) or not clients:
        raise r.err("clients", "must be a non-empty list of clients")
    duration = r.num("duration", lo=0, lo_open=True, hi=MAX_DURATION_S)
    spec = Spec(duration=duration, seed=r.num("seed", 0, lo=0, integer=True),
                block_size=r.num("block_size", 16, lo=1, integer=True),
                length_scale=r.num("length_scale", 1.0, lo=0, lo_open=True),
                max_input_tokens=r.num("max_input_tokens", None, lo=1, integer=True),
                max_output_tokens=r.num("max_output_tokens", None, lo=0, integer=True),
                timestamp_quantum_s=r.num("timestamp_quantum_s", None, lo=0, lo_open=True),
                timestamp_spread=r.flag("timestamp_spread", False),
                clients=[parse_client(_Reader(c, f"clients[{i}]", file), i, exact) for i, c in enumerate(clients)])
    for i, c in enumerate(spec.clients):  # generate holds one knot (rate value) per window
        for key, w in (("profile", c.profile.window if c.profile.kind == "table" else None),
                       ("modulation", c.modulation.window if c.modulation else None)):
            if w and duration / w > MAX_WINDOWS:
                rule = f"{w:g} s cuts {duration:g} s into {duration / w:,.0f} windows; at most {MAX_WINDOWS:,}"
                raise SpecError(f"clients[{i}].{key}.window", rule, file)
    return spec


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON spec file, or the spec embedded in a generated Parquet trace."""
    import yaml
    path = Path(path)
    if not path.exists():
        raise TraceError("spec file not found", file=str(path))
    if path.suffix.lower() == ".parquet":
        from .trace import Trace
        gen = Trace.read_metadata(path).get("generator")
        if not isinstance(gen, dict) or "spec" not in gen:
            raise TraceError("this trace has no embedded generator spec (metadata key 'generator')", file=str(path))
        return {**gen["spec"], "seed": gen.get("seed", 0)}
    text = path.read_text()
    try:  # JSON first: a long imported spec (ServeGen: tens of MB) loads ~70x faster than as YAML
        d = json.loads(text) if path.suffix.lower() == ".json" else None
    except ValueError:
        d = None
    try:
        d = yaml.safe_load(text) if d is None else d
    except yaml.YAMLError as e:
        raise TraceError(f"not valid YAML/JSON: {str(e)[:300]}", file=str(path)) from None
    if not isinstance(d, dict):
        raise TraceError("a spec must be a mapping with duration and clients", file=str(path))
    return d
