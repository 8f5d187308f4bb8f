"""`evolve bench --smoke`: the machinery works end to end. Nothing here is timed
and no speed target is asserted; the numbers are only checked for shape."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from evolve import bench, treeio
from evolve import primitives as P
from evolve.cli import main
from evolve.kernels import SplitArrays


@pytest.fixture(scope="module")
def smoke():
    result = CliRunner().invoke(main, ["bench", "--smoke", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_smoke_document_structure(smoke):
    assert smoke["format"] == bench.FORMAT and smoke["mode"] == "smoke"
    m = smoke["machine"]
    assert m["cpu_model"] and m["numba_threads"] >= 1 and m["logical_cpus"] >= 1
    assert {"python", "numpy", "numba", "deap"} <= set(m["versions"])
    for section in ("population", "run", "champion", "startup", "njit", "targets"):
        assert section in smoke, section


def test_smoke_population_counts_checked_equal(smoke):
    pop = smoke["population"]
    check = pop["counts_check"]
    assert check["all_equal"] is True
    assert check["trees"] == pop["trees"] == bench.SMOKE.pop_size
    assert check["identical"] + check["identical_after_libm_exp_log"] == check["trees"]
    assert pop["node_evals"] == pop["nodes"] * pop["rows"]
    for path in ("kernel", "numpy"):
        assert pop[path]["node_evals_per_s"] > 0
        assert len(pop[path]["all_wall_s"]) == bench.SMOKE.repeats
    assert pop["ratio"] > 0 and pop["kernel"]["threads"] == smoke["machine"]["numba_threads"]


def test_smoke_run_champion_startup_njit(smoke):
    run = smoke["run"]
    gens = bench.SMOKE.run_generations
    assert len(run["engine"]["rss_per_generation_mb"]) == gens + 1
    assert 0.0 <= run["overhead_fraction"] <= 1.0
    assert run["cli"]["peak_rss_mb"] > 0 and run["reference"]["evaluations"] > 0
    assert "<tmp>" in run["cli"]["command"] and "--no-writeback" in run["cli"]["command"]
    assert isinstance(run["same_best_fitness_every_generation"], bool)
    champ = smoke["champion"]
    assert champ["champion"]["tree"] == run["engine"]["champion"]["tree"]
    assert "standard_rejection" in champ["heuristics"] and "evolved" in champ["heuristics"]
    assert all(h["eval_ms"] > 0 for h in champ["heuristics"].values())
    assert smoke["startup"]["help_s"] > 0 and smoke["startup"]["benchmark_s"] > 0
    assert smoke["njit"]["trees"] == bench.SMOKE.njit_trees
    assert smoke["njit"]["compile_ms_median"] > 0


def test_smoke_never_judges_targets(smoke):
    assert len(smoke["targets"]) == len(bench.TARGETS)
    assert all(t["met"] is None for t in smoke["targets"])


def test_table_renders_from_the_document(smoke, capsys):
    from evolve.terminal import Terminal
    bench.show(smoke, Terminal())
    out = capsys.readouterr().out
    assert "not checked (smoke)" in out and "population" in out


def test_count_disagreement_is_an_error(small_splits):
    ds = small_splits["valid"]
    pset = P.make_pset()
    trees = [treeio.deap_from_string("pmin(1.0, pdiv(target_prob, draft_prob))", pset)]
    split = SplitArrays(ds)
    rows, _, _ = bench._kernel_path(trees, split)
    cols = bench.numpy_columns(ds)
    std = ds.standard_threshold()
    counts = [bench._numpy_counts(t, pset, cols, ds, std)[0] for t in trees]
    assert bench.check_counts(trees, rows, counts, cols, ds, std)["identical"] == 1
    bad = rows.copy()
    bad[0, 0] += 1
    with pytest.raises(bench.BenchError, match="differ"):
        bench.check_counts(trees, bad, counts, cols, ds, std)


def test_numpy_columns_follow_the_primitive_inputs(small_splits):
    ds = small_splits["valid"]
    cols = bench.numpy_columns(ds)
    assert len(cols) == len(P.INPUT_NAMES)
    np.testing.assert_array_equal(np.vstack([np.asarray(c, dtype=np.float64) for c in cols]),
                                  ds.feature_matrix()[:len(cols)])


FUSED_PATTERNS = (
    # the kernel's special paths: leaf + op, leaf + leaf + binary op, constants
    # folded through unary ops, cached plog/pexp/psqrt of inputs, a leaf as result
    "draft_prob", "1.5", "plog(position)", "neg(plog(3.0))", "pexp(plog(psqrt(2.5)))",
    "add(pexp(1.0), plog(draft_prob))", "ite(top_token_match, pexp(0.5), psqrt(target_entropy))",
    "ite(lt(plog(draft_prob), pexp(target_prob)), plog(1e-300), pexp(60.0))",
    "sub(plog(draft_prob), plog(draft_prob))", "pdiv(pexp(draft_entropy), psqrt(0.0))",
    "pmin(plog(target_entropy), pexp(square(draft_entropy)))", "add(1.0, 2.0)",
    "ite(not_(top_token_match), 1.0, plog(2.0))",
    "ite(and_(lt(1.0, 2.0), top_token_match), pexp(pexp(pexp(1.0))), 3.0)",
    "add(plog(draft_prob), add(pexp(target_prob), psqrt(position)))",
)


def test_kernel_fast_paths_equal_the_scalar_reference(small_splits):
    from evolve.kernels import population_thresholds
    from tests import naive
    ds = small_splits["valid"]
    trees = [treeio.parse(t) for t in FUSED_PATTERNS]
    th = population_thresholds(treeio.linearise(trees), SplitArrays(ds))
    for i, nodes in enumerate(trees):
        np.testing.assert_array_equal(th[i], naive.eval_rows(nodes, ds), err_msg=FUSED_PATTERNS[i])
