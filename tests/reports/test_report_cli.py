"""`replay report RUN` with options that change the result (--warmup, --cooldown, --steady-state,
--slo, --window-s) writes beside the run's own summary and report, not over them (--force does)."""
from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.reports.synth import synth_records, write_run


def test_report_options_write_beside_the_runs_own_files(tmp_path):
    run = write_run(tmp_path / "run", synth_records(400, seed=3))
    run_cli("replay", "report", run, check=True)        # the run's own summary (as `replay run` writes it)
    own = {f: (run / f).read_bytes() for f in ("summary.json", "summary.md", "report.html")}

    r = run_cli("replay", "report", run, "--warmup", "2s", "--cooldown", "10", check=True)
    assert {f: (run / f).read_bytes() for f in own} == own     # untouched
    for f in ("summary.warmup-2s.cooldown-10.json", "summary.warmup-2s.cooldown-10.md",
              "report.warmup-2s.cooldown-10.html"):
        assert f"wrote {run / f}" in r.stdout
    measured = lambda f: json.loads((run / f).read_text())["counts"]["measured"]  # noqa: E731
    assert measured("summary.warmup-2s.cooldown-10.json") < measured("summary.json") == 400

    slo = tmp_path / "prod slo.yaml"
    slo.write_text("per_request: {ttft_ms: 100}\n")
    r = run_cli("replay", "report", run, "--steady-state", "0.5", "--slo", slo, "--json", check=True)
    assert json.loads(r.stdout)["files"]["summary.json"] == str(run / "summary.steady-state-0.5.slo-prod-slo.json")
    assert f"wrote {run / 'report.steady-state-0.5.slo-prod-slo.html'}" in r.stderr

    r = run_cli("replay", "report", run, "--warmup", "2s", "--force", check=True)   # in place, on request
    assert f"wrote {run / 'summary.json'}" in r.stdout and measured("summary.json") < 400


def test_a_run_without_a_summary_gets_the_plain_names(tmp_path):
    run = write_run(tmp_path / "run", synth_records(200, seed=4))
    r = run_cli("replay", "report", run, "--warmup", "1s", check=True)
    assert f"wrote {run / 'summary.json'}" in r.stdout and not list(run.glob("summary.warmup*"))
