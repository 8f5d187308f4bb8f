"""Runs as the reliability tests drive them: tiny budgets, copies of a finished run to
tamper with, real `evolve` processes, and the checks that a run directory loads and
that a resumed run matches the uninterrupted one.

Budgets are tiny (population 40, a few generations, the 30-sequence splits of
conftest). Every run uses a temporary --runs-dir and either --no-writeback or a
temporary heuristics directory; the ``isolated`` fixture of tests/clikit.py (which
every reliability test file uses module-wide) also points $EVOLVE_RUNS_DIR and
$EVOLVE_HEURISTICS_DIR at temporary directories, so the repository's runs/ and
heuristics/evolved.py are never touched. The finished runs to copy
(``finished_run``, ``finished``) and a copy of the small splits in a directory of
its own (``data_copy``) are fixtures of tests/conftest.py, built once per session.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from evolve.runs import rundir as runs
from evolve.search.config import Config
from evolve.search.engine import Evolution
from tests.clikit import ENV, invoke

REPO = Path(__file__).resolve().parent.parent
POP = 40                        # tiny population for every run here
GENS = 2                        # generations of the ``finished`` run (conftest)


def strip_timing(records):
    return [{k: v for k, v in r.items() if k != "timing"} for r in records]


def read_history(run_dir: Path):
    return runs.RunDir(run_dir).history()


def listing(root: Path) -> dict:
    """Every file under root with its bytes (to show that nothing changed)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def reference_run(splits, generations, seed):
    """The uninterrupted run, in-process: history without timing, champion tree."""
    ev = Evolution(Config(generations=generations, population=POP, seed=seed),
                   splits["train"], splits["valid"])
    hist = [ev.initialise()] + [ev.step() for _ in range(generations)]
    return strip_timing(hist), ev.champion().tree


def champion_view(run_dir: Path) -> dict:
    """champion.json without the timing it carries (eval_ms)."""
    ch = json.loads((run_dir / "champion.json").read_text())
    ch["metrics"] = {s: {k: v for k, v in m.items() if k != "eval_ms"}
                     for s, m in ch["metrics"].items()}
    return ch


def copy_run(src: Path, parent: Path, name: str = "r") -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    dst = parent / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def resume(run: Path, *extra):
    """`evolve run --resume` of a copy of the ``finished`` run, one generation on."""
    return invoke("run", "--resume", run.name, "--runs-dir", run.parent, "--no-writeback",
                  "--generations", GENS + 1, *extra)


def edit_json(path: Path, edit):
    doc = json.loads(path.read_text())
    doc = edit(doc)
    path.write_text(json.dumps(doc))


def write_zip(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return path


def enospc(path=""):
    return OSError(errno.ENOSPC, "No space left on device", str(path))


# ------------------------------------------------------------------------------------
# real subprocesses
# ------------------------------------------------------------------------------------

def proc_env(tmp_path: Path) -> dict:
    return {**os.environ, **ENV, "EVOLVE_RUNS_DIR": str(tmp_path / "default-runs"),
            "EVOLVE_HEURISTICS_DIR": str(tmp_path / "default-heuristics")}


def default_sigint() -> None:
    """In a child before it runs: Ctrl-C as a user at a terminal has it. A test suite
    started in the background by a shell without job control inherits SIGINT ignored,
    and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evolve", *map(str, args)], cwd=tmp_path,
                            env=proc_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)


def history_lines(run_dir: Path) -> int:
    try:
        return (run_dir / "history.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_history(proc, run_dir: Path, lines: int, timeout: float = 90.0) -> None:
    t0 = time.monotonic()
    while history_lines(run_dir) < lines:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process ended early ({proc.returncode}): {err[-2000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("no progress")
        time.sleep(0.02)


def assert_loadable(run_dir: Path, splits) -> tuple[int, int | None]:
    """Everything in the run directory loads; returns (last history gen, checkpoint gen)."""
    rd = runs.RunDir.open(run_dir.parent, run_dir.name)
    meta = rd.meta()
    hist = rd.history()                          # a torn last line is ignored, never fatal
    gens = [h["generation"] for h in hist]
    assert gens == list(range(len(gens)))
    for name in ("summary.json", "hall_of_fame.json", "champion.json"):
        if (run_dir / name).exists():
            json.loads((run_dir / name).read_text())
    if (run_dir / "champion.py").exists():
        ast.parse((run_dir / "champion.py").read_text())
    if not (run_dir / "checkpoint.json").exists():
        assert len(gens) <= 1                    # killed before the first checkpoint
        return (gens[-1] if gens else -1), None
    state = rd.checkpoint()
    ev = Evolution(Config.from_dict(meta["config"]), splits["train"], splits["valid"])
    ev.restore(state)
    # history is never behind the checkpoint and at most one line ahead of it
    assert gens[-1] - ev.generation in (0, 1), (gens[-1], ev.generation)
    return gens[-1], ev.generation
