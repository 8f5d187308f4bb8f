"""A live run owns its run directory: a second writer is refused while it lives.

Guarantee 10 of docs/reliability.md, A live run owns its directory:

`evolve run` takes an OS advisory lock (`fcntl.flock`, without waiting) on the run
directory itself and holds it until the process ends: a new run locks its directory
while it is still under its hidden name, so the run is owned from the moment it
appears, and `--resume` locks it before reading anything (`evolve/io/lock.py`). The
OS drops the lock however the process ends, `kill -9` included, so there is never a
stale lock to remove, and locking writes nothing into the directory. A second
`--resume` of a live run gets one line (`... the run is in use by another process
...`), exit code 2, and changes nothing; `--name` of an existing run was already
refused. `inspect` and `runs` only read and take no lock. Tests:
`test_resume_of_a_locked_run_is_refused_and_changes_nothing`,
`test_a_new_run_owns_its_directory_from_the_start` and (slow, real processes)
`test_live_run_refuses_second_resume_and_name_then_dies_with_its_lock`, which starts
a run in another process, is refused a second resume and a run of the same name
while it lives, kills it with SIGKILL and then resumes it, checking that the history
has one writer (contiguous generations).

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from evolve.runs import rundir as runs
from tests.clikit import ENV, invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.runkit import REPO, copy_run, listing, resume

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 10. A live run owns its directory
# ------------------------------------------------------------------------------------

def test_resume_of_a_locked_run_is_refused_and_changes_nothing(tmp_path, finished):
    from evolve.io.lock import DirLock
    run = copy_run(finished, tmp_path / "runs")
    before = listing(run)
    with DirLock(run):                                  # another process's live run
        line = one_line_error(resume(run))
        assert "in use by another process" in line and str(run) in line
    assert listing(run) == before
    assert resume(run).exit_code == 0                   # the lock is gone with its owner


def test_a_new_run_owns_its_directory_from_the_start(tmp_path):
    run = runs.RunDir.create(tmp_path, "fresh", {}, {"dir": str(tmp_path)})
    try:
        with pytest.raises(runs.RunError, match="in use by another process"):
            runs.RunDir(run.path).lock()
    finally:
        run.unlock()
    runs.RunDir(run.path).lock().unlock()               # free once the owner lets go


@pytest.mark.slow
def test_live_run_refuses_second_resume_and_name_then_dies_with_its_lock(tmp_path, data_copy):
    """A real run in another process: a second resume and a new run of its name are
    refused while it lives; after kill -9 the OS has dropped the lock and the resume
    completes."""
    parent = tmp_path / "runs"
    cmd = [sys.executable, "-c", "from evolve.cli import main; main()", "run",
           "--population", "400", "--generations", "400", "--seed", "2", "--name", "live",
           "--data", str(data_copy), "--runs-dir", str(parent), "--no-writeback"]
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (parent / "live" / "checkpoint.json").exists():
            assert proc.poll() is None and time.time() < deadline, "run did not start"
            time.sleep(0.2)
        hist = (parent / "live" / "history.jsonl").read_bytes()
        line = one_line_error(invoke("run", "--resume", "live", "--runs-dir", parent,
                                     "--no-writeback"))
        assert "in use by another process" in line
        line = one_line_error(invoke("run", "--name", "live", "--runs-dir", parent,
                                     "--data", data_copy, "--no-writeback"))
        assert "exists" in line
        assert (parent / "live" / "history.jsonl").read_bytes()[:len(hist)] == hist
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    r = invoke("run", "--resume", "live", "--runs-dir", parent, "--no-writeback",
               "--generations", 1 + runs.RunDir(parent / "live").checkpoint()["generation"])
    assert r.exit_code == 0, r.output
    gens = [h["generation"] for h in runs.RunDir(parent / "live").history()]
    assert gens == list(range(len(gens)))               # one writer: contiguous, no repeats
