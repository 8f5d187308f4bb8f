"""SIGINT and SIGTERM stop a run cleanly after its generation; a second one exits at once.

Guarantee 2 of docs/reliability.md, Interrupts:

The first SIGINT or SIGTERM lets the current generation finish. The run then writes
`checkpoint.json` and `summary.json` (status `interrupted`), prints the exact resume
command and exits with code 130. The command adds `--runs-dir` (shell-quoted) when
the runs directory is not the default, and keeps `--no-writeback`/`--force`. A
signal that arrives during the last generation or while finishing lets the run
finish. A second signal exits at once. The last complete checkpoint is still
loadable because every write is atomic. Tests (real subprocesses):
`test_signal_finishes_generation_saves_and_prints_resume[SIGINT|SIGTERM]` runs the
printed command and checks that the history matches an uninterrupted run.
`test_second_sigint_exits_at_once_leaving_checkpoint_intact` uses a large population
and sends the second SIGINT once the first has been acknowledged.
`test_stop_requested_handler_logic` checks the handler in-process.

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import json
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from evolve.runs import runner
from tests.clikit import isolated  # noqa: F401 (a fixture)
from tests.runkit import (POP, assert_loadable, proc_env, read_history, reference_run,
                          start, strip_timing, wait_for_history)

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finishes_generation_saves_and_prints_resume(tmp_path, small_data_dir,
                                                            small_splits, sig):
    parent = tmp_path / "my runs"                # a space: the command must quote it
    run_dir = parent / "r"
    proc = start(tmp_path, "run", "--population", POP, "--generations", 100000, "--seed", 3,
                 "--name", "r", "--data", small_data_dir, "--runs-dir", parent,
                 "--no-writeback")
    wait_for_history(proc, run_dir, 2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == runner.EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    expected = f"evolve run --resume r --runs-dir {shlex.quote(str(parent))} --no-writeback"
    assert f"resume with: {expected}\n" in err, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name
    assert summary["resume"] == expected
    last, ckpt = assert_loadable(run_dir, small_splits)
    assert last == ckpt == summary["generation"] >= 1   # the generation was finished and saved
    if sig == signal.SIGINT:
        # the printed command, verbatim, continues the run (a short horizon added)
        cmd = shlex.split(expected)[1:] + ["--generations", str(ckpt + 2), "--json"]
        res = subprocess.run([sys.executable, "-m", "evolve", *cmd], cwd=tmp_path,
                             env=proc_env(tmp_path), capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["status"] == "finished"
        hist = read_history(run_dir)
        assert [h["generation"] for h in hist] == list(range(ckpt + 3))
        assert strip_timing(hist) == reference_run(small_splits, ckpt + 2, 3)[0]


@pytest.mark.slow
def test_second_sigint_exits_at_once_leaving_checkpoint_intact(tmp_path, small_data_dir,
                                                               small_splits):
    """Large population so that a generation takes a while: the second SIGINT is
    sent as soon as the first one is acknowledged, well inside the generation."""
    for attempt in range(3):
        parent = tmp_path / f"runs{attempt}"
        run_dir = parent / "r"
        proc = start(tmp_path, "run", "--population", 6000, "--generations", 100000,
                     "--seed", 4, "--name", "r", "--data", small_data_dir,
                     "--runs-dir", parent, "--no-writeback")
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr],
                         daemon=True).start()
        wait_for_history(proc, run_dir, 2)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            try:
                if lines.get(timeout=1).startswith("interrupt: finishing"):
                    break
            except queue.Empty:
                pass
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        time.sleep(0.2)
        err = "".join(lines.queue)
        assert rc == runner.EXIT_INTERRUPTED, err
        if "second interrupt" not in err:
            continue          # the generation ended before the second signal: try again
        assert "Traceback" not in err
        assert not (run_dir / "summary.json").exists()      # exited at once: no summary
        last, ckpt = assert_loadable(run_dir, small_splits)
        assert ckpt is not None        # the last complete checkpoint (it may be mid-write)
        res = subprocess.run([sys.executable, "-m", "evolve", "run", "--resume", "r",
                              "--runs-dir", parent, "--no-writeback", "--json",
                              "--generations", str(ckpt + 1)], cwd=tmp_path,
                             env=proc_env(tmp_path), capture_output=True, text=True,
                             timeout=180)
        assert res.returncode == 0, res.stderr
        return
    pytest.fail("the second SIGINT never arrived inside a generation")


def test_stop_requested_handler_logic(monkeypatch):
    """In-process: first signal sets the flag, second calls os._exit(130)."""
    exits = []
    monkeypatch.setattr(runner.os, "_exit", lambda code: exits.append(code))
    with runner.StopRequested(None) as stop:
        assert signal.getsignal(signal.SIGINT) == stop._handle
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        stop._handle(signal.SIGTERM, None)
        assert stop.requested and stop.signal_name == "SIGTERM" and exits == []
        stop._handle(signal.SIGINT, None)
        assert exits == [130]
    assert signal.getsignal(signal.SIGINT) is not stop._handle
