"""The built site in a real headless Chromium at 1280 px: no code block runs past its column
(issue 36 item 13: long commands were cut off at the right edge, with nothing showing that the
box scrolls). The pages probed hold the widest blocks; docs/extra.css applies to every page."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
PROBE = ("<script>document.body.setAttribute('data-cut', [...document.querySelectorAll('.md-typeset pre > code')]"
         ".filter(c => c.scrollWidth > c.clientWidth + 1).length + '/' + "
         "document.querySelectorAll('.md-typeset pre > code').length)</script>")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium on PATH (apt-get install -y chromium)")
@pytest.mark.skipif(shutil.which("mkdocs") is None, reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_code_blocks_fit_the_column_at_1280_px(tmp_path):
    site = tmp_path / "site"
    subprocess.run(["mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=REPO, check=True,
                   capture_output=True, timeout=600)
    for page in ("pytest", "servertime"):
        probe = site / page / "probe.html"
        probe.write_text((site / page / "index.html").read_text().replace("</body>", PROBE + "</body>"))
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
                              "--window-size=1280,900", "--dump-dom", probe.as_uri()],
                             capture_output=True, text=True, timeout=300).stdout
        cut, blocks = map(int, re.search(r'data-cut="(\d+)/(\d+)"', dom).groups())
        assert blocks > 0 and cut == 0, f"{page}: {cut} of {blocks} code blocks wider than the column"
