"""The KL sums on the torch device: ``with_kl=True`` gives the Numba kernel's 128-bit
sums integer for integer (both take the KL terms' log from ``heuristics.ops.log_poly``),
the numpy reference's KL (libm's log) to rounding, a ``speed_kl`` run on ``cuda`` is
the run on ``cpu``, and ``evolve tradeoff --device cuda`` prints the JSON of ``--device
cpu``. No GPU here: torch's CPU device stands for it (``EVOLVE_TORCH_DEVICE=cpu``).

Also guarantee 28 of docs/reliability.md, Evaluation on a GPU gives the CPU kernels'
results, bit for bit: see tests/test_gpu_runs.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

import evolve                                                            # noqa: E402
from evolve.kernels import gpu, layout                                   # noqa: E402
from evolve.kernels import speculative as spec_kernels                    # noqa: E402
from evolve.kernels import tokens as tok_kernels                          # noqa: E402
from evolve.kernels.gpu import traces as gpu_traces                       # noqa: E402
from evolve.lang import treeio                                            # noqa: E402
from evolve.objectives import spec                                        # noqa: E402
from evolve.rules import tuning                                           # noqa: E402
from tests import tracekit                                                # noqa: E402
from tests.clikit import invoke, one_line_error                           # noqa: E402
from tests.test_gpu_eval import edge_programs, random_trees               # noqa: E402
from tests.test_gpu_runs import view                                      # noqa: E402

CPU = torch.device("cpu")
npz_dir = tracekit.npz_dir_fixture()
# valid and test of 24 blocks each: the torch kernel on torch's CPU device pays a fixed
# cost per operation, and the trade-off scores some 150 small populations
SMALL = dataclasses.replace(tracekit.TINY, valid_prompts=6, test_prompts=6,
                            blocks_per_prompt=4)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    from evolve.data import traces
    d = tmp_path_factory.mktemp("small_traces")
    for s in traces.SPLITS:
        traces.save(tracekit.split(s, SMALL), d / f"{s}.npz")
    return d


@pytest.fixture(scope="module")
def sa():
    """The first 160 blocks of the tiny valid split (torch on the CPU is slow)."""
    return spec.TraceArrays.from_split(tracekit.split("valid")).blocks(np.arange(160))


@pytest.fixture
def torch_on_cpu(monkeypatch):
    """``cuda`` runs the torch kernels on torch's CPU device."""
    monkeypatch.setenv(gpu.OVERRIDE, "cpu")


def _programs():
    return treeio.linearise(random_trees(12, 17, trace=True)
                            + [treeio.parse(t) for t in
                               ("target_prob", "1.0", "0.0", "pmin(1.0, pdiv(target_prob, "
                                "mul(0.7, draft_prob)))")])


@pytest.mark.parametrize("cap", [spec_kernels.TAIL_OFF, 0.05])
def test_kl_sums_equal_the_numba_kernel(sa, cap):
    """with_kl=True: the exact sums, KL included, integer for integer, in one chunk and
    in chunks of 70 blocks (the last one short) and batches of 5 programs; the KL sum
    is not 0 for most programs (the test compares something)."""
    programs = _programs()
    want = spec_kernels.population_sums(programs, sa, with_kl=True, tail_cap=cap)
    L = layout.sums_layout(sa.g)
    assert (want[:, L.kl] != 0).any(axis=1).sum() >= len(programs) // 2
    assert np.array_equal(gpu_traces.population_sums(programs, sa, True, cap, device=CPU), want)
    got = gpu_traces.population_sums(programs, sa, True, cap, chunk_blocks=70,
                                     batch_programs=5, device=CPU)
    assert np.array_equal(got, want)
    # without KL the other sums are the same integers and the kl sum is 0
    no_kl = gpu_traces.population_sums(programs, sa, False, cap, chunk_blocks=70, device=CPU)
    assert (no_kl[:, L.kl] == 0).all()
    other = [i for i in range(L.width) if i != L.kl]
    assert np.array_equal(no_kl[:, other], want[:, other])


def test_kl_sums_of_edge_programs_and_minibatches(sa):
    """Edge programs (NaN, inf, thresholds at 0 and 1) and minibatches of blocks."""
    edge = edge_programs(n_inputs=sa.X.shape[0])
    assert np.array_equal(gpu_traces.population_sums(edge, sa, True, chunk_blocks=90, device=CPU),
                          spec_kernels.population_sums(edge, sa, with_kl=True))
    programs = _programs()
    blocks = np.sort(np.random.default_rng(4).choice(sa.n_blocks, 40, replace=False))
    assert np.array_equal(
        gpu_traces.population_sums(programs, sa, True, blocks=blocks, chunk_blocks=16, device=CPU),
        spec_kernels.population_sums(programs, sa.blocks(blocks), with_kl=True))


