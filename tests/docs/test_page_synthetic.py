"""docs/synthetic.md, every block as written (mdblocks.py: how), from the bundled fixtures."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.docs.mdblocks import DOCS, FIX, Page, commands, sh, substitute

PAGE = Page(DOCS / "synthetic.md", {
    "replay trace generate --preset bursty --duration 600": "test_synthetic_block",
    "replay trace generate --preset bursty --rate 5": "test_exact_rate_block",
    "replay trace import servegen ServeGen/data/language/m-large": "test_window_block",
    "duration: 3600": "test_spec_yaml",
    "# per-window rates, CVs and lengths": "test_length_windows_yaml",
    "clients:": "test_images_spec_yaml",
    "# a reasoning model beside an instruct one": "test_reasoning_share_yaml",
    "# shared application prefixes": "test_pool_yaml",
    "replay trace generate --preset chat --duration 60": "test_small_sample_fit",
    "replay: warning: client 'chat': only 120 arrivals": "test_small_sample_fit",
    "# keys from why:": "test_modulation_yaml",
    "replay trace import mooncake tests/traces/fixtures/public/mooncake_arxiv": "test_describe_arxiv",
    "conversations    944 inferred": "test_describe_arxiv",
    "replay trace import servegen tests/traces/fixtures/synth/servegen/r1-test": "test_servegen_reason_mm_block",
})
PAGES = [PAGE]
block = PAGE.block


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-synthetic")


@pytest.mark.slow
def test_synthetic_block(work):
    for cmd in commands(block("replay trace generate --preset bursty --duration 600").text):
        if "fixtures" in cmd:
            cmd = substitute(cmd, {"tests/traces/fixtures/": f"{FIX}/"})
        # compare: exit 1, as the page says (4x the rate differs)
        sh(cmd, work, ok=(1,) if "trace compare" in cmd else (0,))
    assert (work / "again.parquet").read_bytes() == (work / "bursty.parquet").read_bytes()
    assert (work / "m-test.yaml").exists() and (work / "mine.parquet").exists()
    prod, x4 = (json.loads(sh(f"replay trace describe {n}.parquet --json", work).stdout) for n in ("prod", "prod-x4"))
    assert 3.5 < x4["mean_rate"] / prod["mean_rate"] < 4.5     # "at 4x its rate"


def _generate_from(work: Path, spec_text: str, name: str) -> dict:
    (work / f"{name}.yaml").write_text(spec_text)
    sh(f"replay trace generate --spec {name}.yaml --duration 600 -o {name}.parquet", work)
    return json.loads(sh(f"replay trace describe {name}.parquet --json", work).stdout)


def test_spec_yaml(work):
    d = _generate_from(work, block("duration: 3600").text, "spec")
    assert d["requests"] > 100


def test_images_spec_yaml(work):
    # the fragment's rest (rate, lengths), as the page's full spec above has them
    d = _generate_from(work, "duration: 600\nseed: 1\n" + block("clients:").text.replace(
        "  - name: chat\n", "  - name: chat\n    rate: 2\n    input: {dist: lognormal, median: 200, sigma: 0.5}\n"
                             "    output: {dist: lognormal, median: 50, sigma: 0.5}\n", 1), "vision")
    assert d["requests"] > 100 and d["images"]


LENGTHS = ("    input: {dist: lognormal, median: 200, sigma: 0.5}\n"
           "    output: {dist: lognormal, median: 50, sigma: 0.5}\n")
SERVEGEN = FIX / "synth" / "servegen"


def _norm(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def test_exact_rate_block(work):
    """Each command prints the line shown under it."""
    lines = block("replay trace generate --preset bursty --rate 5").text.splitlines()
    for cmd, shown in zip(lines[::2], lines[1::2]):
        assert shown.startswith("# ")
        assert sh(cmd, work).stdout.strip() == shown[2:]


def _windows(lo: float, hi: float) -> dict[str, float]:
    """Requests per client in the source's 600-s windows that start in [lo, hi): rate x 600."""
    out = {}
    for f in sorted(SERVEGEN.glob("m-days/chunk-*-trace.csv")):
        n = sum(float(r[1]) * 600 for r in csv.reader(f.open()) if lo <= float(r[0]) < hi)
        out[f"client-{f.name.split('-')[1]}"] = n
    return out


