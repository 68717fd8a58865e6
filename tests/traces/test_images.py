"""Images as trace columns (DESIGN.md section 9): `num_images` (int16) and `image_px` (`WxH`)
through the schema, validation (real CLI, exit 2, no traceback), the Azure 2025 importer,
canonical CSV/JSONL, transforms, describe, the generator spec, fit and compare."""
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_cli
from llm_replay.traces import TRACE_SCHEMA, Trace, TraceError
from llm_replay.traces import stats as tstats
from llm_replay.traces.compare import compare_traces
from llm_replay.traces.describe import describe_file
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.generate import generate, generate_to
from llm_replay.traces.importers import import_trace, module
from llm_replay.traces.presets import preset_spec
from llm_replay.traces.spec import SpecError, load_spec_file, parse_spec

FIX = Path(__file__).parent / "fixtures"
CONST = {"dist": "constant", "value": 10}
# model a: 30 % with images, mean 0.2 + 0.4 = 0.6; model b: none; model c: always 2
PMF_A = {0: 0.7, 1: 0.2, 4: 0.1}


def _images_spec(duration=600, rate=20):
    return {"duration": duration, "clients": [
        {"name": "vis", "rate": rate, "input": CONST, "output": CONST, "models": [
            {"name": "a", "weight": 0.5, "images": {"count": PMF_A, "px": {"512x512": 3, "1024x768": 1}}},
            {"name": "b", "weight": 0.3},
            {"name": "c", "weight": 0.2, "images": {"count": 2, "px": "336x336"}}]},
        {"name": "txt", "rate": rate / 4, "input": CONST, "output": CONST}]}


def _table(n_img, px=None, **cols):
    n = len(n_img)
    base = {"arrival_ns": pa.array(np.arange(n) * 10**8, pa.int64()), "input_tokens": [10] * n,
            "output_tokens": [5] * n, "num_images": n_img, **cols}
    if px is not None:
        base["image_px"] = px
    return pa.table(base)


# ------------------------------------------------------------------ schema and validation
def test_schema_columns_and_parquet_round_trip(tmp_path):
    assert TRACE_SCHEMA.field("num_images").type == pa.int16() and TRACE_SCHEMA.field("num_images").nullable
    assert TRACE_SCHEMA.field("image_px").type == pa.string() and TRACE_SCHEMA.field("image_px").nullable
    t = Trace(_table([0, 2, None, 64], [None, "1024x768", None, "8192x1"]))
    t.write(tmp_path / "t.parquet")
    back = Trace.read(tmp_path / "t.parquet")
    assert back.table.schema.field("num_images").type == pa.int16()
    assert back.table.column("num_images").to_pylist() == [0, 2, None, 64]
    assert back.table.column("image_px").to_pylist() == [None, "1024x768", None, "8192x1"]


@pytest.mark.parametrize("cols, needle", [
    ({"n_img": [0, -1, 2]}, "column 'num_images': num_images must be >= 0 (got -1): rows 1 (of 3 rows)"),
    ({"n_img": [0, 65, 100]}, "num_images must be <= 64: more images in one request is absurd (got 100): rows 1, 2"),
    ({"n_img": [1, 70000, 2]}, "num_images must be <= 64"),  # not an int16 overflow message
    ({"n_img": [1.0, 2.5, None]}, "column 'num_images': must be a whole number: rows 1"),
    ({"n_img": ["1", "x", "2"]}, "column 'num_images': expected integers"),
    ({"n_img": [1, 1, 1], "px": ["512x512", "512X512", None]}, "column 'image_px': image_px must be WxH"),
    ({"n_img": [1, 1, 1], "px": ["", "1x1", "1x1"]}, "image_px must be WxH in pixels, digits and a lowercase x, "
                                                    "e.g. 512x512 (got ''): rows 0"),
    ({"n_img": [1, 1, 1], "px": ["512x512", "0x5", "9000x1"]}, "image_px sides must be in 1..8192 pixels "
                                                              "(got '0x5'): rows 1, 2 (of 3 rows)"),
    ({"n_img": [1, 1, 1], "px": ["1x1", "1x1", "99999999999999999999999x1"]}, "sides must be in 1..8192"),
])
def test_validation_rules_in_process(cols, needle):
    with pytest.raises(TraceError) as e:
        Trace(_table(cols["n_img"], cols.get("px")), file="t.parquet")
    assert needle in str(e.value) and str(e.value).startswith("t.parquet: ")


