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

Guarantee 40 of docs/reliability.md, Ctrl-C ends every command the same way:

Every other command ends the same way on Ctrl-C (`friendly_errors` in
evolve/cli/common.py; `evolve run` prints its line through the same function): one
line, `interrupted: evolve COMMAND: ...`, saying what was under way and what was kept
or not written, and exit code 130, never click's "Aborted!" and exit 1. Each test
sends SIGINT once the command has printed a state on stderr:
`test_ctrl_c_while_recording_a_task_writes_nothing` (`evolve data task`, recording),
`test_ctrl_c_after_a_task_split_keeps_it_and_resumes` (a split written stays, and
`--resume` continues from it),
`test_ctrl_c_in_simulate_task_is_one_line` and
`test_ctrl_c_while_sharding_keeps_the_splits_in_place_and_says_so` (`evolve data
shard`: a split is complete or absent).

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import json
import os
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
from tests.runkit import (POP, assert_loadable, default_sigint, proc_env, read_history,
                          reference_run, start, strip_timing, wait_for_history)

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


# ------------------------------------------------------------------ every command

class Lines:
    """A process's stderr, read line by line in a thread (so waiting can time out)."""

    def __init__(self, proc):
        self.proc, self.q, self.seen = proc, queue.Queue(), []
        threading.Thread(target=lambda: [self.q.put(x) for x in proc.stderr],
                         daemon=True).start()

    def wait(self, prefix: str, timeout: float = 300.0) -> None:
        """Until a line starting with ``prefix`` (the state); the timeout only guards
        against a hang."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                line = self.q.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None and self.q.empty():
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return
        self.proc.kill()
        pytest.fail(f"never printed {prefix!r}: {''.join(self.seen)[-3000:]}")

    def end(self, timeout: float = 120.0) -> tuple[int, str]:
        """(exit code, all of stderr) once the process has ended."""
        rc = self.proc.wait(timeout=timeout)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            try:
                self.seen.append(self.q.get(timeout=0.2))
            except queue.Empty:
                break
        return rc, "".join(self.seen)


def interrupted_line(rc: int, err: str, command: str, *needles) -> str:
    """Exit code 130 and, last on stderr, the one line of an interrupted command."""
    assert rc == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted: {command}: "), err
    assert "Traceback" not in err and "Aborted" not in err, err
    for n in needles:
        assert n in last, (n, last)
    return last


def start_patched(tmp_path, patch: str, *args) -> subprocess.Popen:
    """``evolve ARGS`` in a process that first runs ``patch`` (a test's hold point)."""
    code = f"{patch}\nfrom evolve.cli import main\nmain()\n"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=tmp_path,
                            env=proc_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)


@pytest.mark.slow
def test_ctrl_c_while_recording_a_task_writes_nothing(tmp_path):
    out = tmp_path / "task"
    proc = start(tmp_path, "data", "task", "--out", out, "--train-prompts", 200,
                 "--valid-prompts", 8, "--test-prompts", 8)
    err = Lines(proc)
    err.wait("task pair built")            # recording the train split from here on
    proc.send_signal(signal.SIGINT)
    interrupted_line(*err.end(), "evolve data task", "recording and mining train",
                     "continue with --resume")
    assert not out.exists()


# the valid split waits once train is written
HOLD_TASK_VALID = """
import os, sys, time
from evolve.data.sources.task import record
real = record.record_traces
def record_traces(pair, split, *args, **kwargs):
    if split == "valid":
        print("RECORDING valid", file=sys.stderr, flush=True)
        time.sleep(600)
    return real(pair, split, *args, **kwargs)
record.record_traces = record_traces
"""


@pytest.mark.slow
def test_ctrl_c_after_a_task_split_keeps_it_and_resumes(tmp_path):
    out = tmp_path / "task"
    sizes = ("--train-prompts", 4, "--valid-prompts", 2, "--test-prompts", 2)
    proc = start_patched(tmp_path, HOLD_TASK_VALID, "data", "task", "--out", out, *sizes)
    err = Lines(proc)
    err.wait("RECORDING valid")
    proc.send_signal(signal.SIGINT)
    interrupted_line(*err.end(), "evolve data task", "recording and mining valid",
                     "continue with --resume")
    from evolve.data.sources.task import record
    assert len(record.load(out, "train").traces) > 0 and not (out / "valid.npz").exists()
    from tests.clikit import invoke
    r = invoke("data", "task", "--out", out, *sizes, "--resume")
    assert r.exit_code == 0, r.output
    for split in ("train", "valid", "test"):      # all three, each with its labels
        assert len(record.load(out, split).traces) > 0


@pytest.mark.slow
def test_ctrl_c_in_simulate_task_is_one_line(tmp_path, task_greedy_small):
    proc = start(tmp_path, "simulate-task", "--data", task_greedy_small, "--split", "train",
                 "--compare", "lossless", "--compare", "leniency:0.5", "--compare",
                 "leniency:0.8")
    err = Lines(proc)
    err.wait("lossless: decoding")
    proc.send_signal(signal.SIGINT)
    interrupted_line(*err.end(), "evolve simulate-task", "decoding the train problems",
                     "nothing was written")


# the valid split waits, its shards written but not yet in place
HOLD_SHARD_COMMIT = """
import sys, time
from evolve.data import shard_writer
real = shard_writer.SplitWriter.commit
def commit(self):
    if self.out.name == "valid":
        print("COMMITTING valid", file=sys.stderr, flush=True)
        time.sleep(600)
    return real(self)
shard_writer.SplitWriter.commit = commit
"""


@pytest.mark.slow
def test_ctrl_c_while_sharding_keeps_the_splits_in_place_and_says_so(tmp_path):
    from evolve.data import traces
    from tests import tracekit
    src, out = tmp_path / "traces", tmp_path / "shards"
    for s in traces.SPLITS:
        traces.save(tracekit.split(s), src / f"{s}.npz")
    proc = start_patched(tmp_path, HOLD_SHARD_COMMIT, "data", "shard", src, "--out", out,
                         "--rows-per-shard", 64)
    err = Lines(proc)
    err.wait("COMMITTING valid")
    proc.send_signal(signal.SIGINT)
    interrupted_line(*err.end(), "evolve data shard", f"train written to {out}",
                     "valid, test not written")
    assert sorted(p.name for p in out.iterdir()) == ["train"]     # no partial split left
