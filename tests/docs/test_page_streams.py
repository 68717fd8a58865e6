"""docs/reasoning.md, docs/images.md and docs/client.md: their blocks checked or run
(mdblocks.py: how); the client's example against the SSE test server."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import REPO, wait_s
from tests.docs.mdblocks import DOCS, Page, commands, env, sh, substitute
from tests.replay.runkit import sse_server, write_trace

REASONING = Page(DOCS / "reasoning.md", {
    "per_request: {ttfa_ms: 2000, tpot_ms: 40}": "test_reasoning_slo",
    "replay: the trace's reasoning_tokens are not sent": "test_asked_reasoning_blocks",
    "reasoning share of output tokens": "test_asked_reasoning_blocks",
})
IMAGES = Page(DOCS / "images.md", {'{"role": "user", "content": [{"type": "text"': "test_image_content_json"})
CLIENT = Page(DOCS / "client.md", {
    "# inside a gevent-patched process": "test_client_python_block",
    "python3 -m pytest -q tests/replay/test_sse.py": "test_verify_block",
})
PAGES = [REASONING, IMAGES, CLIENT]


def test_every_block_is_checked():
    for page in PAGES:
        page.assert_checked(globals())


def test_reasoning_slo(tmp_path):
    from llm_replay import reports
    (tmp_path / "reasoning.yaml").write_text(REASONING.block("per_request:").text + "\n")
    spec = reports.load_slo(tmp_path / "reasoning.yaml")
    assert [o.text for o in spec.objectives][1] == "ttfa_ms.p90 <= 3000" and spec.per_request["ttfa_ms"] == 2000


def test_asked_reasoning_blocks(tmp_path):
    """The page's case: a server that reasons 2 tokens of every 12-token chat answer (it takes no
    count), a trace that asks for half of the output as reasoning: the note and the row shown."""
    trace = write_trace(tmp_path / "t.parquet", 6, gap_s=0.05, output_tokens=12, api=["chat"] * 6,
                        reasoning_tokens=[0, 3, 6, 12, None, 9])
    with sse_server("--reasoning", "2", "--report-reasoning", "--interval", "0.001") as url:
        p = sh(f"replay run --trace {trace} --target {url} -o run --no-progress", tmp_path, timeout=120)
    assert REASONING.block("replay: the trace's reasoning_tokens").text.strip() in p.stderr.splitlines()
    row = " ".join(REASONING.block("reasoning share of output tokens").text.split())
    assert row in [" ".join(line.split()) for line in p.stdout.splitlines()], p.stdout[-3000:]


def test_image_content_json():
    """The message shape shown is the one replay sends: a text part, then image_url parts whose
    data URL starts as shown."""
    from llm_replay.replay.images import Images
    shown = IMAGES.block('{"role": "user"').text
    parts = json.loads(b"[" + b"".join(Images().parts(2, "64x64", key=0)) + b"]")
    assert len(parts) == 2 and parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith(
        re.search(r'"url": "([^"]+?)\.\.\."', shown).group(1))


def test_client_python_block(tmp_path):
    code = CLIENT.block("# inside a gevent-patched process").text
    prelude = ("from gevent import monkey; monkey.patch_all()\nkey = 'k'\n"
               "body_bytes = b'{\"model\": \"m\", \"prompt\": \"hi\", \"max_tokens\": 5, \"stream\": true}'\n")
    with sse_server("--tokens", "5") as url:
        script = prelude + substitute(code, {"http://127.0.0.1:8000": url}) + \
            "\nprint('status', res.status, len(res.token_times))\n"
        p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env(), capture_output=True, text=True,
                           timeout=wait_s(60))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "status ok 5" in p.stdout, p.stdout


def test_verify_block():
    """The test files named run in this suite; each benchmark script starts (--help)."""
    for cmd in commands(CLIENT.block("python3 -m pytest -q tests/replay/test_sse.py").text):
        args = cmd.split("#")[0].split()
        if args[:3] == ["python3", "-m", "pytest"]:
            assert args[4:] and all((REPO / a).exists() for a in args[4:])
        else:
            assert (REPO / args[1]).exists()
            sh(f"{sys.executable} {REPO / args[1]} --help", REPO, timeout=60)
