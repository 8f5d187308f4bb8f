"""A run killed, torn or out of disk space leaves a loadable run that resumes exactly.

Guarantee 3 of docs/reliability.md, `kill -9` at any moment leaves a loadable run:

Every file is written to a temporary file, fsynced and moved into place with
`os.replace` (`evolve/io/atomic.py`). A run directory is assembled under a hidden
name and renamed into place once `config.json` exists, so it is never half-made.
`history.jsonl` is appended one fsynced line at a time. Loading ignores a torn last
line, and a resume rewrites the history up to the checkpoint's generation. A run
killed before its first checkpoint restarts from its seed. Leftover temporary files
are removed on resume. In
`test_kill9_at_random_moments_then_resume_completes_exactly`, a real run is killed
with SIGKILL seven times at random moments, during start-up or mid-run (every other
one once the process has saved a generation, so the run exists however slow
start-up is). After every kill the directory must load: the history is contiguous,
at most one line ahead of the checkpoint, and the checkpoint restores. `evolve run
--resume` then completes with the same history and champion as an undisturbed run. Other tests:
`test_torn_last_history_line_is_ignored_and_resume_completes`,
`test_torn_line_in_the_middle_is_an_error`,
`test_atomic_write_crash_keeps_old_file_and_leaves_no_temp`,
`test_run_directory_appears_complete_or_not_at_all`,
`test_resume_without_checkpoint_starts_from_the_seed` and
`test_refinish_in_a_new_process`. The last one covers a crash while finishing: the
resumed process scores the same champion again (from its parsed tree; `champion.py`
is rewritten, never imported).

Guarantee 8 of docs/reliability.md, Write errors (disk full):

A failed write during a run ends it with one line and exit code 2. The line names
the run, the generation, the OS error and the resume command. The run is marked
`failed` in `summary.json` when that write can still succeed. The last good
checkpoint is intact, no temporary file is left, and a resume completes exactly.
`test_disk_full_ends_run_cleanly_and_resume_completes` injects ENOSPC in four
places: atomic writes after N calls, a history line torn halfway, `fsync` failing
inside the real atomic code path, and the champion files while finishing. The
operating system's error names no file ("No space left on device"); every writer
adds the file it was writing, so the line of `run`, `export --out` and `data
generate` says what failed
(`test_a_full_disk_names_the_file_that_could_not_be_written`).

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from evolve.io import atomic
from evolve.runs import rundir as runs
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.runkit import (POP, assert_loadable, champion_view, copy_run, enospc, proc_env,
                          read_history, reference_run, start, strip_timing)

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 3. kill -9 at random moments
# ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_kill9_at_random_moments_then_resume_completes_exactly(tmp_path, small_data_dir,
                                                               small_splits):
    """Seven SIGKILLs at random moments of a run with a horizon it never reaches;
    after each the directory loads. Then a resume to a close horizon completes with
    the history and champion of an undisturbed run.

    The moments are random but placed by states, never by a guessed start-up time
    (on a loaded machine start-up took longer than a 1.8 s window, every kill landed
    before the run directory existed, and the final resume found no run): every
    other kill comes at a random moment after this process has written a checkpoint
    (mid-run), the others at a random moment after the start (start-up, or mid-run on
    a fast machine)."""
    seed = 6
    parent = tmp_path / "runs"
    run_dir = parent / "k"
    rng = random.Random(20240601)
    common = ["--generations", 100000, "--data", small_data_dir, "--runs-dir", parent,
              "--no-writeback", "--json"]
    allowed = {"config.json", "history.jsonl", "checkpoint.json", "summary.json"}
    for i in range(7):
        if (run_dir / "config.json").exists():
            args = ["run", "--resume", "k", *common]
        else:                       # killed before the run directory existed: start again
            args = ["run", "--population", POP, "--seed", seed, "--name", "k", *common]
        before = _checkpoint_id(run_dir)
        proc = start(tmp_path, *args)
        if i % 2 == 0:              # mid-run: once this process has saved a generation
            _wait_until(proc, lambda: _checkpoint_id(run_dir) not in (None, before))
        time.sleep(rng.uniform(0.0, 1.0))
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        if run_dir.exists():
            assert_loadable(run_dir, small_splits)
            leftovers = [p.name for p in run_dir.iterdir() if p.name not in allowed]
            assert all(n.startswith(".") and n.endswith(".tmp") for n in leftovers), leftovers
    ckpt = runs.RunDir(run_dir).checkpoint()["generation"] if \
        (run_dir / "checkpoint.json").exists() else 0
    horizon = ckpt + 5
    res = subprocess.run([sys.executable, "-m", "evolve", "run", "--resume", "k",
                          "--generations", str(horizon), "--runs-dir", parent,
                          "--no-writeback", "--json"],
                         cwd=tmp_path, env=proc_env(tmp_path), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    ref_hist, ref_champ = reference_run(small_splits, horizon, seed)
    assert strip_timing(read_history(run_dir)) == ref_hist
    assert champion_view(run_dir)["tree"] == ref_champ
    assert not list(run_dir.glob(".*.tmp"))


def _checkpoint_id(run_dir) -> tuple | None:
    """Which checkpoint file is there (each atomic write is a new file), or None."""
    try:
        st = os.stat(run_dir / "checkpoint.json")
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _wait_until(proc, reached, timeout: float = 300.0) -> None:
    """Wait for a state of the process's run (the timeout only guards against a hang)."""
    t0 = time.monotonic()
    while not reached():
        if proc.poll() is not None:
            pytest.fail(f"the run ended early ({proc.returncode}): {proc.communicate()[1]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("the run never reached the state")
        time.sleep(0.01)


REFINISH = ("import evolve.runs.runner as r; r.now_iso = lambda: '2001-01-01T00:00:00+00:00'; "
            "from evolve.cli import main; main()")


@pytest.mark.slow
def test_refinish_in_a_new_process(tmp_path, finished_run):
    """A crash while finishing means the same champion.py is compiled again by the
    resumed process. With Numba's disk cache that crashed (the cached entry names
    a module no other process can import); the date is pinned so both processes
    generate byte-identical champion.py files."""
    run = copy_run(finished_run, tmp_path / "runs")
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", REFINISH, "run", "--resume", "r",
                              "--runs-dir", run.parent, "--no-writeback", "--json"],
                             cwd=tmp_path, env=proc_env(tmp_path), capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
    assert champion_view(run) == champion_view(finished_run)


