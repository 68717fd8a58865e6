"""How far a replay that fell behind its schedule can have moved each figure: the gate's bounds.

A late send is direct evidence that the client did not run when it should have (its own core
was saturated, or the host did not schedule it). While it did not run, it also read nothing:
a token that arrived then was stamped when the client ran again, late by at most the stall
(kernel timestamps do not help when one late read drains several events). So:
- the stalls are the intervals [scheduled, sent] of the late sends (lag > LATE_MS), joined
  with the CPU-sample windows that hold them (bottleneck.assess `windows`, 0.1 s grid);
- a stamp t inside a stall [a, b] (or within SETTLE after it: the read that ends it) may be
  late by up to t - a; a stamp outside every stall is on time. A send stamped in or just before
  a stall may have been written only at its end: up to b - sent more in every latency from it;
- so TTFT and E2E lie in [x - b, x] (b: that send delay plus the stamp's own); TPOT, whose two
  stamps can both be late, in [x - d_last/(k-1), x + d_first/(k-1)]; a gap between two token
  stamps in [max(0, g - d_k), g + d_(k-1)]; the `_sched` latencies, which also hold a late
  send's lag, in [x - lag - b, x]; other latencies, by the stalled time inside the request;
- when fewer requests went out than the trace offered, the rates lie in
  [x, x * offered / achieved].
The dispatch lag itself is measured exactly and has no bound. A stall that no send fell in is
not seen: at 20 req/s sends are 50 ms apart, so what is missed is shorter than that.
The gate takes the statistic of the lower and of the upper sample: pass when even the worst
end passes, fail when even the best end fails, undecided in between.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .bottleneck import LATE_MS
from .metrics import chunk_token_rows

SETTLE = LATE_MS / 1e3     # a stamp this soon after a stall may be the read that ended it
UPPER_ONLY = ("ttft_ms", "e2e_ms")                  # stamps only late: [x - b, x]
PER_TOKEN = ("tpot_ms",)
RATES = ("requests_per_s", "output_tokens_per_s", "goodput_rps", "token_goodput_per_s")


@dataclass
class Bias:
    stalls: np.ndarray        # (k, 2) merged stall intervals, seconds from T0
    send: np.ndarray          # per row, ms: how much later than stamped the request may have been written
    lag: np.ndarray           # per row, ms: the lag of a late send (0 when on time)
    d_first: np.ndarray       # per row, ms: how late its first-token stamp may be
    d_end: np.ndarray         # per row, ms: how late its last stamp may be
    overlap: np.ndarray       # per row, ms: stalled time in [scheduled, end] (the other latencies)
    rate_factor: float        # offered / achieved when fewer went out than offered, else 1

    @property
    def stalled_s(self) -> float:
        return float((self.stalls[:, 1] - self.stalls[:, 0]).sum()) if len(self.stalls) else 0.0

    def affected(self, rows: np.ndarray) -> int:
        return int(np.count_nonzero(rows & (self.overlap > 0)))

    def delay(self, t: np.ndarray) -> np.ndarray:
        """ms by which stamps at `t` (seconds from T0) may be late."""
        a, b = self.stalls[:, 0], self.stalls[:, 1]
        k = np.searchsorted(a, np.nan_to_num(t, nan=-np.inf), side="right") - 1
        j = np.maximum(k, 0)
        inside = (k >= 0) & (t <= b[j] + SETTLE)
        return np.where(inside, (t - a[j]) * 1e3, 0.0)

    def sample_bounds(self, metric: str, rm, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(lower, upper) samples of a per-request metric over `rows` (NaN dropped alike), or
        None when the metric carries no bias (the lag, or nothing stalled)."""
        base = metric.replace("_sched_ms", "_ms")
        if base == "lag_ms":
            return None
        x = rm.latency(metric)[rows]
        keep = ~np.isnan(x)
        x = x[keep]
        sched = metric.endswith("_sched_ms") and rm.latency(metric) is not rm.columns[base]
        pick = (lambda v: v[rows][keep])
        send, d_first, d_end = pick(self.send), pick(self.d_first), pick(self.d_end)
        extra = pick(self.lag) if sched else 0.0
        if base == "ttft_ms":
            lo, hi = x - send - d_first - extra, x
        elif base == "e2e_ms":
            lo, hi = x - send - d_end - extra, x
        elif base == "tpot_ms":
            k = np.maximum(pick(rm.n_out) - 1, 1)
            lo, hi = x - d_end / k, x + d_first / k
        elif base == "ntpot_ms":
            k = np.maximum(pick(rm.n_out), 1)
            lo, hi = x - (send + d_end + extra) / k, x
        else:
            b = pick(self.overlap)
            lo, hi = x - b, x + b
        if np.array_equal(lo, x) and np.array_equal(hi, x):
            return None
        return np.maximum(lo, 0), hi

    def pooled_bounds(self, an, metric: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Token gaps of the requests with a stamp in a stall, each by its own two stamps' delays
        (chunk gaps of one token each); otherwise by the request's stalled time either way."""
        base = metric.replace("_sched_ms", "_ms")
        hit = rows & (self.overlap > 0)
        if not hit.any():
            return None
        clean, dirty = an.pooled(rows & ~hit)[base], an.pooled(hit)[base]
        per_gap = base == "icl_ms" or (base == "itl_ms" and (an.rm.one_token[hit] | ~an.rm.ok[hit]).all()
                                       and not chunk_token_rows(an.table, hit).any())
        if per_gap:
            idx = np.flatnonzero(hit & an.rm.ok)
            tt = an.table.column("token_times").take(idx).combine_chunks()
            lens = np.diff(tt.offsets.to_numpy())
            t = tt.values.to_numpy(zero_copy_only=False).astype(np.float64) + np.repeat(an.rm.sent[idx], lens)
            g, same = np.diff(t) * 1e3, np.ones(max(len(t) - 1, 0), bool)
            ends = np.cumsum(lens)[:-1]
            same[ends[(ends > 0) & (ends < len(t))] - 1] = False
            d = self.delay(t)
            g, lo, hi = g[same], (g - d[1:])[same], (g + d[:-1])[same]
            if len(g) == len(dirty):      # the same gaps pooled_gaps found (else: the safe bound)
                return np.concatenate([clean, np.maximum(lo, 0)]), np.concatenate([clean, hi])
        big = float(self.overlap[hit].max())
        return np.concatenate([clean, np.maximum(dirty - big, 0)]), np.concatenate([clean, dirty + big])

    def shifted(self, rm, upper: bool):
        """RequestMetrics with every biased per-request latency at its upper (or lower) end,
        for good requests (attainment, goodput) under the worst and best case."""
        cols = dict(rm.columns)
        everyone = np.ones(rm.n, bool)
        for key in ("ttft_ms", "ttfa_ms", "tpot_ms", "e2e_ms"):
            if key in cols:
                b = self.sample_bounds(key, rm, everyone)
                if b is not None:
                    col = cols[key].copy()
                    col[~np.isnan(col)] = b[1] if upper else b[0]
                    cols[key] = col
        return replace(rm, columns=cols)


def _merge(iv: np.ndarray) -> np.ndarray:
    if not len(iv):
        return np.zeros((0, 2))
    iv = iv[np.argsort(iv[:, 0])]
    out = [list(iv[0])]
    for a, b in iv[1:]:
        if a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.asarray(out, float)


def _stalled_before(stalls: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Total stalled time (s) before each t (NaN -> NaN)."""
    if not len(stalls):
        return np.zeros_like(t)
    a, b = stalls[:, 0], stalls[:, 1]
    cum = np.concatenate([[0.0], np.cumsum(b - a)])
    tt = np.nan_to_num(t, nan=-np.inf)
    k = np.searchsorted(a, tt, side="right")          # stalls starting at or before t
    inside = np.where(k > 0, np.minimum(tt, b[np.maximum(k - 1, 0)]) - a[np.maximum(k - 1, 0)], 0.0)
    out = cum[np.maximum(k - 1, 0)] + np.maximum(inside, 0.0)
    out = np.where(k > 0, out, 0.0)
    return np.where(np.isnan(t), np.nan, out)


def bias_of(an, dispatch_lag: dict | None) -> Bias | None:
    """The bounds of a run from its records and its `dispatch_lag` section (bottleneck.assess);
    None when no send was late and the offered load was sent."""
    rm, m = an.rm, an.mask
    lag = (rm.sent - rm.scheduled) * 1e3
    late = m & (lag > LATE_MS)
    d = dispatch_lag or {}
    off, ach = d.get("offered_rps"), d.get("achieved_rps")
    factor = off / ach if off and ach and ach < 0.98 * off else 1.0
    if not late.any() and factor == 1.0:
        return None
    iv = [np.column_stack([rm.scheduled[late], rm.sent[late]])]
    iv += [np.asarray([[w["start_s"], w["end_s"]] for w in d.get("windows") or []], float).reshape(-1, 2)]
    stalls = _merge(np.concatenate(iv))
    bias = Bias(stalls, *(np.zeros(rm.n) for _ in range(5)), factor)
    if not len(stalls):
        return bias
    a, b = stalls[:, 0], stalls[:, 1]
    k = np.searchsorted(a, np.nan_to_num(rm.sent + SETTLE, nan=-np.inf), side="right") - 1
    j = np.maximum(k, 0)
    near = (k >= 0) & (rm.sent <= b[j])
    bias.send = np.nan_to_num(np.where(near, np.maximum(b[j] - rm.sent, 0) * 1e3, 0.0))
    bias.lag = np.where(late, lag, 0.0)
    bias.d_first = np.nan_to_num(bias.delay(rm.sent + rm.columns["ttft_ms"] / 1e3))
    bias.d_end = np.nan_to_num(bias.delay(rm.end))
    cum = _stalled_before(stalls, rm.end) - _stalled_before(stalls, rm.scheduled)
    bias.overlap = np.nan_to_num(np.maximum(cum, 0) * 1e3)
    return bias
