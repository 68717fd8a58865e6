"""docs/capacity.md, its block as written (mdblocks.py: how), in a folder laid out as a clone
(`examples/` copied in): engine-stub on a free port for `8000`. The two sweeps wait on their
traces' schedules, not on the CPU, so they run side by side, each in a folder of its own."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import REPO, wait_s
from tests.docs.mdblocks import DOCS, Page, commands, env, serve, sh, stop, substitute

PAGE = Page(DOCS / "capacity.md", {"engine-stub serve --port 8000 &": "test_sweep_block"})
PAGES = [PAGE]


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.mark.slow
def test_sweep_block(tmp_path):
    pytest.importorskip("torch")
    engine, generate, with_target, no_target = commands(PAGE.block("engine-stub serve --port 8000 &").text)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    sh(generate, tmp_path)
    other = tmp_path / "no-target"
    shutil.copytree(tmp_path, other, ignore=shutil.ignore_patterns("no-target"))
    proc, url = serve(engine, tmp_path, tmp_path / "engine.log")
    try:
        runs = [(cmd, subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env(),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                for cmd, cwd in ((substitute(with_target, {"http://127.0.0.1:8000": url}), tmp_path),
                                 (no_target, other))]
        for cmd, p in runs:
            out = p.communicate(timeout=wait_s(500))[0]
            assert p.returncode == 0 and "Traceback" not in out, f"`{cmd}`:\n{out[-4000:]}"
            assert "capacity" in out, out[-3000:]
    finally:
        stop(proc)
    for folder, name in ((tmp_path, "sweep"), (other, "sweep-chat")):
        sweep = json.loads((folder / "runs" / name / "sweep.json").read_text())
        assert 1 <= len(sweep["points"]) <= 4, sweep["points"]           # --max-runs 4
