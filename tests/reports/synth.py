"""Synthetic but realistic records (RECORD_SCHEMA), built column-wise for tests and benchmarks.

Poisson arrivals, log-normal prompt lengths, geometric output lengths, TTFT growing with the
prompt, gamma-distributed gaps between chunks, a share of failures of several kinds.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from llm_replay.reports.schema import RECORD_SCHEMA


def synth_records(n: int, *, seed: int = 0, rate: float = 50.0, models=("llama-8b", "qwen-32b"),
                  classes=("interactive", "batch"), ttft_ms: float = 80.0, tpot_ms: float = 20.0,
                  ttft_factor: float = 1.0, fail_share: float = 0.01, lag_ms: float = 0.3,
                  out_mean: float = 16.0, chunk_tokens: bool = False, usage: bool = True,
                  t0: float = 0.0, first_id: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    sched = t0 + np.cumsum(rng.exponential(1.0 / rate, n))
    sent = sched + rng.exponential(lag_ms / 1e3, n)
    inp = np.clip(rng.lognormal(6.5, 1.0, n), 8, 32000).astype(np.int32)
    out = np.minimum(rng.geometric(1.0 / out_mean, n), 2000).astype(np.int32)
    ttft = rng.lognormal(np.log(ttft_ms / 1e3), 0.4, n) * (1 + inp / 4000) * ttft_factor
    per = 2 if chunk_tokens else 1
    nch = (out + per - 1) // per
    total = int(nch.sum())
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nch, out=starts[1:])
    gaps = rng.gamma(4.0, tpot_ms / 1e3 / 4.0 * per, total)
    gaps[starts[:-1]] = ttft                      # the first chunk arrives after TTFT
    cs = np.cumsum(gaps)
    times = cs - np.repeat(np.concatenate([[0.0], cs[starts[1:-1] - 1]]), nch)
    failed = rng.random(n) < fail_share
    status = np.where(failed, rng.choice(["http_error", "timeout", "connection_error"], n), "ok")
    first = np.where(failed, np.nan, sent + ttft)
    last = np.where(failed, np.nan, sent + times[starts[1:] - 1])
    tt = pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(times.astype(np.float32)),
                                  mask=pa.array(failed))
    cols = {
        "request_id": pa.array(np.char.add("r", np.arange(first_id, first_id + n).astype(str))),
        "model": pa.array(np.asarray(models)[rng.integers(0, len(models), n)]),
        "slo_class": pa.array(np.asarray(classes)[rng.integers(0, len(classes), n)]),
        "worker": pa.array(np.zeros(n, dtype=np.int32)),
        "scheduled_s": pa.array(sched), "sent_s": pa.array(sent),
        "first_token_s": pa.array(first, from_pandas=True), "last_token_s": pa.array(last, from_pandas=True),
        "token_times": tt,
        "input_tokens": pa.array(inp), "output_tokens": pa.array(out),
        "prompt_tokens": pa.array(np.where(failed, 0, inp), mask=failed) if usage else pa.nulls(n, pa.int32()),
        "completion_tokens": pa.array(out, mask=failed) if usage else pa.nulls(n, pa.int32()),
        "status": pa.array(status),
        "http_status": pa.array(np.where(status == "http_error", 500, 0).astype(np.int32),
                                mask=status != "http_error"),
        "error": pa.array(np.where(failed, np.char.add("failed: ", status), ""), mask=~failed),
    }
    if chunk_tokens:
        ct = np.full(total, per, dtype=np.int16)
        odd = out % per == 1
        ct[(starts[1:] - 1)[odd]] = 1
        cols["chunk_tokens"] = pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(ct),
                                                        mask=pa.array(failed))
    n_rows = n
    arrays = [cols.get(f.name, pa.nulls(n_rows, f.type)) for f in RECORD_SCHEMA]
    arrays = [a.cast(f.type) for a, f in zip(arrays, RECORD_SCHEMA)]
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def write_run(run_dir: Path, table: pa.Table, config: dict | None = None,
              server_metrics: pa.Table | None = None) -> Path:
    import pyarrow.parquet as pq
    run_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run_dir / "records.parquet")
    if config is not None:
        (run_dir / "run.json").write_text(json.dumps(config))
    if server_metrics is not None:
        pq.write_table(server_metrics, run_dir / "server_metrics.parquet")
    return run_dir
