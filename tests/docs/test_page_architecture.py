"""docs/architecture.md states the project's contracts; these checks hold it to the code: the
trace and records schema tables against traces/schema.py and reports/schema.py, the trace
metadata keys against real traces, the run directory against a real run, the command table
against the `replay` argument parser, the layout and the module tables against the folders, and
the dependency rules against every module's imports."""
from __future__ import annotations

import argparse
import ast
import json
import re

import pyarrow as pa
import pytest

from tests.conftest import REPO
from tests.docs.mdblocks import DOCS, FIX, Page, sh
from tests.replay.runkit import write_trace

PAGE = Page(DOCS / "architecture.md", {"runs/<id>/run.json": "test_run_directory_block"})
PAGES = [PAGE]
TEXT = PAGE.path.read_text()


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


def section(title: str) -> str:
    start = TEXT.index(f"\n## {title}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end > 0 else None]


def table_rows(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]
    return rows[1:]   # without the header


def type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{type_name(t.value_type)}>"
    if pa.types.is_dictionary(t):
        return f"dictionary<{type_name(t.value_type)}>"
    return {"float": "float32", "double": "float64"}.get(str(t), str(t))


def yes(cell: str) -> bool:
    assert cell in ("yes", "no"), cell
    return cell == "yes"


def test_trace_schema_table():
    from llm_replay.traces.schema import COLUMNS, SCHEMA_VERSION
    shown = [(r[0].strip("`"), r[1], yes(r[2]), yes(r[3])) for r in table_rows(section("Trace schema"))]
    assert shown == [(c.name, type_name(c.type), c.required, c.nullable) for c in COLUMNS]
    assert f"schema version {SCHEMA_VERSION} " in section("Trace schema")


def test_records_schema_table():
    from llm_replay.reports.schema import RECORD_SCHEMA, RECORDS_SCHEMA_VERSION, SERVER_METRICS_SCHEMA, STATUSES
    text = section("Records schema")
    shown = [(r[0].strip("`"), r[1], yes(r[2])) for r in table_rows(text)]
    assert shown == [(f.name, type_name(f.type), f.nullable) for f in RECORD_SCHEMA]
    assert f"records schema\nversion {RECORDS_SCHEMA_VERSION} " in text
    status_row = next(r for r in table_rows(text) if r[0] == "`status`")
    assert re.findall(r"`(\w+)`", status_row[3]) == list(STATUSES)
    assert re.findall(r"`(\w+)`", text[text.index("`server_metrics.parquet`"):])[:4] == SERVER_METRICS_SCHEMA.names


def test_trace_metadata_keys(tmp_path):
    """Every key real traces carry is named (an import, a generated trace, a transformed one, a
    ShareGPT import with its token estimate), and every key named occurs in one of them."""
    from llm_replay.traces.trace import Trace
    cmds = [f"replay trace import azure {FIX / 'azure_2023_code.csv'} -o a.parquet",
            f"replay trace import sharegpt {FIX / 'sharegpt.json'} -o s.parquet --rate 1",
            "replay trace generate --preset multi-turn --duration 60 --rate 1 -o g.parquet",
            "replay trace transform g.parquet --speed 2 -o t.parquet"]
    for cmd in cmds:
        sh(cmd, tmp_path)
    seen = set().union(*(Trace.read_metadata(tmp_path / f"{n}.parquet") for n in "asgt"))
    text = section("Trace schema")
    named = set(re.findall(r"`(\w+)`", text[text.index("Trace-level metadata"):]))
    named -= {"generator", "transforms"} - seen or set()
    assert seen <= named, seen - named
    keys = named & {"schema_version", "source", "rows", "time_origin_ns", "time_origin_kind", "original_time_format",
                    "timestamp_quantum_ns", "block_size", "tokenizer", "generator", "transforms"}
    assert keys <= seen, keys - seen


@pytest.mark.slow
def test_run_directory_block(tmp_path):
    """The files listed are the files of a real run with --scrape, --slo and --otlp (against engine-stub
    exporting its spans), and run.json has every key said to be always present."""
    pytest.importorskip("torch")
    from tests.conftest import free_port, start_engine
    listed = set(re.findall(r"^runs/<id>/(\S+)", PAGE.block("runs/<id>/run.json").text, re.M))
    write_trace(tmp_path / "t.parquet", 12, gap_s=0.05, input_tokens=30, output_tokens=4)
    (tmp_path / "slo.yaml").write_text("objectives: ['error_rate <= 0.5']\n")
    otlp = free_port()
    eng = start_engine("--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces")
    try:
        sh(f"replay run --trace t.parquet --target {eng.url} --scrape {eng.url}/metrics -o runs/x --no-progress "
           f"--slo slo.yaml --otlp 127.0.0.1:{otlp}",
           tmp_path, timeout=240)
    finally:
        eng.stop()
    run = tmp_path / "runs" / "x"
    # trace.parquet: only a run --until-decided writes it (its passes of the trace)
    assert listed - {"trace.parquet"} == {p.name for p in run.iterdir()}
    text = section("Run directory")
    always = text[text.index("keys always present"):text.index("and when they apply")]
    info = json.loads((run / "run.json").read_text())
    assert set(re.findall(r"`(\w+)`", always)) <= set(info), set(re.findall(r"`(\w+)`", always)) - set(info)
    assert info["status"] == "completed" and "`completed`" in text
    assert info["otlp"]["matched"] == 12 and "`otlp`" in text


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_command_table():
    from llm_replay.replay.cli import build_parser
    top = _subcommands(build_parser())
    real = {f"replay {c}" for c in top if c != "trace"} | {f"replay trace {c}" for c in _subcommands(top["trace"])}
    shown = set()
    for row in table_rows(section("Command line")):
        w = row[0].strip("`").split()
        shown.add(" ".join(w[:3] if w[:2] == ["replay", "trace"] else w[:2] if w[0] != "locust" else w[:1]))
    assert real <= shown and shown - real == {"engine-stub serve", "locust"}, (real - shown, shown - real)
    formats = re.search(r"import a public trace \(([^)]*)\)", TEXT).group(1).replace("; servegen -> spec", "")
    from llm_replay.traces.cli import IMPORT_FORMATS
    assert set(formats.split(", ")) | {"servegen"} == set(IMPORT_FORMATS), formats


def test_layout_table():
    for folder, package, _role in table_rows(section("Layout")):
        folder = REPO / folder.strip("`/")
        assert folder.is_dir() and package.strip("`").split(".")[-1] == folder.name


MODULE_FOLDERS = ("replay", "reports", "traces", "traces/importers", "engine_stub")


def test_modules_tables():
    """Every product module has a row in its folder's table under Modules, with a job, and every
    row names a module that exists."""
    real = {f"{d}/{p.name}" for d in MODULE_FOLDERS for p in (REPO / d).glob("*.py")
            if p.stem not in ("__init__", "__main__")}
    parts = re.split(r"^### `?([\w/]+?)/?`?$", section("Modules"), flags=re.M)
    assert parts[1::2] == list(MODULE_FOLDERS), parts[1::2]
    shown = {}
    for folder, text in zip(parts[1::2], parts[2::2]):
        for name, job in table_rows(text):
            assert job and name.startswith("`") and name.endswith(".py`"), (folder, name, job)
            shown[f"{folder}/{name.strip('`')}"] = job
    assert not real - shown.keys(), f"modules without a row under Modules: {sorted(real - shown.keys())}"
    assert not shown.keys() - real, f"rows naming no module: {sorted(shown.keys() - real)}"


def _imports(path, pkg: str) -> set[str]:
    """Every module a file imports, fully qualified (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                parts = ["llm_replay", pkg, *path.relative_to(REPO / pkg).parent.parts]
                mod = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return names


PACKAGES = ("traces", "replay", "reports", "engine_stub")


def test_dependencies_point_one_way():
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            names = _imports(path, pkg)
            ours = {p for p in PACKAGES for n in names if n == f"llm_replay.{p}" or n.startswith(f"llm_replay.{p}.")}
            allowed = {"replay": {"replay", "traces", "reports"}}.get(pkg, {pkg})
            if path.name == "pytest_plugin.py":   # the one exception the page names
                names -= {"llm_replay.engine_stub.cli"}
                ours = {p for p in PACKAGES for n in names
                        if n == f"llm_replay.{p}" or n.startswith(f"llm_replay.{p}.")}
            assert ours <= allowed, f"{path.relative_to(REPO)} imports {ours - allowed}"
            if any(n == "locust" or n.startswith("locust.") for n in names):
                assert pkg == "replay" and path.stem in ("runner", "dispatcher", "master", "worker", "locustfile"), path
            if any(n == "torch" or n.startswith("torch.") for n in names):
                assert pkg == "engine_stub", path


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_no_import_cycles():
    """No import cycle among our modules, imports inside functions included (they hide a cycle
    from Python's start-up but still tie the modules together). Packages' __init__ files are
    left out: they load their names lazily."""
    files = {".".join(["llm_replay", pkg, *p.relative_to(REPO / pkg).with_suffix("").parts]): (p, pkg)
             for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if p.name != "__init__.py"}
    graph = {m: _imports(p, pkg) & files.keys() - {m} for m, (p, pkg) in files.items()}
    reach = {m: _reach(graph, m) for m in graph}
    cycles = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in graph if m in reach[m]}
    assert not cycles, sorted(sorted(c) for c in cycles)
