"""Files read from a run or data directory are data: nothing in them runs, and what
does not fit is one line.

Guarantee 6 of docs/reliability.md, No code runs from data:

Checkpoints, hall of fame and champion files are JSON. Trees are read by
`treeio.parse`, which accepts only primitive names, input names and finite numbers
and limits text length, node count and depth. Nothing uses `eval`, `exec`, `pickle`
or DEAP's `compile`/`from_string` (the one exception is the speed benchmark,
`benchmarks/speed/harness.py`, outside the package, which times `gp.compile` and per-tree
`exec` as baselines on trees it generates in memory). Nothing under a run directory
or a data directory is imported: champions are scored from their parsed trees by the
kernel, and write-back reads the installed rule's tree from the `METADATA` literal
of `heuristics/evolved.py` with `ast.literal_eval`. What is executed is the
installed package's own code, `heuristics/` included: `evolve benchmark` imports
`heuristics/evolved.py` to time the installed rule, and reports a hand-edited file
that does not compile in one line while still benchmarking the baselines. Every JSON
file is size-checked, and each checkpoint and config field is type- and range-
checked before use. A crafted run directory is rejected with one line naming the
file and field, and exit code 2. Examples are a tree that carries
`__import__('os').system(...)`, nesting 10,000 levels deep, a 64-MiB-plus or
10,000-deep JSON file, a 5,000-digit number, wrong types, non-finite fitness, an
absurd population and a directory name containing a newline and code. Generated
modules hold only a sanitised docstring, two imports, a `METADATA` literal, the
function and its jitted twin. The function body references only inputs and primitive
helpers, whatever the metadata holds. Tests: `test_crafted_checkpoint_rejected`,
`test_crafted_checkpoint_file_rejected`, `test_crafted_absurd_file_size_rejected`,
`test_crafted_config_rejected`, `test_crafted_run_name_rejected`,
`test_crafted_champion_rejected_by_inspect` (each also checks that a marker file was
not created), `test_no_eval_exec_or_pickle_in_the_harness` (a static scan of
`evolve/`), `test_generated_module_with_hostile_metadata` and
`test_generated_module_with_any_metadata_text` (hypothesis).

Guarantee 9 of docs/reliability.md, Nothing in a run directory is imported or run:

Champions are scored from their parsed trees by the kernel; `champion.py` is
written, never read; write-back reads the installed rule's tree from the `METADATA`
literal with `ast.literal_eval`. `test_files_planted_in_a_run_directory_never_run`
plants `champion.py`, `numba.py`, `numpy.py`, `heuristics.py`, `sitecustomize.py`
and `__init__.py` that would create a marker file, then runs `inspect`, `runs` and a
resume that finishes the run: no marker appears and `champion.py` is regenerated
from the tree. The static scan of guarantee 6 above also forbids
`exec_module`/`spec_from_file_location` in `evolve/`.

Guarantee 12 of docs/reliability.md, One JSON reader, with the same limits everywhere:

Run files, `history.jsonl` lines, data splits in JSON form and the `meta.json` of
split files are all read by `evolve/io/jsonio.py`: regular files only, a byte cap
(64 MiB for run files, 1 GiB for a JSON split, 1 MiB for a `meta.json`), nesting at
most 64 levels (checked before parsing), integers of at most 40 digits, and only
finite numbers: `NaN`, `Infinity` and overflowing literals such as `1e999` are
refused (the project never writes them; a JSON data split may hold them, and its
validation then names the field and row); so is an object holding a key twice, which
a parser would read as its last value (the `duplicate` case). Every failure is one line naming the file
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
`test_absurd_data_options_are_one_line`, and (with guarantee 6 above)
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

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import ast
import json
import random
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.cli.render import Terminal
from evolve.data import tokens as data
from evolve.data import traces
from evolve.lang import codegen
from evolve.lang import primitives as P
from evolve.lang import treeio
from evolve.runs import rundir as runs
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.genload import load_module_from
from tests.runkit import REPO, copy_run, edit_json, listing, resume, write_zip

NAME_HINT = "letters, digits"   # part of the invalid run name message
ESC = "\x1b"
PSET = P.make_pset()            # the engine's primitive set

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 6. No code runs from data
# ------------------------------------------------------------------------------------

PWNED = "PWNED_MARKER"
CODE_TREE = f"__import__('os').system('touch {PWNED}')"


def _set_tree(field, value):
    def edit(state):
        state[field][0]["tree"] = value
    return edit


def _set(key, value):
    def edit(doc):
        doc[key] = value
        return doc
    return edit


def _set_item(field, key, value):
    def edit(state):
        state[field][0][key] = value
    return edit


@pytest.mark.parametrize("edit,words", [
    (_set_tree("population", CODE_TREE), "unknown name '__import__'"),
    (_set_tree("hall_of_fame", CODE_TREE), "unknown name '__import__'"),
    (_set_tree("population", "add(1.0, draft_prob); import os"), "unexpected character"),
    (_set_tree("population", "neg(" * 10000 + "1.0" + ")" * 10000), "nested deeper"),
    (_set_tree("population", "add(1.0, " * 40000 + "1.0" + ")" * 40000), "characters"),
    (_set_tree("population", 42), "'tree' must be a string"),
    (_set("population", "everyone"), "field 'population'"),
    (_set("population", []), "field 'population'"),
    (_set("hall_of_fame", [None]), "field 'hall_of_fame' item 0"),
    (_set_item("population", "fitness", "nan"), "'fitness' must be a finite number"),
    (_set_item("population", "fitness", float("inf")), "non-finite number Infinity"),
    (_set_item("population", "born", 10 ** 9), "'born'"),
    (_set_item("hall_of_fame", "size", 10 ** 6), "'size'"),
    (_set("random_state", [3, [1, 2, 3], None]), "random_state"),
    (_set("random_state", "seed"), "random_state"),
    (_set("generation", "3"), "generation"),
    (_set("generation", -1), "generation"),
    (_set("config", None), "config"),
])
def test_crafted_checkpoint_rejected(tmp_path, finished_run, monkeypatch, edit, words):
    monkeypatch.chdir(tmp_path)
    run = copy_run(finished_run, tmp_path / "runs")
    state = json.loads((run / "checkpoint.json").read_text())
    edit(state)
    # json.dumps writes inf as Infinity, which the project's one JSON reader refuses
    (run / "checkpoint.json").write_text(json.dumps(state))
    before = listing(run)
    line = one_line_error(invoke("run", "--resume", "r", "--runs-dir", run.parent,
                                 "--generations", 5, "--no-writeback"))
    assert words in line and "checkpoint.json" in line, line
    assert len(line) < 400
    assert listing(run) == before and not (tmp_path / PWNED).exists()


@pytest.mark.parametrize("text,words", [
    ("[" * 10000 + "]" * 10000, "nested too deeply"),
    ('{"generation": ' + "9" * 5000 + "}", "not valid JSON"),
    ("{", "not valid JSON"),
    ("\udcff", "cannot read"),
])
def test_crafted_checkpoint_file_rejected(tmp_path, finished_run, text, words):
    run = copy_run(finished_run, tmp_path / "runs")
    (run / "checkpoint.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    line = one_line_error(invoke("run", "--resume", "r", "--runs-dir", run.parent,
                                 "--generations", 5, "--no-writeback"))
    assert words in line and "checkpoint.json" in line, line


def test_crafted_absurd_file_size_rejected(tmp_path, finished_run):
    run = copy_run(finished_run, tmp_path / "runs")
    with open(run / "checkpoint.json", "r+b") as fh:
        fh.truncate(runs.MAX_JSON_BYTES + 1)             # sparse: costs no disk
    line = one_line_error(invoke("run", "--resume", "r", "--runs-dir", run.parent,
                                 "--generations", 5, "--no-writeback"))
    assert "larger than" in line


@pytest.mark.parametrize("key,value,words", [
    ("population", 10 ** 12, "population: "),
    ("seed", [1], "'seed'"),
    ("objective", {"x": 1}, "'objective'"),
    ("cx_prob", "0.5", "'cx_prob'"),
    ("seed_baselines", 1, "'seed_baselines'"),
    ("__class__", 1, "unknown key"),
])
def test_crafted_config_rejected(tmp_path, finished_run, key, value, words):
    run = copy_run(finished_run, tmp_path / "runs")
    meta = json.loads((run / "config.json").read_text())
    meta["config"][key] = value
    (run / "config.json").write_text(json.dumps(meta))
    line = one_line_error(invoke("run", "--resume", "r", "--runs-dir", run.parent,
                                 "--no-writeback"))
    assert words in line and "config" in line, line


def test_crafted_run_name_rejected(tmp_path, finished_run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = f"x\nimport os; os.system('touch {PWNED}') #\"\"\"'"
    run = copy_run(finished_run, tmp_path / "runs", evil)
    line = one_line_error(invoke("run", "--resume", evil, "--runs-dir", run.parent,
                                 "--no-writeback"))
    assert "--resume" in line and NAME_HINT in line
    line = one_line_error(invoke("inspect", evil, "--runs-dir", run.parent))
    assert NAME_HINT in line
    r = invoke("runs", "--runs-dir", run.parent, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == []     # not listed as a run
    assert not (tmp_path / PWNED).exists()


def test_crafted_champion_rejected_by_inspect(tmp_path, finished_run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = copy_run(finished_run, tmp_path / "runs")
    champ = json.loads((run / "champion.json").read_text())
    champ["tree"] = CODE_TREE
    (run / "champion.json").write_text(json.dumps(champ))
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "__import__" in line
    assert not (tmp_path / PWNED).exists()


def test_no_eval_exec_or_pickle_in_the_harness():
    """Static guard: nothing in evolve/ (every subpackage) evaluates text, imports a
    file or unpickles: no eval/exec, no DEAP compile/from_string (they eval), no
    exec_module/spec_from_file_location, no pickle-like modules, no
    allow_pickle=True. (The speed benchmark, benchmarks/speed/harness.py, outside the
    package, times DEAP's ``gp.compile`` and per-tree ``exec`` as baselines on
    trees it generates in memory.)"""
    unsafe_modules = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
    allowed = set()
    paths = sorted((REPO / "evolve").rglob("*.py"))
    assert len(paths) > 30
    for path in paths:
        where = str(path.relative_to(REPO))
        text = path.read_text()
        assert "exec_module" not in text and "spec_from_file_location" not in text, where
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in {"eval", "exec", "__import__"}:
                    assert (where, f.id) in allowed, f"{where}: {f.id}"
                if isinstance(f, ast.Attribute):
                    assert f.attr not in {"from_string", "compileADF"}, f"{where}: {f.attr}"
                    if f.attr == "compile" and getattr(f.value, "id", "") == "gp":
                        assert (where, "gp.compile") in allowed, f"{where}: gp.compile"
                for kw in node.keywords:
                    assert not (kw.arg == "allow_pickle" and
                                getattr(kw.value, "value", False) is not False), where
            if isinstance(node, ast.Import):
                assert not unsafe_modules & {a.name.split(".")[0] for a in node.names}, where
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in unsafe_modules, where


HOSTILE = 'evil"""\n__import__("os").system("touch ' + PWNED + '")\n"""\'\'\'\\ # \x00 \u2028 é'


def _check_generated_module(src: str, metadata: dict) -> None:
    """Only: docstring, imports, METADATA literal, the function, its jitted twin;
    the function body references only inputs and primitive helpers."""
    mod = ast.parse(src)
    body = mod.body
    kinds = [type(n).__name__ for n in body]
    assert kinds[0] == "Expr" and isinstance(body[0].value, ast.Constant)
    doc = body[0].value.value
    assert '"""' not in doc and "\\" not in doc and "__import__(\"" not in doc
    assert all(32 <= ord(c) < 127 for c in doc.replace("\n", ""))
    rest = body[1:]
    imports = [n for n in rest if isinstance(n, ast.ImportFrom)]
    assert [(i.module, [a.name for a in i.names]) for i in imports][0] == ("numba", ["njit"])
    helpers = {p.code.split("(")[0] for p in P.PRIMITIVES if p.code[0].isalpha()}
    for imp in imports[1:]:
        assert imp.module == "heuristics.ops" and {a.name for a in imp.names} <= helpers
    assigns = [n for n in rest if isinstance(n, ast.Assign)]
    funcs = [n for n in rest if isinstance(n, ast.FunctionDef)]
    assert len(rest) == len(imports) + len(assigns) + len(funcs)
    assert [a.targets[0].id for a in assigns] == ["METADATA", "evolved_jit"]
    assert ast.literal_eval(assigns[0].value) == json.loads(json.dumps(metadata))
    jit = assigns[1].value          # njit(cache=True)(evolved)
    assert isinstance(jit, ast.Call) and jit.func.func.id == "njit"
    assert [a.id for a in jit.args] == ["evolved"]
    (fn,) = funcs
    assert fn.name == "evolved" and [a.arg for a in fn.args.args] == list(P.INPUT_NAMES)
    assert fn.decorator_list == [] and len(fn.body) == 1 and isinstance(fn.body[0], ast.Return)
    allowed_nodes = (ast.Return, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call,
                     ast.Name, ast.Constant, ast.Load, ast.operator, ast.unaryop, ast.boolop,
                     ast.cmpop)
    for node in ast.walk(fn.body[0]):
        assert isinstance(node, allowed_nodes), type(node).__name__
        if isinstance(node, ast.Name):
            assert node.id in set(P.INPUT_NAMES) | helpers | {"abs"}, node.id
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name) and not node.keywords


