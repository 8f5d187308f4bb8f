"""Write-back of a champion into heuristics/evolved.py, and a broken hand-edited one.

Guarantee 5 of docs/reliability.md, Write-back is atomic, serialised and reversible:

`heuristics/evolved.py` is always either the old or the new complete module. The new
text is compiled (never run) before it is installed. Writers take an exclusive
`fcntl` lock, so two runs cannot interleave. The current file is scored on the run's
valid split, and the champion replaces it only if its valid fitness is higher (or
with `--force`). The replaced file is kept in `heuristics/history/`, copied
atomically too: a full disk there fails the write-back with `evolved.py` unchanged
and no temporary file left
(`test_writeback_on_a_full_disk_leaves_nothing_half_written`). The target directory
can be set with `$EVOLVE_HEURISTICS_DIR`. Tests:
`test_writeback_better_on_valid_wins_and_previous_file_is_kept`,
`test_writeback_refuses_source_that_does_not_compile`,
`test_writeback_lock_serialises_writers` (a writer blocks while the test holds the
lock), and `test_writeback_concurrent_writers_and_reader`. In the last one, two
writer processes and a reader that imports the file in a loop run together. The
reader only ever sees complete modules, every installed version ends up either
current or in `history/` exactly once, and the best tree on valid wins.
`test_writeback_env_var_redirects_cli` checks `$EVOLVE_HEURISTICS_DIR`.

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

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from numba import vectorize

from evolve import standing
from evolve.io import paths
from evolve.lang import codegen
from evolve.lang import treeio
from evolve.runs.scoring import PreparedSplit, score
from evolve.tasks import writeback
from evolve.tasks.writeback import module_metadata as evolved_metadata
from heuristics.registry import SIGNATURE
from tests.clikit import invoke, isolated  # noqa: F401 (isolated: a fixture)
from tests.genload import load_module_from
from tests.runkit import POP, enospc, proc_env

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 5. Write-back: atomic, serialised, better on valid wins, previous file kept
# ------------------------------------------------------------------------------------

WB_TREES = [
    "pmin(1.0, pdiv(target_prob, draft_prob))",
    "pmin(1.0, mul(0.9, pdiv(target_prob, draft_prob)))",
    "pmin(1.0, mul(0.5, pdiv(target_prob, draft_prob)))",
    "mul(0.3, pdiv(target_prob, draft_prob))",
    "ite(lt(draft_prob, target_prob), 1.0, 0.0)",
    "pmin(1.0, mul(0.7, pdiv(target_prob, draft_prob)))",
]


def wb_source(tree: str, tag: str) -> str:
    nodes = treeio.parse(tree)
    return codegen.module_source(nodes, "evolved", {"run": tag, "tree": tree, "metrics": {},
                                                    "pad": "x" * 20000},
                                 f"Evolved acceptance heuristic (run {tag})")


@pytest.fixture(scope="module")
def wb_fitness(small_splits):
    """Valid fitness of each tree, through generated code (the write-back's own path)."""
    valid = PreparedSplit(small_splits["valid"])
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for i, tree in enumerate(WB_TREES):
            path = Path(d) / f"m{i}.py"
            path.write_text(wb_source(tree, "probe"))
            mod = load_module_from(path, f"_wb_probe_{i}")
            out[tree] = score(vectorize([SIGNATURE])(mod.evolved), valid, 1)["fitness"]
    assert len(set(out.values())) == len(out), out     # distinct, so "the best" is unique
    return out


def test_writeback_better_on_valid_wins_and_previous_file_is_kept(tmp_path, small_splits,
                                                                  wb_fitness):
    heur = tmp_path / "heur"
    valid = small_splits["valid"]
    by_fit = sorted(WB_TREES, key=wb_fitness.get)
    worst, mid, best = by_fit[0], by_fit[len(by_fit) // 2], by_fit[-1]
    res = writeback.write_back(wb_source(mid, "a"), wb_fitness[mid], valid, "a",
                               directory=heur)
    assert res["written"] and res["backup"] is None
    mid_text = (heur / "evolved.py").read_text()
    res = writeback.write_back(wb_source(worst, "b"), wb_fitness[worst], valid, "b",
                               directory=heur)
    assert not res["written"] and res["current_valid_fitness"] == wb_fitness[mid]
    assert (heur / "evolved.py").read_text() == mid_text
    res = writeback.write_back(wb_source(best, "c"), wb_fitness[best], valid, "c",
                               directory=heur)
    assert res["written"] and Path(res["backup"]).read_text() == mid_text
    best_text = (heur / "evolved.py").read_text()
    res = writeback.write_back(wb_source(worst, "d"), wb_fitness[worst], valid, 'd"\n/x',
                               force=True, directory=heur)
    assert res["written"] and Path(res["backup"]).read_text() == best_text
    assert Path(res["backup"]).parent == heur / "history"        # odd run names stay inside
    assert len(list((heur / "history").iterdir())) == 2


@pytest.mark.parametrize("fail", ["write", "fsync"])
def test_writeback_on_a_full_disk_leaves_nothing_half_written(tmp_path, small_splits,
                                                              monkeypatch, fail):
    """The disk fills up while the replaced file is kept in history/: the write-back
    fails with the OS error, evolved.py is unchanged and history/ holds no temporary
    file (nor any other)."""
    heur = tmp_path / "heur"
    valid = small_splits["valid"]
    writeback.write_back(wb_source(WB_TREES[0], "a"), 0.1, valid, "a", directory=heur)
    before = (heur / "evolved.py").read_text()

    def full(*args, **kwargs):
        raise enospc()

    def half_copyfileobj(src, dst, *args):
        dst.write(src.read()[:100])          # the disk filled up mid-copy
        raise enospc()

    def half_copyfile(src, dst, *args, **kwargs):
        with open(src, "rb") as a, open(dst, "wb") as b:
            half_copyfileobj(a, b)
    if fail == "fsync":
        monkeypatch.setattr(os, "fsync", full)
    else:                                # whichever way the copy writes its bytes
        monkeypatch.setattr(writeback.shutil, "copyfile", half_copyfile)
        monkeypatch.setattr(writeback.shutil, "copyfileobj", half_copyfileobj)
    with pytest.raises(OSError, match="No space left on device"):
        writeback.write_back(wb_source(WB_TREES[1], "b"), 1.0, valid, "b", force=True,
                             directory=heur)
    monkeypatch.undo()
    assert (heur / "evolved.py").read_text() == before
    assert sorted(p.name for p in heur.iterdir()) == [".evolved.lock", "evolved.py", "history"]
    assert list((heur / "history").iterdir()) == []


def test_writeback_refuses_source_that_does_not_compile(tmp_path, small_splits):
    heur = tmp_path / "heur"
    valid = small_splits["valid"]
    writeback.write_back(wb_source(WB_TREES[0], "a"), 0.1, valid, "a", directory=heur)
    before = (heur / "evolved.py").read_text()
    with pytest.raises(SyntaxError):
        writeback.write_back("def evolved(:\n", 1.0, valid, "b", force=True, directory=heur)
    assert (heur / "evolved.py").read_text() == before


WRITER = r"""
import json, sys
from pathlib import Path
from evolve.lang import codegen
from evolve.data import tokens as data
from evolve.lang import treeio
from evolve.tasks import writeback
heur, data_dir, tag, force = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
items = json.loads(sys.argv[5])
valid = data.load_split(data_dir, "valid")
results = []
print("ready", file=sys.stderr, flush=True)
for i, (tree, fit) in enumerate(items):
    src = codegen.module_source(treeio.parse(tree), "evolved",
        {"run": f"{tag}{i}", "tree": tree, "metrics": {}, "pad": "x" * 20000},
        f"Evolved acceptance heuristic (run {tag}{i})")
    results.append(writeback.write_back(src, fit, valid, f"{tag}{i}", force=force,
                                        directory=heur))
print(json.dumps(results))
"""

READER = r"""
import sys, time
from pathlib import Path
import importlib.util
def load_module_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
target, stop, allowed = Path(sys.argv[1]), Path(sys.argv[2]), set(sys.argv[3:])
n = 0
while not stop.exists():
    if target.exists():
        mod = load_module_from(target, "_reader")
        assert mod.METADATA["tree"] in allowed, mod.METADATA["tree"]
        float(mod.evolved(0.5, 0.4, 3, 1.0, 2.0, True))
        n += 1
print(n)
"""


def _spawn_py(tmp_path, code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=tmp_path,
                            env=proc_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_writeback_concurrent_writers_and_reader(tmp_path, small_data_dir, wb_fitness):
    """Two processes write back concurrently while a third imports the file in a
    loop: the reader only ever sees complete modules, the best tree on valid ends
    up installed, and every replaced file is in history/ (no lost update)."""
    heur = tmp_path / "heur"
    heur.mkdir()
    stop = tmp_path / "stop"
    reader = _spawn_py(tmp_path, READER, heur / "evolved.py", stop, *WB_TREES)
    # each writer offers its trees in turn; forced writers replace every time
    a = [[t, wb_fitness[t]] for t in WB_TREES[0::2]] * 2
    b = [[t, wb_fitness[t]] for t in WB_TREES[1::2]] * 2
    writers = [_spawn_py(tmp_path, WRITER, heur, small_data_dir, tag, "1", json.dumps(items))
               for tag, items in (("a", a), ("b", b))]
    results = []
    for w in writers:
        out, err = w.communicate(timeout=180)
        assert w.returncode == 0, err
        results += json.loads(out)
    assert all(r["written"] for r in results)
    # every installed version is either the current file or kept in history/,
    # exactly once (a lost update would drop one version and back up another twice)
    kept = sorted((heur / "history").iterdir()) + [heur / "evolved.py"]
    versions = []
    for p in kept:
        text = p.read_text()
        ast.parse(text)                              # complete modules only
        assert text.endswith("evolved_jit = njit(cache=True)(evolved)\n")
        versions.append(evolved_metadata(p)["run"])
    assert sorted(versions) == sorted([f"a{i}" for i in range(len(a))] +
                                      [f"b{i}" for i in range(len(b))])
    # not forced: the best tree on valid must win, whatever the interleaving
    writers = [_spawn_py(tmp_path, WRITER, heur, small_data_dir, tag, "0", json.dumps(items))
               for tag, items in (("c", a), ("d", b))]
    for w in writers:
        out, err = w.communicate(timeout=180)
        assert w.returncode == 0, err
    stop.write_text("")
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    assert int(out) > 10, out                        # it really read while writers wrote
    best = max(WB_TREES, key=wb_fitness.get)
    installed = load_module_from(heur / "evolved.py", "_final")
    assert installed.METADATA["tree"] == best


@pytest.mark.slow
def test_writeback_lock_serialises_writers(tmp_path, small_data_dir, wb_fitness):
    heur = tmp_path / "heur"
    heur.mkdir()
    items = json.dumps([[WB_TREES[0], wb_fitness[WB_TREES[0]]]])
    with writeback.locked(heur):
        w = _spawn_py(tmp_path, WRITER, heur, small_data_dir, "w", "1", items)
        assert w.stderr.readline() == "ready\n"      # about to call write_back
        time.sleep(1.5)                              # ample time to reach the lock
        assert w.poll() is None                      # it waits for the lock ...
        assert not (heur / "evolved.py").exists()    # ... without touching the file
    out, err = w.communicate(timeout=120)            # released: it completes
    assert w.returncode == 0, err
    assert json.loads(out)[0]["written"] and (heur / "evolved.py").exists()


def test_writeback_env_var_redirects_cli(tmp_path, small_data_dir, monkeypatch):
    heur = tmp_path / "heur"
    guard = tmp_path / "guard"           # where it would go if the variable were ignored
    monkeypatch.setattr(paths, "HEURISTICS_DIR", guard)
    r = invoke("run", "--population", POP, "--generations", 2, "--name", "wb",
               "--data", small_data_dir, "--runs-dir", tmp_path / "runs", "--json",
               "--force",            # written back whatever the (short) run's standing
               env={"EVOLVE_HEURISTICS_DIR": str(heur)})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["writeback"]["written"]
    assert "run: wb" in (heur / "evolved.py").read_text()
    assert not guard.exists()


# ------------------------------------------------------------------------------------
# 15. A broken hand-edited heuristics/evolved.py
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


@pytest.mark.parametrize("verdict,reads", [
    ("wins", "the champion wins (the best rule on valid): WHY"),
    ("loses", "the champion loses (another rule does better on valid): WHY"),
    ("infeasible", "the champion is infeasible (over the run's budget, or below the standard "
                   "rule, on valid): WHY"),
])
def test_a_verdict_reads_as_a_sentence_saying_what_it_means(verdict, reads):
    """Where a champion stands, and why it is not written back, read naturally for every
    verdict ("the champion is loses" did not)."""
    from evolve.cli import views
    printed = []
    term = type("Term", (), {"result": lambda self, text: printed.append(text)})()
    views.show_standing({"standing": {"verdict": verdict, "why": "WHY"}}, term)
    views.show_refusal({"module": "evolved.py", "refused": verdict, "why": "WHY"}, term)
    assert printed == [reads.replace("the champion", "champion", 1),
                       f"not written back to heuristics/evolved.py: {reads} (use --force to "
                       "write it back)"]


def test_a_token_champion_is_judged_before_it_is_written_back(tmp_path, small_splits,
                                                               small_data_dir, monkeypatch):
    """``tokens.standing``: a rule below standard rejection on valid is infeasible, the
    best of the benchmark's baselines wins against them all; a run's champion that does
    not win is not written back (the run says why), nor exported without
    --allow-infeasible when infeasible, and --force writes it back."""
    from evolve.objectives import bind
    from evolve.objectives.tokens import champion_counts
    from evolve.search.config import Config
    from evolve.tasks import tokens as TT
    from evolve.rules import table
    valid = small_splits["valid"]
    obj, cfg = bind(Config()), Config()
    m = lambda tree: champion_counts(treeio.parse(tree), valid).metrics()    # noqa: E731
    low = TT.standing(obj, cfg, m("0.0"), valid)
    assert low["verdict"] == "infeasible" and "below standard rejection" in low["why"]
    best = low["best_baseline"]["rule"]
    top = TT.standing(obj, cfg, m(table.get(best).tree()), valid)
    assert top["verdict"] == "wins" and top["valid_score"] == low["best_baseline"]["score"]
    assert low["standard_rejection"] <= low["best_baseline"]["score"]
    heur = tmp_path / "heuristics"
    monkeypatch.setenv("EVOLVE_HEURISTICS_DIR", str(heur))
    r = invoke("run", "--data", small_data_dir, "--generations", 1, "--population", 20,
               "--seed", 3, "--runs-dir", tmp_path / "runs", "--name", "r")
    assert r.exit_code == 0, r.output
    st = json.loads((tmp_path / "runs" / "r" / "champion.json").read_text())["standing"]
    assert st["verdict"] == "infeasible"         # one generation of 20: a weak champion
    line = f"champion is infeasible ({standing.MEANING['infeasible']}): {st['why']}"
    assert line in r.stdout
    # ... what that means, and what to try next with this run (1 generation)
    assert "  what it means: the champion breaks the run's budget" in r.stdout
    assert "  next: search longer (evolve run --resume r --generations 50); or a new run " \
           "that starts from the baselines (--seed-baselines)" in r.stdout
    assert "not written back" in r.stdout and not (heur / "evolved.py").exists()
    shown = invoke("inspect", "r", "--runs-dir", tmp_path / "runs").stdout
    assert line in shown and "  next: search longer (evolve " \
        "run --resume r --generations 50)" in shown
    r = invoke("export", "r", "--format", "numpy", "--runs-dir", tmp_path / "runs")
    assert r.exit_code == 2 and "infeasible" in r.stderr and "--allow-infeasible" in r.stderr
    r = invoke("run", "--resume", "r", "--runs-dir", tmp_path / "runs", "--force")
    assert r.exit_code == 0, r.output
    assert (heur / "evolved.py").exists()                   # --force: written back
