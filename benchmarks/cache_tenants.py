"""Controlled experiments on the cache and on tenants, against engine-stub (docs/experiments.md).

    python3 benchmarks/cache_tenants.py [--only reuse|reset|tenants] [--scale 1.0] [--keep DIR]

reuse: one trace (200 rows, prompts of 256-1024 tokens) set to an intended prefix reuse of 0, 0.5
  and 0.9 by `replay trace transform --prefix-reuse`, each replayed with `--reset-cache` against one
  engine-stub; prints target, intended (run.json), achieved (summary.json prefix_cache) and the gate
  of `prefix_hit >= target - 0.05`. Target: achieved within 0.05 of the target.
reset: a trace of 2,048-4,096-token prompts at reuse 0.9, twice against a fresh engine-stub that paces
  steps as an 8B model on an A100 (--emulate, so a miss costs its prefill), with one --salt (the same
  prompt bytes): with --reset-cache, then without (the second finds the first one's prefixes cached):
  prints each run's cache state and TTFT p50 of the first and the last fifth, and the report's
  cold-cache warning.
tenants: four tenants (client_id a-d) at 1.5 req/s each, tenant d at 10x from 1/3 to 2/3 of a 60 s
  trace, against engine-stub paced as an 8B model on an A100 with 4 sequences a step, under
  `--tenant-policy fcfs` and `fair`; prints per tenant the attainment (TTFT <= 2 s) before, during and
  after the burst, the fairness (worst window, normalised service) with its bounds, and `replay gate`
  on `fairness >= 0.9` (--whole-run). Target: FCFS below 0.8 and FAIL, fair above 0.95 and PASS.
Every process it starts is stopped by its PID; each run has a deadline.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from llm_replay.replay.orchestrate import child_env, replay_run, start_engine  # noqa: E402
from llm_replay.traces.trace import Trace  # noqa: E402

TTFT_MS = 2000


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llm_replay.replay", *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


def write(path: Path, arrival_s: np.ndarray, inp: np.ndarray, out: np.ndarray, **cols) -> Path:
    Trace(pa.table({"arrival_ns": (arrival_s * 1e9).astype("int64"), "input_tokens": inp.astype("int32"),
                    "output_tokens": out.astype("int32"), **cols})).write(path)
    return path


def run(trace: Path, url: str, out: Path, *extra: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)   # --keep's directory from an earlier run
    r = replay_run(trace, url, out, extra=["--no-progress", *extra], timeout=900)
    if not (out / "summary.json").exists():
        raise SystemExit(f"replay run exited {r.returncode}:\n{r.output[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def reuse(tmp: Path, scale: float) -> None:
    rng = np.random.default_rng(0)
    n = int(200 * scale)
    base = write(tmp / "base.parquet", np.sort(rng.uniform(0, n / 10, n)), rng.integers(256, 1025, n), np.full(n, 4))
    print("reuse: target, intended (run.json), achieved (per request) [server counters], gate prefix_hit >= target - 0.05")
    with start_engine("--num-blocks", "65536", "--max-num-seqs", "16") as eng:
        for target in (0.0, 0.5, 0.9):
            t = tmp / f"reuse{target}.parquet"
            p = cli("trace", "transform", str(base), "-o", str(t), "--prefix-reuse", str(target))
            assert p.returncode == 0, p.stderr
            s = run(t, eng.url, tmp / f"reuse{target}", "--reset-cache", "--scrape", eng.url + "/metrics")
            pc = s["prefix_cache"]
            slo = tmp / f"hit{target}.yaml"
            slo.write_text(f"objectives:\n  - 'prefix_hit >= {max(target - 0.05, 0):.2f}'\n")
            g = cli("gate", str(tmp / f"reuse{target}"), "--slo", str(slo), "--whole-run")
            print(f"  {target:.2f}  {pc['intended_token_hit_ratio']:.3f}  {pc['achieved_hit_ratio']:.3f} "
                  f"({pc['achieved_source']}) [{pc['server_hit_ratio']:.3f}]  gate exit {g.returncode}  "
                  f"{'within 0.05' if abs(pc['achieved_hit_ratio'] - target) <= 0.05 else 'OFF'}", flush=True)
    with start_engine("--num-blocks", "65536", "--max-num-seqs", "16", "--no-prefix-caching") as eng:
        s = run(tmp / "reuse0.5.parquet", eng.url, tmp / "nocache", "--reset-cache", "--scrape", eng.url + "/metrics")
        g = cli("gate", str(tmp / "nocache"), "--slo", str(tmp / "hit0.5.yaml"), "--whole-run")
        print(f"  0.50 against --no-prefix-caching: achieved {s['prefix_cache']['achieved_hit_ratio']:.3f}, gate exit "
              f"{g.returncode}; {s['prefix_cache']['delivery_warning']}", flush=True)


def fifths(run_dir: Path) -> tuple[float, float]:
    r = pq.read_table(run_dir / "records.parquet", columns=["scheduled_s", "sent_s", "first_token_s"]).to_pandas()
    r = r.sort_values("scheduled_s")
    ttft = (r.first_token_s - r.sent_s).to_numpy() * 1e3
    k = max(len(ttft) // 5, 1)
    return float(np.nanmedian(ttft[:k])), float(np.nanmedian(ttft[-k:]))


def reset(tmp: Path, scale: float) -> None:
    rng = np.random.default_rng(1)
    n = 200   # whatever --scale: the report looks for a warm-up in runs of >= 160 requests
    base = write(tmp / "long.parquet", np.sort(rng.uniform(0, n / 5, n)), rng.integers(2048, 4097, n), np.full(n, 4))
    t = tmp / "long0.9.parquet"
    p = cli("trace", "transform", str(base), "-o", str(t), "--prefix-reuse", "0.9")
    assert p.returncode == 0, p.stderr
    print("reset: run, cache state, TTFT p50 first fifth / last fifth (ms), achieved hit, the report's cache warnings")
    with start_engine("--emulate", "llama3-8b-a100", "--max-num-seqs", "16") as eng:
        for name, extra in (("cold", ["--reset-cache"]), ("again", [])):   # one salt: the same prompt bytes
            extra += ["--salt", "7", "--scrape", eng.url + "/metrics"]
            s = run(t, eng.url, tmp / f"reset-{name}", *extra)
            first, last = fifths(tmp / f"reset-{name}")
            warn = [w for w in s["warnings"] if w.startswith(("cold cache", "the server did not deliver"))]
            print(f"  {name:6} {(s.get('cache_state') or {}).get('sentence')}  {first:.0f} / {last:.0f}  "
                  f"{s['prefix_cache']['achieved_hit_ratio']:.3f}  {'; '.join(warn) or '-'}", flush=True)


def tenants_trace(path: Path, span: float, rate: float, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    times, who = [], []
    for k, name in enumerate("abcd"):
        t = 0.0
        while True:
            burst = name == "d" and span / 3 <= t < 2 * span / 3
            t += rng.exponential(1 / (rate * (10 if burst else 1)))
            if t >= span:
                break
            times.append(t)
            who.append(name)
    order = np.argsort(times)
    n = len(times)
    return write(path, np.asarray(times)[order], np.full(n, 128), np.full(n, 32),
                 client_id=pa.array(np.asarray(who)[order]))


def tenants(tmp: Path, scale: float) -> None:
    span = 60 * scale
    trace = tenants_trace(tmp / "tenants.parquet", span, 1.5)
    slo = tmp / "fair.yaml"
    slo.write_text(f"per_request:\n  ttft_ms: {TTFT_MS}\nobjectives:\n  - 'fairness >= 0.9'\n")
    print(f"tenants: policy, attainment (TTFT <= {TTFT_MS} ms) before / during / after the burst per tenant, "
          "fairness [bounds], gate fairness >= 0.9")
    for policy in ("fcfs", "fair"):
        with start_engine("--emulate", "llama3-8b-a100", "--max-num-seqs", "4", "--tenant-policy", policy) as eng:
            out = tmp / f"tenants-{policy}"
            s = run(trace, eng.url, out, "--slo", str(slo))
        r = pq.read_table(out / "records.parquet", columns=["client_id", "scheduled_s", "sent_s", "first_token_s",
                                                           "status"]).to_pandas()
        good = (r.status == "ok") & ((r.first_token_s - r.sent_s) * 1e3 <= TTFT_MS)
        phase = np.digitize(r.scheduled_s - r.scheduled_s.min(), [span / 3, 2 * span / 3])
        cells = []
        for name in "abcd":
            m = r.client_id == name
            cells.append(name + " " + "/".join(f"{good[m & (phase == p)].mean():.2f}" for p in range(3)))
        f = s["tenants"]["fairness"]["service"]
        g = cli("gate", str(out), "--slo", str(slo), "--whole-run")
        verdict = {0: "PASS", 1: "FAIL"}.get(g.returncode, f"exit {g.returncode}")
        print(f"  {policy:5} {'  '.join(cells)}  fairness {f['value']:.3f}  {verdict}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("reuse", "reset", "tenants"))
    ap.add_argument("--scale", type=float, default=1.0, help="trace sizes and spans times this")
    ap.add_argument("--keep", type=Path, help="keep the run directories here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = a.keep or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        for name, fn in (("reuse", reuse), ("reset", reset), ("tenants", tenants)):
            if a.only in (None, name):
                fn(tmp, a.scale)


if __name__ == "__main__":
    main()
