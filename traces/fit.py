"""`replay trace fit T -o SPEC.yaml`: learn a generator spec that reproduces a trace.

Per client (the trace's `client_id` when it has few of them, else one client):
- rate profile: windowed counts, kept as a table when the rate visibly varies (windows
  correlated, or far more dispersed than the process within a window);
- arrival process on rate-rescaled gaps: batch when many arrivals coincide, on/off when the
  index of dispersion keeps growing with the window, else the best of Poisson / gamma /
  Weibull by AIC, with the gaps' CV;
- per model: input and output lengths (lognormal / gamma / Weibull by AIC when its
  p50/p90/p99 match, else an empirical quantile table), their Spearman rho, the model mix
  (per window when it drifts), SLO classes, failures;
- sessions (turns, think time, new user tokens per turn) and prefix structure from hash_ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import linalg, optimize
from scipy import stats as sst

from . import stats
from .errors import TraceError

MAX_CLIENTS = 64          # more distinct client_ids than this: one aggregate client
FIT_SAMPLES = 200_000       # likelihoods on an evenly spaced subsample: fast on 10M rows
EMPIRICAL_POINTS = 1000


def _sub(x: np.ndarray) -> np.ndarray:
    return x[np.linspace(0, len(x) - 1, FIT_SAMPLES).astype(np.int64)] if len(x) > FIT_SAMPLES else x


def _candidates(x: np.ndarray) -> list[tuple[float, str, dict[str, float], Any]]:
    """(AIC, family, params, frozen scipy dist) of lognormal, gamma and Weibull fits (loc 0)."""
    x = _sub(x[x > 0])
    out = []
    lx = np.log(x)
    ln = sst.lognorm(max(lx.std(), 1e-6), scale=np.exp(lx.mean()))
    out.append(("lognormal", {"median": float(np.exp(lx.mean())), "sigma": float(lx.std())}, ln))
    k = stats.gamma_shape(x)
    if k:
        out.append(("gamma", {"shape": k, "scale": float(x.mean() / k)}, sst.gamma(k, scale=x.mean() / k)))
    c = stats.weibull_shape(x)
    if c:
        scale = float(np.mean(x ** c) ** (1 / c))
        out.append(("weibull", {"shape": c, "scale": scale}, sst.weibull_min(c, scale=scale)))
    return sorted((4 - 2 * float(np.sum(d.logpdf(x))), f, p, d) for f, p, d in out)


def fit_length(x: np.ndarray, integer: bool = True) -> dict[str, Any]:
    """A spec distribution for samples x: the best parametric family by AIC whose capped
    quantiles match the data within 3%, else an empirical quantile table."""
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        return {"dist": "constant", "value": lo}
    qs = np.array([0.5, 0.9, 0.99])
    emp = np.quantile(x, qs)
    vals, counts = np.unique(x, return_counts=True)
    small_support = integer and len(vals) <= 64  # e.g. turns, batch sizes: keep the exact PMF
    for _, fam, params, d in ([] if small_support else _candidates(x)[:1]):
        fitted = np.clip(d.ppf(qs), lo, hi)
        fitted = np.rint(fitted) if integer else fitted
        if np.all(np.abs(fitted - emp) <= 0.03 * np.maximum(emp, 1)):
            return {"dist": fam, **{k: round(v, 6) for k, v in params.items()}, "min": lo, "max": hi}
    if len(vals) > EMPIRICAL_POINTS:
        vals = np.quantile(x, (np.arange(EMPIRICAL_POINTS) + 0.5) / EMPIRICAL_POINTS, method="inverted_cdf")
        counts = np.ones(len(vals))
    return {"dist": "empirical", "values": [float(v) for v in vals], "weights": [int(c) for c in counts],
            "min": lo, "max": hi}


def _idc(u: np.ndarray, w: float) -> float | None:
    """Index of dispersion of counts of points u in windows of width w."""
    nb = int(u[-1] // w) if len(u) else 0
    if nb < 10:
        return None
    c = np.bincount((u // w).astype(np.int64), minlength=nb)[:nb]
    return float(c.var(ddof=1) / c.mean()) if c.mean() > 0 else None


def fit_profile(t: np.ndarray, duration: float, window: float) -> tuple[dict[str, Any], np.ndarray]:
    """The rate profile and the arrivals in operational time (mean rate 1)."""
    nb = max(int(round(duration / window)), 1)  # a remainder under half a window joins the last
    counts = np.bincount(np.minimum((t // window).astype(np.int64), nb - 1), minlength=nb).astype(float)
    widths = np.full(nb, window)
    widths[-1] = duration - (nb - 1) * window
    dens = counts / widths
    varying = False
    if nb >= 6 and counts.mean() >= 5:
        lag1 = np.corrcoef(dens[:-1], dens[1:])[0, 1] if dens.std() > 0 else 0.0
        u_flat = t * len(t) / duration
        inner = _idc(u_flat, max(counts.mean() / 10, 1.0)) or 1.0
        varying = lag1 > 0.5 or (dens.var(ddof=1) * window / dens.mean() > 4 * inner + 2)
    if not varying:
        return {"kind": "constant"}, t * len(t) / duration
    knots = np.append(np.arange(nb) * window, duration)
    lam = np.concatenate([[0.0], np.cumsum(counts)])
    mean = dens.mean()
    values = [round(float(v / mean), 4) for v in dens]
    if widths[-1] > window:  # the generator's table is in whole windows: repeat the last value
        values.append(values[-1])
    return ({"kind": "table", "window": window, "values": values},
            np.interp(t, knots, lam))


def fit_arrival(u: np.ndarray, rate: float) -> dict[str, Any]:
    """Arrival process for points u in operational time (unit mean rate); `rate` in req/s."""
    g = np.diff(u)
    if len(g) < 20:
        return {"process": "poisson"}
    zero = float(np.mean(g <= 1e-9))
    if zero > 0.2:  # compound arrivals: many requests share an instant
        times, k = np.unique(u, return_counts=True)
        gaps = np.diff(times)
        return {"process": "batch", "cv": round(float(min(max(gaps.std() / gaps.mean(), 0.05), 20)), 4),
                "size": fit_length(k.astype(float))}
    g = g[g > 1e-9]
    cv = float(g.std() / g.mean())
    big = max(60 * rate, 20.0)
    idc_big, idc_small = _idc(u, big), _idc(u, max(rate, 1.0))
    if idc_big and idc_small and idc_big > 2 * max(cv * cv, 1) + 1 and idc_big > 2 * idc_small:
        return _fit_onoff(u, rate)
    best = _candidates(g)
    ll_exp = 2 - 2 * float(np.sum(sst.expon(scale=g.mean()).logpdf(_sub(g))))
    if ll_exp <= best[0][0] or abs(cv - 1) < 0.03:
        return {"process": "poisson"}
    fam = best[0][1] if best[0][1] in ("gamma", "weibull") else "gamma"
    return {"process": fam, "cv": round(min(max(cv, 0.05), 20.0), 4)}


def _mmpp_idc(w: np.ndarray, l1: float, l2: float, p1: float, rho: float) -> np.ndarray:
    """Index of dispersion of a two-state MMPP at window w (p1 = share of time bursting,
    rho = sum of the switching rates)."""
    m = p1 * l1 + (1 - p1) * l2
    return 1 + 2 * (l1 - l2) ** 2 * p1 * (1 - p1) / (m * rho) * (1 - (1 - np.exp(-rho * w)) / (rho * w))


def _mmpp_p0(b: float, l1: float, l2: float, p1: float, rho: float) -> float:
    """P(no arrival in a window of width b) = pi exp((Q - L) b) 1."""
    r_on, r_off = rho * (1 - p1), rho * p1           # leave burst, leave idle
    q = np.array([[-r_on - l1, r_on], [r_off, -r_off - l2]])
    return float(np.array([p1, 1 - p1]) @ linalg.expm(q * b) @ np.ones(2))


def _fit_onoff(u: np.ndarray, rate: float) -> dict[str, Any]:
    """Two-state MMPP by moments: its closed-form index of dispersion over a ladder of windows
    and the share of empty short windows, matched by least squares (unit mean rate)."""
    scales = np.geomspace(0.5, max(u[-1] / 30, 1.0), 14)
    idc = np.array([_idc(u, w) or np.nan for w in scales])
    ok = np.isfinite(idc) & (idc > 0)
    scales, idc = scales[ok], idc[ok]
    small = (0.3, 1.0)
    p0 = [float(np.mean(np.bincount((u // b).astype(np.int64))[: int(u[-1] // b)] == 0)) for b in small]

    def unpack(x: np.ndarray) -> tuple[float, float, float, float]:
        p1, ratio, rho = 1 / (1 + np.exp(-x[0])), 1 / (1 + np.exp(-x[1])), np.exp(x[2])
        l1 = 1 / (p1 + (1 - p1) * ratio)  # mean rate 1
        return l1, ratio * l1, p1, rho

    def resid(x: np.ndarray) -> np.ndarray:
        l1, l2, p1, rho = unpack(x)
        r = np.log(_mmpp_idc(scales, l1, l2, p1, rho)) - np.log(idc)
        return np.concatenate([r, [5 * (_mmpp_p0(b, l1, l2, p1, rho) - p) for b, p in zip(small, p0)]])

    best = min((optimize.least_squares(resid, x0) for x0 in
                ([-1.5, -2.5, np.log(0.05)], [0.0, -1.0, np.log(0.01)], [-3.0, -4.0, np.log(0.002)])),
               key=lambda r: r.cost)
    l1, l2, p1, rho = unpack(best.x)
    return {"process": "onoff", "burst_rate": round(l1 * rate, 6), "idle_rate": round(l2 * rate, 6),
            "on_s": round(1 / (rho * (1 - p1)) / rate, 4), "off_s": round(1 / (rho * p1) / rate, 4)}


def _col(t: pa.Table, name: str) -> np.ndarray | None:
    if name not in t.column_names or t.column(name).null_count == t.num_rows:
        return None
    return t.column(name).to_numpy(zero_copy_only=False)


def _codes(t: pa.Table, name: str) -> tuple[np.ndarray, list[str]] | None:
    if name not in t.column_names or t.column(name).null_count == t.num_rows:
        return None
    col = pc.dictionary_encode(t.column(name).cast(pa.string())).combine_chunks()
    return col.indices.fill_null(-1).to_numpy(zero_copy_only=False), [str(v) for v in col.dictionary.to_pylist()]


def _fit_sessions(t: pa.Table, first: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """Turns per session, think time, new user tokens; the mask of rows that open a session."""
    sid = _codes(t, "session_id")[0]
    order = np.lexsort((_col(t, "arrival_ns"), sid))
    s, a = sid[order], _col(t, "arrival_ns")[order].astype(np.int64)
    same = np.concatenate([[False], s[1:] == s[:-1]])
    turn = _col(t, "turn")
    turn = turn[order].astype(float) if turn is not None else np.zeros(len(s))
    last_turn = np.maximum.reduceat(np.nan_to_num(turn), np.flatnonzero(~same))
    inp = _col(t, "input_tokens")[order].astype(float)
    out = np.nan_to_num(_col(t, "output_tokens")[order].astype(float))
    think = (a[1:] - a[:-1])[same[1:]] / 1e9
    user = (inp[1:] - inp[:-1] - out[:-1])[same[1:]]
    opens = np.zeros(len(s), bool)
    opens[order[~same]] = True
    spec = {"turns": fit_length(last_turn + 1), "think_s": fit_length(think, integer=False) if len(think) > 10
            else {"dist": "constant", "value": 30.0}}
    if len(user) > 10:
        spec["user_tokens"] = fit_length(np.maximum(user, 1))
    return spec, opens & first


def _fit_prefix(t: pa.Table) -> dict[str, Any] | None:
    """System prompt (modal first block) and application prefixes (recurring blocks after it)."""
    col = t.column("hash_ids").combine_chunks()
    lens = np.diff(col.offsets.to_numpy().astype(np.int64))
    if lens.sum() == 0:
        return None
    m = int(min(lens.max(), 256))
    ids = np.full((len(lens), m), -1, np.int64)
    row = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(len(row)) - np.repeat(np.cumsum(lens) - lens, lens)
    flat = col.flatten().to_numpy(zero_copy_only=False)
    keep = pos < m
    ids[row[keep], pos[keep]] = flat[keep]

    def leading_run(rows: np.ndarray, start: int) -> int:
        n = 0
        while start + n < m:
            v = ids[rows, start + n]
            v = v[v >= 0]  # rows with a full block here (short prompts truncate their prefix)
            vals, cnt = np.unique(v, return_counts=True)
            if len(v) < max(0.1 * len(rows), 3) or cnt.max() < 0.9 * len(v):
                break
            n += 1
        return n

    out: dict[str, Any] = {}
    vals, cnt = np.unique(ids[:, 0][ids[:, 0] >= 0], return_counts=True)
    sys_rows = np.zeros(len(lens), bool)
    if len(vals) and cnt.max() >= max(10, 0.05 * len(lens)):
        sys_rows = ids[:, 0] == vals[cnt.argmax()]
        out["system_blocks"] = leading_run(np.flatnonzero(sys_rows), 0)
        out["system_share"] = round(float(sys_rows.mean()), 4)
    start = np.where(sys_rows, out.get("system_blocks", 0), 0)
    at = ids[np.arange(len(lens)), np.minimum(start, m - 1)]
    # an application prefix recurs across sessions (a session repeats its own blocks every turn)
    sess = _codes(t, "session_id")
    owner = sess[0] if sess is not None else np.arange(len(lens))
    pairs = np.unique(np.stack([at, owner]), axis=1)[0]
    vals, cnt = np.unique(pairs, return_counts=True)
    recurring = (cnt[np.searchsorted(vals, at)] >= 3) & (at >= 0)
    if recurring.mean() > 0.05 and len(np.unique(at[recurring])) > 1:
        top = at == vals[np.argmax(np.where(vals >= 0, cnt, 0))]
        out.update(apps=int(len(np.unique(at[recurring]))), app_share=round(float(recurring.mean()), 4),
                   app_blocks=leading_run(np.flatnonzero(top), int(np.median(start[top]))))
    return out


def _mix(model: np.ndarray, names: list[str], t: np.ndarray, window: float) -> tuple[list[dict], float]:
    nb = max(int(t.max() // window) + 1, 1)
    table = np.zeros((nb, len(names)))
    np.add.at(table, ((t // window).astype(np.int64), model), 1)
    total = table.sum(0)
    drift = nb > 1 and len(names) > 1 and (table.sum(1) > 0).sum() > 1
    if drift:
        nz = table[table.sum(1) > 0]
        drift = sst.chi2_contingency(nz[:, total > 0])[1] < 1e-3
    if not drift:
        return [{"name": n, "weight": round(float(total[i] / total.sum()), 6)} for i, n in enumerate(names)], window
    share = table / np.maximum(table.sum(1, keepdims=True), 1)
    return [{"name": n, "weight": [round(float(v), 4) for v in share[:, i]]} for i, n in enumerate(names)], window


def _fit_client(t: pa.Table, name: str, duration: float, window: float) -> dict[str, Any]:
    a = _col(t, "arrival_ns").astype(np.int64)  # already relative to the trace's first arrival
    times = a / 1e9
    opens = np.ones(len(a), bool)
    c: dict[str, Any] = {"name": name, "rate": round(len(a) / duration, 6)}
    if _col(t, "session_id") is not None:
        c["sessions"], opens = _fit_sessions(t, opens)
    starts = times[opens]
    start_rate = len(starts) / duration
    c["profile"], u = fit_profile(starts, duration, window)
    c["arrival"] = fit_arrival(u, start_rate)
    failed = _col(t, "failed_in_source")
    failed = failed.astype(bool) if failed is not None else np.zeros(len(a), bool)
    if failed.any():
        c["failures"] = round(float(failed.mean()), 6)
    inp, out = _col(t, "input_tokens").astype(float), _col(t, "output_tokens").astype(float)
    mc = _codes(t, "model") or (np.zeros(len(a), np.int64), ["default"])
    models, names = mc
    models = np.where(models < 0, len(names), models)
    names = names + ["default"] if (models == len(names)).any() else names
    turn = _col(t, "turn")
    new = opens & (np.nan_to_num(turn.astype(float)) == 0) if "sessions" in c and turn is not None else opens
    c["models"], c["mix_window"] = _mix(models[opens], names, starts, window)
    for i, m in enumerate(c["models"]):
        sel = (models == i) & ~failed & ~np.isnan(out)
        x, y = inp[sel & new], out[sel & new]
        if len(x) < 2:
            x, y = inp[models == i], np.nan_to_num(out[models == i])
        m["input"], m["output"] = fit_length(x), fit_length(out[sel] if sel.any() else y)
        if len(x) > 2 and x.std() > 0 and y.std() > 0:
            m["rho"] = round(float(sst.spearmanr(x, y)[0]), 4)
    sc = _codes(t, "slo_class")
    if sc is not None:
        cnt = np.bincount(sc[0][sc[0] >= 0], minlength=len(sc[1]))
        c["slo_class"] = {n: int(k) for n, k in zip(sc[1], cnt) if k}
    if len(c["models"]) == 1:  # one model: its lengths are the client's
        m = c["models"][0]
        c.update({k: m.pop(k) for k in ("input", "output", "rho") if k in m})
        c["models"] = {m["name"]: 1.0}
    return c


def fit_trace(trace: Any, window: float | None = None) -> dict[str, Any]:
    """A generator spec (dict) that reproduces `trace`'s statistics."""
    t = trace.table if hasattr(trace, "table") else trace
    if t.num_rows < 10:
        raise TraceError(f"too few requests to fit ({t.num_rows}; need at least 10)")
    a = _col(t, "arrival_ns").astype(np.int64)
    t = t.set_column(t.column_names.index("arrival_ns"), "arrival_ns", pa.array(a - a[0]))
    span = (a[-1] - a[0]) / 1e9
    if span <= 0:
        raise TraceError("all arrivals share one timestamp: no rate to fit")
    duration = span * len(a) / (len(a) - 1)
    window = float(window or max(60.0, round(duration / 48 / 60) * 60))
    groups = [(t, "fitted")]
    cc = _codes(t, "client_id")
    if cc is not None and len(cc[1]) <= MAX_CLIENTS and (cc[0] >= 0).all():
        groups = [(t.filter(pa.array(cc[0] == i)), n) for i, n in enumerate(cc[1])]
    meta = getattr(trace, "metadata", {}) or {}
    spec: dict[str, Any] = {"duration": round(duration, 6), "seed": 0,
                            "block_size": int(meta.get("block_size") or 16),
                            "clients": [_fit_client(g, n, duration, window) for g, n in groups if g.num_rows >= 2]}
    if "hash_ids" in t.column_names:
        for (g, _), c in zip(groups, spec["clients"]):
            p = _fit_prefix(g) if g.column("hash_ids").null_count < g.num_rows else None
            if p is not None:
                c["prefix"] = p
    # plain Python numbers only: the spec is written as YAML and embedded as JSON
    return json.loads(json.dumps(spec, default=lambda v: v.item()))


def write_spec(spec: dict[str, Any], path: Path) -> None:
    """YAML (default) or JSON (by suffix)."""
    import yaml
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(spec, indent=2))
    else:
        path.write_text(yaml.safe_dump(spec, sort_keys=False, width=120))