def _random_arrays(seed: int, nb: int = 40, g: int = 3, k: int = 4) -> spec.TraceArrays:
    """Random per-candidate and tail constants that no valid trace has: q(T+) above
    p(T+) (the residual falls back to p, so both tail bins' KL terms are non-zero),
    rows with p = q (fallback too), zeros: every operation of the KL terms counts."""
    rng = np.random.default_rng(seed)
    n = nb * g
    cq = rng.uniform(0.0, 0.2, (n, k))
    cp = np.where(rng.random((n, 1)) < 0.3, cq, rng.uniform(0.0, 0.2, (n, k)))
    cq[rng.random((n, k)) < 0.05] = 0.0
    tq, tp = rng.uniform(0.1, 0.4, n), rng.uniform(0.1, 0.4, n)
    eq, ep = tq * rng.uniform(0.2, 0.9, n), tp * rng.uniform(0.0, 0.5, n)
    X = rng.uniform(0.0, 1.0, (len(spec.FEATURES), n * k))
    X[0], X[1] = cq.reshape(-1), cp.reshape(-1)
    dcand = rng.integers(-1, k, n).astype(np.int64)
    return spec.TraceArrays(g, k, n, np.ascontiguousarray(X), cq.reshape(-1), cp.reshape(-1),
                           tq, tp, eq, ep, dcand, rng.uniform(0.0, 1.0, n))


def test_kl_sums_on_constants_no_trace_has():
    """Tail bins with non-zero KL terms on both sides, fallback rows, zeros: the sums
    are the kernel's integers (the order of every addition of the KL terms shows)."""
    programs = treeio.linearise(random_trees(8, 3, trace=True)
                                + [treeio.parse("target_prob"), treeio.parse("0.5")])
    L = layout.sums_layout(3)
    for seed in (0, 1):
        sa = _random_arrays(seed)
        with np.errstate(divide="ignore", invalid="ignore"):    # q = 0: min(1, p/q) is inf
            want = spec_kernels.population_sums(programs, sa, with_kl=True)
        assert (want[:, L.kl] != 0).any()
        got = gpu_traces.population_sums(programs, sa, True, chunk_blocks=16, device=CPU)
        assert np.array_equal(got, want)


def test_an_accepted_candidate_the_target_never_emits_has_infinite_kl():
    """p = 0 under q > 0: accepting it puts out mass where the target has none, KL +inf
    (the reference's inf; such a block's KL saturates the fixed point), the same integers
    on the device; the kernel used to raise ZeroDivisionError there."""
    sa = _random_arrays(2)
    cp = sa.cp.copy()
    cp[::7] = 0.0
    sa = spec.TraceArrays(sa.g, sa.k, sa.n, sa.X, sa.cq, cp, sa.tq, sa.tp, sa.eq, sa.ep,
                         sa.dcand, sa.std_x)
    programs = treeio.linearise([treeio.parse("1.0"), treeio.parse("target_prob")])
    with np.errstate(divide="ignore", invalid="ignore"):
        want = spec_kernels.population_sums(programs, sa, with_kl=True)
        ref = spec.objectives(sa, np.ones(sa.n * sa.k))
    assert ref.kl_per_token == np.inf
    from evolve.kernels import fixed
    assert fixed.to_float(want)[0, layout.KL] >= fixed.LIMIT        # saturated blocks
    assert np.array_equal(gpu_traces.population_sums(programs, sa, True, device=CPU), want)


def test_kl_terms_where_the_target_mass_is_zero():
    """o > 0 against p = 0 is +inf in both kernels (log_poly(inf) = inf), o = 0 is 0,
    and the block's sum keeps the kernel's bits (fixed point saturates)."""
    o = torch.tensor([0.0, 1e-300, 0.25, 0.5, 0.3, 1.0], dtype=torch.float64)
    p = torch.tensor([0.0, 0.0, 0.5, 0.25, 0.3, 1e-300], dtype=torch.float64)
    got = gpu_traces._kl_term(o, p).numpy()
    import math
    ref = [0.0, math.inf, 0.25 * math.log(0.5), 0.5 * math.log(2.0), 0.0,
           math.log(1e300)]
    assert got[:2].tolist() == ref[:2] and got[4] == 0.0
    assert got[2:] == pytest.approx(np.array(ref[2:]), rel=1e-15)
    numba_terms = [spec_kernels._kl_term(a, b) for a, b in zip(o.tolist(), p.tolist())]
    assert np.array(numba_terms).view(np.int64).tolist() == got.view(np.int64).tolist()


