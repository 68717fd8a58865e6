"""Issue 36 item 3: a run that did not finish (run.json still `running` after a kill -9, `failed`
on a full disk, `interrupted`) says so in every report (terminal, summary.json, summary.md,
report.html) with how many of its trace rows it recorded or sent, and a gate of it exits 2 with
that reason whatever its objectives say; a finished run is unchanged."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import run_cli
from tests.reports.synth import synth_records, write_run

SLO = "objectives: ['error_rate <= 0.5', 'ttft_ms.p99 <= 60000']\n"


def _run(tmp_path, status: str, rows: int, table: pa.Table):
    return write_run(tmp_path / status, table, config={"status": status, "config": {"rows": rows},
                                                        "trace": {"rows": rows}})


@pytest.mark.parametrize("status", ["running", "failed"])
def test_a_fragment_says_how_many_rows_it_recorded_and_cannot_pass_a_gate(tmp_path, status):
    run = _run(tmp_path, status, 2000, synth_records(646, seed=3))
    why = f"the run did not finish (run.json status {status}): 646 of 2,000 trace rows have records"
    r = run_cli("replay", "report", run)
    assert r.returncode == 0, r.stderr
    assert why in " ".join(r.stdout.split()), r.stdout
    s = json.loads((run / "summary.json").read_text())
    assert s["unfinished"] == why and s["warnings"][0] == why
    assert why in (run / "summary.md").read_text() and why in (run / "report.html").read_text()
    slo = tmp_path / "slo.yaml"
    slo.write_text(SLO)
    g = run_cli("replay", "gate", run, "--slo", slo)
    assert g.returncode == 2, g.stdout + g.stderr
    assert "CANNOT EVALUATE (exit 2)" in g.stdout and why + ": not gated" in " ".join(g.stdout.split()), g.stdout
    g = json.loads(run_cli("replay", "gate", run, "--slo", slo, "--json").stdout)
    assert g["exit_code"] == 2 and g["unfinished"] == why
    assert {r["verdict"] for r in g["rows"]} == {"pass"}     # its objectives would have passed


def test_an_interrupted_run_counts_the_rows_it_sent(tmp_path):
    t = synth_records(500, seed=4)
    status = pc.if_else(pa.array([i >= 300 for i in range(500)]), "not_sent", t.column("status"))
    run = _run(tmp_path, "interrupted", 500, t.set_column(t.schema.get_field_index("status"), "status", status))
    slo = tmp_path / "slo.yaml"
    slo.write_text(SLO)
    g = json.loads(run_cli("replay", "gate", run, "--slo", slo, "--json").stdout)
    assert g["exit_code"] == 2
    assert g["unfinished"] == "the run did not finish (run.json status interrupted): 300 of 500 trace rows were sent"


def test_a_finished_run_is_judged_as_before(tmp_path):
    run = _run(tmp_path, "completed", 800, synth_records(800, seed=5))
    slo = tmp_path / "slo.yaml"
    slo.write_text(SLO)
    g = run_cli("replay", "gate", run, "--slo", slo, "--json")
    assert g.returncode == 0 and json.loads(g.stdout)["unfinished"] is None, g.stdout
    r = run_cli("replay", "report", run, "--no-write", "--json")
    assert json.loads(r.stdout)["unfinished"] is None
