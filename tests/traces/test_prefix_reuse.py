"""Prefix reuse as a variable (issue 42): `transform --prefix-reuse R` and the spec key
`prefix_reuse` rewrite hash_ids so that the unbounded-cache token hit ratio is R."""
from pathlib import Path

import pytest

from tests.conftest import run_cli
from llm_replay.traces import Trace, TraceError
from llm_replay.traces.generate import generate, generate_to
from llm_replay.traces.importers import import_trace
from llm_replay.traces.spec import parse_spec
from llm_replay.traces.stats import prefix_cache_hits
from llm_replay.traces.transform import apply, prefix_reuse

ARXIV = Path(__file__).parent / "fixtures" / "public" / "mooncake_arxiv_window.jsonl"
SPEC = {"duration": 250, "seed": 3, "clients": [{"name": "chat", "rate": 1.0, "output": {"dist": "constant", "value": 9},
        "input": {"dist": "lognormal", "median": 350, "sigma": 1.0, "min": 1, "max": 6144}}]}


def _ratio(t: Trace) -> float:
    return prefix_cache_hits(t.table, t.metadata["block_size"])["token_hit_ratio"]


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory) -> Trace:
    out = tmp_path_factory.mktemp("pr") / "arxiv.parquet"
    import_trace("mooncake", ARXIV, out)
    return Trace.read(out)


@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("source", ["synthetic", "mooncake"])
def test_ratio_is_reached_and_other_columns_kept(source, ratio, request):
    t = generate(SPEC) if source == "synthetic" else request.getfixturevalue("mooncake")
    assert t.num_rows >= 200 and ("hash_ids" in t.table.column_names) == (source == "mooncake")
    out = prefix_reuse(t, ratio, seed=1)
    assert abs(_ratio(out) - ratio) <= 0.01
    assert abs(_ratio(out) - ratio) * t.table.column("input_tokens").to_numpy().sum() <= out.metadata["block_size"]
    had = ["hash_ids"] if source == "mooncake" else []
    assert out.table.drop_columns(["hash_ids"]).equals(t.table.drop_columns(had))
    assert out.metadata["transforms"][-1]["op"] == "prefix_reuse" and out.metadata["transforms"][-1]["ratio"] == ratio
    if ratio == 0:  # every block unique
        ids = out.table.column("hash_ids").combine_chunks().flatten().to_numpy()
        assert len(set(ids.tolist())) == len(ids)
    again = prefix_reuse(t, ratio, seed=1)
    assert again.table.equals(out.table)


def test_block_size_is_the_traces_unless_given(mooncake):
    assert prefix_reuse(mooncake, 0.5).metadata["block_size"] == 512
    out = apply(mooncake, "prefix_reuse", "0.5", seed=2, block_size=16)
    assert out.metadata["block_size"] == 16 and abs(_ratio(out) - 0.5) <= 0.01
    assert not prefix_reuse(mooncake, 0.5, seed=2).table.equals(prefix_reuse(mooncake, 0.5, seed=3).table)


def test_bad_values_are_one_line_errors(mooncake):
    for value, msg in [("1", r"--prefix-reuse must be in \[0, 1\)"), ("-0.1", "must be in"), ("nan", "must be in"),
                       ("x", "--prefix-reuse 'x': could not convert"), ("0.99", "0.99 is out of reach for this trace")]:
        with pytest.raises(TraceError, match=msg) as e:
            apply(mooncake, "prefix_reuse", value)
        assert "\n" not in str(e.value)
    with pytest.raises(TraceError, match="--block-size must be >= 1"):
        prefix_reuse(mooncake, 0.5, block_size=0)


def test_cli_option_and_describe(tmp_path):
    src, out = tmp_path / "a.parquet", tmp_path / "b.parquet"
    generate(SPEC).write(src)
    run_cli("replay", "trace", "transform", src, "-o", out, "--head", "250", "--prefix-reuse", "0.5", "--seed", "4",
            check=True)
    t = Trace.read(out)
    assert [op["op"] for op in t.metadata["transforms"]] == ["head", "prefix_reuse"] and abs(_ratio(t) - 0.5) <= 0.01
    assert "tokens 0.500 (block_size 16)" in run_cli("replay", "trace", "describe", out, check=True).stdout
    bad = run_cli("replay", "trace", "transform", src, "-o", out, "--prefix-reuse", "1.5")
    assert bad.returncode == 2 and "--prefix-reuse must be in [0, 1)" in bad.stderr


def test_spec_key(tmp_path):
    t = generate({**SPEC, "prefix_reuse": 0.5})
    assert abs(_ratio(t) - 0.5) <= 0.01 and t.metadata["transforms"][0]["seed"] == 3
    n, _ = generate_to({**SPEC, "prefix_reuse": 0.5}, tmp_path / "g.parquet")
    assert Trace.read(tmp_path / "g.parquet").table.equals(t.table)
    for value, msg in [(1, "prefix_reuse: must be < 1"), (-1, "prefix_reuse: must be >= 0"),
                       ("a", "prefix_reuse: must be a finite number")]:
        with pytest.raises(TraceError, match=msg):
            parse_spec({**SPEC, "prefix_reuse": value})
    with pytest.raises(TraceError, match="prefix_reuse 0.99 is out of reach"):
        generate({**SPEC, "prefix_reuse": 0.99})
