"""Agentic tasks in the generator: a client with `agent` draws TASK starts from its arrival
process (at rate / the mean rows per task, so that `rate` stays the rows' mean rate) and
expands each task into a graph of calls (`task_id`, `depends_on`, `delay_s`), vectorised:

- **steps** S calls in a chain; step k > 0 depends on step k - 1 and is sent `tool_delay_s`
  after it (and its subagents) complete;
- **fanout** `{p, width, input}`: each step but the last fans out with probability p to
  `width` parallel subagent calls (one call each, depending on the step that spawned them,
  their own `tool_delay_s` after it); the next step joins them: its depends_on lists the
  previous step first, then the subagent calls;
- **lengths**: step 0's prompt = the shared prefix + a draw of the client's `input` (the
  task's request); step k's = step k-1's prompt + its output + its subagents' outputs +
  `growth` new tokens (tool results, user messages), cut to the last `context` - output
  tokens (`context`, and the spec's max_input_tokens) the way a framework truncates history;
  a subagent's prompt = the shared prefix + a draw of `fanout.input` (default `input`): a
  fresh, shorter context. Outputs: the client's (or model's) `output`, `rho` per group;
- **hash_ids**: `system_blocks` + `tools_blocks` shared by every call of the client (not
  scaled by length_scale), then the task's own blocks, one id range per task that every
  step repeats (so a step shares its predecessor's whole prefix), and one per subagent;
- **arrival_ns** of a dependant: what an unloaded server would have recorded: its last
  dependency's arrival + that call's estimated time + delay_s, the call time being
  CALL_S + input / PREFILL_TPS + output / DECODE_TPS (monotone, > 0: dependants sort after
  their dependencies). Replay ignores it (a dependant is released by its dependencies).

Tasks start from before t = 0 (a warm-up of about the longest task) so the trace is
stationary; a task whose step fell before 0 starts in the trace at its first later step, as
a root (no depends_on), and rows at or after `duration` are cut. `exact_count` fixes the
count of rows, round(rate * duration) (`--rate` is of requests): on a stationary client
the tasks are drawn over a longer span and the trace is a window of it that holds that
count (`_slide`); else every time and delay_s is scaled by one factor, as
`generate._session_times` does. A task's rows are drawn in topological order, so a stable
sort by arrival keeps every dependant after its dependencies, quantised timestamps included.
"""
from __future__ import annotations

import numpy as np

from .arrivals import arrival_times
from .sampling import (NS_BITS, arrival_order, discrete_mean, draw_labels, exact_scale, finish, sample,
                       sample_from_normal, sample_pair, segmented_cumsum)
from .schema import MAX_TOKENS
from .spec_types import Agent, Client, Spec

CALL_S, PREFILL_TPS, DECODE_TPS = 0.1, 10_000.0, 50.0   # the recorded-time estimate of one call


def call_s(inp: np.ndarray, out: np.ndarray) -> np.ndarray:
    return CALL_S + inp / PREFILL_TPS + out / DECODE_TPS


def mean_rows(a: Agent) -> float:
    """Rows per task: S steps + width subagents on each of the S - 1 steps that may fan out."""
    s = discrete_mean(a.steps)
    return s + (a.fanout_p * (s - 1) * discrete_mean(a.fanout_width) if a.fanout_width else 0.0)


def _warm(spec: Spec, c: Client) -> float:
    """About the span of a long (p99) task: how far before 0 tasks start."""
    a, out_d = c.agent, c.models[0].output or c.output
    long = float(finish(sample_from_normal(a.steps, np.array([2.33])), a.steps)[0])
    mo = discrete_mean(out_d)
    ctx = (a.system_blocks + a.tools_blocks) * spec.block_size + discrete_mean(c.models[0].input or c.input)
    ctx = min(ctx + long * (discrete_mean(a.growth) + mo), a.context or MAX_TOKENS)
    step = (1 + a.fanout_p) * (discrete_mean(a.tool_delay_s) + float(call_s(ctx, mo)))
    return max(long - 1, 0) * step  # (not cut to the duration: a short trace lost the tasks in flight)


