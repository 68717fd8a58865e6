"""Our packages live under one namespace (llm_replay.*): a user's project with its own `reports/`,
`traces/` or `replay/` package runs the pytest plugin, and both sides import their own modules."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.replay.runkit import sse_server, write_trace
from tests.conftest import wait_s

pytest_plugins = ["pytester"]

USER_TEST = """
import reports, traces, replay

def test_user_packages_and_plugin(replay):
    assert reports.WHO == traces.WHO == "user"      # the project's own packages, not ours
    r = replay(TRACE, no_check=True, no_progress=True)
    r.assert_slo({"objectives": ["error_rate <= 0.5"]})   # 6 of 6 ok prove it at 95 %
    assert r.metrics["ok"] == 6
"""


@pytest.mark.slow
def test_plugin_beside_user_packages_named_like_ours(pytester: pytest.Pytester, tmp_path, monkeypatch):
    for name in ("reports", "traces", "replay"):
        pkg = pytester.path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text('WHO = "user"\n')
        (pkg / "schema.py").write_text('WHO = "user"\n')
    trace = write_trace(tmp_path / "t.parquet", 6, gap_s=0.01)
    pytester.makepyfile(test_user=USER_TEST.replace("TRACE", repr(str(trace))))
    # as a user runs it: no PYTHONPATH pointing at this checkout, the project's folder first
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with sse_server() as url:
        res = pytester.runpytest_subprocess("--replay-target", url, "-p", "no:cacheprovider", timeout=wait_s(240))
    assert "ModuleNotFoundError" not in res.stdout.str()
    res.assert_outcomes(passed=1)


def test_installed_names_do_not_leak_top_level(tmp_path):
    code = ("import importlib.util, llm_replay.replay.cli, llm_replay.reports, llm_replay.traces;"
            "print([m for m in ('replay', 'reports', 'traces', 'engine_stub')"
            " if importlib.util.find_spec(m) is not None])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=wait_s(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
