"""The fused interpreter (``evolve.kernels.gpu.fused``, Triton) gives the Numba kernels'
values, counts and 128-bit trace sums bit for bit. No GPU here: the kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``, numpy on the CPU, switched on by
``choice.fused_for`` on torch's CPU device); on a machine with a GPU the same tests run the
compiled kernels on it. The interpreter runs a kernel instruction by instruction in
Python, so sizes are small: a trace program costs about 0.1 s per drafted position."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    # Triton decides for every function, its own included, when it is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

import evolve                                                             # noqa: E402
from evolve.kernels import gpu                                            # noqa: E402
from evolve.kernels.gpu import choice                                     # noqa: E402
from evolve.kernels import speculative as spec_kernels                    # noqa: E402
from evolve.kernels import tokens as tok_kernels                          # noqa: E402
from evolve.kernels.gpu import tokens as gpu_tokens                       # noqa: E402
from evolve.kernels.gpu import traces as gpu_traces                       # noqa: E402
from evolve.lang import primitives as P                                   # noqa: E402
from evolve.lang import treeio                                            # noqa: E402
from evolve.objectives.spec import TraceArrays                             # noqa: E402
from tests import tracekit                                                # noqa: E402
from tests.clikit import invoke, isolated, one_line_error  # noqa: E402,F401 (isolated: a fixture)
from tests.test_gpu_eval import edge_programs, random_trees, raw, same_bits  # noqa: E402
from tests.test_kernels import edge_dataset                               # noqa: E402

C = P.OP_CONST
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def fused():
    """The fused kernels: compiled on a GPU, else in Triton's interpreter."""
    return choice.fused_for(DEV, "fused")


def primitive_programs():
    """Every primitive on inputs, on 1e-300 and on -0.0, and -0.0 itself."""
    progs = []
    for p in P.PRIMITIVES:
        args = [(5,), (0,), (1,)][:p.arity] if p.name == "ite" else [(j,) for j in range(p.arity)]
        progs.append(list(reversed(args)) + [(p.opcode,)])
        progs.append([(C, 1e-300)] * (p.arity - 1) + [(3,), (p.opcode,)])
        progs.append([(C, -0.0)] * (p.arity - 1) + [(2,), (p.opcode,)])
    progs += [[(C, -0.0)], [(C, 0.0), (P.OP["neg"],)], [(0,), (C, -0.0), (P.OP["mul"],)]]
    return raw(progs)


# ------------------------------------------------------------ token splits

def test_every_primitive_and_edge_program_gives_the_numba_values(fused):
    """Thresholds, bit for bit (-0.0 and NaN included), on the edge split (NaN, inf, 0,
    1e-300, 1e300 inputs), and the counts: every primitive alone, then the hand-made
    edge programs (NaN and inf made on purpose, ~0 divisions, huge exponents, stacks
    40 deep, which spill out of the registers)."""
    arrays = tok_kernels.TokenArrays(edge_dataset())
    for programs in (primitive_programs(), edge_programs()):
        same_bits(gpu_tokens.population_thresholds(programs, arrays, kernel="fused", device=DEV),
                  tok_kernels.population_thresholds(programs, arrays))
        assert np.array_equal(gpu_tokens.population_counts(programs, arrays,
                                                           kernel="fused", device=DEV),
                              tok_kernels.population_counts(programs, arrays))


def _halfway_arguments() -> list:
    """Arguments x of exp whose x / ln 2 rounds to exactly n + 1/2 (round half to even
    and round half up disagree there)."""
    from tests.test_gpu_eval import _halfway_arguments as halfway
    return halfway()