def test_generated_module_with_hostile_metadata(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nodes = treeio.parse("ite(and_(top_token_match, not_(lt(position, 2.0))), "
                         "psqrt(absf(plog(pexp(neg(square(draft_prob)))))), "
                         "pmax(pmin(pdiv(target_prob, draft_prob), 1.0), sub(0.5, add("
                         "draft_entropy, mul(target_entropy, -0.25)))))")
    metadata = {"run": HOSTILE, "seed": 3, "date": HOSTILE, "objective": HOSTILE,
                "tree": treeio.to_string(nodes), HOSTILE: [HOSTILE, {"k": None}],
                "metrics": {HOSTILE: {"accept_rate": 0.5, "accuracy": 0.9, "fitness": 0.4}}}
    src = codegen.module_source(nodes, "evolved", metadata, f"Evolved (run {HOSTILE})")
    _check_generated_module(src, metadata)
    path = tmp_path / "hostile.py"
    path.write_text(src, encoding="utf-8")
    mod = load_module_from(path, "_hostile")
    assert mod.METADATA == metadata and not (tmp_path / PWNED).exists()
    assert mod.evolved(0.5, 0.4, 3, 1.0, 2.0, True) == mod.evolved_jit(0.5, 0.4, 3, 1.0, 2.0, True)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80), seed=st.integers(0, 10 ** 6))
