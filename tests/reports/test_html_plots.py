"""report.html is honest and readable (issue 16, item 6): time-series windows sized from the run,
no rate divided by a sliver of a window, every plotted point inside its frame, legends outside
the data, every series visible, TTFT and E2E on their own panels, units in every table header,
run.json as a table with ISO UTC times, intervals without float noise."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from llm_replay.reports import compare_runs, summarize_run
from llm_replay.reports.breakdown import MIN_PER_WINDOW, nice_window, window_edges
from llm_replay.reports.html import fmt, fmt_ci
from tests.reports.synth import synth_records
from tests.reports.test_summary import _server_metrics

NS = "{http://www.w3.org/2000/svg}"
EPOCH = 1796184848.626
CONFIG = {"target": "http://127.0.0.1:9", "started_wall": EPOCH, "t0_wall": EPOCH + 1.25,
          "ended_wall": EPOCH + 60, "config": {"workers": 1, "speed": 1.0}, "status": "completed"}


def _report(make_run, name="run", n=135, rate=3.0, slo=None, **kw) -> tuple[dict, str]:
    run = make_run(name, synth_records(n, seed=kw.pop("seed", 1), rate=rate, fail_share=0.03),
                   config=CONFIG, server=_server_metrics(n / rate + 5))
    s = summarize_run(run, slo=slo, **kw)
    return s, (run / "report.html").read_text()


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", html, re.S)]


def _title(svg: ET.Element) -> str:
    return svg.get("aria-label")


def _points(el: ET.Element) -> list[tuple[float, float]]:
    if el.tag == NS + "path":
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", el.get("d"))]
        return list(zip(nums[::2], nums[1::2]))
    if el.tag == NS + "circle":
        return [(float(el.get("cx")), float(el.get("cy")))]
    return [p for child in el for p in _points(child)]


def _frame(svg: ET.Element) -> tuple[float, float, float, float]:
    r = next(e for e in svg.iter(NS + "rect") if e.get("class") == "frame")
    x, y = float(r.get("x")), float(r.get("y"))
    return x, y, x + float(r.get("width")), y + float(r.get("height"))


def _series(svg: ET.Element) -> list[ET.Element]:
    return [e for e in svg.iter() if e.get("class") == "series"]


# -- windows and rates ------------------------------------------------------------------------

def test_window_is_chosen_from_run_length_and_count():
    assert nice_window(48.7, 135) == 5          # 135 requests over 49 s: ~14 a window, not 1.4
    assert nice_window(75, 3000) == 1           # enough requests: at most 100 windows decides
    assert nice_window(3600, 10**6) == 50
    for span, count in ((48.7, 135), (75, 3000), (10, 12), (3600, 10**6), (0.2, 500)):
        w = nice_window(span, count)
        assert count * w / span >= MIN_PER_WINDOW * (1 - 1e-9) and span / w <= 100


def test_small_run_gets_few_full_windows(make_run):
    s, _ = _report(make_run)
    ts = s["timeseries"]
    span = ts["t_s"][-1] + ts["width_s"][-1]
    assert ts["window_s"] == 5 and len(ts["t_s"]) <= span / 5 + 1
    assert 135 / len(ts["t_s"]) >= MIN_PER_WINDOW


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_no_window_rate_far_above_the_true_rate(make_run, seed):
    """A 3 req/s run: no window (the last included) shows more than 2x that rate."""
    run = make_run(f"r{seed}", synth_records(135, seed=seed, rate=3.0, fail_share=0.0))
    s = summarize_run(run, write=False)
    ts = s["timeseries"]
    for key in ("offered_rps", "achieved_rps", "goodput_rps"):
        assert max(ts[key]) <= 2 * 3.0, (key, ts[key])
    # Counts are conserved: rate x the time each window covers gives back every request.
    assert round(sum(r * w for r, w in zip(ts["achieved_rps"], ts["width_s"]))) == s["counts"]["ok"]
    assert round(sum(r * w for r, w in zip(ts["offered_rps"], ts["width_s"]))) == 135


def test_last_window_never_divides_by_a_sliver(make_run):
    run = make_run("run", synth_records(135, seed=1, rate=3.0, fail_share=0.0))
    span = summarize_run(run, write=False)["throughput"]["duration_s"]   # the series span, to 1 ms
    s = summarize_run(run, write=False, window_s=span / 9.02)     # 9 windows and 2% of one
    ts = s["timeseries"]
    assert max(ts["achieved_rps"] + ts["goodput_rps"] + ts["offered_rps"]) <= 6.0, ts
    assert min(ts["width_s"]) >= ts["window_s"] / 2 and max(ts["width_s"]) <= 1.5 * ts["window_s"]
    e = window_edges(0.0, 10.2, 1.0)                  # 0.2 s left over: merged into the 10th
    assert len(e) == 11 and e[-1] == 10.2
    e = window_edges(0.0, 10.6, 1.0)                  # 0.6 s: a window of its own
    assert len(e) == 12 and e[-1] == 10.6
    assert list(window_edges(3.0, 3.0, 1.0)) == [3.0, 4.0]


# -- SVG geometry -----------------------------------------------------------------------------

def test_every_point_inside_its_frame_and_legend_below(make_run):
    _, html = _report(make_run, slo={"per_request": {"ttft_ms": 150}})
    svgs = _svgs(html)
    assert len(svgs) >= 11
    for svg in svgs:
        x0, y0, x1, y1 = _frame(svg)
        series = _series(svg)
        assert series, _title(svg)
        for el in series:
            for x, y in _points(el):       # strictly inside: not drawn over the frame's border
                assert x0 < x < x1 and y0 < y < y1, (_title(svg), el.get("data-label"), x, y)
        legend = next(e for e in svg.iter(NS + "g") if e.get("class") == "legend")
        labels = [t.text for t in legend.iter(NS + "text")]
        assert len(labels) == len({e.get("data-label") for e in series}), _title(svg)
        for t in legend.iter(NS + "text"):
            assert float(t.get("y")) > y1 + 20, (_title(svg), t.text)     # below the x tick labels
        assert float(svg.get("height")) >= max(float(t.get("y")) for t in legend.iter(NS + "text")) + 3


def test_every_series_visible(make_run):
    """Distinct colour and dash per series; equal series drawn thinner on top of each other;
    the smallest series (errors) drawn last, on top."""
    _, html = _report(make_run, n=2000, rate=40.0)      # no SLO: goodput == completed ok
    for svg in _svgs(html):
        paths = [e for e in _series(svg) if e.tag == NS + "path"]
        styles = [(p.get("stroke"), p.get("stroke-dasharray")) for p in paths]
        assert len(set(styles)) == len(styles), (_title(svg), styles)
        for i, a in enumerate(paths):
            for b in paths[i + 1:]:
                if a.get("d") == b.get("d"):
                    assert float(b.get("stroke-width")) < float(a.get("stroke-width")), _title(svg)
    rates = next(s for s in _svgs(html) if _title(s).startswith("Request rates"))
    paths = [e for e in _series(rates) if e.tag == NS + "path"]
    by = {p.get("data-label"): p for p in paths}
    assert by["goodput"].get("d") == by["completed ok"].get("d")
    assert paths[-1].get("data-label") == "errors"
    queue = next(s for s in _svgs(html) if _title(s) == "Server queue depth")
    waiting = next(p for p in _series(queue) if p.get("data-label") == "waiting")
    assert waiting.get("stroke-dasharray")
    assert float(waiting.get("stroke-width")) < max(float(p.get("stroke-width")) for p in _series(queue))


def test_ttft_and_e2e_on_separate_panels(make_run):
    _, html = _report(make_run)
    titles = [_title(s) for s in _svgs(html)]
    assert "TTFT vs input length (sample)" in titles and "E2E vs input length (sample)" in titles
    for svg in _svgs(html):
        labels = " ".join(e.get("data-label") for e in _series(svg))
        assert not ("TTFT" in labels and "E2E" in labels), _title(svg)


# -- tables -----------------------------------------------------------------------------------

class _Tables(HTMLParser):
    """Tables as lists of rows of (tag, text) cells; <pre> blocks counted."""

    def __init__(self):
        super().__init__()
        self.tables, self.pre, self._cell = [], 0, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = [tag, ""]
        elif tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell:
            self.tables[-1][-1].append(tuple(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data


LABEL_COLUMNS = {"metric", "model", "slo class", "objective", "scope", "verdict", "status", "HTTP status",
                 "message", "kind", "setting", "value", "run.json key", "SLO setting", "unit"}
NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?(e[-+]\d+)?$")


def test_every_table_header_has_a_unit(make_run):
    _, html = _report(make_run, slo={"per_request": {"ttft_ms": 150}, "objectives": ["ttft_ms.p99 <= 800"]})
    p = _Tables()
    p.feed(html)
    headers = [c[1].strip() for t in p.tables for row in t for c in row if c[0] == "th"]
    assert len(headers) > 40
    for h in headers:
        assert h in LABEL_COLUMNS or re.search(r"\(.+\)", h), h
    # Key/value tables (headline, goodput, dispatch lag): a row holding a number says its unit.
    # (run.json and SLO settings are listed under their own names, which carry theirs: ttft_ms.)
    kv = [t for t in p.tables if t and all(c[0] == "td" for c in t[0])]
    assert len(kv) >= 3
    for t in kv:
        for row in t:
            if len(row) == 2 and row[0][0] == row[1][0] == "td" and NUMBER.match(row[1][1].strip()):
                assert re.search(r"\(.+\)|/s\b|tokens/s|req/s", row[0][1]), row


def test_run_config_and_window_are_tables_with_iso_times(make_run):
    _, html = _report(make_run, warmup="5s")
    p = _Tables()
    p.feed(html)
    body = re.sub(r"<style>.*?</style>", "", html, flags=re.S)
    assert p.pre == 0 and '"started_wall"' not in html and "{" not in body
    rows = {r[0][1]: r[1][1] for t in p.tables for r in t if len(r) == 2 and r[0][0] == "td"}
    assert rows["started_wall"].startswith("2026-12-02T04:14:08.626 UTC")
    assert rows["t0_wall"].startswith("2026-12-02T04:14:09.876 UTC")
    assert rows["config.workers"] == "1"
    assert rows["warm-up excluded"].startswith("first 5 s")
    assert "run started 2026-12-02T04:14:09.876 UTC" in html
    # An epoch is only ever shown next to its ISO form.
    for cell in re.findall(r"<td>([^<]*1796184\d{3}[^<]*)</td>", html):
        assert "UTC" in cell, cell


def test_intervals_have_sensible_figures_and_no_float_noise(make_run):
    assert fmt_ci(1.735e-18, 3.2) == "[0, 3.2]"
    assert fmt([1.735e-18, 3.2]) == "[0, 3.2]" and fmt(1.735e-18) == "0" and fmt(-2e-17) == "0"
    assert fmt_ci(232.64668775398513, 452.2024268735863) == "[233, 452]"
    assert fmt_ci(0.21013, 0.25131) == "[0.210, 0.251]"
    assert fmt_ci(1014.2, 1920.4) == "[1,014, 1,920]"
    assert fmt_ci(5.0, 5.0) == "[5, 5]" and fmt_ci(None, 1.0) == "-"
    assert fmt(0.0001234) == "1.234e-04"          # a real small number keeps its figures
    s, html = _report(make_run, slo={"objectives": ["ttft_ms.p99 <= 800"]})
    p = _Tables()
    p.feed(html)
    cis = [c[1] for t in p.tables for row in t for c in row if c[1].startswith("[")]
    assert len(cis) >= 5
    for ci in cis:
        # a gate's one-sided bound may be unbounded on one side (too few samples): shown as ∞
        assert re.fullmatch(r"\[(-∞|[\d,.]+), (∞|[\d,.]+)\]", ci) and "e-" not in ci, ci


def test_compare_page_has_units_and_clean_intervals(tmp_path, make_run):
    base = make_run("base", synth_records(800, seed=1))
    cand = make_run("cand", synth_records(800, seed=2, ttft_factor=1.3))
    compare_runs(base, cand, html=tmp_path / "cmp.html")
    page = (tmp_path / "cmp.html").read_text()
    p = _Tables()
    p.feed(page)
    for h in (c[1] for t in p.tables for row in t for c in row if c[0] == "th"):
        assert h in LABEL_COLUMNS or re.search(r"\(.+\)", h), h
    cis = [c[1] for t in p.tables for row in t for c in row if c[1].startswith("[")]
    assert cis and all(re.fullmatch(r"\[-?[\d,.]+, -?[\d,.]+\]", ci) for ci in cis), cis
    units = {row[1][1] for t in p.tables for row in t[1:]}
    assert {"ms", "probability", "fraction", "req/s"} <= units, units
    for svg in _svgs(page):
        x0, y0, x1, y1 = _frame(svg)
        assert all(x0 < x < x1 and y0 < y < y1 for e in _series(svg) for x, y in _points(e))


def test_terminal_and_markdown_intervals_share_the_rule():
    from llm_replay.reports.text import fmt as text_fmt
    assert text_fmt([1.735e-18, 3.2]) == "[0, 3.2]" and text_fmt(2e-19) == "0"
    assert text_fmt([232.64668775398513, 452.2024268735863]) == "[233, 452]"
