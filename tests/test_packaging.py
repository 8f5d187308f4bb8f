"""A normal, non-editable install works: the wheel holds every package the CLI needs.

The wheel is built from this checkout and installed into a fresh virtualenv outside
the source tree; the installed ``evolve`` then runs the main commands there, with the
default locations of an installed package (``runs/`` and ``heuristics/`` of the working
directory: write-back never changes the installed package). Slow: the virtualenv installs the
core dependencies (from pip's cache when they are there).

Also guarantee 34 of docs/reliability.md, What an export decides is what was scored: see
tests/test_faithful.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.speed import tour_time
from benchmarks.speed.tour_time import readme_block

ROOT = Path(__file__).resolve().parents[1]


def _packages_on_disk() -> set[str]:
    """Dotted names of every package (folder with __init__.py) under evolve/ and heuristics/."""
    found = set()
    for top in ("evolve", "heuristics"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if "__pycache__" not in rel.parts:
                found.add(".".join(rel.parts))
    return found


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EVOLVE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "120"
    return env


def _run(cmd, cwd, timeout=600):
    p = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # built from a copy of what the wheel is made of: a build/ folder left in the
    # checkout by an earlier build would otherwise be packed again, hiding a bad list
    src = tmp_path_factory.mktemp("src")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "history",
                                  ".*.lock")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for top in ("evolve", "heuristics"):
        shutil.copytree(ROOT / top, src / top, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
         cwd=out)
    (whl,) = out.glob("specevolve-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_every_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    expected = _packages_on_disk()
    assert {"evolve.cli", "evolve.kernels", "evolve.data.sources"} <= expected
    assert expected <= in_wheel, f"missing from the wheel: {sorted(expected - in_wheel)}"
    # nothing from outside the two packages (tests, benchmarks, data) is shipped
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"evolve", "heuristics"}


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (and its core dependencies only)."""
    where = tmp_path_factory.mktemp("venv")
    venv = where / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=where)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
          "--disable-pip-version-check", str(wheel)], cwd=where)
    return venv


def tour_commands() -> list[list[str]]:
    """The README tour's commands, each as its words (comments dropped), read as the
    script that times them reads them (benchmarks/speed/tour_time.py)."""
    cmds = tour_time.tour_commands()
    assert all(c[0] == "evolve" for c in cmds) and len(cmds) >= 5, cmds
    return cmds


def run_readme(bindir: Path, python: str, work: Path, env_extra: dict | None = None) -> None:
    """The README's tour, then its Python example, in ``work`` as written: ``evolve`` and
    ``python`` are the ones in ``bindir``; each must exit 0."""
    env = {**_clean_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           **(env_extra or {})}
    for cmd in tour_commands():
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{p.stdout[-3000:]}\n" \
                                  f"{p.stderr[-3000:]}"
    p = subprocess.run([python, "-c", readme_block("From Python", "python")], cwd=work,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"the README's Python example:\n{p.stdout[-3000:]}\n" \
                              f"{p.stderr[-3000:]}"
    assert (work / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert "def speculative_sampling(" in (work / "rule_hf.py").read_text()
    assert len(p.stdout.splitlines()) >= 5, p.stdout       # every print of the example


def _untracked_in(wheel: Path) -> list[str]:
    """Files the wheel packs (from this working tree) that the last commit lacks: what a
    fresh clone, and so a wheel built from it, would be missing."""
    tracked = set(subprocess.run(["git", "ls-files", "evolve", "heuristics"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.split())
    packed = [n for n in zipfile.ZipFile(wheel).namelist()
              if n.split("/", 1)[0] in ("evolve", "heuristics")]
    return sorted(n for n in packed if n not in tracked)


@pytest.mark.slow
def test_the_readme_tour_and_api_example_run_after_a_wheel_install(venv, tmp_path):
    """`pip install .` and an empty directory: the README's tour and Python example run
    as written, everything they make in that directory. The wheel is built from this
    working tree; a fresh clone has the same package exactly when every file the wheel
    packs is committed, which the next test checks (a fresh clone is how CI runs this
    suite, so there the two are one)."""
    work = tmp_path / "empty"
    work.mkdir()
    run_readme(venv / "bin", str(venv / "bin" / "python"), work)
    assert {"datasets", "runs", "rule_hf.py"} <= {p.name for p in work.iterdir()}


@pytest.mark.slow
def test_a_fresh_clone_holds_every_file_the_wheel_packs(wheel):
    """Every file of the two packages the wheel ships is in the last commit (a module
    left untracked would pass every test here and be missing from a fresh clone)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert not _untracked_in(wheel), f"not committed: {_untracked_in(wheel)}"


@pytest.mark.slow
def test_non_editable_install_runs_the_main_commands(venv, tmp_path):
    py = venv / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()
    # the installed package, not this checkout, is what runs
    where = _run([str(py), "-c", "import evolve, heuristics; print(evolve.__file__); "
                  "print(heuristics.__file__)"], cwd=work).stdout.split()
    assert all(str(venv) in w and str(ROOT) not in w for w in where), where

    evolve = str(venv / "bin" / "evolve")
    assert "Usage: evolve" in _run([evolve, "--help"], cwd=work).stdout
    _run([evolve, "data", "generate", "--out", "d"], cwd=work)
    assert sorted(p.name for p in (work / "d").iterdir()) == ["test.npz", "train.npz", "valid.npz"]
    _run([evolve, "run", "--data", "d", "--generations", "3", "--population", "40",
          "--seed", "1"], cwd=work)
    (run,) = (work / "runs").iterdir()           # runs/ of the working directory
    history = (run / "history.jsonl").read_text().splitlines()
    assert len(history) == 4                     # generations 0..3
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    bench = _run([evolve, "benchmark", "--data", "d"], cwd=work).stdout
    assert "standard_rejection" in bench and "evolved" in bench
    # write-back stays in the project: heuristics/ of the working directory, never the
    # installed package (nor this checkout)
    package = Path(where[1]).parent / "evolved.py"
    before = package.read_text()
    written = work / "heuristics" / "evolved.py"
    assert written.is_file() and "run: " in written.read_text()
    assert f"run ({run.name}" in bench or run.name in bench, bench
    other = tmp_path / "other"
    other.mkdir()
    _run([evolve, "data", "generate", "--out", "d", "--sequences", "40"], cwd=other)
    mine = _run([evolve, "export", "--installed", "tokens", "--format", "numpy"], cwd=work)
    theirs = _run([evolve, "export", "--installed", "tokens", "--format", "numpy"], cwd=other)
    assert f"run: {run.name}" in mine.stdout and "run: initial" in theirs.stdout
    assert package.read_text() == before and not (other / "heuristics").exists()
