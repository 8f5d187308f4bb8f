"""`python -m benchmarks.speed.harness --smoke`: the machinery works end to end. Nothing
here is timed and no speed target is asserted; the numbers are only checked for
shape. The smokes take about a minute, so they are marked slow (`make test` and CI
run them; `make test-fast` does not). The Operon reference is optional: without
pyoperon its section says it was skipped."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evolve.kernels.tokens import TokenArrays
from evolve.lang import primitives as P
from evolve.lang import treeio

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.speed.harness"]
from benchmarks.speed import harness as bench  # noqa: E402


@pytest.fixture(scope="module")
def smoke():
    proc = subprocess.run([sys.executable, *SCRIPT, "--smoke", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_script_usage_errors():
    proc = subprocess.run([sys.executable, *SCRIPT, "--no-such-option"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = subprocess.run([sys.executable, *SCRIPT, "engine-child"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "engine-child SPEC_JSON" in proc.stderr


@pytest.mark.slow
def test_smoke_document_structure(smoke):
    assert smoke["format"] == bench.FORMAT and smoke["mode"] == "smoke"
    m = smoke["machine"]
    assert m["cpu_model"] and m["numba_threads"] >= 1 and m["logical_cpus"] >= 1
    assert {"python", "numpy", "numba", "deap"} <= set(m["versions"])
    for section in ("population", "run", "champion", "startup", "cold_start", "njit",
                    "operon", "trace", "targets"):
        assert section in smoke, section


@pytest.mark.slow
def test_smoke_operon_and_trace_sections(smoke):
    """Section 7 either ran (values checked, both mixes timed on 1 and 2 threads) or
    says why not; section 8 timed both kernels on one population, no target judged."""
    op = smoke["operon"]
    if "skipped" not in op:
        assert set(op["mixes"]) == {"arith", "transcendental"}
        for m in op["mixes"].values():
            assert m["check"]["roundtrip"] and m["check"]["trees_compared"] > 0
            for x in m["threads"].values():
                assert x["ours_node_evals_per_s"] > 0 and x["operon_node_evals_per_s"] > 0
    else:
        assert "pyoperon" in op["skipped"]
    tr = smoke["trace"]
    assert tr["trees"] == bench.SMOKE.pop_size and tr["trace_candidate_rows"] > 0
    assert tr["ratio_trace_vs_token_1t"] > 0
    judged = [t for t in smoke["targets"] if t["key"].startswith(("operon", "trace"))]
    assert len(judged) == 5 and all(t["met"] is None for t in judged)


@pytest.mark.slow
def test_smoke_population_counts_checked_equal(smoke):
    pop = smoke["population"]
    check = pop["counts_check"]
    assert check["all_equal"] is True
    assert check["trees"] == pop["trees"] == bench.SMOKE.pop_size
    assert check["identical"] == check["trees"]
    assert pop["node_evals"] == pop["nodes"] * pop["rows"]
    for path in ("kernel", "numpy"):
        assert pop[path]["node_evals_per_s"] > 0
        assert len(pop[path]["all_wall_s"]) == bench.SMOKE.repeats
    assert pop["ratio"] > 0 and pop["kernel"]["threads"] == smoke["machine"]["numba_threads"]


@pytest.mark.slow
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
    cold = smoke["cold_start"]
    assert cold["population"] == bench.SMOKE.cold_population
    # an empty cache compiles the kernels, a warm one loads them
    assert cold["functions_compiled"] >= 1 and cold["cold_s"] > cold["warm_s"] > 0
    assert "--no-writeback" in cold["command"] and "<tmp>" in cold["command"]
    assert smoke["njit"]["trees"] == bench.SMOKE.njit_trees
    assert smoke["njit"]["compile_ms_median"] > 0


@pytest.mark.slow
def test_smoke_never_judges_targets(smoke):
    assert len(smoke["targets"]) == len(bench.TARGETS)
    assert all(t["met"] is None for t in smoke["targets"])
    whole_run = [t for t in smoke["targets"] if t["key"] == "run.ratio"]
    assert len(whole_run) == 1 and whole_run[0]["op"] == ">=" and whole_run[0]["target"] >= 10


@pytest.mark.slow
def test_targets_are_judged_outside_smoke(smoke):
    judged = bench._targets(smoke, checked=True)
    assert all(isinstance(t["met"], bool) for t in judged)


@pytest.mark.slow
def test_table_renders_from_the_document(smoke, capsys):
    from evolve.cli.render import Terminal
    bench.show(smoke, Terminal())
    out = capsys.readouterr().out
    assert "not checked (smoke)" in out and "population" in out and "cold start" in out


def test_count_disagreement_is_an_error(small_splits):
    ds = small_splits["valid"]
    pset = P.make_pset()
    trees = [treeio.deap_from_string("pmin(1.0, pdiv(target_prob, draft_prob))", pset)]
    split = TokenArrays(ds)
    rows, _, _ = bench._kernel_path(trees, split)
    cols = bench.numpy_columns(ds)
    std = ds.standard_threshold()
    counts = [bench._numpy_counts(t, pset, cols, ds, std)[0] for t in trees]
    assert bench.check_counts(trees, rows, counts)["identical"] == 1
    bad = rows.copy()
    bad[0, 0] += 1
    with pytest.raises(bench.BenchError, match="differ"):
        bench.check_counts(trees, bad, counts)


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
    from evolve.kernels.tokens import population_thresholds
    from tests import naive
    ds = small_splits["valid"]
    trees = [treeio.parse(t) for t in FUSED_PATTERNS]
    th = population_thresholds(treeio.linearise(trees), TokenArrays(ds))
    for i, nodes in enumerate(trees):
        np.testing.assert_array_equal(th[i], naive.eval_rows(nodes, ds), err_msg=FUSED_PATTERNS[i])


def test_row_level_share_counts_subtrees_of_per_position_inputs():
    from benchmarks.speed.trace_speed import row_level_share
    from evolve.lang import treeio
    # add(mul(pos, 2), d): pos, 2 and mul are per-position; add and d are not
    assert row_level_share([treeio.parse("add(mul(position, 2.0), draft_prob)")]) == 3 / 5
    assert row_level_share([treeio.parse("draft_prob")]) == 0.0
    assert row_level_share([treeio.parse("psqrt(target_entropy)")]) == 1.0


@pytest.mark.slow
def test_trace_speed_smoke(tmp_path):
    """`python -m benchmarks.speed.trace_speed --smoke --before DIR`: both kernels score the
    same trees, the run section runs both checkouts (here this one twice) and finds
    their histories and champions identical. Nothing is timed against a target."""
    from evolve.data import tokens, traces
    from tests import tracekit
    for s in tokens.SPLITS:
        ds = tokens.load_npz(ROOT / "datasets" / f"{s}.npz")
        tokens.save_npz(tokens.from_columns({k: v[:2000] for k, v in ds.columns().items()}),
                        tmp_path / f"{s}.npz")
        traces.save(tracekit.split(s), (tmp_path / "traces").mkdir(exist_ok=True)
                    or tmp_path / "traces" / f"{s}.npz")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.speed.trace_speed",
                           "--smoke", "--data", str(tmp_path), "--before", str(ROOT),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    k = doc["kernel"]
    assert k["trace_candidate_rows"] > 0 and k["token_rows"] == 2000
    assert k["trace_1t_node_evals_per_s"] > 0 and k["ratio_trace_vs_token_1t"] > 0
    assert 0 < k["sums_share_1t"] and 0 < k["row_level_node_share"] < 1
    r = doc["run"]
    assert r["same_history"] and r["same_champion"] and r["this"]["deterministic"]
    assert "speed-up" in proc.stdout


def test_the_ranks_benchmark_checks_counts_against_the_sort(capsys):
    """benchmarks/speed/ranks.py on a small shape: both ways give the same integers."""
    pytest.importorskip("torch")
    from benchmarks.speed import ranks
    assert ranks.main(["--rows", "8", "--vocab", "300", "--columns", "1", "5",
                       "--repeats", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.split("\n", 2)[2])
    assert doc["vocab"] == 300 and set(doc["columns"]) == {"1", "5"}
    assert all(c["same_integers"] and c["count_ms"] > 0 for c in doc["columns"].values())