def test_generated_module_with_any_metadata_text(text, seed):
    from deap import gp
    state = random.getstate()
    random.seed(seed)
    try:
        nodes = treeio.from_deap(gp.PrimitiveTree(gp.genHalfAndHalf(PSET, 1, 1 + seed % 5)))
    finally:
        random.setstate(state)
    metadata = {"run": text, "date": text, "objective": text, "seed": seed, "k" + text: text,
                "metrics": {text: {"accept_rate": 0.1, "accuracy": 0.2, "fitness": 0.3}}}
    _check_generated_module(codegen.module_source(nodes, "evolved", metadata, text), metadata)


# ------------------------------------------------------------------------------------
# 9. Nothing in a run directory is imported or run
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
# 12. One JSON reader: same limits, one-line errors everywhere
# ------------------------------------------------------------------------------------

HOSTILE_JSON = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "digits": ("[" + "9" * 5000 + "]", "digits"),
    "infinity": ('{"x": Infinity}', "non-finite"),
    "overflow": ('{"x": 1e999}', "out of range"),
    "duplicate": ('{"x": 1, "y": {"z": 2, "z": 3}}', "key 'z' appears twice"),
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


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_trace_meta_hostile(tmp_path, case):
    text, words = HOSTILE_JSON[case]
    f = write_zip(tmp_path / "train.npz", {"meta.json": text})
    with pytest.raises(data.DataError, match=words):
        traces.load(f)
    assert not traces.is_trace_file(f)


@pytest.mark.parametrize("version", ["5", "3.0", "true", '"3"', "1.0", "null"])
def test_an_unsupported_trace_version_is_named_as_such(tmp_path, data_copy, version):
    """A trace file whose format_version is not 2, 3 or 4 (5, 3.0, true, "3") was
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
        write_zip(d / f"{s}.npz", {**members, "meta.json": text})
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
# ------------------------------------------------------------------------------------

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
    edit_json(run / name, edit)
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
    edit_json(run / "config.json",
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
# 16. Trees beyond the run's limits are refused from a checkpoint
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
    edit_json(run / "checkpoint.json", edit)
    before = listing(run)
    line = one_line_error(resume(run))
    assert "checkpoint.json" in line and f"'{field}' item 0" in line and words in line, line
    assert listing(run) == before