def test_kl_matches_the_numpy_reference(sa):
    """The kernel's KL per token (log_poly) is the reference's (libm's log) to rounding,
    for random programs and the rules of the table."""
    trees = random_trees(16, 5, trace=True) + [treeio.parse(tuning.RULES[n].tree())
                                                for n in ("standard_rejection", "leniency")]
    progs = treeio.linearise(trees)
    rows = spec_kernels.population_objectives(progs, sa, with_kl=True)
    dev = gpu_traces.population_sums(progs, sa, True, device=CPU)
    h_all = tok_kernels.matrix_thresholds(progs, sa.X)
    L = layout.sums_layout(sa.g)
    positive = 0
    for i in range(len(trees)):
        ref = spec.block_sums(sa, spec.position_terms(sa, h_all[i]))["kl"].sum()
        # rel: the two logs differ by at most 1 ulp; abs: a KL that is rounding noise
        # (the standard rule's is 0 in exact arithmetic) at the fixed point's scale
        assert rows[i, L.kl] == pytest.approx(ref, rel=1e-12, abs=1e-12), i
        positive += ref > 1e-6
    assert positive >= 5
    from evolve.kernels import fixed
    assert np.array_equal(fixed.to_float(dev), rows)


def test_threshold_sums_use_the_same_log(sa):
    """The threshold path (``threshold_sums``) runs the same tile scorer: a rule's
    thresholds give its program's sums, KL included."""
    nodes = treeio.parse("pmin(1.0, pdiv(target_prob, mul(0.6, draft_prob)))")
    progs = treeio.linearise([nodes])
    h = tok_kernels.matrix_thresholds(progs, sa.X)[0]
    assert np.array_equal(spec_kernels.threshold_sums(h, sa, with_kl=True),
                          spec_kernels.population_objectives(progs, sa, with_kl=True)[0])


# ------------------------------------------------------------------ runs

KL_RUN = dict(population=40, seed=4, objective="speed_kl", kl_budget=0.02, tv_p99_cap=0.3,
              batch_blocks=60, writeback=False)


@pytest.mark.slow
def test_speed_kl_run_on_the_torch_kernels_is_the_cpu_run(tmp_path, npz_dir, torch_on_cpu,
                                                          monkeypatch):
    cpu = evolve.run(generations=3, data_dir=npz_dir, runs_dir=tmp_path, name="cpu", **KL_RUN)
    real, flags = gpu_traces.population_sums, []

    def spy(progs, sa, with_kl=True, *a, **kw):
        flags.append(with_kl)
        return real(progs, sa, with_kl, *a, **kw)
    monkeypatch.setattr(gpu_traces, "population_sums", spy)
    dev = evolve.run(generations=3, data_dir=npz_dir, runs_dir=tmp_path, name="dev",
                     device="cuda", **KL_RUN)
    assert flags and all(flags)               # every population's KL summed on the device
    assert view(dev) == view(cpu)
    assert cpu.champion["metrics"]["valid"]["kl_per_token"] > 0


def test_the_trajectory_objective_stays_on_cpu(tmp_path, npz_dir):
    r = invoke("run", "--generations", 1, "--device", "cuda", "--objective", "speed",
               "--trajectory", "--data", npz_dir, "--runs-dir", tmp_path)
    one_line_error(r, "--device", "cpu only")


# -------------------------------------------------------------- tradeoff

def _numba_refused(*a, **k):
    raise AssertionError("a kernel sum of the trade-off ran on the Numba kernel")


def _tradeoff(data, tmp_path, *extra):
    r = invoke("tradeoff", "--data", data, "--budget", "0.03", "--runs-dir",
               tmp_path / "runs", "--json", *extra)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    doc.pop("seconds")
    return doc


