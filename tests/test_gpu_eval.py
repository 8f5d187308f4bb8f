"""The torch evaluation path (``--device cuda``, ``evolve.kernels.gpu``) gives the Numba
kernels' results bit for bit. No GPU here: the same torch code runs on torch's CPU
device (the code is device-agnostic; ``EVOLVE_TORCH_DEVICE=cpu`` makes ``cuda`` mean
it for the end-to-end tests).

Also guarantee 28 of docs/reliability.md, Evaluation on a GPU gives the CPU kernels'
results, bit for bit: see tests/test_gpu_runs.py.
"""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from evolve.kernels import fixed                                         # noqa: E402
from evolve.lang.randtrees import random_trees                             # noqa: E402
from evolve.kernels import speculative as spec_kernels                    # noqa: E402
from evolve.kernels import tokens as tok_kernels                          # noqa: E402
from evolve.kernels.gpu import interp                                     # noqa: E402
from evolve.kernels.gpu import tokens as gpu_tokens                       # noqa: E402
from evolve.kernels.gpu import traces as gpu_traces                       # noqa: E402
from evolve.lang import primitives as P                                   # noqa: E402
from evolve.lang import treeio                                            # noqa: E402
from evolve.objectives.spec import TraceArrays                             # noqa: E402
from heuristics import ops as O                                           # noqa: E402
from tests import tracekit                                                 # noqa: E402
from tests.test_kernels import edge_dataset                               # noqa: E402

CPU = torch.device("cpu")
C = P.OP_CONST


def raw(tokens_list):
    """Programs from reversed-prefix (opcode, const) token lists (their stack depth
    counted as ``treeio.linearise`` does: the Numba kernel trusts it)."""
    arity = {p.opcode: p.arity for p in P.PRIMITIVES}
    ops, consts, starts, lengths = [], [], [], []
    max_stack = 1
    for toks in tokens_list:
        starts.append(len(ops))
        lengths.append(len(toks))
        ops += [t[0] for t in toks]
        consts += [t[1] if len(t) > 1 else 0.0 for t in toks]
        sp = 0
        for t in toks:
            sp += 1 - arity.get(t[0], 0)
            max_stack = max(max_stack, sp)
        assert sp == 1, toks
    return treeio.Programs(np.array(ops, np.int32), np.array(consts, np.float64),
                           np.array(starts, np.int64), np.array(lengths, np.int64), max_stack)


def edge_programs(n_inputs=6):
    """Hand-made programs at the edges: division by ~0, huge exponents, logs of 0 and
    subnormals, NaN and inf made on purpose, NaN through min/max/comparisons, and deep
    stacks."""
    op = P.OP
    progs = [
        [(1,), (C, 1e-300), (op["pdiv"],)],                       # 1e-300 / t
        [(C, 1e-10), (0,), (op["pdiv"],)],                        # d / 1e-10 (protected)
        [(C, 0.0), (C, 1e308), (op["mul"],), (op["pexp"],)],      # exp of a constant 0
        [(0,), (C, 700.0), (op["mul"],), (op["pexp"],)],          # 700 d, clamped at 50
        [(0,), (C, -800.0), (op["mul"],), (op["pexp"],)],         # exp underflow, subnormal
        [(0,), (C, -709.5), (op["add"],), (op["pexp"],)],
        [(0,), (C, 5e-324), (op["mul"],), (op["plog"],)],         # log of subnormals / 0
        [(C, 2.2250738585072014e-308), (op["plog"],), (1,), (op["add"],)],
        [(0,), (op["plog"],), (op["pexp"],), (op["psqrt"],)],
        [(C, 1e308), (C, 1e308), (op["mul"],), (C, 1e308), (C, -1e308), (op["mul"],),
         (op["add"],), (0,), (op["pmin"],)],                      # pmin(d, inf + -inf = NaN)
        [(0,), (C, 1e308), (C, 1e308), (op["mul"],), (C, 1e308), (C, -1e308), (op["mul"],),
         (op["add"],), (op["pmax"],)],                            # pmax(NaN, d)
        [(1,), (C, np.inf), (C, 0.0), (op["mul"],), (op["lt"],)],  # lt(inf*0 = NaN, t)
        [(C, np.inf), (C, 0.0), (op["mul"],), (op["not_"],), (0,), (op["and_"],),
         (C, 0.0), (op["or_"],)],
        [(1,), (0,), (C, np.inf), (C, 0.0), (op["mul"],), (op["ite"],)],   # ite(NaN, d, t)
        [(C, 0.5), (C, 0.5), (op["sub"],), (op["neg"],), (op["absf"],), (op["square"],)],
    ]
    deep = [(0,)]
    for j in range(40):                                           # a deep right spine
        deep = [(j % n_inputs,)] + deep + [(list(op.values())[j % 6],)]
    progs.append(deep)
    wide = [(j % n_inputs,) for j in range(12)] + [(op["add"],)] * 11   # a deep stack
    progs.append(wide)
    return raw(progs)