@pytest.mark.slow
def test_window_block(work):
    """A window has its own windows' counts, per client; --rate keeps the window's mix; the
    dumped spec is the window's; the page's 'hour 1d14h' rates are that hour's."""
    cmds = commands(block("replay trace import servegen ServeGen/data/language/m-large").text)
    sh(substitute(cmds[0], {"ServeGen/data/language/m-large": str(SERVEGEN / "m-days")}), work)
    for cmd in cmds[1:4]:
        sh(substitute(cmd, {"--rate 400": "--rate 40"}) if "--rate" in cmd else cmd, work)   # 1.4M rows -> 144k
    dump = yaml.safe_load(sh(cmds[4], work).stdout)
    t0 = 86400 + 14 * 3600
    hour, first, x = (pq.read_table(work / f, columns=["client_id"]).column(0).to_pylist()
                      for f in ("tue-14h.parquet", "first-hour.parquet", "x.parquet"))
    for got, want in ((hour, _windows(t0, t0 + 3600)), (first, _windows(0, 3600))):
        assert {c: got.count(c) for c in set(got)} == {c: round(n) for c, n in want.items() if n}
    assert abs(len(x) / 144000 - 1) < 0.001
    for c in set(hour):
        assert abs(x.count(c) / len(x) - hour.count(c) / len(hour)) < 0.01
    assert dump["duration"] == 3600 and all(len(c["profile"]["values"]) == 6 for c in dump["clients"])
    text = PAGE.path.read_text()
    total = float(re.search(r"\| total rate \| ([\d.]+) req/s", text).group(1))
    batch = float(re.search(r"\| client 2 \(batch\) rate \| ([\d.]+) req/s", text).group(1))
    assert abs(len(hour) / 3600 / total - 1) < 0.01 and abs(hour.count("client-2") / 3600 / batch - 1) < 0.01


def test_length_windows_yaml(work):
    (work / "lw.yaml").write_text(block("# per-window rates, CVs and lengths").text)
    sh("replay trace generate --spec lw.yaml -o lw.parquet", work)
    t = pq.read_table(work / "lw.parquet").to_pandas()
    late = t.arrival_ns >= 1200e9
    assert set(t.input_tokens[~late]) <= {120, 480} and t.input_tokens[late].median() > 480


def test_reasoning_share_yaml(work):
    (work / "rs.yaml").write_text("duration: 600\nseed: 1\n" + block("# a reasoning model beside").text)
    sh("replay trace generate --spec rs.yaml -o rs.parquet", work)
    t = pq.read_table(work / "rs.parquet").to_pandas()
    assert (t.reasoning_tokens <= t.output_tokens).all()
    share = t.groupby("model").apply(lambda g: g.reasoning_tokens.sum() / g.output_tokens.sum())
    assert share["qwen-instruct"] == 0 and abs(share["deepseek-r1"] - (0.4 * 0.3 + 0.6 * 0.9)) < 0.05


def test_pool_yaml(work):
    (work / "pool.yaml").write_text("duration: 60\nseed: 1\n" + block("# shared application prefixes").text)
    sh("replay trace generate --spec pool.yaml -o pool.parquet", work)
    d = json.loads(sh("replay trace describe pool.parquet --json", work).stdout)["shared_prefixes"]
    # system prompt on 45 %, a pool prefix on 55 %: every conversation opens with one of them
    assert d["share"] > 0.95 and d["blocks"]["p90"] >= 12 and d["blocks"]["max"] <= 1 + 33


def test_small_sample_fit(work):
    for cmd in commands(block("replay trace generate --preset chat --duration 60").text):
        p = sh(cmd, work)
    assert block("replay: warning: client 'chat'").text.strip() in p.stderr.splitlines()


def test_modulation_yaml(work):
    d = _generate_from(work, "duration: 600\nseed: 1\n" + block("# keys from why:").text.replace(
        "  rate: 24.0\n", "  rate: 24.0\n" + LENGTHS.replace("    ", "  "), 1), "modulated")
    assert d["requests"] > 10000


def test_describe_arxiv(work):
    imp, desc = commands(block("replay trace import mooncake tests/traces/fixtures/public/mooncake_arxiv").text)
    sh(substitute(imp, {"tests/traces/fixtures/": f"{FIX}/"}), work)
    real = _norm(sh(desc, work).stdout)
    for line in _norm(block("conversations    944 inferred").text):
        assert line in real, (line, real)


@pytest.mark.slow
def test_servegen_reason_mm_block(work):
    for cmd in commands(block("replay trace import servegen tests/traces/fixtures/synth/servegen/r1-test").text):
        out = sh(substitute(cmd, {"tests/traces/fixtures/": f"{FIX}/"}) if "fixtures" in cmd else cmd, work).stdout
        if "describe" in cmd:
            shown = " ".join(cmd.split("# ...")[1].split())
            assert shown in _norm(out), out
    mm = yaml.safe_load((work / "mm.yaml").read_text())
    assert any("980x952" in c["images"]["px"] for c in mm["clients"])   # 1196 tokens -> 35 x 34 cells
