"""Inputs that validate cost memory by what their rows hold, not by their span (issue 23 items 1,
2, 5): a 2-row trace over 10^18 ns or int64 max, the per-row token ceiling, a 5,000-digit
integer, binary bytes in an error line."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import repo_env, run_cli, wait_s
from llm_replay.traces import Trace, TraceError, stats
from llm_replay.traces.schema import MAX_TOKENS
from llm_replay.traces.validate import validate_file

GIB = 1 << 30


def _trace(path: Path, arrival, input_tokens=None) -> Path:
    n = len(arrival)
    pq.write_table(pa.table({"arrival_ns": pa.array(arrival, pa.int64()),
                             "input_tokens": pa.array(input_tokens or [10] * n, pa.int64()),
                             "output_tokens": pa.array([5] * n, pa.int32())}), path)
    return path


# Runs argv[3:] and writes its peak RSS (bytes, from wait4) to argv[1]; a watchdog kills it past
# argv[2] bytes (or 300 s). A launcher of its own: a child forked from pytest would inherit
# pytest's RSS high-water mark into its ru_maxrss (Linux keeps it across exec).
LAUNCHER = """
import os, subprocess, sys, threading, time
p = subprocess.Popen(sys.argv[3:])
def watch():
    t0 = time.monotonic()
    while p.returncode is None:
        try:
            rss = int(open(f"/proc/{p.pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            return
        if rss > int(sys.argv[2]) or time.monotonic() - t0 > 300:
            return p.kill()
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
_, status, usage = os.wait4(p.pid, 0)
p.returncode = os.waitstatus_to_exitcode(status)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(p.returncode)
"""


def _measured(tmp_path: Path, *args, limit: int = GIB):
    """`replay *args` as a subprocess: (exit code, stdout, stderr, its peak RSS in bytes). Past
    `limit` it is killed, so the old code cannot eat the machine (its peak then shows it)."""
    rss = tmp_path / "rss.txt"
    p = subprocess.run([sys.executable, "-c", LAUNCHER, rss, str(limit), sys.executable, "-m", "llm_replay.replay",
                        *map(str, args)], capture_output=True, text=True, env=repo_env(), timeout=wait_s(400))
    return p.returncode, p.stdout, p.stderr, int(rss.read_text())


def _one_line_or_nothing(stderr: str) -> None:
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("replay: warning: ")]
    assert not lines or (len(lines) == 1 and lines[0].startswith("error: ")), stderr
    assert "Traceback" not in stderr and "unexpected" not in stderr, stderr


@pytest.mark.slow
@pytest.mark.parametrize("last", [10**18, 2**63 - 1])
def test_huge_span_costs_what_the_rows_hold(tmp_path, last):
    """validate, describe and fit of a 2-row (and a 12-row) trace whose last arrival is 10^18 ns
    or int64 max: a result or a one-line error, in under 1 GiB (the old code binned the span:
    7.45 GiB, then 68.7 GiB)."""
    two = _trace(tmp_path / "two.parquet", [0, last])
    twelve = _trace(tmp_path / "twelve.parquet", [i * 1000 for i in range(11)] + [last])
    runs = {}
    for name, args in {"validate": ("validate", two), "describe": ("describe", two, "--json"),
                       "describe12": ("describe", twelve), "fit": ("fit", two, "-o", tmp_path / "s2.yaml"),
                       "fit12": ("fit", twelve, "-o", tmp_path / "s.yaml")}.items():
        rc, out, err, rss = _measured(tmp_path, "trace", *args)
        assert rss < GIB, (name, rss)
        assert rc in (0, 2), (name, rc, err)
        _one_line_or_nothing(err)
        runs[name] = rc, out, err
    assert runs["validate"][0] == 0 and f"over {last / 1e9:.3f} s" in runs["validate"][1]
    d = json.loads(runs["describe"][1])
    assert d["requests"] == 2 and d["duration_s"] == pytest.approx(last / 1e9)
    assert d["peak_rate_60s"] == pytest.approx(1 / 60) and all(v is not None for v in d["index_of_dispersion"].values())
    assert runs["describe12"][0] == 0 and "12 requests" in runs["describe12"][1]
    assert runs["fit"][0] == 2 and "too few requests to fit" in runs["fit"][2]
    if last == 10**18:  # fitted, and the spec generates a valid trace again, in bounded memory
        assert runs["fit12"][0] == 0, runs["fit12"]
        rc, out, err, rss = _measured(tmp_path, "trace", "generate", "--spec", tmp_path / "s.yaml",
                                      "-o", tmp_path / "g.parquet")
        assert rc == 0 and rss < GIB, err
        assert validate_file(tmp_path / "g.parquet")["rows"] == 12
    else:  # 1.09 x 2^63 ns: past what a spec (int64 ns) can hold
        assert runs["fit12"][0] == 2 and "a spec holds at most" in runs["fit12"][2]


def test_window_statistics_from_occupied_windows_only():
    """idc / peak_rate from the occupied windows equal the dense binning they replace."""
    rng = np.random.default_rng(3)
    for t in (np.sort(rng.exponential(1, 3000).cumsum()), np.repeat(np.arange(50.0), 7) * 3.3):
        for w in (0.5, 1.0, 10.0):
            nb = int((t[-1] - t[0]) // w)
            b = ((t - t[0]) // w).astype(np.int64)
            dense = np.bincount(b[b < nb], minlength=nb).astype(float)
            assert stats.idc(t, w) == pytest.approx(dense.var(ddof=1) / dense.mean(), rel=1e-12)
            assert stats.window_counts(t, w).max() == np.bincount(b).max()
    assert stats.idc(np.array([0, 2**63 - 1]), 1) == pytest.approx(1.0, rel=1e-6)  # one count in 9.2e18 windows
    assert stats.weibull_shape(np.array([1.0] * 19 + [1 - 2e-7])) is None  # equal to 1e-7: no finite shape


def test_token_ceiling(tmp_path):
    """input_tokens and output_tokens are each at most 2^24: a one-line validate error naming
    the file, the column, the rows and the rule; the same from validate_file (what replay run
    calls) and from an import; generate caps at it."""
    bad = _trace(tmp_path / "big.parquet", [0, 1, 2], [10, 2**31 - 1, MAX_TOKENS])
    p = run_cli("replay", "trace", "validate", bad)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0] == (f"error: {bad}: column 'input_tokens': input_tokens must be <= 16,777,216 (2^24) tokens "
                        "per request: no model takes more; a larger count is a unit or mapping mistake "
                        "(got 2,147,483,647): rows 1 (of 3 rows)")
    with pytest.raises(ValueError) as e:
        validate_file(bad)
    assert isinstance(e.value, TraceError) and "error: " + str(e.value) == lines[0]
    assert run_cli("replay", "trace", "validate", _trace(tmp_path / "ok.parquet", [0, 1], [MAX_TOKENS, 1])).returncode == 0
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3}\n'
                   f'{{"timestamp": 1, "input_length": 5, "output_length": {MAX_TOKENS + 1}}}\n')
    p = run_cli("replay", "trace", "import", "mooncake", src, "-o", tmp_path / "m.parquet")
    assert p.returncode == 2 and "output_tokens must be <= 16,777,216" in p.stderr and "rows 1" in p.stderr
    from llm_replay.traces.generate import generate
    t = generate({"duration": 5, "clients": [{"rate": 2, "input": {"dist": "constant", "value": 1e8, "max": 1e9},
                                              "output": {"dist": "constant", "value": 1e8, "max": 1e9}}]})
    assert t.table.column("input_tokens").to_pylist() == [MAX_TOKENS] * t.num_rows
    assert set(t.table.column("output_tokens").to_pylist()) == {MAX_TOKENS}


def test_validate_file_streams_with_read_s_rules(tmp_path):
    """validate_file checks batch by batch what Trace.read checks at once: order and unique
    request ids across batches, file rows in its messages."""
    n = 1000
    a = np.arange(n) * 10
    a[700] = 5
    path = tmp_path / "u.parquet"
    pq.write_table(pa.table({"arrival_ns": a, "input_tokens": np.ones(n, np.int32), "output_tokens": np.ones(n, np.int32),
                             "request_id": [str(i % (n - 1)) for i in range(n)]}), path)
    msg = {}
    for sort in (False, True):
        with pytest.raises(TraceError) as whole:
            Trace.read(path, sort=sort)
        with pytest.raises(TraceError) as streamed:
            validate_file(path, sort=sort, batch_size=128)
        assert str(streamed.value) == str(whole.value)
        msg[sort] = str(whole.value)
    assert "non-decreasing" in msg[False] and msg[False].endswith("rows 700 (of 1000 rows)")
    assert "request_id must be unique" in msg[True] and msg[True].endswith("rows 0, 999 (of 1000 rows)")


def test_sharegpt_huge_integer_is_one_error_line(tmp_path):
    src = tmp_path / "sg.json"
    src.write_text('[{"id": "a", "n": ' + "9" * 5000 + ', "conversations": [{"from": "human", "value": "hi"}]}]')
    p = run_cli("replay", "trace", "import", "sharegpt", src, "-o", tmp_path / "o.parquet")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert "item 0" in lines[0] and "5000 digits" in lines[0] and "unexpected" not in lines[0]
    assert not (tmp_path / "o.parquet").exists()


def test_import_errors_escape_binary_bytes(tmp_path):
    """Control bytes of the input are escaped in the error line (\\x00, \\x1b), and a huge
    value is cut: one printable line."""
    src = tmp_path / "bin.csv"
    src.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,\x00\x1b[2J\x07" + b"\x01" * 5000
                    + b",3\n")
    p = run_cli("replay", "trace", "import", "azure", src, "-o", tmp_path / "o.parquet")
    line = p.stderr.rstrip("\n")
    assert p.returncode == 2 and line.startswith("error: ") and "\n" not in line, p.stderr
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in line), repr(line)
    assert "\\x00\\x1b[2J\\x07" in line and len(line) < 800
    assert str(TraceError("bad \udcff\u2028", file="a\nb")) == "a\\nb: bad \\udcff\\u2028"


def test_a_gap_or_delay_that_dwarfs_the_trace_is_named(tmp_path):
    """Issue 36 item 3: validate accepted a last arrival at int64 max or a delay_s of 1e12 and a run
    then waited for ever: one warning line each, naming the row; an ordinary night-long gap, an
    unsorted file (validate --sort) and ordinary delays are no warning."""
    from llm_replay.traces.validate import timing_warnings
    p = run_cli("replay", "trace", "validate", _trace(tmp_path / "max.parquet", [0, 1000, 2**63 - 1]))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 0 and p.stdout.startswith("ok:") and len(lines) == 1, p.stderr
    assert lines[0].startswith("replay: warning: ") and "row 2 arrives" in lines[0] and "292 years" in lines[0]
    chain = tmp_path / "chain.parquet"
    pq.write_table(pa.table({"arrival_ns": pa.array([0, 10**9, 2 * 10**9], pa.int64()), "input_tokens": [9] * 3,
                             "output_tokens": [4] * 3, "request_id": ["a", "b", "c"], "task_id": ["t"] * 3,
                             "depends_on": pa.array([None, ["a"], ["b"]], pa.list_(pa.string())),
                             "delay_s": [None, 1e12, 0.5]}), chain)
    p = run_cli("replay", "trace", "validate", chain)
    assert p.returncode == 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "row 1 has delay_s 1e+12 s" in p.stderr and "--max-delay" in p.stderr
    assert "--max-delay 60 s caps it (1 row over that)" in timing_warnings(chain, 60.0)[0]
    night = _trace(tmp_path / "night.parquet", [i * 10**12 for i in range(40)] + [40 * 10**12 + 8 * 3600 * 10**9])
    assert not timing_warnings(night) and not timing_warnings(tmp_path / "max.parquet", None)[1:]
    unsorted = _trace(tmp_path / "unsorted.parquet", [2**62, 0, 5])
    assert run_cli("replay", "trace", "validate", unsorted, "--sort").stderr == ""


def test_replay_run_names_the_delay_its_max_delay_caps(tmp_path):
    from tests.replay.runkit import records, sse_server
    chain = tmp_path / "chain.parquet"
    pq.write_table(pa.table({"arrival_ns": pa.array([0, 10**8, 2 * 10**8], pa.int64()), "input_tokens": [9] * 3,
                             "output_tokens": [4] * 3, "request_id": ["a", "b", "c"], "task_id": ["t"] * 3,
                             "depends_on": pa.array([None, ["a"], ["b"]], pa.list_(pa.string())),
                             "delay_s": [None, 1e12, 0.05]}), chain)
    with sse_server("--interval", "0.001") as url:
        p = run_cli("replay", "run", "--trace", chain, "--target", url, "-o", tmp_path / "run", "--no-check",
                    "--no-progress", "--model-map", "*=m", "--max-delay", "0.1", check=True)
    warned = [ln for ln in p.stderr.splitlines() if ln.startswith("replay: warning: ")]
    assert len(warned) == 1 and "row 1 has delay_s 1e+12 s" in warned[0] and "--max-delay 0.1 s caps it" in warned[0]
    assert (records(tmp_path / "run").status == "ok").all()