def same_bits(a, b):
    """Equal arrays, NaN where the other has NaN (the bits of a NaN's payload are the
    device's)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b))
    assert np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64))


# ------------------------------------------------------------ the primitives

def _halfway_arguments() -> list:
    """Arguments x of exp whose x / ln 2 rounds to exactly n + 1/2 (round half to even
    and round half up disagree there)."""
    out = []
    for half in (0.5, 2.5, -1.5, -3.5, 10.5, -20.5):
        x = half / O.INV_LN2
        for _ in range(200):
            got = x * O.INV_LN2
            if got == half:
                out.append(x)
                break
            x = np.nextafter(x, np.inf if got < half else -np.inf)
    assert len(out) >= 4, out
    return out


def test_exp_and_log_are_heuristics_ops_bit_for_bit():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-800, 60, 20000), rng.normal(0, 3, 20000),
                        _halfway_arguments(),
                        [0.0, -0.0, 1e-320, -745.13, -745.2, 709.78, 49.999999, 50.0,
                         np.nan, np.inf, -np.inf, 1e-12, 1.0000000000000002]])
    t = torch.as_tensor(x)
    same_bits(interp.pexp(t).numpy(), np.array([O.pexp(v) for v in x]))
    same_bits(interp.plog(t).numpy(), np.array([O.plog(v) for v in x]))
    pos = np.abs(x[np.isfinite(x)]) + 1e-300
    same_bits(interp.log_poly(torch.as_tensor(pos)).numpy(),
              np.array([O.log_poly(v) for v in pos]))


def test_sqrt_is_correctly_rounded():
    """psqrt on computed values (not only inputs): IEEE's square root, as the Numba
    kernels get from the hardware, on random, tiny, subnormal and huge arguments."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(0, 100, 50000), np.exp(rng.uniform(-745, 709, 50000)),
                        [0.0, -0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 1.0, 4.0,
                         np.nextafter(4.0, 0), np.nextafter(1.0, 2), 1.7976931348623157e308,
                         -51.0, np.inf, -np.inf, np.nan]])
    same_bits(interp.unary(interp.PSQRT, torch.as_tensor(x)).numpy(), np.sqrt(np.abs(x)))


def test_each_primitive_matches_the_kernel_on_edge_inputs():
    """Every primitive alone on the edge inputs (NaN, inf, 0, 1e-300, 1e300, ...):
    the torch thresholds are the Numba interpreter's."""
    arrays = tok_kernels.TokenArrays(edge_dataset())
    progs = []
    for p in P.PRIMITIVES:
        if p.name in ("and_", "or_", "not_", "ite", "lt"):
            args = [(5,), (0,), (1,)][:p.arity] if p.name == "ite" else \
                [(j,) for j in range(p.arity)]
        else:
            args = [(j,) for j in range(p.arity)]
        progs.append(list(reversed(args)) + [(p.opcode,)])
        progs.append([(C, 1e-300)] * (p.arity - 1) + [(3,), (p.opcode,)])
    programs = raw(progs)
    same_bits(gpu_tokens.population_thresholds(programs, arrays, device=CPU),
              tok_kernels.population_thresholds(programs, arrays))


# ------------------------------------------------------------ token splits

def test_token_counts_equal_the_numba_kernel(small_splits):
    """Random trees of the real primitive set and the edge programs, on a token split
    and on the edge split, in one chunk and in several (chunks of 97 rows)."""
    programs = treeio.linearise(random_trees(60, 5))
    arrays = tok_kernels.TokenArrays(small_splits["valid"])
    want = tok_kernels.population_counts(programs, arrays)
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, device=CPU), want)
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, chunk_rows=97, device=CPU),
                          want)
    same_bits(gpu_tokens.population_thresholds(programs, arrays, device=CPU),
              tok_kernels.population_thresholds(programs, arrays))
    edge = tok_kernels.TokenArrays(edge_dataset())
    for progs in (edge_programs(), programs):
        assert np.array_equal(gpu_tokens.population_counts(progs, edge, chunk_rows=5, device=CPU),
                              tok_kernels.population_counts(progs, edge))


# ------------------------------------------------------------ trace splits

@pytest.fixture(scope="module")
def sa():
    return TraceArrays.from_split(tracekit.split("valid"))


def _trace_programs():
    return treeio.linearise(random_trees(30, 9, trace=True)
                            + [treeio.parse("target_prob"), treeio.parse("p_max")])


@pytest.mark.parametrize("cap", [spec_kernels.TAIL_OFF, 0.05])
def test_trace_sums_equal_the_numba_kernel(sa, cap):
    """The exact 128-bit sums, integer for integer, with and without a tail cap, in one
    chunk and in chunks of 150 blocks (the last one short) and batches of 8 programs."""
    programs = _trace_programs()
    want = spec_kernels.population_sums(programs, sa, with_kl=False, tail_cap=cap)
    got = gpu_traces.population_sums(programs, sa, with_kl=False, tail_cap=cap, device=CPU)
    assert np.array_equal(got, want)
    got = gpu_traces.population_sums(programs, sa, with_kl=False, tail_cap=cap, chunk_blocks=150,
                                     batch_programs=8, device=CPU)
    assert np.array_equal(got, want)
    same_bits(fixed.to_float(got), spec_kernels.population_objectives(programs, sa, False, cap))


