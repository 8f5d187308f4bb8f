"""Generated champion code against the kernel and the reference; tree text and parsing."""

import ast

import numpy as np
import pytest

from evolve.lang import codegen
from evolve.lang import treeio
from evolve.lang import primitives as P
from evolve.rules.table import RULES

SEED_TREES = {n: r.tree() for n, r in RULES.items() if r.data == "tokens"}
from evolve.kernels.tokens import TokenArrays, population_thresholds
from evolve.runs.scoring import PreparedSplit, score
from tests.genload import load_module_from
from heuristics.registry import compile_function
from tests import naive
from tests.test_kernels import random_trees

TREES = [
    "pdiv(target_prob, draft_prob)",
    SEED_TREES["entropy_aware"],
    SEED_TREES["position_aware"],
    "ite(and_(top_token_match, lt(0.3, target_prob)), pmax(pdiv(target_prob, draft_prob), "
    "0.9), mul(pdiv(target_prob, draft_prob), sub(1.0, pexp(neg(target_entropy)))))",
    "psqrt(mul(plog(draft_prob), square(sub(target_prob, position))))",
    "ite(or_(not_(top_token_match), lt(draft_entropy, target_entropy)), position, -0.25)",
]


def _module(tmp_path, nodes, i=0):
    src = codegen.module_source(nodes, "evolved", {"run": f"t{i}", "metrics": {}}, "test")
    path = tmp_path / f"gen_{i}.py"
    path.write_text(src)
    return load_module_from(path, f"_gen_test_{i}_{abs(hash(str(tmp_path)))}")


def test_generated_code_agrees_with_kernel_and_reference(tmp_path, default_splits):
    trees = [treeio.parse(t) for t in TREES] + random_trees(6, seed=21)
    for split_name, ds in default_splits.items():
        split = TokenArrays(ds)
        th = population_thresholds(treeio.linearise(trees), split)
        for i, nodes in enumerate(trees):
            mod = _module(tmp_path, nodes, i)
            ufunc = compile_function(mod.evolved)
            code_h = ufunc(*ds.features())
            np.testing.assert_array_equal(code_h, th[i], err_msg=treeio.to_string(nodes))
            # decision for decision
            assert np.array_equal(ds.rand_value < code_h, ds.rand_value < th[i])
            if split_name == "valid" and i < 6:
                np.testing.assert_array_equal(code_h[:2000],
                                              naive.eval_rows(nodes, _head(ds, 2000)))
            # the plain-Python function agrees too, on a sample of rows
            for j in range(0, len(ds), 997):
                args = [getattr(ds, f)[j].item() for f in P.INPUT_NAMES]
                py = float(mod.evolved(*args))
                assert py == code_h[j] or (np.isnan(py) and np.isnan(code_h[j]))


def _head(ds, n):
    from evolve.data.tokens import FIELDS, Dataset
    return Dataset(**{f: getattr(ds, f)[:n] for f in FIELDS})


def test_generated_module_is_plain_and_jitted_twin_works(tmp_path, default_splits):
    nodes = treeio.parse(TREES[3])
    mod = _module(tmp_path, nodes, 99)
    args = (0.5, 0.4, 3, 2.0, 2.5, True)
    assert mod.evolved(*args) == mod.evolved_jit(*args)
    src = (tmp_path / "gen_99.py").read_text()
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert [a.arg for a in fn.args.args] == list(P.INPUT_NAMES)
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    allowed = set(P.INPUT_NAMES) | {"pdiv", "pmin", "pmax", "plog", "pexp", "psqrt", "square",
                                    "ite", "abs"}
    assert names <= allowed


def test_score_of_generated_code_equals_kernel_counts(tmp_path, default_splits):
    from evolve.kernels.tokens import population_counts
    from evolve.objectives.metrics import Counts
    nodes = treeio.parse(TREES[3])
    mod = _module(tmp_path, nodes, 7)
    ufunc = compile_function(mod.evolved)
    ds = default_splits["train"]
    m = score(ufunc, PreparedSplit(ds), repeats=1)
    row = population_counts(treeio.linearise([nodes]), TokenArrays(ds))[0]
    km = Counts.from_raw(len(ds), row).metrics()
    for k, v in km.items():
        assert m[k] == v, k


def test_tree_text_roundtrip():
    for nodes in random_trees(200, seed=2):
        text = treeio.to_string(nodes)
        assert treeio.to_string(treeio.parse(text)) == text
        assert treeio.parse(text) == nodes


def test_tree_text_equals_deap_text():
    from deap import gp
    pset = P.make_pset()
    for nodes in random_trees(50, seed=4):
        tree = treeio.to_deap(nodes, pset)
        assert str(tree) == treeio.to_string(nodes)
        assert treeio.from_deap(tree) == nodes
        assert isinstance(tree, gp.PrimitiveTree)


def test_depth_matches_deap():
    pset = P.make_pset()
    for nodes in random_trees(50, seed=6):
        assert treeio.depth(nodes) == treeio.to_deap(nodes, pset).height


@pytest.mark.parametrize("text,words", [
    ("__import__('os').system('echo hi')", "unknown name"),
    ("pdiv(target_prob)", "too few arguments"),
    ("pdiv(target_prob, draft_prob, 1.0)", "too many arguments"),
    ("lt(draft_prob, target_prob)", "must return a number"),
    ("ite(draft_prob, 1.0, 0.0)", "must be bool"),
    ("add(top_token_match, 1.0)", "must be float"),
    ("add(1.0, 2.0", "ends early"),
    ("add(1.0, 2.0))", "unexpected"),
    ("", "empty"),
    ("nan", "unknown name"),
    ("1e999", "not finite"),
    ("pdiv draft_prob", r"must be followed by '\('"),
    ("draft_prob; import os", "unexpected character"),
])
def test_parser_rejects(text, words):
    with pytest.raises(treeio.TreeError, match=words):
        treeio.parse(text)


def test_parser_bounds_nesting_and_size():
    deep = "neg(" * 10_000 + "draft_prob" + ")" * 10_000
    with pytest.raises(treeio.TreeError, match="nested deeper"):
        treeio.parse(deep)
    balanced = "draft_prob"
    for _ in range(13):   # 2^14 - 1 nodes, only 13 levels deep
        balanced = f"add({balanced}, {balanced})"
    with pytest.raises(treeio.TreeError, match="more than"):
        treeio.parse(balanced)
    with pytest.raises(treeio.TreeError, match="characters"):
        treeio.parse("1.0" + " " * (treeio.MAX_TEXT + 1))


def test_infix_is_readable():
    assert codegen.infix(treeio.parse("pdiv(target_prob, draft_prob)")) == "t / d"
    text = codegen.infix(treeio.parse(SEED_TREES["top_token_match"]))
    assert "match" in text and "t / d" in text


def test_sanitise_strips_code_from_comments():
    bad = 'x"""\nimport os; os.system("rm -rf /")\n\\'
    out = codegen.sanitise(bad)
    assert '"' not in out and "\n" not in out and "\\" not in out
