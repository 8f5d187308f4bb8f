"""Hostile run directories, concurrent resumes, changed data and pathological files
(docs/reliability.md, guarantees 9 to 14). Each test fails without the behaviour
it names.

Budgets are tiny (population 40, a few generations, the 30-sequence splits of
conftest); runs use a temporary --runs-dir and --no-writeback, and the fixture
below points $EVOLVE_RUNS_DIR and $EVOLVE_HEURISTICS_DIR at temporary
directories, so the repository's runs/ and heuristics/evolved.py are never
touched.

Guarantee 9 of docs/reliability.md, Nothing in a run directory is imported or run:

Champions are scored from their parsed trees by the kernel; `champion.py` is
written, never read; write-back reads the installed rule's tree from the `METADATA`
literal with `ast.literal_eval`. `test_files_planted_in_a_run_directory_never_run`
plants `champion.py`, `numba.py`, `numpy.py`, `heuristics.py`, `sitecustomize.py`
and `__init__.py` that would create a marker file, then runs `inspect`, `runs` and a
resume that finishes the run: no marker appears and `champion.py` is regenerated
from the tree. The static scan of 6 also forbids
`exec_module`/`spec_from_file_location` in `evolve/`.

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

Guarantee 11 of docs/reliability.md, A run continues only on the data it started on:

`config.json` records the sha256 of every split the run uses (`data.sha256`; over
each column's name, dtype, shape and bytes, so it follows the content whatever the
file form, `evolve/runs/datasum.py`). `--resume` recomputes them and refuses data
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

Guarantee 12 of docs/reliability.md, One JSON reader, with the same limits everywhere:

Run files, `history.jsonl` lines, data splits in JSON form and the `meta.json` of
split files are all read by `evolve/io/jsonio.py`: regular files only, a byte cap
(64 MiB for run files, 1 GiB for a JSON split, 1 MiB for a `meta.json`), nesting at
most 64 levels (checked before parsing), integers of at most 40 digits, and only
finite numbers: `NaN`, `Infinity` and overflowing literals such as `1e999` are
refused (the project never writes them; a JSON data split may hold them, and its
validation then names the field and row). Every failure is one line naming the file
(and the line of `history.jsonl`), exit code 2. Trace metadata is also range-checked
(`block_size`, `top_k`, `context_len` whole numbers up to 2^20), and a recorded
trace configuration is type-checked and bounded before `simulate` rebuilds the
models from it (a whole number `prompt_len` of at most 100,000, finite numbers,
...); one that still cannot be rebuilt is one line. Option bounds: `data generate
--seed` must be >= 0 and `--sequences` at most 10,000,000; `data trace
--temperature` must be finite, prompts per split at most 1,000,000, blocks per
prompt at most 10,000 and a split at most 20,000,000 rows. Tests:
`test_json_reader_limits`, `test_data_json_import_hostile`,
`test_history_line_hostile`, `test_trace_meta_hostile`,
`test_trace_meta_absurd_values`, `test_simulate_refuses_a_config_it_cannot_rebuild`,
`test_absurd_data_options_are_one_line`, and in `tests/test_reliability.py`
`test_crafted_checkpoint_file_rejected`.

Guarantee 13 of docs/reliability.md, Run files are checked against schemas; output is escaped:

Every run file is validated on read (`evolve/runs/schema.py`): `summary.json` must
be an object with a known status, whole-number generation and a resume command that
is exactly one `evolve run` prints (`evolve run --resume NAME [--runs-dir DIR]
[--no-writeback] [--force]`); `champion.json` needs a tree and finite metrics for
valid and test; every history line needs a whole-number generation and finite
`best_train`, `best_valid` and `mean_size`; `pareto.json` needs a finite budget and
series of finite points within 1e6. A file that does not fit is one line naming the
file, the line (for history), the field and the value. `evolve inspect` of such a
run fails in that line; `evolve runs` shows it as `damaged: ...` and lists every
other run. Everything printed goes through one terminal (`evolve/cli/render.py`)
that never reads text as rich markup or emoji codes and shows control characters
(C0, C1, DEL, bidi overrides, zero-width characters) as escapes such as `\\x1b`, so a
crafted file can neither clear the screen nor move the cursor nor fake a line;
values read from `config.json` are shown on one line. Tests:
`test_crafted_run_file_inspect_one_line_and_runs_lists_the_rest` (12 crafted
summaries and champions), `test_crafted_history_line`,
`test_missing_history_field_names_file_line_and_field`, `test_crafted_pareto_file`
(±1e308 included), `test_control_sequences_and_markup_from_run_files_are_escaped`,
`test_terminal_escapes_everything_it_prints`.

Guarantee 14 of docs/reliability.md, Reading is bounded:

Files read from a run or data directory must be regular files: a FIFO, a device
(also behind a symlink, e.g. to `/dev/zero`) or a directory is refused before it is
opened (JSON files are also opened non-blocking and checked again once open), so a
read can neither hang nor run without end. Each `.npy` member of a split file is
checked against the shape its header declares before anything is allocated (at most
4 GiB of arrays per split; object arrays refused), then read with exactly that many
bytes as its cap: a small compressed member that inflates beyond its declared shape
is refused after reading at most its declared size. Tests:
`test_npz_member_declaring_a_huge_shape_is_refused_before_allocating`,
`test_npz_member_that_inflates_beyond_its_shape_is_refused` (64 MiB of zeros in a
small file, refused in well under a second),
`test_npz_compressed_bomb_with_a_big_declared_shape_is_refused`,
`test_object_arrays_are_refused`. A split file (trace or token) that holds two zip
members of one name, of which a reader would silently take the last, is refused
naming the file and the member
(`test_a_member_held_twice_is_refused_naming_file_and_member`,
`test_a_token_split_member_held_twice_is_refused`). Also:
`test_non_regular_files_are_refused_without_reading[fifo|device|directory]`
(checkpoint, history, a data split and a JSON import), `test_json_read_is_capped`.

Guarantee 15 of docs/reliability.md, A broken hand-edited `heuristics/evolved.py`:

`evolve benchmark` imports the installed `heuristics/evolved.py` (part of the
package; the one file of it that write-back replaces) to time the installed rule.
When that module cannot be imported, lacks the `evolved` function, cannot be
compiled with the heuristic signature (wrong arity, wrong return type) or raises
when called, the command prints one `warning: evolved skipped: ...` line naming the
reason and benchmarks the baselines; exit code 0. Tests:
`test_broken_evolved_is_reported_and_baselines_still_benchmarked` (syntax error,
missing function, wrong signature, wrong return type, raising on import, raising
when called).

Guarantee 16 of docs/reliability.md, Trees within the run's limits:

Every tree a run makes is within its `max_size` and `max_height` (DEAP's static
limit on variation; seeded baselines larger than the limits are left out of the
first population). A checkpoint whose population, hall of fame or valid hall of fame
holds a larger tree is refused on resume in one line naming the field, the item and
the limit. Test: `test_checkpoint_tree_beyond_limits_is_refused` (too many nodes,
too tall; each of the three fields).

Guarantee 29 of docs/reliability.md, Trace schema v3: slot features, checked like the rest:

Trace files of schema v3 carry four slot features (TV, both KLs and the count of
tokens with q > p, from the full distributions). A file that holds only some of them
is refused when written (`DataError` naming the first missing field), so a half-v3
file never reaches disk. Loading checks each (finite, `slot_tv` in [0, 1], both KLs
>= 0, the count within the vocabulary, and where the candidates hold all of both
distributions' mass, `slot_tv` equal to their TV within 1e-9) and names file, field,
row and value, like the v2 fields. A file of any other `format_version` (4, `3.0`,
`true`, `"3"`) is refused saying that version is not supported, not described as
token splits (`test_an_unsupported_trace_version_is_named_as_such`). Version 2 files
still load unchanged; where their candidates hold the whole vocabulary the features
are computed from them exactly. A rule that reads a slot feature on a split without
it (a v2 file whose candidates miss some of the mass, or v2 shards) is refused in
one line naming the file and the missing field, exit code 2, never scored on made-up
values; a search on such data is not offered the slot inputs, and `evolve tradeoff`
lists the slot baselines as not exact there, with that reason. A sharded copy of v3
traces keeps the slot features (manifest `schema_version: 3`), so a search over the
shards is offered the same inputs and runs the same as over the `.npz` files. Tests:
`tests/test_slot_features.py`, `tests/test_cluster.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from evolve.cli.render import Terminal
from evolve.data import tokens as data
from evolve.data import traces
from evolve.data.sources import synthetic as synth
from evolve.runs import rundir as runs
from tests.clikit import ENV, invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated")

REPO = Path(__file__).resolve().parent.parent
POP = 40                    # tiny population for every run here
GENS = 2                    # generations of the shared finished run
PWNED = "PWNED"             # a marker file hostile content tries to create
ESC = "\x1b"


def listing(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def data_copy(tmp_path_factory, small_data_dir):
    """The small splits in a directory of this module's own (other data than
    ``small_data_dir`` for --resume, and free to be copied and tampered with)."""
    d = tmp_path_factory.mktemp("data") / "splits"
    shutil.copytree(small_data_dir, d)
    return d


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_copy):
    """A finished run of GENS generations on ``data_copy``, to copy and tamper with."""
    parent = tmp_path_factory.mktemp("finished")
    r = invoke("run", "--population", POP, "--generations", GENS, "--seed", 1, "--name", "done",
               "--data", data_copy, "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    return parent / "done"


def copy_run(src: Path, parent: Path, name: str = "r") -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, parent / name)
    return parent / name


def resume(run: Path, *extra):
    return invoke("run", "--resume", run.name, "--runs-dir", run.parent, "--no-writeback",
                  "--generations", GENS + 1, *extra)


# ------------------------------------------------------------------------------------
# 9. Nothing in a run directory is imported or run (item 1)
# ------------------------------------------------------------------------------------

HOSTILE_PY = f"open({PWNED!r}, 'w').write('x')\n"


def test_files_planted_in_a_run_directory_never_run(tmp_path, finished, monkeypatch):
    """champion.py, and modules named like what the harness imports, planted in a run
    directory: inspect, runs, simulate-free resume and refinish never execute them."""
    monkeypatch.chdir(tmp_path)
    run = copy_run(finished, tmp_path / "runs")
    for name in ("champion.py", "numba.py", "numpy.py", "heuristics.py", "evolved.py",
                 "sitecustomize.py", "__init__.py"):
        (run / name).write_text(HOSTILE_PY)
    assert invoke("inspect", "r", "--runs-dir", run.parent).exit_code == 0
    assert invoke("runs", "--runs-dir", run.parent).exit_code == 0
    r = resume(run)
    assert r.exit_code == 0, r.output
    assert not (tmp_path / PWNED).exists()
    # champion.py is rewritten from the parsed tree, never read
    assert "PWNED" not in (run / "champion.py").read_text()


# ------------------------------------------------------------------------------------
# 10. A live run owns its directory (item 2)
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


# ------------------------------------------------------------------------------------
# 11. Resume on changed data is refused (item 3), --data on resume (item 9)
# ------------------------------------------------------------------------------------

def test_checksums_of_every_split_are_recorded(finished, data_copy):
    from evolve.runs import datasum
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


# ------------------------------------------------------------------------------------
# 12. One JSON reader: same limits, one-line errors everywhere (items 4, 8)
# ------------------------------------------------------------------------------------

HOSTILE_JSON = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "digits": ("[" + "9" * 5000 + "]", "digits"),
    "infinity": ('{"x": Infinity}', "non-finite"),
    "overflow": ('{"x": 1e999}', "out of range"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_json_reader_limits(case):
    from evolve.io import jsonio
    text, words = HOSTILE_JSON[case]
    with pytest.raises(jsonio.JsonError, match=words):
        jsonio.loads(text, "f.json")


@pytest.mark.parametrize("case", ["deep", "digits"])
def test_data_json_import_hostile(tmp_path, case):
    f = tmp_path / "x.json"
    f.write_text(HOSTILE_JSON[case][0])
    line = one_line_error(invoke("data", "import", f, "--split", "train",
                                 "--out", tmp_path / "o"))
    assert str(f) in line and HOSTILE_JSON[case][1] in line


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_history_line_hostile(tmp_path, finished, case):
    run = copy_run(finished, tmp_path / "runs")
    with open(run / "history.jsonl", "a") as fh:
        fh.write(HOSTILE_JSON[case][0] + "\n")
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "history.jsonl" in line and HOSTILE_JSON[case][1] in line


def _zip(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_trace_meta_hostile(tmp_path, case):
    text, words = HOSTILE_JSON[case]
    f = _zip(tmp_path / "train.npz", {"meta.json": text})
    with pytest.raises(data.DataError, match=words):
        traces.load(f)
    assert not traces.is_trace_file(f)


@pytest.mark.parametrize("version", ["4", "3.0", "true", '"3"', "1.0", "null"])
def test_an_unsupported_trace_version_is_named_as_such(tmp_path, data_copy, version):
    """A trace file whose format_version is not 2 or 3 (4, 3.0, true, "3") was
    described as "holds token splits": the line says the version is not supported.
    Token splits (format_version 1) are still named as such."""
    from tests import tracekit
    d = tmp_path / "t"
    for s in traces.SPLITS:
        traces.save(tracekit.split(s), d / f"{s}.npz")
        with zipfile.ZipFile(d / f"{s}.npz") as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        meta = json.loads(members["meta.json"])
        text = json.dumps(meta).replace(f'"format_version": {meta["format_version"]}',
                                        f'"format_version": {version}')
        _zip(d / f"{s}.npz", {**members, "meta.json": text})
    run = ("run", "--objective", "speed", "--generations", 1, "--population", 10,
           "--no-writeback", "--runs-dir", tmp_path / "runs", "--data")
    line = one_line_error(invoke(*run, d), "train.npz", "format_version", "not supported")
    assert "token splits, version 1" in line and "holds token splits" not in line, line
    one_line_error(invoke(*run, data_copy), "holds token splits")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("key,value", [("block_size", 10 ** 30), ("block_size", 2.5),
                                       ("top_k", -1), ("context_len", True)])
def test_trace_meta_absurd_values(tmp_path, key, value):
    from tests import tracekit
    ts = tracekit.split("test")
    f = tmp_path / "test.npz"
    traces.save(traces.TraceSplit(ts.columns, {**ts.meta, key: value}, "test"), f)
    with pytest.raises(data.DataError, match=key):
        traces.load(f)


def test_simulate_refuses_a_config_it_cannot_rebuild(tmp_path):
    from tests import tracekit
    ts = tracekit.split("test")
    for key, value in (("prompt_len", 10 ** 12), ("seed", "0"), ("temperature", 1e300 * 0),
                       ("max_files", -3)):
        meta = {**ts.meta, "config": {**ts.meta["config"], key: value}}
        if isinstance(value, float) and value != value:
            continue                       # NaN cannot even be written (allow_nan=False)
        d = tmp_path / key
        traces.save(traces.TraceSplit(ts.columns, meta, "test"), d / "test.npz")
        r = invoke("simulate", "--heuristic", "standard_rejection", "--data", d,
                   "--split", "test")
        assert r.exit_code == 2 and "Traceback" not in r.output, (r.output, r.exception)
        line = r.stderr.strip().splitlines()[-1]      # after a progress note
        assert line.startswith("error: ") and "config" in line and key in line, line


@pytest.mark.parametrize("args,words", [
    (["data", "generate", "--seed", "-5"], "--seed"),
    (["data", "trace", "--temperature", "inf"], "--temperature"),
    (["data", "trace", "--temperature", "nan"], "--temperature"),
    (["data", "trace", "--train-prompts", str(10 ** 12)], "--train-prompts"),
    (["data", "trace", "--blocks-per-prompt", str(10 ** 12)], "--blocks-per-prompt"),
    (["data", "trace", "--train-prompts", "900000", "--blocks-per-prompt", "9000"],
     "--train-prompts"),
])
def test_absurd_data_options_are_one_line(tmp_path, args, words):
    line = one_line_error(invoke(*args, "--out", tmp_path / "o"))
    assert words in line
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------
# 13. Run files are checked against schemas; one damaged run does not hide the others
#     (items 5, 10)
# ------------------------------------------------------------------------------------

def _edit_json(path: Path, edit):
    doc = json.loads(path.read_text())
    doc = edit(doc)
    path.write_text(json.dumps(doc))


def _set(key, value):
    def edit(doc):
        doc[key] = value
        return doc
    return edit


def _metric(split, value):
    def edit(doc):
        doc["metrics"][split] = value
        return doc
    return edit


CRAFTED = [
    ("summary.json", lambda d: [1, 2], "summary must be a JSON object"),
    ("summary.json", lambda d: "finished", "summary must be a JSON object"),
    ("summary.json", _set("status", {"x": 1}), "'status'"),
    ("summary.json", _set("generation", "3"), "'generation'"),
    ("summary.json", _set("resume", "rm -rf ~"), "'resume'"),
    ("summary.json", _set("resume", "evolve run --resume r; rm -rf ~"), "'resume'"),
    ("champion.json", _set("metrics", [1, 2]), "'metrics'"),
    ("champion.json", _set("metrics", "good"), "'metrics'"),
    ("champion.json", _metric("valid", [0.5]), "'metrics.valid'"),
    ("champion.json", _metric("test", {"fitness": "0.5"}), "'metrics.test.accept_rate'"),
    ("champion.json", _set("generation", -1), "'generation'"),
    ("champion.json", lambda d: None, "champion must be a JSON object"),
]


@pytest.mark.parametrize("name,edit,words", CRAFTED)
def test_crafted_run_file_inspect_one_line_and_runs_lists_the_rest(tmp_path, finished, name,
                                                                   edit, words):
    parent = tmp_path / "runs"
    copy_run(finished, parent, "good")
    run = copy_run(finished, parent, "r")
    _edit_json(run / name, edit)
    line = one_line_error(invoke("inspect", "r", "--runs-dir", parent))
    assert name in line and words in line, line
    r = invoke("runs", "--runs-dir", parent, "--json")
    assert r.exit_code == 0, r.output
    rows = {row["run"]: row for row in json.loads(r.stdout)}
    assert rows["good"]["status"] == "finished" and rows["good"]["valid_fitness"] is not None
    assert rows["r"]["status"].startswith("damaged: ") and name in rows["r"]["status"]
    r = invoke("runs", "--runs-dir", parent)
    assert r.exit_code == 0 and "damaged" in r.stdout and "good" in r.stdout


@pytest.mark.parametrize("field,value,words", [
    ("best_train", "NaN", "non-finite"),
    ("best_train", '"high"', "'best_train'"),
    ("best_valid", "1e999", "out of range"),
    ("mean_size", "[1]", "'mean_size'"),
    ("generation", "-2", "'generation'"),
])
def test_crafted_history_line(tmp_path, finished, field, value, words):
    run = copy_run(finished, tmp_path / "runs")
    lines = (run / "history.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    rec[field] = "@@"
    lines[1] = json.dumps(rec).replace('"@@"', value)
    (run / "history.jsonl").write_text("\n".join(lines) + "\n")
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "history.jsonl" in line and "line 2" in line and words in line, line


def test_missing_history_field_names_file_line_and_field(tmp_path, finished):
    run = copy_run(finished, tmp_path / "runs")
    lines = (run / "history.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    del rec["best_train"]
    lines[0] = json.dumps(rec)
    (run / "history.jsonl").write_text("\n".join(lines) + "\n")
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "history.jsonl: line 1" in line and "'best_train'" in line, line


@pytest.mark.parametrize("series,budget,words", [
    ({"a": [[1e308, 1.0], [-1e308, 2.0]]}, 0.02, "'series.a'"),
    ({"a": [[0.01, "x"]]}, 0.02, "'series.a'"),
    ({"a": "points"}, 0.02, "'series.a'"),
    ({"a": [[0.01, 2.0]]}, -1e308, "'budget'"),
])
def test_crafted_pareto_file(tmp_path, finished, series, budget, words):
    run = copy_run(finished, tmp_path / "runs")
    (run / "pareto.json").write_text(json.dumps({"split": "valid", "budget": budget,
                                                 "series": series}))
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "pareto.json" in line and words in line, line


def test_control_sequences_and_markup_from_run_files_are_escaped(tmp_path, finished):
    run = copy_run(finished, tmp_path / "runs")
    _edit_json(run / "config.json",
               lambda d: {**d, "config": {**d["config"], "seed": "\x1b[2J[bold red]x\x07",
                                          "\x1b]0;title\x07": "\u202egnp.exe\nfake line"}})
    r = invoke("inspect", "r", "--runs-dir", run.parent)
    assert r.exit_code == 0, r.output
    assert ESC not in r.output and "\x07" not in r.output and "\u202e" not in r.output
    assert "\\x1b[2J[bold red]x\\x07" in r.stdout          # shown, escaped, no markup
    assert "\nfake line" not in r.stdout
    # a crafted summary: listed as damaged, and printing the listing moves nothing
    (run / "summary.json").write_text(json.dumps({"status": "\x1b[2J\x1b[1;1Hfinished"}))
    r = invoke("runs", "--runs-dir", run.parent)
    assert r.exit_code == 0 and ESC not in r.output and "damaged" in r.stdout


def test_terminal_escapes_everything_it_prints(capsys):
    from evolve.cli.render import printable
    assert printable("a\x1bb\x9bc\u202ed\n") == "a\\x1bb\\x9bc\\u202ed\\x0a"
    assert printable("x\ny", keep_newlines=True) == "x\ny"
    t = Terminal()
    t.table("[bold]t\x1b", [("h[red]", "left")], [["[blink]v\x1b[5m"]])
    t.result("r[bold]\x1b[0m")
    t.error("e\x1b[2J\nsecond line")
    out, err = capsys.readouterr()
    assert ESC not in out + err
    assert "[blink]v\\x1b[5m" in out and "[bold]t" in out and "r[bold]" in out
    assert err.count("\n") == 1 and "second line" not in err


# ------------------------------------------------------------------------------------
# 14. Resource limits while reading (item 6)
# ------------------------------------------------------------------------------------

def _npy(shape, dtype="<f8", payload: bytes = b"") -> bytes:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload


def test_npz_member_declaring_a_huge_shape_is_refused_before_allocating(tmp_path):
    f = _zip(tmp_path / "train.npz", {"draft_prob.npy": _npy((10 ** 15,), payload=b"\0" * 8)})
    with pytest.raises(data.DataError, match="declares shape"):
        data.load_npz(f)


def test_npz_member_that_inflates_beyond_its_shape_is_refused(tmp_path):
    f = tmp_path / "train.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("draft_prob.npy", _npy((4,), payload=b"\0" * (64 * 1024 * 1024)))
    assert f.stat().st_size < 1024 * 1024                  # a small file ...
    t0 = time.perf_counter()
    with pytest.raises(data.DataError, match="more data than its shape"):
        data.load_npz(f)                                   # ... not inflated whole
    assert time.perf_counter() - t0 < 5


def test_npz_compressed_bomb_with_a_big_declared_shape_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_SPLIT_BYTES", 1024 * 1024)
    f = tmp_path / "train.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("draft_prob.npy", _npy((1024 * 1024,), payload=b"\0" * (8 * 1024 * 1024)))
    with pytest.raises(data.DataError, match="limit"):
        data.load_npz(f)


def test_object_arrays_are_refused(tmp_path):
    f = _zip(tmp_path / "train.npz", {"draft_prob.npy": _npy((1,), dtype="|O")})
    with pytest.raises(data.DataError, match="object arrays|not a readable"):
        data.load_npz(f)


def _with_a_second_copy(src: Path, dst: Path, member: str, change) -> Path:
    """``src`` copied to ``dst`` with one more member named ``member``: ``change`` of
    its bytes (readers that take the last copy would read that one)."""
    import warnings
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(dst) as zf:
        payload = zf.read(member)
    with warnings.catch_warnings(), zipfile.ZipFile(dst, "a") as zf:
        warnings.simplefilter("ignore")                     # "Duplicate name"
        zf.writestr(member, change(payload))
    return dst


@pytest.mark.parametrize("member", ["v3/slot_tv", "draft_prob.npy", "meta.json"])
def test_a_member_held_twice_is_refused_naming_file_and_member(tmp_path, member):
    """A trace file with two zip members of one name was read by run, shard and
    tradeoff, the last copy used silently: one line naming the file and the member."""
    from tests import tracekit
    src = tmp_path / "good"
    for s in traces.SPLITS:
        traces.save(tracekit.split(s), src / f"{s}.npz")
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    flip = (lambda b: b.replace(b'"block_size": 4', b'"block_size": 2')) \
        if member == "meta.json" else (lambda b: b[:-8] + np.float64(0.5).tobytes())
    f = _with_a_second_copy(src / "valid.npz", bad / "valid.npz", member, flip)
    for args in (("run", "--objective", "speed", "--generations", 1, "--population", 10,
                  "--no-writeback", "--runs-dir", tmp_path / "runs", "--data", bad),
                 ("data", "shard", bad, "--rows-per-shard", 64, "--out", tmp_path / "sh"),
                 ("tradeoff", "--data", bad, "--json")):
        one_line_error(invoke(*args), str(f), repr(member), "more than once")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sh").exists()


def test_a_token_split_member_held_twice_is_refused(tmp_path, data_copy):
    f = _with_a_second_copy(data_copy / "valid.npz", tmp_path / "d" / "valid.npz",
                            "draft_prob.npy", lambda b: b[:-8] + np.float64(0.5).tobytes())
    for s in ("train", "test"):
        shutil.copyfile(data_copy / f"{s}.npz", tmp_path / "d" / f"{s}.npz")
    one_line_error(invoke("data", "info", "--data", tmp_path / "d"), str(f),
                   "'draft_prob.npy'", "more than once")
    with pytest.raises(data.DataError, match="more than once"):
        data.load_npz(f)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_non_regular_files_are_refused_without_reading(tmp_path, finished, data_copy, kind):
    def plant(path: Path):
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)                                # opening it would wait forever
        elif kind == "device":
            path.symlink_to("/dev/zero")                   # reading it never ends
        else:
            path.mkdir()
    run = copy_run(finished, tmp_path / "runs")
    for name in ("checkpoint.json", "history.jsonl"):
        plant(run / name)
    line = one_line_error(resume(run))
    assert "not a regular file" in line
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "not a regular file" in line
    ddir = tmp_path / "data"
    shutil.copytree(data_copy, ddir)
    plant(ddir / "valid.npz")
    line = one_line_error(invoke("data", "info", "--data", ddir))
    assert "valid.npz" in line and "not a regular file" in line
    js = tmp_path / "x.json"
    js.write_text("[]")
    plant(js)
    line = one_line_error(invoke("data", "import", js, "--split", "t", "--out", tmp_path / "o"))
    assert "not a regular file" in line


def test_json_read_is_capped(tmp_path):
    from evolve.io import jsonio
    f = tmp_path / "big.json"
    f.write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(jsonio.JsonError, match="larger than 100"):
        jsonio.read_json(f, "file", limit=100)


# ------------------------------------------------------------------------------------
# 15. A broken hand-edited heuristics/evolved.py (item 7)
# ------------------------------------------------------------------------------------

SIG = "draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match"
BROKEN = {
    "syntax": ("def evolved(:\n", "SyntaxError"),
    "missing function": ("x = 1\n", "AttributeError"),
    "wrong signature": ("def evolved(a, b):\n    return a\n", "cannot be compiled"),
    "wrong return type": (f"def evolved({SIG}):\n    return 'high'\n", "cannot be compiled"),
    "raises on import": ("raise RuntimeError('edited')\n", "RuntimeError"),
    "raises when called": (f"def evolved({SIG}):\n    raise ValueError('boom')\n",
                           "fails when called"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_evolved_is_reported_and_baselines_still_benchmarked(small_data_dir,
                                                                    edited_evolved, case):
    text, words = BROKEN[case]
    edited_evolved(text)
    r = invoke("benchmark", "--data", small_data_dir, "--repeats", 1)
    assert r.exit_code == 0, (r.output, r.exception)
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: evolved skipped")]
    assert len(warn) == 1 and words in warn[0], r.stderr
    assert "Traceback" not in r.output
    assert "standard_rejection" in r.stdout and "evolved *" not in r.stdout


# ------------------------------------------------------------------------------------
# 16. Trees beyond the run's limits are refused from a checkpoint (item 11)
# ------------------------------------------------------------------------------------

def _full(height: int) -> str:
    return "draft_prob" if height == 0 else f"add({_full(height - 1)}, {_full(height - 1)})"


TOO_BIG = _full(6)                                      # 127 nodes, height 6 (size > 60)
TOO_TALL = "neg(" * 12 + "target_prob" + ")" * 12       # 13 nodes, height 12 (> 10)


@pytest.mark.parametrize("field", ["population", "hall_of_fame", "valid_hall_of_fame"])
@pytest.mark.parametrize("tree,words", [(TOO_BIG, "max_size 60"), (TOO_TALL, "max_height 10")],
                         ids=["too-big", "too-tall"])
def test_checkpoint_tree_beyond_limits_is_refused(tmp_path, finished, field, tree, words):
    run = copy_run(finished, tmp_path / "runs")

    def edit(state):
        item = state[field][0]
        item["tree"] = tree
        if "size" in item:
            item["size"] = tree.count("(") + tree.count(",") + 1
        return state
    _edit_json(run / "checkpoint.json", edit)
    before = listing(run)
    line = one_line_error(resume(run))
    assert "checkpoint.json" in line and f"'{field}' item 0" in line and words in line, line
    assert listing(run) == before
