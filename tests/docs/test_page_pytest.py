"""docs/pytest.md, every block as written (mdblocks.py: how): `path/to/llm-replay/` is this
checkout, the deployment URL an SSE test server. The GitHub Actions workflow shown is
examples/github/slo-gate.yml to the byte, and its install step installs this repository from a
git URL (tests/integration/test_pytest_plugin.py runs its gate step)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, wait_s
from tests.docs.mdblocks import DOCS, Page, commands, env, sh, substitute
from tests.replay.runkit import sse_server

PAGE = Page(DOCS / "pytest.md", {
    "# test_slo.py": "test_pytest_blocks",
    "cp path/to/llm-replay/examples/slo.yaml slo.yaml": "test_pytest_blocks",
    "mkdir -p .github/workflows tests/slo": "test_actions_recipe",
    "# Copy to .github/workflows/slo-gate.yml": "test_actions_recipe",
})
PAGES = [PAGE]
block = PAGE.block
CLONE = {"path/to/llm-replay/": f"{REPO}/"}
WORKFLOW = REPO / "examples" / "github" / "slo-gate.yml"


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.mark.slow
def test_pytest_blocks(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "test_slo.py").write_text(block("# test_slo.py").text + "\n")
    cp, generate, with_target, no_target = commands(block("cp path/to/llm-replay/examples/slo.yaml").text)
    sh(substitute(cp, CLONE), tmp_path)
    sh(generate, tmp_path)
    other = tmp_path.parent / (tmp_path.name + "-local-engine")   # side by side, a copy of the project
    shutil.copytree(tmp_path, other)
    with sse_server("--tokens", "8") as url:
        procs = [_pytest(substitute(with_target, {"https://my-deployment.example/": url}), tmp_path),
                 _pytest(no_target, other)]
        for p, _ in procs:
            p.wait(timeout=wait_s(420))
    for p, log in procs:
        out = log.read_text()
        assert p.returncode == 0 and "2 passed" in out, out[-4000:]


def _pytest(cmd: str, cwd: Path) -> tuple[subprocess.Popen, Path]:
    log = cwd / "pytest.log"
    with open(log, "w") as f:
        return subprocess.Popen(["bash", "-c", cmd.split("#")[0] + " -p no:cacheprovider"], cwd=cwd, env=env(),
                                stdout=f, stderr=subprocess.STDOUT), log


def test_actions_recipe(tmp_path):
    assert block("# Copy to .github/workflows/slo-gate.yml").text + "\n" == WORKFLOW.read_text()
    for cmd in commands(block("mkdir -p .github/workflows tests/slo").text):
        sh(substitute(cmd, CLONE) if "path/to" in cmd else cmd, tmp_path)
    assert (tmp_path / ".github" / "workflows" / "slo-gate.yml").read_bytes() == WORKFLOW.read_bytes()
    assert {p.name for p in (tmp_path / "tests" / "slo").iterdir()} == {"test_slo.py", "slo.yaml"}
    # the install step: without the variable it fails and says what to set; with a git URL (here
    # this checkout's own repository) pip resolves llm-replay from it (a dry run: nothing installed)
    step = next(s for s in yaml.safe_load(WORKFLOW.read_text())["jobs"]["slo"]["steps"]
                if "pip install" in str(s.get("run", "")))
    assert step["env"] == {"LLM_REPLAY_GIT": "${{ vars.LLM_REPLAY_GIT }}"}
    missing = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], env={**env(), "LLM_REPLAY_GIT": ""},
                             capture_output=True, text=True, timeout=wait_s(60))
    assert missing.returncode == 1 and "set the repository variable LLM_REPLAY_GIT" in missing.stdout
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git repository to install from here")
    run = substitute(step["run"], {"pip install": f"{sys.executable} -m pip install --dry-run --no-deps "
                                                  "--no-build-isolation --quiet --report -"})
    p = subprocess.run(["bash", "-eo", "pipefail", "-c", run], env={**env(), "LLM_REPLAY_GIT": f"file://localhost{REPO}"},
                       capture_output=True, text=True, timeout=wait_s(240))
    assert p.returncode == 0, p.stderr[-3000:]
    assert [i["metadata"]["name"] for i in json.loads(p.stdout)["install"]] == ["llm-replay"], p.stdout[-3000:]