def test_valid_edge_values_pass():
    t = Trace(_table([0, 64, None], ["1x1", "0512x08192", None]))  # leading zeros: 512 by 8192
    assert t.table.column("num_images").to_pylist() == [0, 64, None]


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                   st.text(max_size=12), st.from_regex(r"\A[0-9]{0,6}x[0-9]{0,6}\Z"))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(n_img=st.lists(VALUES, min_size=2, max_size=2), px=st.lists(VALUES, min_size=2, max_size=2))
def test_random_image_values_conform_or_raise_trace_error(n_img, px):
    try:
        table = _table(pa.array(n_img, from_pandas=True), pa.array(px, from_pandas=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return  # mixed Python types: not a column pyarrow can build
    try:
        t = Trace(table)
    except TraceError as e:
        assert "column 'num_images'" in str(e) or "column 'image_px'" in str(e), str(e)
        return
    k = t.table.column("num_images").to_pylist()
    assert all(v is None or 0 <= v <= 64 for v in k)
    assert all(v is None or _valid_px(v) for v in t.table.column("image_px").to_pylist())


def _valid_px(px: str) -> bool:
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", px)
    return m is not None and all(1 <= int(side) <= 8192 for side in m.groups())


def _bad_parquet(path, **cols):
    pq.write_table(_table(**cols), path)  # raw pyarrow: no validation on the way in
    return path


@pytest.mark.parametrize("name, cols, needle", [
    ("neg.parquet", {"n_img": pa.array([0, 1, -3, -1], pa.int64())},
     "column 'num_images': num_images must be >= 0 (got -3): rows 2, 3 (of 4 rows)"),
    ("absurd.parquet", {"n_img": pa.array([0, 65, 1, 1000], pa.int64())},
     "column 'num_images': num_images must be <= 64: more images in one request is absurd (got 1000): "
     "rows 1, 3"),
    ("fmt.parquet", {"n_img": [1, 1, 1, 1], "px": ["512x512", "512*512", "512x512", None]},
     "column 'image_px': image_px must be WxH in pixels, digits and a lowercase x, e.g. 512x512 "
     "(got '512*512'): rows 1"),
    ("range.parquet", {"n_img": [1, 1, 1, 1], "px": ["512x512", "512x512", "512x0", "16384x512"]},
     "column 'image_px': image_px sides must be in 1..8192 pixels (got '512x0'): rows 2, 3 (of 4 rows)"),
])
def test_validation_rules_through_the_cli(name, cols, needle, tmp_path):
    bad = _bad_parquet(tmp_path / name, **cols)
    p = run_cli("replay", "trace", "validate", bad)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith(f"error: {bad}: ") and needle in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_azure_import_rejects_absurd_num_images(tmp_path):
    src = tmp_path / "mm.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,NumImages\n"
                   "2025-03-01T00:00:00.0000000Z,10,1,2\n2025-03-01T00:00:01.0000000Z,10,1,65\n")
    p = run_cli("replay", "trace", "import", "azure", src, "-o", tmp_path / "o.parquet")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"error: {src}: column 'num_images': num_images must be <= 64" in p.stderr and "rows 1" in p.stderr
    assert not (tmp_path / "o.parquet").exists()
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,NumImages\n2025-03-01T00:00:00.0000000Z,10,1,two\n")
    with pytest.raises(TraceError, match=r"column 'NumImages'.*rows 0"):
        import_trace("azure", src, tmp_path / "o.parquet")


# ------------------------------------------------------------------ Azure 2025 importer
def test_azure_multimodal_round_trip_through_the_cli(tmp_path):
    first, back, again = tmp_path / "a.parquet", tmp_path / "back.csv", tmp_path / "b.parquet"
    run_cli("replay", "trace", "import", "azure", FIX / "azure_2025_multimodal.csv", "-o", first, check=True)
    run_cli("replay", "trace", "export", first, "-o", back, check=True)
    import_trace("azure", back, again)
    a, b = Trace.read(first), Trace.read(again)
    assert a.table.column("num_images").to_pylist() == b.table.column("num_images").to_pylist() == [1, 3, 0]
    assert "extra" not in a.table.column_names
    assert back.read_bytes() == (FIX / "azure_2025_multimodal.csv").read_bytes()


def test_azure_export_of_images_from_other_sources_and_old_imports(tmp_path):
    # a trace from elsewhere with num_images gets a NumImages column (null -> empty cell)
    t = Trace(_table([2, None, 0]))
    module("azure").export(t, tmp_path / "x.csv")
    lines = (tmp_path / "x.csv").read_text().splitlines()
    assert lines[0] == "TIMESTAMP,ContextTokens,GeneratedTokens,NumImages"
    assert [line.rsplit(",", 1)[1] for line in lines[1:]] == ["2", "", "0"]
    # a file imported before num_images existed kept NumImages in `extra`: still exported
    meta = {"source": {"format": "azure", "columns": ["TIMESTAMP", "ContextTokens", "GeneratedTokens", "NumImages"]}}
    old = Trace(pa.table({"arrival_ns": pa.array([0], pa.int64()), "input_tokens": [5], "output_tokens": [1],
                          "extra": ['{"NumImages": "7"}']}), meta)
    module("azure").export(old, tmp_path / "old.csv")
    assert (tmp_path / "old.csv").read_text().splitlines()[1].endswith(",7")


# ------------------------------------------------------------------ canonical text and transforms
def _image_trace(n=400, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.choice([0, 0, 1, 3], n)
    px = np.where(k > 0, rng.choice(["512x512", "1024x768"], n), None)
    return Trace(_table(pa.array(k, pa.int16()), pa.array(px.tolist(), pa.string()),
                        request_id=[f"r{i}" for i in range(n)], model=rng.choice(["m1", "m2"], n).tolist()))


def test_canonical_csv_jsonl_and_transforms_carry_the_columns(tmp_path):
    src = tmp_path / "t.parquet"
    orig = _image_trace()
    orig.write(src)
    want = {r["request_id"]: (r["num_images"], r["image_px"]) for r in orig.table.to_pylist()}
    run_cli("replay", "trace", "export", src, "--format", "csv", "-o", tmp_path / "t.csv", check=True)
    orig.write(tmp_path / "t.jsonl")  # (the CLI's export --format jsonl is this call)
    for fmt in ("csv", "jsonl"):
        back = Trace.read(tmp_path / f"t.{fmt}")
        assert back.table.schema.field("num_images").type == pa.int16(), fmt
        for col in ("request_id", "num_images", "image_px"):
            assert back.table.column(col).to_pylist() == orig.table.column(col).to_pylist(), (fmt, col)
    out = tmp_path / "u.parquet"
    run_cli("replay", "trace", "transform", src, "--slice", "5:35", "--sample", "0.5", "--seed", "3",
            "--speed", "2", "--map-model", "m1=x", "-o", out, check=True)
    u = Trace.read(out)
    assert 0 < u.num_rows < 300
    rows = u.table.to_pylist()
    assert all((r["num_images"], r["image_px"]) == want[r["request_id"]] for r in rows)
    assert {r["model"] for r in rows} == {"x", "m2"}
    # merged with a trace without images: its rows have no image columns' values
    plain = Trace(pa.table({"arrival_ns": pa.array([0, 10], pa.int64()), "input_tokens": [1, 1],
                            "output_tokens": [1, 1], "request_id": ["p0", "p1"]}))
    from llm_replay.traces.transform import merge
    m = merge(orig, plain, "plain").table.to_pylist()
    assert [(r["num_images"], r["image_px"]) for r in m if r["request_id"].startswith("p")] == [(None, None)] * 2


def test_generic_csv_import_maps_num_images(tmp_path):
    src = tmp_path / "g.csv"
    src.write_text("ts,i,o,imgs,size\n0,5,1,2,640x480\n1,5,1,,\n")
    import_trace("csv", src, tmp_path / "g.parquet",
                 map="arrival=ts:s,input_tokens=i,output_tokens=o,num_images=imgs,image_px=size")
    t = Trace.read(tmp_path / "g.parquet").table
    assert t.column("num_images").to_pylist() == [2, None] and t.column("image_px").to_pylist() == ["640x480", None]
    src.write_text("ts,i,o,imgs\n0,5,1,2\n1,5,1,two\n")  # parsed as integers: the bad cell is named
    with pytest.raises(TraceError, match=r"g.csv: column 'imgs': expected int64 values.*'two': rows 1"):
        import_trace("csv", src, tmp_path / "h.parquet",
                     map="arrival=ts:s,input_tokens=i,output_tokens=o,num_images=imgs")


# ------------------------------------------------------------------ describe
def test_image_stats_definitions():
    t = Trace(_table([0, 1, 1, 4, None, 0, 2, 1],
                     [None, "512x512", None, "1024x768", None, None, "1024x768", "1024x768"]))
    s = tstats.image_stats(t)
    assert s["share_with_images"] == pytest.approx(5 / 8)       # null counts as no image
    assert s["mean_images"] == pytest.approx(9 / 8) and s["max_images"] == 4
    assert s["count_histogram"] == {"0": 3, "1": 3, "2": 1, "4": 1}
    assert s["image_px"] == {"1024x768": 0.6, "512x512": 0.4}  # the null size is sent as 512x512
    assert s["image_px_distinct"] == 2 and s["image_px_defaulted"] == pytest.approx(0.2)
    assert tstats.image_stats(Trace(pa.table({"arrival_ns": [0], "input_tokens": [1], "output_tokens": [1]}))) is None


def test_describe_shows_the_image_distribution(tmp_path):
    src = tmp_path / "t.parquet"
    Trace(_table([0, 1, 1, 4, 0, 0, 2, 1], [None, "512x512", "512x512", "1024x768", None, None,
                                          "1024x768", "512x512"])).write(src)
    d = json.loads(run_cli("replay", "trace", "describe", src, "--json", check=True).stdout)
    im = d["images"]
    assert im["share_with_images"] == pytest.approx(5 / 8) and im["mean_images"] == pytest.approx(9 / 8)
    assert im["count_histogram"] == {"0": 3, "1": 3, "2": 1, "4": 1}
    assert im["image_px"] == {"512x512": 0.6, "1024x768": 0.4}
    text = describe_file(src)  # the CLI prints exactly this (one subprocess is enough here)
    assert "images           62.50% of requests have images; mean 1.125 per request, max 4" in text
    assert "  count          0: 37.5%, 1: 37.5%, 2: 12.5%, 4: 12.5%" in text
    assert "  image_px       512x512 60.0%, 1024x768 40.0%" in text


def test_describe_text_stays_one_line_per_part_for_wide_distributions():
    from llm_replay.traces.describe import describe, render
    k = list(range(21))  # 21 distinct counts, 7 distinct sizes
    px = [None] + [f"{100 + i % 7}x100" for i in range(1, 21)]
    text = render(describe(Trace(_table(k, px))), "t.parquet")
    count = next(line for line in text.splitlines() if line.startswith("  count"))
    assert count.endswith(", 11: 4.8%, >11: 42.9%") and count.count(":") == 13
    sizes = next(line for line in text.splitlines() if line.startswith("  image_px"))
    assert sizes.endswith("(+2 other sizes)") and sizes.count("x100") == 5


# ------------------------------------------------------------------ generator spec
@pytest.mark.parametrize("images, needle", [
    ({"count": {0: 0.5, 65: 0.5}}, "clients[0].images.count.65: an image count must be a whole number in 0..64"),
    ({"count": {0: 0.5, 1.5: 0.5}}, "clients[0].images.count.1.5: an image count must be a whole number"),
    ({"count": {0: 0.5, 1: -1}}, "clients[0].images.count.1: must be a probability (weight) >= 0"),
    ({"count": {0: 0, 1: 0}}, "clients[0].images.count: weights must have a positive sum"),
    ({"count": {}}, "clients[0].images.count: must not be empty"),
    ({"count": 100}, "clients[0].images.count: must be <= 64"),
    ({"count": {"dist": "zipf", "a": 2, "max": 100}}, "clients[0].images.count.max: must be <= 64"),
    ({"count": {"dist": "empirical", "values": [1, 99]}}, "clients[0].images.count.values: image counts must be"),
    ({"px": "512x512"}, "clients[0].images.count: is required"),
    ({"count": 1, "px": "512 x 512"}, "clients[0].images.px: image size '512 x 512' must be WxH"),
    ({"count": 1, "px": {"512x512": 1, "9000x9000": 1}},
     "clients[0].images.px: image size '9000x9000' must have both sides in 1..8192"),
    ({"count": 1, "size": "1x1"}, "clients[0].images.size: unknown field"),
])
def test_invalid_images_spec_names_the_field(images, needle):
    spec = {"duration": 10, "clients": [{"rate": 1, "input": CONST, "output": CONST, "images": images}]}
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    assert needle in str(e.value)


def test_generate_draws_images_per_model():
    t = generate(_images_spec(duration=1200), seed=1)
    Trace(t.table)  # full validation
    df = t.table.to_pandas()
    a, b, c, txt = (df[df.model == "a"], df[df.model == "b"], df[df.model == "c"], df[df.client_id == "txt"])
    assert (a.num_images > 0).mean() == pytest.approx(0.3, abs=0.03)
    assert a.num_images.mean() == pytest.approx(0.6, abs=0.06)
    assert set(a.num_images) == {0, 1, 4}
    assert (a[a.num_images > 0].image_px == "512x512").mean() == pytest.approx(0.75, abs=0.05)
    assert a[a.num_images == 0].image_px.isna().all()  # no size where there is no image
    assert (b.num_images == 0).all() and b.image_px.isna().all()        # a model without images
    assert (c.num_images == 2).all() and (c.image_px == "336x336").all()
    assert (txt.num_images == 0).all()                                  # a client without images
    plain = generate({"duration": 60, "clients": [{"rate": 5, "input": CONST, "output": CONST}]}, seed=1)
    assert "num_images" not in plain.table.column_names and "image_px" not in plain.table.column_names


def test_generate_images_reproduce_bit_for_bit(tmp_path, monkeypatch):
    spec_file, first, again, copy = (tmp_path / n for n in ("s.yaml", "a.parquet", "b.parquet", "c.parquet"))
    spec_file.write_text(yaml.safe_dump(_images_spec(duration=120)))  # int keys: `0: 0.7`
    run_cli("replay", "trace", "generate", "--spec", spec_file, "--seed", "4", "-o", first, check=True)
    generate_to(load_spec_file(first), again)  # what `generate --spec T.parquet` runs
    assert first.read_bytes() == again.read_bytes()
    embedded = Trace.read(first).metadata["generator"]["spec"]  # JSON: string keys '0', '1', '4'
    assert embedded["clients"][0]["models"][0]["images"]["count"] == {"0": 0.7, "1": 0.2, "4": 0.1}
    generate_to(embedded, copy, seed=4)
    assert copy.read_bytes() == first.read_bytes()
    other_seed = generate(_images_spec(duration=120), seed=5).table
    assert not generate(_images_spec(duration=120), seed=4).table.equals(other_seed)
    # streamed row groups gather the image columns like every other column
    import llm_replay.traces.generate as gen_mod
    import llm_replay.traces.trace as trace_mod
    monkeypatch.setattr(gen_mod, "ROW_GROUP", 300)
    monkeypatch.setattr(trace_mod, "ROW_GROUP", 300)
    generate_to(_images_spec(duration=120), tmp_path / "s.parquet", seed=4)
    generate(_images_spec(duration=120), seed=4).write(tmp_path / "w.parquet")
    assert (tmp_path / "s.parquet").read_bytes() == (tmp_path / "w.parquet").read_bytes()


def test_vision_preset_has_images():
    t = generate(preset_spec("vision", duration=600, rate=5), seed=0)
    s = tstats.image_stats(t)
    assert s["share_with_images"] == pytest.approx(0.7 * 0.45, abs=0.04)
    assert set(s["image_px"]) == {"512x512", "1024x1024", "1280x720"}


# ------------------------------------------------------------------ fit and compare
def test_fit_learns_images_per_model_and_generate_reproduces_them():
    src = generate(_images_spec(duration=900), seed=2)
    spec = fit_trace(src)
    vis = next(c for c in spec["clients"] if c["name"] == "vis")
    models = {m["name"]: m for m in vis["models"]}
    fitted = models["a"]["images"]
    assert set(fitted["count"]) == {0, 1, 4} and fitted["px"] == "512x512"
    for k, p in PMF_A.items():
        assert fitted["count"][k] == pytest.approx(p, abs=0.03)
    assert "images" not in models["b"]
    assert models["c"]["images"] == {"count": {2: 1.0}, "px": "336x336"}
    txt = next(c for c in spec["clients"] if c["name"] == "txt")
    assert "images" not in txt  # one model, never an image
    parse_spec(yaml.safe_load(yaml.safe_dump(spec)))  # the YAML the CLI writes is a valid spec
    again = generate(spec, seed=3)
    a, b = tstats.image_stats(src), tstats.image_stats(again)
    assert b["share_with_images"] == pytest.approx(a["share_with_images"], abs=0.02)
    assert b["mean_images"] == pytest.approx(a["mean_images"], rel=0.1)
    rows = [r for r in compare_traces(src, again) if r["metric"].startswith("images.")]
    assert {r["metric"] for r in rows} >= {"images.share_with_images", "images.mean_per_request",
                                           "images.count_share.0", "images.count_share.2", "images.count_share.4"}
    assert all(r["verdict"] == "pass" for r in rows), rows


def test_compare_image_rows():
    with_images = _image_trace(seed=1)
    no_column = Trace(with_images.table.drop_columns(["num_images", "image_px"]))
    assert not [r for r in compare_traces(no_column, no_column) if r["metric"].startswith("images.")]
    rows = {r["metric"]: r for r in compare_traces(with_images, no_column)}  # missing = no images
    assert rows["images.share_with_images"]["b"] == 0.0 and rows["images.share_with_images"]["verdict"] == "fail"
    assert rows["images.count_share.0"]["b"] == 1.0
    same = {r["metric"]: r for r in compare_traces(with_images, with_images)}
    assert same["images.mean_per_request"]["diff"] == 0 and same["images.count_share.3"]["verdict"] == "pass"


def test_cli_fit_then_generate_keeps_images(tmp_path):
    src, spec, again = tmp_path / "src.parquet", tmp_path / "spec.yaml", tmp_path / "again.parquet"
    generate(_images_spec(duration=300), seed=5).write(src)
    run_cli("replay", "trace", "fit", src, "-o", spec, check=True)
    assert "images:" in spec.read_text() and "px: 336x336" in spec.read_text()
    generate_to(load_spec_file(spec), again, seed=1)
    rows = [r for r in compare_traces(Trace.read(src), Trace.read(again)) if r["metric"].startswith("images.")]
    assert len(rows) >= 5 and all(r["verdict"] == "pass" for r in rows), rows
