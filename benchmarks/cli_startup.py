"""`replay` start-up: help, version and argument errors, each as a fresh process.

    python3 benchmarks/cli_startup.py [--repeat 15]

Runs every command below `--repeat` times, interleaved (round-robin, so a burst of load on the
host lands on all of them alike), each a subprocess of this Python, and prints the median wall
time per command and its ratio to a bare `python3 -c pass` measured in the same rounds. Also
prints the host's load average, since the targets are for a quiet 2-core host: argument errors
< 1 s, `replay --help` < 0.5 s (issue 36 item 8). An argument error must exit 2 with one
`error:` line and no traceback; the script says so where one does not.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python3 -c pass": ["-c", "pass"],
    "replay --help": ["-m", "llm_replay.replay", "--help"],
    "replay --version": ["-m", "llm_replay.replay", "--version"],
    "replay trace generate --preset chatt": ["-m", "llm_replay.replay", "trace", "generate", "--preset", "chatt",
                                             "-o", "x.parquet"],
    "replay run --url x": ["-m", "llm_replay.replay", "run", "--url", "x", "--trace", "t.parquet"],
    "replay gate (no --slo)": ["-m", "llm_replay.replay", "gate", "run"],
    "replay trace import nosuch": ["-m", "llm_replay.replay", "trace", "import", "nosuch", "a", "-o", "b"],
    "replay trace describe missing.parquet": ["-m", "llm_replay.replay", "trace", "describe", "missing.parquet"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15, help="runs of each command (default 15)")
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    bad: dict[str, str] = {}
    for _ in range(args.repeat):
        for name, argv in COMMANDS.items():
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
            times[name].append(time.perf_counter() - t0)
            errors = [line for line in p.stderr.splitlines() if "error:" in line]
            is_error = name not in ("python3 -c pass", "replay --help", "replay --version")
            if (p.returncode != (2 if is_error else 0) or "Traceback" in p.stderr
                    or (is_error and len(errors) != 1)):
                bad[name] = f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
    bare = statistics.median(times["python3 -c pass"])
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"medians of {args.repeat} runs")
    print(f"{'command':40s} {'median s':>9s} {'x bare':>7s}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:40s} {m:9.3f} {m / bare:7.2f}")
    for name, why in bad.items():
        print(f"UNEXPECTED {name}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