def test_torn_last_history_line_is_ignored_and_resume_completes(tmp_path, finished_run,
                                                                 small_splits):
    run = copy_run(finished_run, tmp_path / "runs")
    good = read_history(run)
    with open(run / "history.jsonl", "a") as fh:
        fh.write('{"generation": 4, "evaluated": 3')   # a crash mid-append
    assert read_history(run) == good
    r = invoke("run", "--resume", "r", "--generations", 5, "--runs-dir", run.parent,
               "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    assert strip_timing(read_history(run)) == reference_run(small_splits, 5, 1)[0]


def test_torn_line_in_the_middle_is_an_error(tmp_path, finished_run):
    run = copy_run(finished_run, tmp_path / "runs")
    lines = (run / "history.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"
    (run / "history.jsonl").write_text("".join(lines))
    with pytest.raises(runs.RunError, match="line 2 is not valid JSON"):
        read_history(run)
    line = one_line_error(invoke("run", "--resume", "r", "--generations", 5,
                                 "--runs-dir", run.parent, "--no-writeback"))
    assert "history.jsonl" in line


def test_atomic_write_crash_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "f.json"
    atomic.atomic_write_json(target, {"v": 1})

    def torn_fsync(fd):
        raise OSError(errno.EIO, "simulated crash before the data reached the disk")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(atomic.os, "fsync", torn_fsync)
        with pytest.raises(OSError):
            atomic.atomic_write_json(target, {"v": 2, "pad": "x" * 100000})
    assert json.loads(target.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["f.json"]


def test_run_directory_appears_complete_or_not_at_all(tmp_path, small_data_dir):
    """A crash while creating the run directory leaves no half-made run behind."""
    parent = tmp_path / "runs"

    def crash(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "atomic_write_json", crash)
        r = invoke("run", "--population", POP, "--generations", 2, "--name", "c", "--data",
                   small_data_dir, "--runs-dir", parent, "--no-writeback")
    one_line_error(r)
    assert os.listdir(parent) == []
    r = invoke("run", "--population", POP, "--generations", 2, "--name", "c", "--data",
               small_data_dir, "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output


def test_resume_without_checkpoint_starts_from_the_seed(tmp_path, finished_run, small_splits):
    """kill -9 after config.json (and maybe history line 0) but before checkpoint 0."""
    run = copy_run(finished_run, tmp_path / "runs")
    for name in ("checkpoint.json", "hall_of_fame.json", "champion.json", "champion.py",
                 "summary.json"):
        (run / name).unlink()
    lines = (run / "history.jsonl").read_text().splitlines(keepends=True)
    (run / "history.jsonl").write_text(lines[0])
    (run / ".checkpoint.json.abc123.tmp").write_text("{")        # a killed atomic write
    r = invoke("run", "--resume", "r", "--runs-dir", run.parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    ref_hist, ref_champ = reference_run(small_splits, 3, 1)
    assert strip_timing(read_history(run)) == ref_hist
    assert champion_view(run) == champion_view(finished_run)
    assert not list(run.glob(".*.tmp"))


# ------------------------------------------------------------------------------------
# 8. Disk full / write errors
# ------------------------------------------------------------------------------------

def _fail_after(n, real, partial=None):
    """A stand-in for ``real`` that succeeds n times, then fails with ENOSPC."""
    calls = itertools.count()

    def fake(path, payload, *a, **kw):
        if next(calls) >= n:
            if partial:
                partial(path, payload)
            raise enospc(path)
        return real(path, payload, *a, **kw)
    return fake


def _half_line(path, line):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line[: len(line) // 2])             # the disk filled up mid-line


@pytest.mark.parametrize("command", ["export", "export --force", "data generate",
                                     "run"])
def test_a_full_disk_names_the_file_that_could_not_be_written(tmp_path, finished_run,
                                                              small_data_dir, command):
    """A write or an fsync on a full disk raises an OSError that names no file ("No
    space left on device" was the whole line): the line names the file the command
    was writing, and no temporary file is left beside it."""
    out = tmp_path / "out"
    out.mkdir()
    export = ("export", "done", "--format", "numpy", "--runs-dir", finished_run.parent,
              "--out", out / "rule.py")
    args = {"export": export, "export --force": (*export, "--force"),
            "data generate": ("data", "generate", "--out", out, "--sequences", 3),
            "run": ("run", "--population", POP, "--generations", 1, "--name", "d", "--data",
                    small_data_dir, "--runs-dir", out, "--no-writeback")}[command]
    if command == "export --force":
        (out / "rule.py").write_text("mine\n")

    def fsync(fd):
        raise enospc("")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", fsync)
        line = one_line_error(invoke(*args))
    assert "No space left on device" in line and str(out) in line, line
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    if command == "export --force":
        assert (out / "rule.py").read_text() == "mine\n"


@pytest.mark.parametrize("where,n", [
    ("checkpoint", 3),      # config.json, checkpoints 0 and 1 succeed; checkpoint 2 fails
    ("history", 4),         # history lines 0..3 succeed; line 4 is torn
    ("fsync", 9),           # the real atomic code path, failing inside a write
    ("finish", None),       # champion files while finishing
])
def test_disk_full_ends_run_cleanly_and_resume_completes(tmp_path, small_data_dir,
                                                         small_splits, where, n):
    parent = tmp_path / "runs"
    gens = 5
    args = ["run", "--population", POP, "--seed", 2, "--generations", gens, "--name", "d",
            "--data", small_data_dir, "--runs-dir", parent, "--no-writeback", "--json"]
    with pytest.MonkeyPatch.context() as mp:
        if where == "checkpoint":
            mp.setattr(atomic, "atomic_write_bytes", _fail_after(n, atomic.atomic_write_bytes))
        elif where == "history":
            mp.setattr(runs, "append_line", _fail_after(n, runs.append_line, _half_line))
        elif where == "fsync":
            real_fsync, calls = os.fsync, itertools.count()

            def fsync(fd):
                if next(calls) >= n:
                    raise enospc()
                return real_fsync(fd)
            mp.setattr(atomic.os, "fsync", fsync)
        else:
            real = runs.RunDir.write_json

            def write_json(self, name, obj):
                if name == "champion.json":
                    raise enospc(self.file(name))
                return real(self, name, obj)
            mp.setattr(runs.RunDir, "write_json", write_json)
        r = invoke(*args)
    line = one_line_error(r)
    assert "No space left on device" in line and "last good checkpoint is kept" in line, line
    assert "resume with: evolve run --resume d" in line
    last, ckpt = assert_loadable(parent / "d", small_splits)
    assert ckpt is not None and ckpt <= gens
    assert not list((parent / "d").glob(".*.tmp"))   # no temp file left behind
    r = invoke("run", "--resume", "d", "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    ref_hist, ref_champ = reference_run(small_splits, gens, 2)
    assert strip_timing(read_history(parent / "d")) == ref_hist
    assert champion_view(parent / "d")["tree"] == ref_champ