def test_exp_log_and_sqrt_of_computed_values(fused):
    """plog, pexp and psqrt of computed values (of inputs they are read from the split's
    precomputed columns), bit for bit the Numba interpreter's: random arguments, exact
    halfway cases of exp's range reduction, subnormals, 0, inf and NaN."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-800, 60, 3000), rng.normal(0, 3, 3000),
                        np.exp(rng.uniform(-745, 709, 3000)), _halfway_arguments(),
                        [0.0, -0.0, 1e-320, -745.13, 709.78, 49.999999, 50.0, np.nan, np.inf,
                         -np.inf, 1e-12, 1.0000000000000002, 51.0, 5e-324]])
    X = np.stack([x, x[::-1].copy()])
    one = (C, 1.0)
    programs = raw([[one, (0,), (P.OP["mul"],), (P.OP[f],)] for f in ("plog", "pexp", "psqrt")])
    out = torch.empty((len(programs), x.size), dtype=torch.float64, device=DEV)
    Xd = torch.as_tensor(X, device=DEV)
    fused.token_values(fused.Programs(programs, DEV), Xd,
                       torch.as_tensor(tok_kernels.derived_columns(X), device=DEV), out,
                       block=1024)
    same_bits(out.cpu().numpy(), tok_kernels.matrix_thresholds(programs, X))


def test_token_counts_equal_the_numba_kernel(small_splits, fused):
    """Random trees of the real primitive set on a token split: in one launch (two tiles
    of one work item) and in chunks of 97 rows (a partial tile each, counts added
    across launches)."""
    programs = treeio.linearise(random_trees(40, 5))
    arrays = tok_kernels.TokenArrays(small_splits["valid"])
    want = tok_kernels.population_counts(programs, arrays)
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, kernel="fused",
                                                       device=DEV), want)
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, chunk_rows=97,
                                                       kernel="fused", device=DEV), want)


def test_work_items_of_several_tiles_and_a_small_grid(small_splits, fused):
    """Tiles of 64 rows, several per work item and several items per thread block of
    the persistent grid, with the values stored and the counts added from each."""
    programs = treeio.linearise(random_trees(6, 8))
    arrays = tok_kernels.TokenArrays(small_splits["train"])
    ds = gpu_tokens.device_split(arrays, DEV)
    X, U, rand, base, std_q = ds.chunk(0, ds.n)
    progs = fused.Programs(programs, DEV)
    out = torch.zeros((len(programs), 6), dtype=torch.int64, device=DEV)
    fused.token_counts(progs, X, U, rand, base, std_q, out, block=64)
    assert np.array_equal(out.cpu().numpy(), tok_kernels.population_counts(programs, arrays))
    H = torch.empty((len(programs), ds.n), dtype=torch.float64, device=DEV)
    fused.token_values(progs, X, U, H, block=64)
    same_bits(H.cpu().numpy(), tok_kernels.population_thresholds(programs, arrays))


# ------------------------------------------------------------ trace splits

@pytest.fixture(scope="module")
def sa():
    return TraceArrays.from_split(tracekit.split("valid"))


def _trace_programs(n):
    return treeio.linearise(random_trees(n, 9, trace=True) + [treeio.parse("p_max")])


def test_trace_sums_with_kl_on_minibatches_in_chunks_and_batches(sa, fused):
    """The 128-bit sums, KL and a tail cap included, integer for integer: a minibatch of
    150 blocks in chunks of 100 (gathered on the device) and batches of 3 programs."""
    programs = _trace_programs(5)
    blocks = np.sort(np.random.default_rng(0).choice(sa.n_blocks, 150, replace=False))
    got = gpu_traces.population_sums(programs, sa, with_kl=True, tail_cap=0.05,
                                     blocks=blocks, chunk_blocks=100, batch_programs=3,
                                     kernel="fused", device=DEV)
    assert np.array_equal(got, spec_kernels.population_sums(programs, sa.blocks(blocks),
                                                            with_kl=True, tail_cap=0.05))


def test_trace_sums_of_edge_programs_over_several_tiles(sa, fused):
    """Thresholds that are NaN, inf, negative or above 1 (clipped as the Numba kernel
    clips them), a program deep enough to spill, KL without a tail, on blocks where a
    quarter of the candidates have p = 0 (with a zero threshold, KL terms 0 log 0/0):
    70 blocks in tiles of 32 (the last one partial), several tiles per thread block."""
    op = P.OP
    deep = [(0,)]
    for j in range(7):
        deep = [(1 + j % 4,)] + deep + [((op["add"], op["mul"], op["pdiv"])[j % 3],)]
    programs = raw([[(0,), (C, 0.0), (op["pdiv"],)],                       # 0 / q: 0
                    [(1,), (0,), (C, np.inf), (C, 0.0), (op["mul"],), (op["ite"],)],  # NaN ? q : p
                    [(0,), (C, -3.0), (op["mul"],)],                        # negative
                    [(C, 1e308), (C, 1e308), (op["mul"],)],                 # inf
                    [(C, np.inf), (0,), (op["mul"],)],             # inf, NaN where q is 0
                    [(C, 0.0), (C, 1e308), (C, 1e308), (op["mul"],), (op["mul"],)],  # NaN
                    deep])
    part = sa.blocks(np.arange(70))
    zero = np.random.default_rng(3).random(part.cp.size) < 0.25    # candidates with p = 0
    part = dataclasses.replace(part, cp=np.where(zero, 0.0, part.cp))
    cols = fused.candidate_major(gpu_traces.device_split(part, DEV))
    acc = torch.zeros((4, len(programs), 5 + 3 * sa.g + 1), dtype=torch.int64, device=DEV)
    fused.trace_sums(fused.Programs(programs, DEV), cols, sa.g, sa.k, acc, 0, len(programs),
                     with_kl=True, block=32)
    assert np.array_equal(gpu_traces.finish(acc.cpu().numpy()),
                          spec_kernels.population_sums(programs, part, with_kl=True))


def test_a_tail_cap_equal_to_a_slot_tv_is_a_tie(sa, fused):
    """The tail counts slots with TV strictly above the cap: caps equal to a reached
    slot's TV (from the numpy reference) give the Numba kernel's sums."""
    from evolve.objectives import spec
    part = sa.blocks(np.arange(24))
    one = treeio.linearise([treeio.parse("p_max")])
    h = tok_kernels.matrix_thresholds(one, part.X)[0]
    ties = 0
    for cap in np.unique(np.asarray(spec.position_terms(part, h).tv).reshape(-1)).tolist():
        want = spec_kernels.population_sums(one, part, with_kl=False, tail_cap=cap)
        below = spec_kernels.population_sums(one, part, with_kl=False,
                                             tail_cap=float(np.nextafter(cap, -1.0)))
        if not np.array_equal(want, below):
            ties += 1
            assert np.array_equal(gpu_traces.population_sums(one, part, with_kl=False, tail_cap=cap,
                                                             kernel="fused", device=DEV), want)
            if ties == 2:
                break
    assert ties == 2


# ------------------------------------------------------------ choosing the kernel

def test_the_probe_passes_and_catches_other_bits(fused, monkeypatch):
    assert fused.probe(DEV) == ""
    real = fused.token_values

    def one_ulp_off(progs, X, U, out, block=fused.TOKEN_BLOCK):
        real(progs, X, U, out, block)
        out[3, 7] = torch.nextafter(out[3, 7], out[3, 7] + 1)
    monkeypatch.setattr(fused, "token_values", one_ulp_off)
    why = fused.probe(DEV)
    assert "\n" not in why and "other bits" in why and "on 1 of" in why, why
    assert why.endswith(" in " + treeio.to_string(fused._probe_programs()[3])), why


def test_the_kernel_is_chosen_once_and_can_be_forced(monkeypatch, fused):
    cpu = torch.device("cpu")
    monkeypatch.delenv(gpu.KERNEL, raising=False)
    assert choice.kernel_for(cpu) == "torch"             # the fused kernels need CUDA
    monkeypatch.setenv(gpu.KERNEL, "torch")
    assert choice.fused_for(cpu) is None
    monkeypatch.setenv(gpu.KERNEL, "fused")
    assert choice.kernel_for(cpu) == "fused" and choice.fused_for(cpu) is fused
    monkeypatch.setenv(gpu.KERNEL, "numba")
    with pytest.raises(gpu.DeviceError, match="EVOLVE_GPU_KERNEL: 'numba' is invalid"):
        choice.kernel_for(cpu)
    with pytest.raises(ValueError, match="kernel: 'x'"):
        choice.fused_for(cpu, "x")
    # on CUDA, a failed probe is one warning and the torch kernels score
    monkeypatch.delenv(gpu.KERNEL)
    monkeypatch.setattr(choice, "_READY", {})
    monkeypatch.setattr(fused, "interpreted", lambda: False)
    monkeypatch.setattr(fused, "probe", lambda dev: "the fused kernels give other bits")
    with pytest.warns(RuntimeWarning, match="other bits.*torch kernels"):
        assert choice.kernel_for(torch.device("cuda")) == "torch"
    assert choice.kernel_for(torch.device("cuda")) == "torch"     # probed once


def test_forced_fused_without_triton_or_a_bad_kernel_is_one_line(tmp_path, small_data_dir,
                                                                  monkeypatch, isolated):
    monkeypatch.setenv(gpu.OVERRIDE, "cpu")
    monkeypatch.setenv(gpu.KERNEL, "fused")
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    r = invoke("run", "--generations", 1, "--device", "cuda", "--data", small_data_dir,
               "--runs-dir", tmp_path / "runs", "--no-writeback")
    one_line_error(r, "--device", "needs triton", "EVOLVE_GPU_KERNEL=torch")
    monkeypatch.setenv(gpu.KERNEL, "fast")
    r = invoke("run", "--generations", 1, "--device", "cuda", "--data", small_data_dir,
               "--runs-dir", tmp_path / "runs", "--no-writeback")
    one_line_error(r, "EVOLVE_GPU_KERNEL", "'fast'")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_token_run_on_the_fused_kernels_is_the_cpu_run(tmp_path, small_data_dir, fused,
                                                         monkeypatch, isolated):
    from tests.test_gpu_runs import view
    opts = dict(generations=2, population=16, seed=4, writeback=False,
                data_dir=small_data_dir, runs_dir=tmp_path)
    cpu = evolve.run(name="cpu", **opts)
    monkeypatch.setenv(gpu.OVERRIDE, DEV.type)
    monkeypatch.setenv(gpu.KERNEL, "fused")
    dev = evolve.run(name="dev", device="cuda", **opts)
    assert view(dev) == view(cpu)


# ------------------------------------------------------------ compiled for a GPU

COMPILE = textwrap.dedent("""
    import json, re, sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type
    from evolve.kernels import layout
    from evolve.kernels.gpu import fused as F
    from evolve.lang import treeio
    arch, fusion = int(sys.argv[1]), sys.argv[2] == "1"
    cpu, f64, i64 = torch.device("cpu"), torch.float64, torch.int64
    progs = F.Programs(treeio.linearise(F._probe_programs()), cpu)
    X, U = torch.rand((6, 1000), dtype=f64), torch.rand((18, 1000), dtype=f64)
    calls = [F.token_call(progs, X, U, torch.zeros((progs.n, 6), dtype=i64),
                          torch.rand(1000, dtype=f64), torch.zeros(1000, dtype=torch.bool),
                          torch.zeros(1000, dtype=i64)),
             F.token_call(progs, X, U, torch.empty((progs.n, 1000), dtype=f64))]
    g, k, nb = 4, 16, 200
    cols = (torch.rand((9, g * k, nb), dtype=f64),
            *(torch.rand((g * k, nb), dtype=f64) for _ in range(3)),
            torch.rand((layout.N_ROW_CONSTANTS, g, nb), dtype=f64),
            torch.zeros((g, nb), dtype=i64), torch.rand((g, nb), dtype=f64))
    acc = torch.zeros((4, progs.n, layout.width(g)), dtype=i64)
    calls += [F.trace_call(progs, cols, g, k, acc, 0, progs.n, 0.05, kl) for kl in (0, 1)]
    found = {}
    for call in calls:              # each kernel with the argument types of its launch
        args = iter(call.args)
        sig = {a: "constexpr" if a in call.meta else mangle_type(next(args))
               for a in call.kernel.arg_names}
        k = triton.compile(ASTSource(call.kernel, sig, call.meta),
                           target=GPUTarget("cuda", arch, 32),
                           options=dict(num_warps=F.WARPS, enable_fp_fusion=fusion))
        ptx = k.asm["ptx"]
        for pat in ("fma.rn.f64", "div.rn.f64", "sqrt.rn.f64", "f32", "approx"):
            found[pat] = found.get(pat, 0) + len(re.findall(re.escape(pat), ptx))
        # the float64 tensors each loop carries, and every float64 immediate
        found.setdefault("carried", []).extend(
            line.split("->")[0].count("xf64>") for line in k.asm["ttir"].splitlines()
            if "scf.while" in line)
        found["immediates"] = sorted(set(found.get("immediates", []))
                                     | set(re.findall(r"0d([0-9A-F]{16})", ptx)))
    print(json.dumps(found))
