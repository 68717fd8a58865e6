"""The documentation as a whole: the site builds with `mkdocs build --strict` (a broken link or
anchor fails it; .ci/run builds it too), every page is in the navigation, every page with code
blocks has the test module that runs them, no page repeats a section title, none points at a
design document this repository does not hold. Also the blocks of docs/index.md and
docs/development.md (mdblocks.py: how)."""
from __future__ import annotations

import importlib
import re
import shutil

import pytest
import yaml

from tests.conftest import REPO
from tests.docs.mdblocks import DOCS, Page, commands, read_blocks, sh, substitute

INDEX = Page(DOCS / "index.md", {"pip install torch==2.13.0 -e '.[engine]' && replay demo": "test_index_quick_start"})
DEVELOPMENT = Page(DOCS / "development.md", {"pip install torch==2.13.0 -e '.[engine,test,docs]'": "test_development_block"})
PAGES = [INDEX, DEVELOPMENT]


def test_every_block_is_checked():
    for page in PAGES:
        page.assert_checked(globals())


def _modules():
    names = ["tests.test_readme", "tests.docs.test_site"] + \
        [f"tests.docs.{p.stem}" for p in sorted((REPO / "tests" / "docs").glob("test_page_*.py"))]
    return {n: importlib.import_module(n) for n in names}


def test_every_page_with_blocks_has_its_checks():
    owners: dict = {}
    for name, mod in _modules().items():
        for page in mod.PAGES:
            owners.setdefault(page.path.resolve(), []).append(name)
    for path in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        if read_blocks(path):
            assert len(owners.get(path.resolve(), [])) == 1, (path.name, owners.get(path.resolve()))


def _nav_files(nav) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_files(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_files(config["nav"])
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md")) and len(nav) == len(set(nav))


def test_titles_are_not_repeated():
    h1 = []
    for path in sorted(DOCS.glob("*.md")):
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)   # not a block's comments
        titles = re.findall(r"^(#{1,4} .+)$", text, re.M)
        assert len(titles) == len(set(titles)), (path.name, sorted(t for t in titles if titles.count(t) > 1))
        assert titles[0].startswith("# ") and sum(t.startswith("# ") for t in titles) == 1, path.name
        h1.append(titles[0])
    assert len(h1) == len(set(h1)), h1


def test_no_design_document_is_assumed():
    for path in [REPO / "README.md", *DOCS.glob("*.md")]:
        assert "DESIGN" not in path.read_text(), path.name


def test_index_quick_start():
    """The site's home page shows the README's quick start, to the byte."""
    readme = Page(REPO / "README.md", {})
    assert INDEX.block("pip install torch").text == readme.block("pip install torch==2.13.0 -e '.[engine]'").text


def test_development_block(tmp_path):
    """The install line is .ci/run's (torch pinned first, then the extras it installs); the test
    paths exist; the site builds with `mkdocs build --strict`, as written, into a folder here."""
    install, suite, slow, timing, docs_tests, build = commands(DEVELOPMENT.block("pip install torch").text)
    ci = (REPO / ".ci" / "run").read_text()
    extras = re.search(r"-e '\.\[([\w,]+)\]'", install).group(1)
    assert install.startswith("pip install torch==2.13.0 ") and f'-e ".[{extras}]"' in ci
    lines = ci.strip().splitlines()
    assert [lines.index(c.split("#")[0].strip()) for c in (suite, slow, timing)] == sorted(
        lines.index(c.split("#")[0].strip()) for c in (suite, slow, timing))
    assert "mkdocs build --strict" in ci
    for arg in docs_tests.split("#")[0].split()[4:]:
        assert (REPO / arg).exists(), arg
    if shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'); .ci/run builds the site")
    cmd = substitute(build.split("#")[0].strip(), {"-d site": f"-d {tmp_path / 'site'}"})
    p = sh(f"NO_MKDOCS_2_WARNING=1 {cmd}", REPO, timeout=300)
    assert "WARNING" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    for page in DOCS.glob("*.md"):
        html = tmp_path / "site" / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert html.exists(), html
