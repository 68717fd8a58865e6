"""A short slice of the fuzz and fault campaign (benchmarks/fuzz_campaign.py: the long one and the
README's figures): seeded hostile inputs to every file-reading entry point of the CLI, each in its
own process. None may end in a traceback, in the CLI's `error: unexpected` line (a bug caught by
its last resort), in a hang or in an exit code the command does not document; each stays within
a memory bound that no input of this size needs (a span of 10^18 ns once took 2.6 GB). The
campaign runs as a process of its own, so that its children's peak RSS is theirs, not pytest's."""
from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys

from tests.conftest import REPO, repo_env, wait_s

PER_ENTRY = int(os.environ.get("FUZZ_CAMPAIGN_PER_ENTRY", 4))
SEED = int(os.environ.get("FUZZ_CAMPAIGN_SEED", 0))
MAX_RSS_MB = 1024


@pytest.mark.slow
def test_hostile_inputs_give_results_or_one_line_errors():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fuzz_campaign.py"), "--per-entry", str(PER_ENTRY),
                        "--seed", str(SEED), "--json"], capture_output=True, text=True, env=repo_env(), timeout=wait_s(900))
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(results) >= 6 and all(r["inputs"] == PER_ENTRY for r in results)
    bad = [r for r in results if r["tracebacks"] or r["unexpected"] or r["hangs"] or r["bad_exit"]
           or r["peak_rss_mb"] > MAX_RSS_MB]
    assert not bad, "\n\n".join(f"{r['entry']}: {r}\n" + "\n".join(r["examples"]) for r in bad)
