"""The documentation site builds with ``mkdocs build --strict``: a broken link, a
missing page or an API reference to a name that does not exist fails it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="the docs extra (pip install '.[docs]'; make test has it)")
pytest.importorskip("mkdocstrings")


def _build(root: Path, site: Path):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=root, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    p = _build(ROOT, tmp_path / "site")
    assert p.returncode == 0, p.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "RunResult" in api                       # docstrings made it into the reference


@pytest.mark.slow
def test_broken_link_fails_the_build(tmp_path):
    """The strict build is a real check: a copy of the docs with one broken link fails."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for top in ("evolve", "heuristics"):
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "guide.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    p = _build(copy, tmp_path / "site")
    assert p.returncode != 0
    assert "no-such-page.md" in p.stdout + p.stderr
