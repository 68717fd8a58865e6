"""Benchmark: records -> full summary, vectorised (reports) vs a per-request Python loop.

Generates N synthetic records (default 10M; tests/reports/synth.py: Poisson arrivals, log-normal
prompts, geometric outputs, ~1% failures), writes them as records.parquet, then times
`reports.summarize_run` end to end (read, validate, every metric, CIs, breakdowns, time series,
summary.json/md and report.html). The baseline is the style of vLLM's `calculate_metrics`: a
Python loop over per-request objects computing TTFT, TPOT, ICL, E2E, NTPOT, dispatch lag,
throughput and goodput, then np.percentile on the lists. It runs on a subset (default 200k)
and is scaled linearly to N; the loop computes a subset of what the summary computes, so the
ratio favours the loop. Both are checked to agree on the subset.

    python3 benchmarks/analyze.py [--records 10000000] [--loop-records 200000]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_replay.reports import summarize_run  # noqa: E402
from llm_replay.reports.analysis import analyze, plain_pages  # noqa: E402
from llm_replay.reports.slo import load_slo  # noqa: E402
from llm_replay.reports.stats import describe  # noqa: E402
from tests.reports.synth import synth_records  # noqa: E402

SLO = {"per_request": {"ttft_ms": 300, "tpot_ms": 40}}
SAME = ("ttft_ms", "tpot_ms", "icl_ms", "e2e_ms", "ntpot_ms", "lag_ms")


class Clock:
    """Wall and process CPU time of a block: on a shared machine the CPU time is the stable one."""

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t, time.process_time() - self.c
CHUNK = 1_000_000


def generate(path: Path, n: int, rate: float) -> None:
    writer = None
    for i, start in enumerate(range(0, n, CHUNK)):
        m = min(CHUNK, n - start)
        t = synth_records(m, seed=i, rate=rate, out_mean=8, t0=start / rate, first_id=start)
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t, row_group_size=256_000)
    writer.close()


def loop_metrics(rows: list[dict], ttft_slo_ms: float, tpot_slo_ms: float) -> dict:
    """Per-request loop in the style of vLLM's calculate_metrics."""
    ttfts, tpots, icls, e2els, ntpots, lags = [], [], [], [], [], []
    completed = good = total_in = total_out = 0
    start, end = math.inf, -math.inf
    for r in rows:
        sent = r["sent_s"]
        if sent is None:
            continue
        start = min(start, sent)
        if r["scheduled_s"] is not None:
            lags.append(sent - r["scheduled_s"])
        if r["status"] != "ok":
            end = max(end, sent)
            continue
        completed += 1
        tt = r["token_times"] or []
        n_out = r["completion_tokens"] if r["completion_tokens"] is not None else len(tt)
        ttft, e2e = r["first_token_s"] - sent, r["last_token_s"] - sent
        ttfts.append(ttft)
        e2els.append(e2e)
        tpot = None
        if n_out > 1:
            tpot = (r["last_token_s"] - r["first_token_s"]) / (n_out - 1)
            tpots.append(tpot)
        if n_out:
            ntpots.append(e2e / n_out)
        for i in range(1, len(tt)):
            icls.append(tt[i] - tt[i - 1])
        total_out += n_out
        total_in += r["prompt_tokens"] if r["prompt_tokens"] is not None else r["input_tokens"]
        end = max(end, r["last_token_s"])
        if ttft * 1e3 <= ttft_slo_ms and (tpot is None or tpot * 1e3 <= tpot_slo_ms):
            good += 1
    d = end - start
    pct = [50, 90, 95, 99, 99.9]
    out = {name: (np.mean(v) * 1e3, *(np.percentile(v, pct) * 1e3), np.max(v) * 1e3)
           for name, v in (("ttft_ms", ttfts), ("tpot_ms", tpots), ("icl_ms", icls), ("e2e_ms", e2els),
                           ("ntpot_ms", ntpots), ("lag_ms", lags))}
    out.update(requests_per_s=completed / d, output_tokens_per_s=total_out / d,
               total_tokens_per_s=(total_in + total_out) / d, goodput_rps=good / d)
    return out


def check_agreement(table, loop: dict) -> None:
    an = analyze(table, slo=load_slo(SLO))
    sc = an.scalars()
    for name in ("ttft_ms", "tpot_ms", "icl_ms", "e2e_ms", "ntpot_ms"):
        x = an.values(name)
        ours = (x.mean(), *np.percentile(x, [50, 90, 95, 99, 99.9]), x.max())
        assert np.allclose(ours, loop[name], rtol=1e-4), (name, ours, loop[name])
    for key in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "goodput_rps"):
        assert math.isclose(sc[key], loop[key], rel_tol=1e-9), (key, sc[key], loop[key])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--loop-records", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=2000.0, help="arrival rate of the synthetic run (req/s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        t = time.perf_counter()
        generate(run / "records.parquet", args.records, args.rate)
        print(f"generated {args.records:,} records in {time.perf_counter() - t:.1f} s "
              f"({(run / 'records.parquet').stat().st_size / 2**20:.0f} MiB parquet)")

        with Clock() as full:
            summary = summarize_run(run, slo=SLO)
        icl_n = summary["latency"]["icl_ms"]["n"]
        print(f"summarize_run (read + validate + all metrics + CIs + breakdowns + time series + "
              f"JSON/MD/HTML) for {args.records:,} records and {icl_n:,} chunk gaps: {full.wall:.2f} s wall, "
              f"{full.cpu:.2f} s CPU [target <= 10 s wall: {'met' if full.wall <= 10 else 'NOT met'}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores]")
        table = pq.read_table(run / "records.parquet")
        with Clock() as core, plain_pages():   # the loop's metrics, vectorised, same records
            an = analyze(table, slo=load_slo(SLO))
            stats = {k: describe(an.column(k), ci=()) for k in SAME}
            an.scalars()
        del table, an, stats
        print(f"same metrics as the loop, vectorised: {core.wall:.2f} s wall, {core.cpu:.2f} s CPU")

        sub = pq.ParquetFile(run / "records.parquet").read_row_groups(
            range(math.ceil(args.loop_records / 256_000))).slice(0, args.loop_records)
        rows = sub.to_pylist()
        with Clock() as loop_t:
            loop = loop_metrics(rows, SLO["per_request"]["ttft_ms"], SLO["per_request"]["tpot_ms"])
        check_agreement(sub, loop)
        scale = args.records / len(rows)
        print(f"per-request Python loop (vLLM calculate_metrics style) on {len(rows):,} records: "
              f"{loop_t.wall / len(rows) * 1e6:.2f} us/record wall, {loop_t.cpu / len(rows) * 1e6:.2f} us CPU -> "
              f"{loop_t.wall * scale:.1f} s wall, {loop_t.cpu * scale:.1f} s CPU scaled to {args.records:,} "
              f"(building the Python objects not counted); results agree")
        print(f"ratio loop / vectorised, same metrics: {loop_t.wall * scale / core.wall:.1f}x wall, "
              f"{loop_t.cpu * scale / core.cpu:.1f}x CPU")
        print(f"ratio loop / full summary: {loop_t.wall * scale / full.wall:.1f}x wall, "
              f"{loop_t.cpu * scale / full.cpu:.1f}x CPU")


if __name__ == "__main__":
    main()