""")


# Other Triton releases to compile with: folders holding one each (``pip install
# --target DIR triton==X``), separated by os.pathsep; ``make test-triton-releases`` sets
# it to the release torch's CUDA 13 wheels pin (3.6.0). CI compiles with the pinned one.
RELEASES = [None] + [d for d in os.environ.get("EVOLVE_TRITON_RELEASES", "").split(os.pathsep)
                     if d]


@functools.lru_cache(maxsize=None)
def _compiled_ptx(arch: int, fusion: bool, release: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(([release] if release else [])
                                        + [str(Path(__file__).resolve().parents[1])]
                                        + sys.path)
    r = subprocess.run([sys.executable, "-c", COMPILE, str(arch), "1" if fusion else "0"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the other tests run them compiled")
@pytest.mark.parametrize("release", RELEASES)
def test_the_kernels_compile_for_a_gpu_without_fused_multiply_adds(release):
    """The compiled path, which the interpreter does not take: the kernels compile, with
    the argument types of their launches, for an H100 (sm_90, Triton's own ptxas, no GPU
    needed), with IEEE division and square root, no float64 FMA and no float32 at all
    (a float argument would be float32: the tail cap goes by memory); with fusion
    allowed the same check finds FMAs."""
    got = _compiled_ptx(90, False, release)
    assert got["fma.rn.f64"] == 0 and got["f32"] == 0 and got["approx"] == 0, got
    assert got["div.rn.f64"] >= 6 and got["sqrt.rn.f64"] >= 2, got
    assert _compiled_ptx(90, True, release)["fma.rn.f64"] > 0


def _hex(x: float) -> str:
    return np.float64(x).view(np.uint64).item().to_bytes(8, "big").hex().upper()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the other tests run them compiled")
@pytest.mark.parametrize("release", RELEASES)
def test_the_compiled_kernels_keep_every_register_and_float64_constant(release):
    """Two ways the compiled kernels once differed from the interpreter on a GPU (10,128
    of 31,232 probe values on an H100 with Triton 3.6, then 1): Triton's compiler
    carries through a loop only the names the body changes, judged by identity, so a
    stack register that started as another's alias stayed 0 (3.6 and 3.9); and Triton
    3.6 rounds a Python float compared with a float64 tensor to float32 first (pdiv at
    |b| = 1e-9; ``make test-triton-releases`` compiles with 3.6). So: the interpreter's loop
    carries its four float64 registers, and no float64 immediate of the PTX is a
    constant of the kernels rounded to float32; the thresholds are there exactly."""
    got = _compiled_ptx(90, False, release)
    assert got["carried"] and min(n for n in got["carried"] if n) >= 4, got["carried"]
    assert max(got["carried"]) >= 4
    import triton.language as tl
    from evolve.kernels.gpu import fused as F
    consts = [v for v in vars(F).values()
              if isinstance(v, tl.constexpr) and isinstance(v.value, float)]
    rounded = {_hex(float(np.float32(c.value))) for c in consts
               if np.isfinite(np.float32(c.value)) and float(np.float32(c.value)) != c.value}
    assert not rounded & set(got["immediates"]), sorted(rounded & set(got["immediates"]))
    from heuristics import ops as O
    for c in (O.DIV_EPS, O.LOG_EPS, O.SQRT2):
        assert _hex(c) in got["immediates"], c
