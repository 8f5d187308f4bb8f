"""A resumed run ends exactly where the undisturbed one does, and only on the data it
started on.

Guarantee 4 of docs/reliability.md, Resume is exact:

The engine draws all randomness from its own `random.Random` state, which every
checkpoint stores. numpy's generator is not used. A run interrupted at generation k
and resumed gives the same history (every field except `timing`), hall of fame and
champion as the run that was never interrupted. `test_resume_is_exact_in_process[k]`
(k = 0, 1, 3 and the last generation) sends the state through JSON and reseeds both
global RNGs before the restore and the steps. It then compares the history,
champion, hall of fame, population, RNG state and full `state()`.
`test_resume_is_exact_end_to_end[k]` (k = 0, 2 and the last) sends a real SIGINT
during `evolve run`, then runs `evolve run --resume`, and compares `history.jsonl`,
`champion.json` and `hall_of_fame.json` with the uninterrupted run. The kill and
disk-full tests (tests/test_crash_safety.py) also compare against the
uninterrupted run.

Guarantee 11 of docs/reliability.md, A run continues only on the data it started on:

`config.json` records the sha256 of every split the run uses (`data.sha256`; over
each column's name, dtype, shape and bytes, so it follows the content whatever the
file form, `evolve/data/datasum.py`). `--resume` recomputes them and refuses data
that changed with one line naming the split (`--resume: split 'valid' in DIR has
changed since run NAME started ...`), exit code 2, the run's files unchanged. Runs
made before checksums were recorded are resumed unchecked. `--data` on `--resume` is
accepted only when it names the run's own data directory, and is refused before any
work otherwise (the final report used to read the other directory); the final report
always uses the run's data. An empty `--resume`, `--name` or `--runs-dir` is an
error, never "absent" (an empty `--resume` used to start a new run). `evolve data
generate --force` overwrites only splits that differ, and first keeps each one it
replaces as `<out>/previous/<split>-<sha256 prefix>.npz`, so a run that recorded the
old checksum can be resumed by moving that file back. Tests:
`test_checksums_of_every_split_are_recorded`,
`test_resume_on_changed_data_is_refused_naming_the_split[train|valid|test]`,
`test_resume_with_other_data_is_refused_before_any_work`,
`test_empty_run_options_are_errors[--resume|--name|--runs-dir]`,
`test_data_generate_force_keeps_the_previous_split`.

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal

import numpy as np
import pytest

from evolve.data import tokens as data
from evolve.data.sources import synthetic as synth
from evolve.runs import runner
from evolve.runs import rundir as runs
from evolve.search.config import Config
from evolve.search.engine import Evolution
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.runkit import (POP, champion_view, copy_run, listing, read_history, resume,
                          strip_timing)

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 4. Resume is exact
# ------------------------------------------------------------------------------------

G = 6


@pytest.mark.parametrize("k", [0, 1, 3, G])
def test_resume_is_exact_in_process(small_splits, k):
    cfg = dict(generations=G, population=POP, seed=11)
    ref = Evolution(Config(**cfg), small_splits["train"], small_splits["valid"])
    ref_hist = strip_timing([ref.initialise()] + [ref.step() for _ in range(G)])

    a = Evolution(Config(**cfg), small_splits["train"], small_splits["valid"])
    a.initialise()
    for _ in range(k):
        a.step()
    state = json.loads(json.dumps(a.state(), allow_nan=False))   # as checkpoint.json holds it
    # whatever the process did to the global RNGs meanwhile must not matter
    random.seed(12345)
    np.random.seed(54321)
    b = Evolution(Config(**cfg), small_splits["train"], small_splits["valid"])
    b.restore(state)
    random.seed(999)
    np.random.seed(999)
    rest = strip_timing([b.step() for _ in range(G - k)])
    assert rest == ref_hist[k + 1:]
    assert b.champion() == ref.champion()
    assert b.hof.entries == ref.hof.entries
    assert [str(i) for i in b.population] == [str(i) for i in ref.population]
    assert b.rng.getstate() == ref.rng.getstate()
    assert b.state() == ref.state()


@pytest.mark.parametrize("k", [0, 2, G])
def test_resume_is_exact_end_to_end(tmp_path, small_data_dir, k):
    """A real SIGINT (sent by the process to itself) at generation k, then
    `evolve run --resume`: same history and champion as the uninterrupted run."""
    parent = tmp_path / "runs"
    base = ["run", "--population", POP, "--seed", 8, "--generations", G, "--data",
            small_data_dir, "--runs-dir", parent, "--no-writeback", "--json"]
    assert invoke(*base, "--name", "ref").exit_code == 0

    def after(fn):
        def wrapped(self):
            rec = fn(self)
            if self.generation == k:
                os.kill(os.getpid(), signal.SIGINT)
            return rec
        return wrapped
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Evolution, "initialise", after(Evolution.initialise))
        mp.setattr(Evolution, "step", after(Evolution.step))
        r = invoke(*base, "--name", "cut")
    # a signal in the last generation lets the run finish; otherwise it stops at k
    assert r.exit_code == (0 if k == G else runner.EXIT_INTERRUPTED), r.output
    assert runs.RunDir(parent / "cut").checkpoint()["generation"] == k
    r = invoke("run", "--resume", "cut", "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    assert strip_timing(read_history(parent / "cut")) == \
        strip_timing(read_history(parent / "ref"))
    assert champion_view(parent / "cut") == champion_view(parent / "ref")
    assert json.loads((parent / "cut" / "hall_of_fame.json").read_text()) == \
        json.loads((parent / "ref" / "hall_of_fame.json").read_text())


# ------------------------------------------------------------------------------------
# 11. Resume on changed data is refused, --data on resume
# ------------------------------------------------------------------------------------

def test_checksums_of_every_split_are_recorded(finished, data_copy):
    from evolve.data import datasum
    meta = json.loads((finished / "config.json").read_text())
    want = datasum.digests(data.load_splits(data_copy))
    assert meta["data"]["sha256"] == want and set(want) == {"train", "valid", "test"}


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_resume_on_changed_data_is_refused_naming_the_split(tmp_path, finished, data_copy,
                                                           split):
    ddir = tmp_path / "data"
    shutil.copytree(data_copy, ddir)
    run = copy_run(finished, tmp_path / "runs")
    meta = json.loads((run / "config.json").read_text())
    meta["data"]["dir"] = str(ddir)
    (run / "config.json").write_text(json.dumps(meta))
    other = synth.generate(10, seed=999, name=split)       # same schema, other content
    data.save_npz(other, data.split_path(ddir, split))
    before = listing(run)
    line = one_line_error(resume(run))
    assert f"split '{split}'" in line and "changed" in line, line
    assert listing(run) == before


def test_data_generate_force_keeps_the_previous_split(tmp_path):
    out = tmp_path / "d"
    assert invoke("data", "generate", "--out", out, "--sequences", 3).exit_code == 0
    old = (out / "train.npz").read_bytes()
    r = invoke("data", "generate", "--out", out, "--sequences", 4)
    assert "--force" in one_line_error(r)
    assert (out / "train.npz").read_bytes() == old
    r = invoke("data", "generate", "--out", out, "--sequences", 4, "--force")
    assert r.exit_code == 0, r.output
    kept = list((out / "previous").glob("train-*.npz"))
    assert len(kept) == 1 and kept[0].read_bytes() == old
    assert (out / "train.npz").read_bytes() != old
    assert not list((out / "previous").glob("valid-*"))   # unchanged splits are not copied


def test_resume_with_other_data_is_refused_before_any_work(tmp_path, finished, small_data_dir):
    run = copy_run(finished, tmp_path / "runs")
    before = listing(run)
    line = one_line_error(resume(run, "--data", small_data_dir))
    assert "--data" in line and "cannot be changed on --resume" in line
    assert listing(run) == before
    recorded = json.loads((run / "config.json").read_text())["data"]["dir"]
    assert resume(run, "--data", recorded).exit_code == 0     # the run's own data: fine


@pytest.mark.parametrize("option", ["--resume", "--name", "--runs-dir"])
def test_empty_run_options_are_errors(tmp_path, data_copy, option):
    args = ["run", "--population", POP, "--generations", 1, "--data", data_copy,
            "--no-writeback"]
    if option != "--runs-dir":
        args += ["--runs-dir", tmp_path / "runs"]
    line = one_line_error(invoke(*args, option, ""))
    assert option in line
    assert not (tmp_path / "runs").exists()


def test_a_run_validates_its_configuration_once(tmp_path, small_data_dir, monkeypatch):
    """One lifecycle (``evolve.runs.lifecycle``): a new run validates its configuration
    once (when its options are made), a resumed run once (its own values and what was
    given, together), and a run of two starts once for itself and once for each start."""
    import evolve
    calls = []
    real = Config.validate
    monkeypatch.setattr(Config, "validate", lambda self: calls.append(self.seed) or real(self))
    runs_dir = tmp_path / "runs"
    common = dict(data_dir=small_data_dir, runs_dir=runs_dir, writeback=False)
    evolve.run(generations=1, population=12, seed=3, name="one", **common)
    assert calls == [3]
    calls.clear()
    evolve.run(resume="one", generations=2, runs_dir=runs_dir, writeback=False)
    assert calls == [3]
    calls.clear()
    evolve.run(generations=1, population=12, seed=5, starts=2, name="two", **common)
    assert calls == [5, 5, 6]