def test_a_tail_cap_equal_to_a_slot_tv_counts_as_the_kernel(sa):
    """The tail sums slots with TV strictly above the cap: a cap equal to a slot's TV
    (from the numpy reference, which gives the kernel's slot TVs) is a tie."""
    from evolve.objectives import spec
    trees = random_trees(3, 9, trace=True)
    progs = treeio.linearise(trees)
    h = tok_kernels.matrix_thresholds(progs, sa.X)
    ties = 0
    for i in range(len(trees)):
        tvs = np.unique(np.asarray(spec.position_terms(sa, h[i]).tv).reshape(-1))
        one = treeio.linearise([trees[i]])
        for cap in tvs[::max(1, len(tvs) // 10)].tolist():
            want = spec_kernels.population_sums(one, sa, with_kl=False, tail_cap=cap)
            below = spec_kernels.population_sums(one, sa, with_kl=False,
                                                 tail_cap=float(np.nextafter(cap, -1.0)))
            if not np.array_equal(want, below):           # a tie with a reached slot
                ties += 1
                assert np.array_equal(gpu_traces.population_sums(
                    one, sa, with_kl=False, tail_cap=cap, device=CPU), want)
                break
    assert ties >= 2


def test_trace_edge_programs_and_minibatches(sa):
    """Edge programs (NaN, inf, ~0 divisions, deep stacks) reading all nine trace
    inputs, and minibatches of blocks (gathered on the device) against the kernel on
    ``sa.blocks``."""
    programs = edge_programs(n_inputs=sa.X.shape[0])
    assert np.array_equal(gpu_traces.population_sums(programs, sa, with_kl=False,
                                                     chunk_blocks=200, device=CPU),
                          spec_kernels.population_sums(programs, sa, with_kl=False))
    rand = _trace_programs()
    for seed in (0, 1):
        blocks = np.sort(np.random.default_rng(seed).choice(sa.n_blocks, 40, replace=False))
        assert np.array_equal(
            gpu_traces.population_sums(rand, sa, False, blocks=blocks, chunk_blocks=16,
                                       device=CPU),
            spec_kernels.population_sums(rand, sa.blocks(blocks), with_kl=False))
        assert np.array_equal(spec_kernels.population_sums(rand, sa, False, blocks=blocks),
                              spec_kernels.population_sums(rand, sa.blocks(blocks), False))


def test_device_kernels_take_the_cpu_kernels_arguments_then_the_device():
    """Each device kernel's signature is its CPU kernel's (names, order, defaults), then
    keyword-only sizes a device chooses (``chunk_*``, ``batch_programs``, ``kernel``) and
    ``device`` last, with no default: ``evolve.objectives.placement`` resolves it."""
    import inspect
    pairs = [(gpu_traces.population_sums, spec_kernels.population_sums),
             (gpu_tokens.population_counts, tok_kernels.population_counts),
             (gpu_tokens.population_thresholds, tok_kernels.population_thresholds)]
    for on_device, on_cpu in pairs:
        dev = list(inspect.signature(on_device).parameters.values())
        cpu = list(inspect.signature(on_cpu).parameters.values())
        assert [(p.name, p.default) for p in dev[:len(cpu)]] == \
            [(p.name, p.default) for p in cpu], on_device.__name__
        extra = dev[len(cpu):]
        assert extra[-1].name == "device" and extra[-1].default is inspect.Parameter.empty
        assert all(p.kind is p.KEYWORD_ONLY for p in extra)
        assert {p.name for p in extra[:-1]} <= {"chunk_rows", "chunk_blocks", "batch_programs",
                                                "kernel"}


def test_fixed_point_limbs_add_like_the_kernel():
    """Values at the fixed point's edges (saturation, NaN, -0.0, 2^-80 steps, carries
    out of the low word, negative sums) give the kernel's (hi, lo) words."""
    vals = np.array([0.0, -0.0, np.nan, 1e300, -1e300, 2.0 ** 30, -(2.0 ** 30) - 1,
                     2.0 ** -80, -(2.0 ** -80), 3 * 2.0 ** -81, 1 - 2.0 ** -53, 0.1, -0.7,
                     1e-30, 5e-324, 123456.789] * 3)
    acc = np.zeros((1, 2), dtype=np.int64)
    add = fixed.add_to
    for v in vals:
        add(acc, 0, v)
    limbs = gpu_traces._limbs(torch.as_tensor(vals)).sum(dim=-1).numpy()
    assert np.array_equal(gpu_traces.finish(limbs[:, None]), acc)
    for v in vals:                        # one value at a time too
        one = np.zeros((1, 2), dtype=np.int64)
        add(one, 0, v)
        limbs = gpu_traces._limbs(torch.as_tensor([v])).sum(dim=-1).numpy()
        got = gpu_traces.finish(limbs[:, None])
        assert np.array_equal(got, one), v
