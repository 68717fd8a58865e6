"""Per-tenant results and fairness (summary.json `tenants`), the tenant and prefix-hit objectives
of the gate with their confidence bounds, and the server cache state on record."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from llm_replay.reports import analyze, summarize_run
from llm_replay.reports.analysis import jain, tenant_codes
from llm_replay.reports.errors import ReportError
from llm_replay.reports.schema import RECORD_SCHEMA
from tests.conftest import run_cli
from tests.reports.synth import synth_records, write_run


def tenant_run(attainment: dict[str, float], n: int, seed: int = 0, **kw) -> pa.Table:
    """Records whose slo_class is the tenant; each tenant's requests fail at 1 - its attainment
    (exactly that share, at random rows), so attainment without per-request thresholds is known."""
    t = synth_records(n * len(attainment), seed=seed, fail_share=0.0, **kw)
    rng = np.random.default_rng(seed)
    names = np.repeat(list(attainment), n)
    status = np.array(t.column("status").to_pylist(), dtype=object)
    for i, (name, a) in enumerate(attainment.items()):
        rows = rng.permutation(np.arange(i * n, (i + 1) * n))[:round(n * (1 - a))]
        status[rows] = "timeout"
    t = t.set_column(RECORD_SCHEMA.get_field_index("slo_class"), "slo_class", pa.array(names))
    return t.set_column(RECORD_SCHEMA.get_field_index("status"), "status", pa.array(status.tolist()))


def test_jain_index_known_values():
    assert jain([0.99, 0.99]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)            # one tenant gets everything: 1/n
    assert jain([0.99, 0.40]) == pytest.approx(1.39 ** 2 / (2 * (0.99 ** 2 + 0.4 ** 2)))
    assert jain([0.0, 0.0]) == 1.0


def test_tenants_by_slo_class_with_fairness(tmp_path):
    d = write_run(tmp_path / "run", tenant_run({"a": 0.99, "b": 0.40}, 400))
    t = summarize_run(d, write=False)["tenants"]
    assert t["column"] == "slo_class" and [r["tenant"] for r in t["rows"]] == ["a", "b"]
    assert [r["requests"] for r in t["rows"]] == [400, 400]
    assert [r["attainment"] for r in t["rows"]] == pytest.approx([0.99, 0.40])
    f = t["fairness"]
    assert f["jain"] == pytest.approx(float(jain([0.99, 0.40])))
    assert (f["worst"]["tenant"], f["best"]["tenant"]) == ("b", "a") and "(sum x)^2 / (n sum x^2)" in f["method"]
    assert set(t["rows"][0]) == {"tenant", "requests", "attainment", "goodput_rps", "ttft_ms", "tpot_ms"}


def test_one_tenant_has_no_tenants_section(tmp_path):
    d = write_run(tmp_path / "run", synth_records(300, classes=("only",)))
    assert summarize_run(d, write=False)["tenants"] is None


def with_clients(t: pa.Table, clients) -> pa.Table:
    """`t` with a client_id column (the records schema's once replay records it; appended before)."""
    col = pa.array(list(clients), pa.string())
    if "client_id" in t.column_names:
        return t.set_column(t.column_names.index("client_id"), "client_id", col)
    return t.append_column("client_id", col)


def test_client_id_is_the_tenant_when_it_names_several():
    t = synth_records(200)
    an = analyze(with_clients(t, np.where(np.arange(200) % 2, "x", "y")))
    name, codes, labels = tenant_codes(an.table, an.rm, None)
    assert name == "client_id" and sorted(labels) == ["x", "y"] and np.bincount(codes).tolist() == [100, 100]
    one = analyze(with_clients(t, ["x"] * 200))
    assert tenant_codes(one.table, one.rm, None)[0] == "slo_class"     # one client: no tenants to compare
    assert tenant_codes(an.table, an.rm, "model")[0] == "model"
    with pytest.raises(ReportError, match="--tenant-column 'nope': no such string column"):
        tenant_codes(an.table, an.rm, "nope")


def test_report_tenant_column_option(tmp_path):
    d = write_run(tmp_path / "run", tenant_run({"a": 0.99, "b": 0.9}, 200))
    r = run_cli("replay", "report", d, "--tenant-column", "model", "--json", "--no-write")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tenants"]["column"] == "model"
    r = run_cli("replay", "report", d, "--tenant-column", "bogus", "--no-write")
    assert r.returncode != 0 and "--tenant-column 'bogus'" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("replay", "report", d)
    assert r.returncode == 0 and "Per tenant (slo_class): fairness" in r.stdout
    assert "Per tenant (slo_class)" in (d / "summary.md").read_text()
    assert "Per tenant (slo_class)" in (d / "report.html").read_text()
