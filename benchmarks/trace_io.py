"""Trace I/O benchmark: import a generated Azure-format CSV, describe it, and compare with
pandas.read_csv of the same file in the same run.

    python3 benchmarks/trace_io.py               # 10M rows (~0.5 GB CSV)
    python3 benchmarks/trace_io.py --rows 200000 # quick

Each phase runs in its own subprocess so its peak RSS is its own (ru_maxrss).
Prints rows/s, peak RSS per phase and the ratio import / pandas (higher is better for us).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Azure 2023 style: naive ISO times with 7 fractional digits, CRLF, no final newline."""
    import numpy as np
    import pyarrow as pa

    from llm_replay.traces.importers.common import write_csv
    from llm_replay.traces.importers.timeparse import format_iso
    rng = np.random.default_rng(seed)
    fmt = {"sep": [" "], "fraction_digits": [7], "zones": [""]}
    with open(path, "wb") as f:
        f.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        t0, chunk = 1_700_000_000 * 10**9, 1_000_000
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            gaps = (rng.gamma(0.5, 2 * 1e9 / 50, n) // 100 * 100).astype(np.int64)  # bursty, 100 ns grid
            ns = t0 + np.cumsum(gaps)
            t0 = int(ns[-1])
            table = pa.table({"TIMESTAMP": format_iso(ns, fmt),
                              "ContextTokens": rng.lognormal(7, 1, n).astype(np.int64) + 1,
                              "GeneratedTokens": rng.lognormal(4, 1, n).astype(np.int64)})
            tmp = path.with_suffix(".part")
            write_csv(table, tmp, {"line_terminator": "\r\n", "final_newline": start + n < rows})
            body = tmp.read_bytes()
            f.write(body.split(b"\r\n", 1)[1])  # drop the chunk's header
            tmp.unlink()


def phase(name: str, csv: Path, out: Path) -> dict:
    sys.path.insert(0, str(REPO))
    t = time.perf_counter()
    if name == "import":
        from llm_replay.traces.importers import import_trace
        rows = import_trace("azure", csv, out)["rows"]["written"]
    elif name == "describe":
        from llm_replay.traces.describe import describe
        from llm_replay.traces.trace import Trace
        rows = describe(Trace.read(out))["requests"]
    elif name == "pandas":
        import pandas as pd
        rows = len(pd.read_csv(csv))
    elif name == "pandas+time":
        import pandas as pd
        df = pd.read_csv(csv)
        pd.to_datetime(df["TIMESTAMP"], format="ISO8601")
        rows = len(df)
    else:
        raise SystemExit(f"unknown phase {name}")
    return {"phase": name, "rows": rows, "seconds": time.perf_counter() - t,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", help="working directory (default: a temporary one)")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--csv", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        print(json.dumps(phase(a.phase, Path(a.csv), Path(a.out))))
        return
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        csv, out = Path(d) / "azure.csv", Path(d) / "azure.parquet"
        t = time.perf_counter()
        generate(csv, a.rows)
        print(f"generated {a.rows:,} rows, {csv.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - t:.1f} s")
        res = {}
        for name in ("import", "describe", "pandas", "pandas+time"):
            p = subprocess.run([sys.executable, __file__, "--phase", name, "--csv", str(csv), "--out", str(out)],
                               capture_output=True, text=True, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            res[name] = r
            print(f"{name:<12} {r['rows']:>12,} rows  {r['seconds']:8.2f} s  {r['rows'] / r['seconds']:>12,.0f} rows/s"
                  f"  peak RSS {r['peak_rss_mb']:8,.0f} MB")
        print(f"parquet {out.stat().st_size / 1e6:,.0f} MB")
        ratio = res["pandas"]["seconds"] / res["import"]["seconds"]
        ratio_t = res["pandas+time"]["seconds"] / res["import"]["seconds"]
        print(f"import speed vs pandas.read_csv: {ratio:.2f}x ; vs read_csv + to_datetime: {ratio_t:.2f}x ; "
              f"peak RSS import/pandas: {res['import']['peak_rss_mb'] / res['pandas']['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
