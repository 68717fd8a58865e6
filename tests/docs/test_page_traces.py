"""docs/traces.md, every block as written (mdblocks.py: how), from the bundled fixtures; the
user's own CSV log is written here first."""
from __future__ import annotations

import json

import pytest

from tests.docs.mdblocks import DOCS, FIX, Page, commands, same_shape, sh, substitute

PAGE = Page(DOCS / "traces.md", {
    "replay trace import azure tests/traces/fixtures/public/": "test_import_block",
    "replay trace import csv my_log.csv": "test_csv_map_block",
    "replay trace import vidur tests/traces/fixtures/vidur_lengths.csv": "test_lengths_only_block",
    "replay trace import mooncake tests/traces/fixtures/mooncake.jsonl": "test_describe_mooncake",
    "mooncake.parquet: 6 requests": "test_describe_mooncake",
})
PAGES = [PAGE]
block = PAGE.block
FIXTURES = {"tests/traces/fixtures/": f"{FIX}/"}


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-traces")


@pytest.mark.slow
def test_import_block(work):
    for cmd in commands(block("replay trace import azure tests/traces/fixtures/public/").text):
        sh(substitute(cmd, FIXTURES) if "fixtures" in cmd else cmd, work)
    # "back.csv is byte for byte the source file"
    assert (work / "back.csv").read_bytes() == (FIX / "public" / "AzureLLMInferenceTrace_code.csv").read_bytes()
    half = json.loads(sh("replay trace describe half.parquet --json", work).stdout)
    assert 0 < half["requests"] < json.loads(sh("replay trace describe azure.parquet --json", work).stdout)["requests"]
    assert (work / "burst-tiny.parquet").exists()


def test_csv_map_block(work):
    (work / "my_log.csv").write_text("ts,prompt_len,gen_len,engine\n0,120,30,a\n250,800,12,b\n1500,64,200,a\n")
    for cmd in commands(block("replay trace import csv my_log.csv").text):
        sh(cmd, work)
    assert json.loads(sh("replay trace describe t.parquet --json", work).stdout)["requests"] == 3


def test_lengths_only_block(work):
    for cmd in commands(block("replay trace import vidur tests/traces/fixtures/vidur_lengths.csv").text):
        sh(substitute(cmd, FIXTURES), work)
    for name in ("lengths", "lengths2"):
        d = json.loads(sh(f"replay trace describe {name}.parquet --json", work).stdout)
        assert d["requests"] == 6 and d["source"]["arrivals"]["synthesized"]


def test_describe_mooncake(work):
    cmds = commands(block("replay trace import mooncake tests/traces/fixtures/mooncake.jsonl").text)
    sh(substitute(cmds[0], FIXTURES), work)
    real = sh(cmds[1], work).stdout
    shown = block("mooncake.parquet: 6 requests").text
    assert shown.splitlines()[0].split(" (")[0] == real.splitlines()[0].split(" (")[0]
    same_shape(shown, real)