def _slide(t: np.ndarray, tm: np.ndarray, T: float, most: float, keep: int, rng: np.random.Generator) -> float:
    """A shift s in [0, most] whose window [s, s + T) holds exactly `keep` rows (a row counts when
    its step starts in the window: tm >= s, and it arrives before the end: t < s + T), drawn
    at random among the stretches of s that do: the tasks' own times, conditioned on the
    count, as exact_count conditions the other processes. 0 when no stretch does (rows that
    straddle a whole window are not subtracted: the caller checks the count)."""
    ts, ms = np.sort(t), np.sort(tm)
    cut = np.unique(np.concatenate([[0.0, most], ms, ts - T]))
    cut = cut[(cut >= 0) & (cut <= most)]
    mid = (cut[:-1] + cut[1:]) / 2
    count = np.searchsorted(ts, mid + T) - np.searchsorted(ms, mid)
    ok = np.flatnonzero(count == keep)
    return float(mid[ok[rng.integers(len(ok))]]) if len(ok) else 0.0


def client_rows(spec: Spec, c: Client, ci: int, streams: list) -> dict[str, np.ndarray]:
    """One agent client's rows as NumPy columns in draw order (task-major, topological), with
    `task`, `dep` (first dependency's draw index in this client), `ndep` (dependencies: draw
    indices dep..dep+ndep-1) and `delay` (NaN on roots); `order` lists the kept rows by arrival."""
    a, T = c.agent, spec.duration
    r_arr, r_sess, r_model, r_len, r_fail, _ = (np.random.default_rng(s) for s in streams)
    # exact_count on a stationary client: tasks drawn over 4 warm-ups more (the count of a
    # window forgets itself over about a task's span), the window slid to hold the count
    warm = _warm(spec, c)
    slide = 4 * warm if c.exact_count and c.profile.kind == "constant" and c.modulation is None \
        and len(c.models[0].weight) == 1 else 0.0
    starts = arrival_times(c.arrival, c.profile, c.rate / mean_rows(a), -warm, T + slide, r_arr,
                           c.modulation, c.exact_count)
    nt = len(starts)
    steps = sample(a.steps, r_sess, nt).astype(np.int64)
    first = np.cumsum(steps) - steps                        # per task: its first main step
    task_m = np.repeat(np.arange(nt), steps)                # per main step: its task, step index
    k = np.arange(len(task_m)) - first[task_m]
    width = np.zeros(len(task_m), np.int64)
    if a.fanout_width is not None and a.fanout_p > 0:
        fan = (r_sess.random(len(task_m)) < a.fanout_p) & (k < steps[task_m] - 1)
        width[fan] = sample(a.fanout_width, r_sess, int(fan.sum()))
    b = 1 + width                                           # a step's block: itself, its subagents
    at = np.cumsum(b) - b                                   # per main step: its row
    n = int(b.sum())
    m_of = np.repeat(np.arange(len(task_m)), b)             # per row: its step (or its spawner)
    main = np.zeros(n, bool)
    main[at] = True
    kind = np.where(main, np.minimum(k[m_of], 1), 2)        # 0 first step, 1 later step, 2 subagent
    task = task_m[m_of]
    model, failed, slo = draw_labels(c, starts, task, r_model, r_fail)   # a task keeps one model

    new, out = np.empty(n), np.empty(n)
    for mi, m in enumerate(c.models):
        in_d, out_d, rho = m.input or c.input, m.output or c.output, c.rho if m.rho is None else m.rho
        for kd, d in enumerate((in_d, a.growth, a.fanout_input or in_d)):
            idx = np.flatnonzero((kind == kd) & (model == mi))
            x, o = sample_pair(d, out_d, rho, r_len, len(idx))
            new[idx] = finish(x, d, spec.length_scale)
            out[idx] = finish(o, out_d, spec.length_scale, spec.max_output_tokens)
    out[failed] = 0
    np.minimum(out, MAX_TOKENS if a.context is None else a.context - 1, out=out)
    shared = a.system_blocks + a.tools_blocks
    new[kind != 1] += shared * spec.block_size
    cap = np.full(n, min(spec.max_input_tokens or MAX_TOKENS, MAX_TOKENS), np.int64)
    if a.context:
        np.minimum(cap, a.context - out.astype(np.int64), out=cap)
    # the chain's prompt: uncapped sums S, then r_k = min(r_{k-1} + inc_k, cap_k) in closed form,
    # S_k + min(0, running min over the task of cap_j - S_j) (a per-task offset restarts the min)
    later = np.flatnonzero(k > 0)
    replies = np.add.reduceat(np.where(main, 0.0, out), at)          # per step: its subagents' outputs
    inc = new[at].astype(np.int64)
    inc[later] += (out[at] + replies)[later - 1].astype(np.int64)
    s = segmented_cumsum(inc, first, steps)
    v = cap[at] - s
    big = int(v.max() - v.min()) + 1 if len(v) else 1
    run = np.minimum.accumulate(v - task_m * big) + task_m * big
    inp = np.minimum(new.astype(np.int64), cap)
    inp[at] = s + np.minimum(run, 0)
    del new, s, v, run, inc

    c_s = call_s(inp, out)
    delay = sample(a.tool_delay_s, r_sess, n, integer=False)
    slowest = np.maximum.reduceat(np.where(main, 0.0, delay + c_s), at)   # subagents' end after the step's
    gap = np.zeros(len(task_m))
    gap[later] = (c_s[at] + slowest)[later - 1] + delay[at[later]]
    t_main = starts[task_m] + segmented_cumsum(gap, first, steps)
    t = t_main[m_of] + np.where(main, 0.0, c_s[at][m_of] + delay)
    keep = max(int(round(c.rate * T)), 1) if c.exact_count else None
    s = _slide(t, t_main[m_of], T, slide, keep, r_arr) if slide else 0.0
    t_main, t = t_main - s, t - s
    dep, ndep = np.zeros(n, np.int64), np.zeros(n, np.int32)
    dep[~main], ndep[~main] = at[m_of[~main]], 1
    kept = later[t_main[later - 1] >= 0]                    # a step whose predecessor is in the trace
    dep[at[kept]], ndep[at[kept]] = at[kept - 1], b[kept - 1]
    delay[ndep == 0] = np.nan

    bs = spec.block_size                                    # [shared][the task's or subagent's own]
    full = (inp // bs).astype(np.int32)
    n_sys = np.minimum(full, np.int32(shared))
    own = (full - n_sys).astype(np.int64)
    span = np.concatenate([np.maximum.reduceat(own[at], first) if nt else own[:0], own[~main]])
    base = (np.int64(ci + 1) << NS_BITS) + shared + np.cumsum(span) - span
    chain = np.where(main, task, nt + np.cumsum(~main) - 1)
    partial = inp % bs > 0
    rows = {"input": inp.astype(np.int32), "output": out.astype(np.int32), "model": model, "failed": failed,
            "slo": slo, "task": task, "dep": dep, "ndep": ndep, "delay": delay,
            "nb": full + partial, "n_sys": n_sys, "n_app": np.zeros(n, np.int32), "partial": partial,
            "app_base": np.zeros(n, np.int64), "content_base": base[chain] - n_sys}
    t = np.where(t_main[m_of] >= 0, t, -1.0)
    if keep is not None and ((t >= 0) & (t < T)).sum() != keep:
        # exact_count where no slide holds it (a profile, a modulation, a mix over time): as
        # with sessions, every time (and delay_s) scaled by one factor
        f = exact_scale(t, keep, T)
        t *= f
        delay *= f
    rows.update(arrival_order(t, T, spec.timestamp_quantum_s, keep))
    return {key: v for key, v in rows.items() if v is not None and key != "keep"}
