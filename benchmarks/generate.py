"""Benchmark: vectorised trace generation vs a straightforward per-request Python loop.

The spec: one day of gamma (CV 2) session arrivals under the diurnal profile, 4 models,
multi-turn sessions with growing context, a shared system prompt and 50 application
prefixes (hash_ids, 512-token blocks). Prints seconds and peak RSS for ROWS rows generated and
written to Parquet the way `replay trace generate` does it (`generate_to`: row group k is
written on a second thread while k+1 is built), and the ratio against a per-request loop
generating the same spec on 100k rows (time scaled linearly to ROWS).

    python3 benchmarks/generate.py              # 10M rows (target: <= 10 s, <= 2 GB)
    python3 benchmarks/generate.py --rows 1e6   # smaller machines
"""
from __future__ import annotations

import argparse
import bisect
import math
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from llm_replay.traces.generate import generate_to  # noqa: E402
from llm_replay.traces.presets import DAY  # noqa: E402

MODELS = {"llama-8b": 0.5, "llama-70b": 0.25, "mistral-7b": 0.15, "qwen-32b": 0.1}
DURATION = 86400.0


def bench_spec(rows: float) -> dict:
    return {"duration": DURATION, "seed": 1, "block_size": 512, "clients": [{
        "name": "app", "rate": rows / DURATION, "arrival": {"process": "gamma", "cv": 2.0},
        "profile": {"kind": "diurnal", "hourly": DAY}, "models": MODELS,
        "input": {"dist": "lognormal", "median": 600, "sigma": 0.9, "max": 16384},
        "output": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 4096}, "rho": 0.2,
        "sessions": {"turns": {"dist": "zipf", "a": 1.6, "max": 12},
                     "think_s": {"dist": "lognormal", "median": 30, "sigma": 0.8, "min": 1, "max": 1800},
                     "user_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.8, "max": 4096}},
        "prefix": {"system_blocks": 2, "system_share": 0.8, "apps": 50, "app_blocks": 2, "app_share": 0.5}}]}


def loop_generate(rows: float, seed: int = 1) -> pa.Table:
    """The same spec, one request at a time in plain Python (the baseline)."""
    rnd = random.Random(seed)
    hours = [DAY[int(h) % 24] for h in range(24)]
    cum = [0.0]
    for v in hours:
        cum.append(cum[-1] + v * 3600)
    scale = cum[-1] / DURATION
    turns_p = [k ** -1.6 for k in range(1, 13)]
    mean_turns = sum(k * p for k, p in zip(range(1, 13), turns_p)) / sum(turns_p)
    unit_rate = rows / DURATION / mean_turns * scale

    def real_time(u: float) -> float:  # invert the cumulative rate, hour by hour
        i = min(bisect.bisect_right(cum, u) - 1, 23)
        return i * 3600 + (u - cum[i]) / hours[i]

    names, weights = list(MODELS), list(MODELS.values())
    out: list[dict] = []
    u, session, app_base, block = 0.0, 0, 1 << 40, 512
    while True:
        u += rnd.gammavariate(0.25, 4.0) / unit_rate  # CV 2 gaps with mean 1/unit_rate
        if u >= cum[-1]:
            break
        t = real_time(u)
        model = rnd.choices(names, weights)[0]
        has_sys, app = rnd.random() < 0.8, rnd.randrange(50) if rnd.random() < 0.5 else None
        ctx, parent = 0, None
        for turn in range(rnd.choices(range(1, 13), turns_p)[0]):
            if turn:
                t += min(max(rnd.lognormvariate(math.log(30), 0.8), 1), 1800)
            if t >= DURATION:
                break
            new = rnd.lognormvariate(math.log(600 if turn == 0 else 80), 0.9 if turn == 0 else 0.8)
            inp = ctx + max(1, round(min(new, 16384 if turn == 0 else 4096)))
            outp = max(1, round(min(rnd.lognormvariate(math.log(200), 0.8), 4096)))
            full = inp // block
            ids = list(range(min(2 * has_sys, full)))
            if app is not None:
                ids += [app_base + app * 2 + j for j in range(min(2, full - len(ids)))]
            ids += [(session << 20) + j for j in range(full - len(ids))]
            if inp % block:
                ids.append(-len(out) - 1)
            rid = str(len(out))
            out.append({"arrival_ns": int(t * 1e9), "input_tokens": inp, "output_tokens": outp,
                        "request_id": rid, "model": model, "session_id": f"app-{session}", "turn": turn,
                        "parent_id": parent, "hash_ids": ids})
            ctx, parent = inp + outp, rid
        session += 1
    out.sort(key=lambda r: r["arrival_ns"])
    return pa.Table.from_pylist(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=float, default=10e6)
    ap.add_argument("--baseline-rows", type=float, default=1e5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.parquet"
        # what `replay trace generate` does: row group k is written while k+1 is built
        cpu0, t0 = time.process_time(), time.perf_counter()
        n, _ = generate_to(bench_spec(args.rows), path)
        t2, cpu = time.perf_counter(), time.process_time() - cpu0
        size = path.stat().st_size
        rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        blocks = len(pq.read_table(path, columns=["hash_ids"]).column(0).combine_chunks().flatten())
        bcpu0, b0 = time.process_time(), time.perf_counter()
        base = loop_generate(args.baseline_rows)
        pq.write_table(base, Path(tmp) / "base.parquet", compression="zstd")
        b1, bcpu = time.perf_counter(), time.process_time() - bcpu0
    vec = t2 - t0
    loop = (b1 - b0) * n / base.num_rows
    # CPU seconds beside wall seconds: on a shared machine the wall clock includes waiting
    print(f"vectorised: {n:,} rows ({blocks:,} prefix blocks) generated and written in {vec:.2f} s wall, "
          f"{cpu:.2f} s CPU ({size / 2**20:.0f} MiB), peak RSS {rss_gb:.2f} GiB")
    print(f"python loop: {base.num_rows:,} rows in {b1 - b0:.2f} s wall, {bcpu:.2f} s CPU "
          f"-> {loop:.1f} s scaled to {n:,} rows")
    print(f"speed-up: {loop / vec:.1f}x wall, {bcpu * n / base.num_rows / cpu:.1f}x CPU   targets: "
          f"<= 10 s {'OK' if vec <= 10 else 'MISSED'}, <= 2 GiB {'OK' if rss_gb <= 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
