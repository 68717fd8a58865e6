"""docs/experiments.md, its block as written (mdblocks.py: how) at half scale: the issue-42 experiments
against engine-stub, each outcome the page states checked on the run's own output: prefix reuse
0 / 0.5 / 0.9 achieved within 0.05 and a server without a cache failing `prefix_hit`; a reset's cold
window named by the report; a noisy tenant's burst failing `fairness >= 0.9` under FCFS and passing
under fair share."""
from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.docs.mdblocks import DOCS, Page, commands, sh

PAGE = Page(DOCS / "experiments.md", {"python3 benchmarks/cache_tenants.py": "test_experiments_block"})
PAGES = [PAGE]


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.mark.slow
def test_experiments_block(tmp_path):
    pytest.importorskip("torch")
    (cmd,) = commands(PAGE.block("python3 benchmarks/cache_tenants.py").text)
    out = sh(f"{cmd} --scale 0.5 --keep {tmp_path}", REPO, timeout=900).stdout
    lines = out.splitlines()
    reuse = [s for s in lines if re.match(r"\s+0\.\d0\s+0\.\d{3}\s", s)]
    assert len(reuse) == 3 and all("within 0.05" in s and "gate exit 0" in s for s in reuse), out
    nocache = next(s for s in lines if "--no-prefix-caching" in s)
    assert "gate exit 1" in nocache and "did not deliver" in nocache, out
    cold = next(s for s in lines if s.lstrip().startswith("cold "))
    assert "cold (reset via POST /reset_prefix_cache before T0" in cold and "cold cache: the first" in cold, out
    assert "warm (not reset" in next(s for s in lines if s.lstrip().startswith("again ")), out
    fairness = {p: (float(re.search(r"fairness (\d\.\d+)", s).group(1)), s.split()[-1])
                for p in ("fcfs", "fair") for s in lines if s.lstrip().startswith(p + " ")}
    assert fairness["fcfs"][0] < 0.8 and fairness["fcfs"][1] == "FAIL", out
    assert fairness["fair"][0] > 0.95 and fairness["fair"][1] == "PASS", out
