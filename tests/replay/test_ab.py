"""Issue 37 item 3, live: `replay ab` replays each block of a trace to both targets (ABBA) and
judges non-inferiority after 1, 2, 4, ... blocks at spending confidences until decided."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.replay.runkit import sse_server, write_trace


def _ab(tmp_path, base, cand, *extra):
    trace = write_trace(tmp_path / "t.parquet", 240, gap_s=0.025, output_tokens=4)   # 6 s: 6 blocks of 1 s
    return run_cli("replay", "ab", "--trace", trace, "--base", base, "--cand", cand, "--block", "1",
                   "--metrics", "ttft_ms.p50", "-o", tmp_path / "ab", *extra, "--", "--no-progress", timeout=300)


@pytest.mark.slow   # two live A/B tests of 2-12 block runs each: ~100 s
def test_a_slower_candidate_fails_and_an_equal_one_passes(tmp_path):
    with sse_server("--first-delay", "0.01") as fast, sse_server("--first-delay", "0.08") as slow:
        worse = _ab(tmp_path / "w", fast, slow, "--not-worse-by", "20")
        same = _ab(tmp_path / "s", fast, fast, "--not-worse-by", "100")
    assert worse.returncode == 1, worse.stdout[-2000:] + worse.stderr[-2000:]
    w = json.loads((tmp_path / "w" / "ab" / "ab.json").read_text())
    assert w["looks"][-1]["blocks"] == 1 and len(w["runs"]["A"]) == len(w["runs"]["B"]) == 1   # decided at once
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr[-2000:]
    s = json.loads((tmp_path / "s" / "ab" / "ab.json").read_text())
    order = [p.rsplit("-", 1)[-1] for p in sorted(s["runs"]["A"] + s["runs"]["B"])]
    assert len(order) == 2 * s["looks"][-1]["blocks"]
    assert "look 1 after 1 block(s)" in same.stdout and "(ABBA)" in same.stdout


def test_bad_input_is_one_line(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 10)
    p = run_cli("replay", "ab", "--trace", trace, "--base", "http://127.0.0.1:9", "--cand", "http://127.0.0.1:9",
                "--not-worse-by", "abc", "-o", tmp_path / "ab")
    assert p.returncode == 2 and p.stderr.count("error:") == 1 and "--not-worse-by" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
