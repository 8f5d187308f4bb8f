"""benchmarks/speed/operon.py: Operon trees convert to ours with the same values (a smoke run,
and hand-built trees pinning argument order). Nothing is timed or judged here."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

op = pytest.importorskip("pyoperon")

from evolve.kernels.tokens import matrix_thresholds  # noqa: E402
from evolve.lang import treeio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.speed.operon"]
from benchmarks.speed import operon as bench  # noqa: E402


def test_smoke_json(tmp_path):
    out = tmp_path / "operon.json"
    proc = subprocess.run([sys.executable, *SCRIPT, "--smoke", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ours/Operon" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "smoke" and doc["rows"] == 2000 and doc["trees"] == 20
    assert set(doc["mixes"]) == {"arith", "transcendental"}
    assert doc["mixes"]["transcendental"]["transcendental_share"] > 0.3
    assert doc["mixes"]["arith"]["transcendental_share"] == 0.0
    for m in doc["mixes"].values():
        c = m["check"]
        assert c["roundtrip"] and c["passed"], c
        assert c["trees_compared"] >= 1 and c["rows_agree_share"] > 0.99
        assert m["nodes"] >= 20 and treeio.parse(m["example"])
        assert "1" in m["threads"]
        for r in m["threads"].values():
            assert r["ours_s"] > 0 and r["operon_s"] > 0 and r["ours_over_operon"] > 0


def test_hand_built_trees_match_operon():
    rng = np.random.default_rng(3)
    X = rng.uniform(0.1, 4.0, size=(6, 64))
    X[5] = rng.integers(0, 2, 64)
    X = X.astype(np.float32).astype(np.float64)     # exact in both precisions
    od = bench.OperonData(X)
    hashes = {name: h for h, name in od.inputs.items()}
    T = op.NodeType

    def var(name):
        n = op.Node(T.Variable)
        n.HashValue, n.Value = hashes[name], 1.0
        return n

    def const(c):
        n = op.Node(T.Constant)
        n.Value = c
        return n

    def fn(name):
        return op.Node(T[name])

    d, t, pos, te = var("draft_prob"), var("target_prob"), var("position"), var("target_entropy")
    postfix = [                                      # Operon order: first argument last
        ([d, t, fn("Sub")], "sub(target_prob, draft_prob)"),
        ([const(2.0), pos, fn("Div")], "pdiv(position, 2.0)"),
        ([d, const(0.5), fn("Add"), te, fn("Div"), const(3.0), fn("Sub")],
         "sub(3.0, pdiv(target_entropy, add(0.5, draft_prob)))"),
        ([d, t, fn("Fmin")], "pmax(target_prob, draft_prob)"),   # pyoperon's label swap
        ([t, fn("Log"), d, fn("Sqrt"), fn("Exp"), fn("Mul")],
         "mul(pexp(psqrt(draft_prob)), plog(target_prob))"),
    ]
    trees = [op.Tree(nodes).UpdateNodes() for nodes, _ in postfix]
    nodes = [bench.to_nodes(tree, od.inputs) for tree in trees]
    assert [treeio.to_string(n) for n in nodes] == [text for _, text in postfix]
    assert all(treeio.parse(treeio.to_string(n)) == n for n in nodes)

    ours = matrix_thresholds(treeio.linearise(nodes), X)
    theirs = bench.operon_values(trees, od).astype(np.float64)
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)
    np.testing.assert_allclose(ours[0], X[1] - X[0])
    np.testing.assert_allclose(ours[2], 3.0 - X[4] / (0.5 + X[0]))
    assert bench.common_domain(nodes[4], X).all()


def test_without_pyoperon_skips(tmp_path):
    out = tmp_path / "skip.json"
    code = ("import runpy, sys; sys.modules['pyoperon'] = None; "
            f"sys.argv = ['operon.py', '--json', {str(out)!r}]; "
            f"runpy.run_module('benchmarks.speed.operon', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == bench.SKIP
    assert json.loads(out.read_text()) == {"skipped": bench.SKIP}
