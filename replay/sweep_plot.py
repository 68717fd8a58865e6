"""capacity.html for `replay sweep`: goodput and p99 latency against offered load, one
self-contained page (inline SVG from reports.svg, nothing fetched)."""
from __future__ import annotations

import html
from pathlib import Path

from llm_replay.reports.svg import chart

from .sweep import CANNOT, FAIL, PASS, capacity_text, shown


def write_capacity_html(path: Path, result: dict) -> None:
    pts = result["points"]
    rates = [p["rate"] for p in pts]
    cap, knee = result.get("capacity_rps"), result.get("knee_rps")
    mark = (cap, cap) if cap else None  # the measured capacity as a thin band
    goodput = chart([{"label": "offered req/s", "x": rates, "y": rates, "dash": True},
                     {"label": "goodput req/s", "x": rates, "y": [p["goodput_rps"] for p in pts]},
                     {"label": "attainment", "x": rates, "y": [p["attainment"] for p in pts], "axis": 2}],
                    title="Goodput vs offered load", xlabel="offered rate (req/s)", ylabel="req/s",
                    y2label="attainment", band=mark)
    latency = chart([{"label": "TTFT p99 (ms)", "x": rates, "y": [p["ttft_p99_ms"] for p in pts]},
                     {"label": "TPOT p99 (ms)", "x": rates, "y": [p["tpot_p99_ms"] for p in pts], "axis": 2}],
                    title="Tail latency vs offered load", xlabel="offered rate (req/s)",
                    ylabel="TTFT p99 (ms)", y2label="TPOT p99 (ms)", band=mark)
    rows = "".join(f"<tr><td>{p['rate']:.4g}</td>{_verdict(p)}<td>{_f(p['attainment'])}</td>"
                   f"<td>{_f(p['goodput_rps'])}</td><td>{_f(p['ttft_p99_ms'])}</td><td>{_f(p['tpot_p99_ms'])}</td>"
                   f"<td>{html.escape(p['run_dir'])}</td></tr>" for p in pts)
    verdict = f"<b>{html.escape(capacity_text(result, digits=4))}</b>"
    if knee:
        verdict += f"; knee of the p99 TTFT curve: {knee:.4g} req/s"
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>llm-replay capacity sweep</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}svg{{margin:1em 1em 0 0}}
td.fail{{color:#b00020;font-weight:bold}}td.unjudged{{color:#8a5a00;background:#fff4d6;font-style:italic}}</style></head><body>
<h1>Capacity sweep</h1><p>{verdict}</p>{goodput}{latency}
<table><tr><th>rate req/s</th><th>verdict</th><th>attainment</th><th>goodput req/s</th><th>TTFT p99 ms</th>
<th>TPOT p99 ms</th><th>run</th></tr>{rows}</table></body></html>
""")


def _verdict(p: dict) -> str:
    """The verdict cell: pass, FAIL, or cannot evaluate (set apart, with the gate's reason)."""
    verdict = p.get("verdict") or (PASS if p["passed"] else FAIL)
    if verdict == CANNOT:
        why = html.escape(p.get("reason") or "")
        return f'<td class="unjudged" title="{why}">cannot evaluate{f" ({why})" if why else ""}</td>'
    return f'<td class="{verdict}">{html.escape(shown(verdict))}</td>'


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
