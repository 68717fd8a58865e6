"""The fuzz and fault campaign, kept in the project: hostile inputs to every file-reading entry point.

Each input is a seeded mutation of a valid one (a trace, an SLO spec, a run directory, an
importer's source): wrong types, nulls, extreme and negative numbers, huge spans, missing and
unknown columns, random and truncated bytes, binary text, deep nesting, oversized documents.
Each runs through the real CLI (`python -m llm_replay.replay ...`) in its own process, reaped with
os.wait4 for its own peak RSS, and is judged: an exit code the command documents (0/2, gate
0/1/2, run 0/1/2), no traceback and no `error: unexpected` (the CLI's last-resort line for a
bug), within the time limit. Prints per entry point: inputs, tracebacks, unexpected errors,
hangs, bad exit codes, peak memory (run it as a process of its own: a child forked from a big
process, pytest say, inherits that process's peak RSS). `tests/test_fuzz_campaign.py` runs a
short slice in CI;
`python3 benchmarks/fuzz_campaign.py --per-entry 300` is the long one (README table).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60.0
I64 = 2**63 - 1


def _trace_table(rng: random.Random, n: int) -> pa.Table:
    arr = np.cumsum(np.array([rng.randint(0, 10**8) for _ in range(n)], dtype=np.int64))
    return pa.table({"arrival_ns": arr, "input_tokens": pa.array([rng.randint(1, 4000) for _ in range(n)], pa.int32()),
                     "output_tokens": pa.array([rng.randint(1, 500) for _ in range(n)], pa.int32()),
                     "model": [rng.choice(["a", "b"]) for _ in range(n)]})


def _extreme(rng: random.Random):
    return rng.choice([0, -1, 1, 2**31 - 1, 2**31, 2**62, I64, -I64, 10**18, 7.5, float("nan"), float("inf"),
                       "12", "x", "", None, True])


def _column(rng: random.Random, n: int) -> pa.Array:
    """n extreme values of one kind (mixed kinds as strings)."""
    vals = [_extreme(rng) for _ in range(n)]
    try:
        return pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([str(v) for v in vals])


def fuzz_trace(rng: random.Random, path: Path) -> None:
    """A trace file: a valid one mutated, or not Parquet at all."""
    kind = rng.randrange(10)
    if kind == 0:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400))))
        return
    t = _trace_table(rng, rng.randint(1, 60))
    if kind == 1:                     # a huge span: the last arrival far away (memory from span)
        a = t.column("arrival_ns").to_numpy().copy()
        a[-1] = rng.choice([10**18, I64, 10**15])
        t = t.set_column(0, "arrival_ns", pa.array(a))
    elif kind in (2, 3):              # one column replaced by mixed extreme values
        name = rng.choice(t.column_names)
        t = t.set_column(t.column_names.index(name), name, _column(rng, t.num_rows))
    elif kind == 4:                   # a column dropped, or an unknown one added
        t = t.drop_columns([rng.choice(t.column_names)]) if rng.random() < 0.5 else t.append_column("zz", pa.array([1] * t.num_rows))
    elif kind == 5:                   # hash_ids of odd shapes
        t = t.append_column("hash_ids", pa.array([[rng.choice([0, -5, I64, 3])] * rng.randrange(0, 300)
                                                  for _ in range(t.num_rows)], pa.list_(pa.int64())))
    elif kind == 6:                   # unsorted, duplicated rows
        t = pa.concat_tables([t, t]).take(pa.array(rng.sample(range(2 * t.num_rows), 2 * t.num_rows)))
    elif kind == 7:                   # enormous token counts
        t = t.set_column(1, "input_tokens", pa.array([rng.choice([2**31 - 1, 2**24 + 1, 10**7, 5])
                                                       for _ in range(t.num_rows)], pa.int64()))
    elif kind == 8:                   # empty
        t = t.slice(0, 0)
    pq.write_table(t, path)
    if kind == 9:                     # truncated Parquet
        data = path.read_bytes()
        path.write_bytes(data[:rng.randrange(len(data))])


def _nest(rng: random.Random, depth: int):
    if depth <= 0:
        return _extreme(rng)
    return rng.choice([[_nest(rng, depth - 1)], {"k": _nest(rng, depth - 1)}])


def fuzz_slo(rng: random.Random, path: Path) -> None:
    kind = rng.randrange(8)
    good = {"per_request": {"ttft_ms": 500}, "objectives": ["ttft_ms.p50 <= 1000", "error_rate <= 0.5"]}
    if kind == 0:
        text = b"objectives: [" + b"[" * rng.choice([100, 5000, 50000]) + b"]"
    elif kind == 1:
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    elif kind == 2:
        good["objectives"] = [rng.choice(["ttft_ms.p99 <= ", "attainment >= ", "nope.p50 < ", "x"]) +
                              str(_extreme(rng)) for _ in range(rng.randint(0, 4))]
        text = json.dumps(good).encode()
    elif kind == 3:
        good[rng.choice(["per_request", "classes", "objectives", "confidence", "zzz"])] = _nest(rng, rng.randint(0, 6))
        text = json.dumps(good, default=str).encode()
    elif kind == 4:
        text = ("objectives:\n" + "".join(f"  - 'e2e_ms.p90 <= {i}'\n" for i in range(rng.choice([10, 3000])))).encode()
    elif kind == 5:
        text = b"a: &x [1]\n" + b"".join(b"b%d: &y%d [*%s, *%s]\n" % (i, i, b"x" if i == 0 else b"y%d" % (i - 1),
                                                                      b"x" if i == 0 else b"y%d" % (i - 1)) for i in range(30))
    elif kind == 6:
        text = json.dumps(good).encode()[:rng.randrange(5, 60)]
    else:
        text = json.dumps(good).encode()
    path.write_bytes(text)


def fuzz_run_dir(rng: random.Random, run: Path, records: Path) -> None:
    """A run directory: the valid one's files, one of them broken."""
    run.mkdir()
    t = pq.read_table(records)
    kind = rng.randrange(7)
    if kind == 0:
        (run / "records.parquet").write_bytes(records.read_bytes()[:rng.randrange(1, 2000)])
    elif kind == 1:
        name = rng.choice(t.column_names)
        pq.write_table(t.set_column(t.column_names.index(name), name, _column(rng, t.num_rows)), run / "records.parquet")
    elif kind == 2:
        pq.write_table(t.drop_columns([rng.choice(t.column_names)]), run / "records.parquet")
    else:
        pq.write_table(t, run / "records.parquet")
    if kind == 3:
        (run / "run.json").write_bytes(rng.choice([b"{", b"[]", b"\xff\xfe", json.dumps({"config": _nest(rng, 4)}).encode()]))
    if kind == 4:
        (run / "cpu.parquet").write_bytes(b"PAR1junk")
    if kind == 5:
        pq.write_table(pa.table({"time_s": _column(rng, 3)}) if rng.random() < 0.5 else pa.table({"x": [1]}),
                       run / "server_metrics.parquet")
    if kind == 6:
        (run / "records.parquet").unlink()


