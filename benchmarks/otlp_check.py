"""Opt-in check of `replay run --otlp` against a real traced server (vLLM; not in the test suite).

    python3 benchmarks/otlp_check.py --target http://127.0.0.1:8100 --model tiny [--rate 4] [--duration 30]

The server must export its spans to this host's receiver: vLLM started with the OpenTelemetry
packages in its venv, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf` and
`--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces` (docs/servertime.md). It replays a
bursty synthetic trace with `--otlp --scrape`, then checks what a span must agree with in its
record, without comparing clocks: every ok request joined by trace id; the span's prompt and
completion token counts equal the usage the client streamed; server TTFT <= client TTFT and
server E2E <= client E2E (the server's stretch lies inside the client's); queue + prefill <=
server TTFT; inference = prefill + decode. Prints the counts, the decomposition's percentiles,
the headline's sentence, and each check's verdict; exit 1 when one fails.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

EPS_S = 1e-3   # vLLM rounds nothing, but its stamps come from two clocks (time.time / monotonic)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--model", required=True, help="served model name")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--otlp", default="127.0.0.1:4318")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="otlp-check-"))
    replay = [sys.executable, "-m", "llm_replay.replay"]
    subprocess.run(replay + ["trace", "generate", "--preset", "bursty", "--rate", str(a.rate), "--duration",
                             str(a.duration), "--max-input-tokens", "1500", "--max-output-tokens", "64",
                             "--seed", "5", "-o", str(out / "t.parquet")], check=True, capture_output=True)
    run = subprocess.run(replay + ["run", "--trace", str(out / "t.parquet"), "--target", a.target, "--model-map",
                                   f"*={a.model}", "--otlp", a.otlp, "--warmup", "2", "--scrape",
                                   a.target.rstrip("/") + "/metrics", "-o", str(out / "run"), "--no-progress"],
                         capture_output=True, text=True)
    if run.returncode not in (0, 1):
        print(run.stdout[-2000:], run.stderr[-2000:])
        return 1
    info = json.loads((out / "run" / "run.json").read_text())
    rec = pq.read_table(out / "run" / "records.parquet").to_pandas()
    spans = pq.read_table(out / "run" / "spans.parquet").to_pandas()
    j = rec[rec.status == "ok"].merge(spans, on="trace_id", how="left", suffixes=("", "_span"))
    client_ttft, client_e2e = j.first_token_s - j.sent_s, j.end_s - j.sent_s
    checks = {
        "every ok request joined": j.ttft_s.notna().all(),
        "prompt tokens = usage": (j.prompt_tokens_span == j.prompt_tokens).all(),
        "completion tokens = usage": (j.completion_tokens_span == j.completion_tokens).all(),
        "server TTFT <= client TTFT": (j.ttft_s <= client_ttft + EPS_S).all(),
        "server E2E <= client E2E": (j.e2e_s <= client_e2e + EPS_S).all(),
        "queue + prefill <= server TTFT": (j.queue_s + j.prefill_s <= j.ttft_s + EPS_S).all(),
        "inference = prefill + decode": np.allclose(j.inference_s, j.prefill_s + j.decode_s, atol=EPS_S),
    }
    summary = json.loads((out / "run" / "summary.json").read_text())["server_time"]
    print(f"run {out / 'run'}: otlp {info['otlp']}")
    for k in ("net_ms", "queue_ms", "prefill_ms", "decode_ms", "server_ttft_ms"):
        o = summary["overall"][k]
        print(f"  {k:15s} p50 {o['p50']:9.2f}  p90 {o['p90']:9.2f}  p99 {o['p99']:9.2f}")
    print("  " + summary["sentence"])
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