@pytest.mark.slow
def test_tradeoff_on_the_device_is_the_cpu_tradeoff(tmp_path, small_dir, torch_on_cpu,
                                                     monkeypatch):
    """The whole JSON document, every number, is the same on cpu and on cuda, and on
    cuda the kernel sums (sweeps, tuning, headroom) ran on the torch kernel."""
    cpu = _tradeoff(small_dir, tmp_path, "--device", "cpu")
    real, calls = gpu_traces.population_sums, []

    def spy(progs, sa, with_kl=True, *a, **kw):
        calls.append(bool(with_kl))
        return real(progs, sa, with_kl, *a, **kw)
    monkeypatch.setattr(gpu_traces, "population_sums", spy)
    monkeypatch.setattr(spec, "population_results", _numba_refused)
    dev = _tradeoff(small_dir, tmp_path, "--device", "cuda")
    assert True in calls and False in calls      # the sweeps (KL) and the headroom tuning
    assert dev == cpu


def test_tradeoff_device_errors_are_one_line(tmp_path, npz_dir, monkeypatch):
    r = invoke("tradeoff", "--data", npz_dir, "--device", "tpu")
    one_line_error(r, "--device", "'tpu'")
    monkeypatch.delenv(gpu.OVERRIDE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = invoke("tradeoff", "--data", npz_dir, "--device", "cuda")
    one_line_error(r, "--device", "no CUDA device")
    import sys
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch fails
    r = invoke("tradeoff", "--data", npz_dir, "--device", "cuda")
    one_line_error(r, "--device", "needs torch")


@pytest.mark.slow
def test_tradeoff_with_a_fixed_rule_is_the_same_on_the_device(small_dir, torch_on_cpu,
                                                              monkeypatch):
    """A fixed rule (a run's champion in ``evolve tradeoff --run``) is scored with KL by
    the kernel: the same report from the torch kernel."""
    from evolve.data import traces
    splits = traces.load_splits(small_dir, ("valid", "test"))
    sas = {s: spec.TraceArrays.from_split(ts) for s, ts in splits.items()}
    extra = {"mine": treeio.parse("pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))")}
    cpu = tuning.tradeoff(sas["valid"], sas["test"], [0.02], extra, device="cpu")
    monkeypatch.setattr(spec, "population_results", _numba_refused)
    dev = tuning.tradeoff(sas["valid"], sas["test"], [0.02], extra, device="cuda")
    assert cpu["extra"]["mine"]["test"]["kl_per_token"] > 0
    assert json.dumps(dev, sort_keys=True) == json.dumps(cpu, sort_keys=True)


@pytest.mark.parametrize("budget", [None, "20000"])
def test_kl_evaluators_on_the_device_in_memory_and_sharded(tmp_path, torch_on_cpu,
                                                           monkeypatch, budget):
    """``trace_evaluator(..., with_kl=True)`` of a split in memory and of a sharded one
    (every shard resident, or streamed under a 20 kB budget), whole and on minibatches
    across shard boundaries: the CPU evaluators' rows, KL included, bit for bit."""
    from evolve.cluster.session import Session
    from evolve.data import shards as S
    from evolve.data import traces
    from evolve.data.shard_writer import shard_dir
    from types import SimpleNamespace

    from evolve.objectives import placement
    from evolve.objectives.splits import ArraySplit
    if budget:
        monkeypatch.setenv(gpu.MEMORY, budget)
    for s in traces.SPLITS:
        traces.save(tracekit.split(s, SMALL), tmp_path / f"{s}.npz")
    shard_dir(tmp_path, tmp_path / "shards", 40)          # valid: 3 shards of 10 blocks
    sharded = Session().attach(S.load_splits(tmp_path / "shards"))["valid"]
    assert len(sharded.backend.shards) == 3
    memory = ArraySplit(tracekit.split("valid", SMALL))
    programs = treeio.linearise(random_trees(6, 23, trace=True))
    L = layout.sums_layout(SMALL.block_size)
    blocks = np.array([0, 3, 9, 10, 11, 19, 20, 23])
    for split in (memory, sharded):
        cpu = split.evaluator("valid", None, True, 0.05)
        dev = placement.trace_evaluator(split, "valid", SimpleNamespace(device="cuda"), 0.05,
                                        with_kl=True)
        want = cpu.run(programs)
        assert (want[:, L.kl] > 0).any()
        assert np.array_equal(dev.run(programs).view(np.int64), want.view(np.int64))
        assert np.array_equal(dev.batch(blocks).run(programs).view(np.int64),
                              cpu.batch(blocks).run(programs).view(np.int64))
    assert gpu_traces.device_split(memory.spec_arrays(), CPU).streaming == bool(budget)
