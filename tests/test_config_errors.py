"""Bad options and bad run directories are refused in one line before any work.

Guarantee 1 of docs/reliability.md, Configuration errors are caught before any work:

Checked before anything is created on disk: non-positive
`--generations`/`--population`, a negative `--seed`, whole numbers of more than 40
digits, `--tournament` larger than the population, rates outside [0, 1] (NaN
included), an unknown `--objective`, an invalid `--name`, a missing data directory,
and an unknown `benchmark --heuristic`. Also checked: a `--runs-dir` that is a file,
lies under a file or is not writable, `--resume` of a missing or foreign directory,
and on `--resume` a `--generations` that is zero, negative or below the checkpoint's
generation. Each gives one line on stderr that names the option and echoes the
value, exit code 2 and no traceback. No runs directory or run directory is created,
and a resumed run's files are left unchanged. Tests:
`test_config_error_before_any_work`, `test_config_missing_data_before_any_work`,
`test_config_unknown_benchmark_heuristic`, `test_config_runs_dir_is_a_file`,
`test_config_runs_dir_not_writable` (and `..._read_only_for_real` when not root),
`test_resume_missing_run_rejected`, `test_resume_foreign_directory_rejected`,
`test_resume_bad_generations_rejected`.

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evolve.runs import runner
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.runkit import POP, copy_run, listing

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.mark.parametrize("args,option,value", [
    (["--generations", "0"], "--generations", "0"),
    (["--generations", "-3"], "--generations", "-3"),
    (["--population", "0"], "--population", "0"),
    (["--population", "-5"], "--population", "-5"),
    (["--population", "10", "--tournament", "11"], "--tournament", "11"),
    (["--cx-prob", "1.5"], "--cx-prob", "1.5"),
    (["--cx-prob", "-0.1"], "--cx-prob", "-0.1"),
    (["--mut-prob", "2"], "--mut-prob", "2.0"),
    (["--cx-prob", "nan"], "--cx-prob", "nan"),
    (["--objective", "speedy"], "--objective", "'speedy'"),
    (["--name", "bad name"], "--name", "'bad name'"),
])
def test_config_error_before_any_work(tmp_path, small_data_dir, args, option, value):
    parent = tmp_path / "runs"
    r = invoke("run", *args, "--data", small_data_dir, "--runs-dir", parent, "--no-writeback")
    line = one_line_error(r)
    assert option in line and value in line, line
    assert not parent.exists()          # not even the runs directory was created


def test_config_missing_data_before_any_work(tmp_path):
    parent = tmp_path / "runs"
    line = one_line_error(invoke("run", "--population", POP, "--generations", 1, "--data",
                                 tmp_path / "nodata", "--runs-dir", parent, "--no-writeback"))
    assert "nodata" in line and "not found" in line and "`evolve data generate`" in line
    assert not parent.exists()


def test_config_unknown_benchmark_heuristic(small_data_dir):
    line = one_line_error(invoke("benchmark", "--data", small_data_dir, "--heuristic", "nope"))
    assert "--rule" in line and "'nope'" in line


def test_config_runs_dir_is_a_file(tmp_path, small_data_dir):
    f = tmp_path / "afile"
    f.write_text("x")
    for target in (f, f / "runs"):
        line = one_line_error(invoke("run", "--population", POP, "--generations", 1, "--data",
                                     small_data_dir, "--runs-dir", target, "--no-writeback"))
        assert "--runs-dir" in line and str(target) in line
    assert f.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["afile"]


def test_config_runs_dir_not_writable(tmp_path, small_data_dir, monkeypatch):
    """As root every directory is writable, so the check is also driven through
    os.access; with a normal user the chmod case below runs for real."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(runner.os, "access",
                        lambda p, mode, **kw: (False if Path(p) == ro and mode & os.W_OK
                                               else real_access(p, mode, **kw)))
    for target in (ro, ro / "runs"):
        line = one_line_error(invoke("run", "--population", POP, "--generations", 1, "--data",
                                     small_data_dir, "--runs-dir", target, "--no-writeback"))
        assert "--runs-dir" in line and str(target) in line and "not writable" in line
    assert os.listdir(ro) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_config_runs_dir_read_only_for_real(tmp_path, small_data_dir):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        line = one_line_error(invoke("run", "--population", POP, "--generations", 1, "--data",
                                     small_data_dir, "--runs-dir", ro / "runs",
                                     "--no-writeback"))
        assert "--runs-dir" in line
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o700)


def test_resume_missing_run_rejected(tmp_path):
    parent = tmp_path / "runs"
    line = one_line_error(invoke("run", "--resume", "nope", "--runs-dir", parent,
                                 "--no-writeback"))
    assert "--resume" in line and "'nope'" in line and "no such run directory" in line
    assert not parent.exists()


@pytest.mark.parametrize("content", [
    {},                                                     # an empty directory
    {"notes.txt": "not a run"},                             # some other directory
    {"config.json": json.dumps({"format": "something-else", "config": {}})},
    {"config.json": "{not json"},
])
def test_resume_foreign_directory_rejected(tmp_path, content):
    parent = tmp_path / "runs"
    (parent / "foreign").mkdir(parents=True)
    for name, text in content.items():
        (parent / "foreign" / name).write_text(text)
    before = listing(parent)
    for ref in ("foreign", str(parent / "foreign")):     # by name and by path
        line = one_line_error(invoke("run", "--resume", ref, "--runs-dir", parent,
                                     "--no-writeback"))
        assert "--resume" in line and ref in line
    assert listing(parent) == before


@pytest.mark.parametrize("generations,words", [
    ("0", "expected a whole number"), ("-2", "expected a whole number"),
    ("2", "already at generation 3"),
])
def test_resume_bad_generations_rejected(tmp_path, finished_run, generations, words):
    run = copy_run(finished_run, tmp_path / "runs")
    before = listing(run)
    line = one_line_error(invoke("run", "--resume", "r", "--generations", generations,
                                 "--runs-dir", run.parent, "--no-writeback"))
    assert "--generations" in line and generations in line and words in line
    assert listing(run) == before
