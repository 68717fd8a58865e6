"""report.html in a real headless Chromium: loads offline with no console messages, and the
plots render (the screenshot carries far more image data than a blank page's)."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib

import pytest

from llm_replay.reports import summarize_run
from tests.reports.synth import synth_records
from tests.reports.test_summary import _server_metrics
from tests.conftest import wait_s

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium on PATH "
                                "(install it with `apt-get install -y chromium`, as .ci/run does)")


def _shoot(page, png, profile, size="1300,4200") -> str:
    """Screenshot `page` with networking off; return Chromium's console log lines."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-extensions", "--no-first-run",
                           "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={size}",
                           f"--screenshot={png}", "--enable-logging=stderr", "--v=0", page.as_uri()],
                          capture_output=True, text=True, timeout=wait_s(90))
    assert png.exists(), proc.stderr[-2000:]
    return "\n".join(line for line in proc.stderr.splitlines() if ":CONSOLE" in line)


def _image_bytes(png) -> tuple[int, int, bytes]:
    """Width, height and the decompressed (filtered) scanlines of a PNG."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_report_renders_offline_in_chromium(tmp_path):
    run = tmp_path / "run"
    from tests.reports.synth import write_run
    write_run(run, synth_records(1500, seed=3), {"target": "http://127.0.0.1:9"}, _server_metrics(35.0))
    summarize_run(run, slo={"per_request": {"ttft_ms": 300}, "objectives": ["ttft_ms.p99 <= 800"]})
    html = (run / "report.html").read_text()
    assert "<script" not in html and not re.search(r"(src|href)=\"https?:", html)
    assert html.count("<svg") >= 9       # CDFs, over-time plots, server KV and queue, scatter

    # The check itself works: a page with a script error logs it, and renders blank.
    blank = tmp_path / "blank.html"
    blank.write_text('<html><body><script>throw new Error("check-" + "works")</script></body></html>')
    log = _shoot(blank, tmp_path / "blank.png", tmp_path / "profile-a")
    assert "check-works" in log

    log = _shoot(run / "report.html", tmp_path / "report.png", tmp_path / "profile-b")
    assert log == "", f"console messages while loading report.html:\n{log}"
    w, h, pixels = _image_bytes(tmp_path / "report.png")
    bw, bh, blank_pixels = _image_bytes(tmp_path / "blank.png")
    assert (w, h) == (bw, bh) == (1300, 4200)
    # Filtered scanlines of a white page are nearly all zero bytes; plots and tables are not.
    busy = sum(1 for b in pixels[::97] if b) / len(pixels[::97])
    blank_busy = sum(1 for b in blank_pixels[::97] if b) / len(blank_pixels[::97])
    assert blank_busy < 0.005 and busy > 0.015 and busy > 20 * blank_busy, (busy, blank_busy)