def fuzz_sharegpt(rng: random.Random, path: Path) -> None:
    conv = [{"id": _extreme(rng) if rng.random() < 0.2 else "c1",
             "conversations": [{"from": rng.choice(["human", "gpt", "x", 5]), "value": rng.choice(
                 ["hello", "", None, 7, "9" * rng.choice([10, 5000])])} for _ in range(rng.randint(0, 4))]}
            for _ in range(rng.randint(0, 5))]
    text = json.dumps(conv).encode()
    if rng.random() < 0.3:
        text = b"[" + b"9" * rng.choice([4301, 20000]) + b"]"
    elif rng.random() < 0.2:
        text = text[:rng.randrange(1, max(2, len(text)))] + bytes(rng.randrange(256) for _ in range(8))
    path.write_bytes(text)


@dataclass
class Result:
    entry: str
    inputs: int = 0
    tracebacks: int = 0
    unexpected: int = 0
    hangs: int = 0
    bad_exit: int = 0
    peak_rss_mb: float = 0.0
    examples: list = field(default_factory=list)


def run_cli(argv: list[str], timeout: float = TIMEOUT_S) -> tuple[int | None, str, float]:
    """(exit code or None on a hang, stderr, peak RSS MB of that process alone)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "llm_replay.replay", *argv], stdout=subprocess.DEVNULL,
                             stderr=err, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline, code, ru = time.monotonic() + timeout, None, None
        while time.monotonic() < deadline:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.02)
        if code is None:
            p.send_signal(signal.SIGKILL)
            _, _, ru = os.wait4(p.pid, 0)
        p.returncode = code if code is not None else -9   # reaped here: Popen must not wait again
        err.seek(0)
        return code, err.read().decode("utf-8", "replace"), ru.ru_maxrss / 1024


ENTRIES = {   # name: (allowed exit codes, argv maker(input path, workdir), input maker)
    "trace validate": ({0, 2}, lambda f, d, url: ["trace", "validate", f], "trace"),
    "trace describe": ({0, 2}, lambda f, d, url: ["trace", "describe", f], "trace"),
    "trace fit": ({0, 2}, lambda f, d, url: ["trace", "fit", f, "-o", str(d / "spec.yaml")], "trace"),
    "gate (SLO spec)": ({0, 1, 2}, lambda f, d, url: ["gate", str(d / "run0"), "--slo", f], "slo"),
    "report (run directory)": ({0, 2}, lambda f, d, url: ["report", f], "run"),
    "trace import sharegpt": ({0, 2}, lambda f, d, url: ["trace", "import", "sharegpt", f, "-o", str(d / "o.parquet")],
                              "sharegpt"),
    # against the SSE test server (started by the campaign); every row of a trace that runs is
    # bounded to 2 s of trace time and 20 rows
    "run (trace)": ({0, 1, 2}, lambda f, d, url: ["run", "--trace", f, "--target", url, "-o", str(d / "run"),
                                             "--no-check", "--no-progress", "--model-map", "*=m", "--timeout", "5s",
                                             "--duration", "2s", "--max-requests", "20"], "trace"),
}


def campaign(per_entry: int, seed: int = 0, jobs: int = 2, entries=None) -> list[Result]:
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="fuzz-"))
    from tests.reports.synth import synth_records   # a valid run to gate on and to break
    run0 = base / "run0"
    run0.mkdir()
    pq.write_table(synth_records(300, seed=seed), run0 / "records.parquet")
    jobs_in: list[tuple[str, list[str]]] = []
    for name in entries or ENTRIES:
        _, argv, kind = ENTRIES[name]
        for i in range(per_entry):
            d = base / f"{name.split()[0]}-{kind}-{i}"
            d.mkdir(exist_ok=True)
            r = random.Random(rng.random())
            if kind == "trace":
                f = d / "t.parquet"
                fuzz_trace(r, f)
            elif kind == "slo":
                f = d / rng.choice(["s.yaml", "s.toml", "s.yml"])
                fuzz_slo(r, f)
            elif kind == "run":
                f = d / "run"
                fuzz_run_dir(r, f, run0 / "records.parquet")
            else:
                f = d / "s.json"
                fuzz_sharegpt(r, f)
            jobs_in.append((name, lambda url, a=argv, f=str(f), d=base if kind == "slo" else d: a(f, d, url)))
    results = {name: Result(name) for name in entries or ENTRIES}
    server = None
    if any(name.startswith("run") for name in results):
        from tests.replay.runkit import start_sse
        server = start_sse("--tokens", "4")
    jobs_in = [(n, make(server.url if server else "")) for n, make in jobs_in]
    try:
        return _judge(jobs_in, results, jobs)
    finally:
        if server is not None:
            server.kill()
            server.wait()


def _judge(jobs_in: list, results: dict, jobs: int) -> list[Result]:
    with ThreadPoolExecutor(jobs) as pool:
        for (name, argv), (code, err, rss) in zip(jobs_in, pool.map(lambda j: run_cli(j[1]), jobs_in)):
            r = results[name]
            r.inputs += 1
            r.peak_rss_mb = max(r.peak_rss_mb, rss)
            bad = None
            if code is None:
                r.hangs, bad = r.hangs + 1, "hang"
            elif "Traceback" in err:
                r.tracebacks, bad = r.tracebacks + 1, "traceback"
            elif "error: unexpected" in err:
                r.unexpected, bad = r.unexpected + 1, "unexpected"
            elif code not in ENTRIES[name][0]:
                r.bad_exit, bad = r.bad_exit + 1, f"exit {code}"
            if bad and len(r.examples) < 3:
                r.examples.append(f"{bad}: replay {' '.join(argv)}\n{err[-800:]}")
    return list(results.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-entry", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON list of results (the test reads it)")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    t = time.monotonic()
    res = campaign(a.per_entry, a.seed, a.jobs)
    if a.json:
        print(json.dumps([r.__dict__ for r in res]))
        return
    print(f"| entry point | inputs | tracebacks | unexpected | hangs | bad exit | peak RSS MB |\n|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| `replay {r.entry}` | {r.inputs} | {r.tracebacks} | {r.unexpected} | {r.hangs} | {r.bad_exit} | "
              f"{r.peak_rss_mb:.0f} |")
    print(f"({time.monotonic() - t:.0f} s, seed {a.seed})")
    for r in res:
        for e in r.examples:
            print(f"\n--- {r.entry}: {e}")


if __name__ == "__main__":
    main()
