"""Streamed splits and sharded traces on the torch path (``--device cuda``;
``evolve.kernels.gpu.stream``): a split whose device columns do not fit half the
memory budget stays on the host and is copied chunk by chunk, and a sharded split
is scored shard by shard; the results are the Numba kernels', integer for integer.

No GPU here: the torch code runs on torch's CPU device (``EVOLVE_TORCH_DEVICE=cpu``
for the evaluators and runs), and ``EVOLVE_TORCH_MEMORY`` sets a budget small enough
to stream these tiny splits. Every test checks that the mode it means was taken.

Also guarantee 28 of docs/reliability.md, Evaluation on a GPU gives the CPU kernels'
results, bit for bit: see tests/test_gpu_runs.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import evolve                                                            # noqa: E402
from evolve.cluster.session import Session                               # noqa: E402
from evolve.data import shards as S                                      # noqa: E402
from evolve.data import traces as T                                      # noqa: E402
from evolve.data.shard_writer import shard_dir                           # noqa: E402
from evolve.kernels import fixed                                         # noqa: E402
from evolve.kernels import gpu                                           # noqa: E402
from evolve.kernels import speculative as spec_kernels                    # noqa: E402
from evolve.kernels import tokens as tok_kernels                          # noqa: E402
from evolve.kernels.gpu import stream                                    # noqa: E402
from evolve.kernels.gpu import tokens as gpu_tokens                       # noqa: E402
from evolve.kernels.gpu import traces as gpu_traces                       # noqa: E402
from evolve.lang import treeio                                           # noqa: E402
from evolve.objectives import on_device, placement                       # noqa: E402
from evolve.objectives.splits import ArraySplit                          # noqa: E402
from evolve.objectives.spec import TraceArrays                            # noqa: E402
from tests import tracekit                                               # noqa: E402
from tests.test_gpu_eval import random_trees, same_bits                  # noqa: E402
from tests.test_gpu_runs import view                                     # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")
ON_CUDA = SimpleNamespace(device="cuda")        # a run's configuration on device "cuda"
TINY_BUDGET = "20000"          # bytes: every split here streams, a block or two a chunk
STREAM_BUDGET = "2000000"      # bytes: the tiny train and valid traces stream, ~16 blocks a chunk
ROWS_PER_SHARD = 256           # train: 3 shards of 64 blocks; valid: 8


@pytest.fixture
def torch_on_cpu(monkeypatch):
    monkeypatch.setenv(gpu.OVERRIDE, "cpu")


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setenv(gpu.MEMORY, TINY_BUDGET)


@pytest.fixture(scope="module")
def shard_data(tmp_path_factory):
    """The tiny traces as .npz and sharded (``ROWS_PER_SHARD`` rows a shard)."""
    d = tmp_path_factory.mktemp("stream_traces")
    for s in T.SPLITS:
        T.save(tracekit.split(s), d / f"{s}.npz")
    shard_dir(d, d / "shards", ROWS_PER_SHARD)
    assert len(S.open_split(d / "shards" / "train").shards) == 3
    return d


def attached(shard_data) -> dict:
    """Sharded splits scored in this process (fresh: no device columns cached yet)."""
    return Session().attach(S.load_splits(shard_data / "shards"))


def trace_programs(n=12, seed=9):
    return treeio.linearise(random_trees(n, seed, trace=True)
                            + [treeio.parse("target_prob"), treeio.parse("p_max")])


# ------------------------------------------------------------ tokens

def test_streamed_token_split_counts_equal_the_numba_kernel(small_splits, small_budget):
    """A token split over the budget streams: counts and thresholds over several row
    chunks (forced and from the budget) are the Numba kernel's; each chunk is copied
    once per population, not once per program."""
    arrays = tok_kernels.TokenArrays(small_splits["train"])
    programs = treeio.linearise(random_trees(25, 5))
    want = tok_kernels.population_counts(programs, arrays)
    ds = gpu_tokens.device_split(arrays, CPU)
    assert ds.streaming and not hasattr(ds, "X")
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, chunk_rows=97, device=CPU),
                          want)
    assert ds.chunks == -(-arrays.n // 97)
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, device=CPU), want)
    step = gpu_tokens.chunk_size(programs, CPU, None, ds.bytes_per_row)
    assert step < arrays.n and ds.chunks == -(-arrays.n // 97) + -(-arrays.n // step)
    same_bits(gpu_tokens.population_thresholds(programs, arrays, chunk_rows=300, device=CPU),
              tok_kernels.population_thresholds(programs, arrays))


def test_a_token_split_within_the_budget_stays_resident(small_splits, monkeypatch):
    arrays = tok_kernels.TokenArrays(small_splits["valid"])
    need = (8 * 4 * arrays.X.shape[0] + 17) * arrays.n    # X, U, rand, base, std_q
    monkeypatch.setenv(gpu.MEMORY, str(int(need / stream.RESIDENT_SHARE)))
    ds = gpu_tokens.device_split(arrays, CPU)
    assert not ds.streaming and ds.bytes_per_row * arrays.n == need
    programs = treeio.linearise(random_trees(10, 6))
    assert np.array_equal(gpu_tokens.population_counts(programs, arrays, chunk_rows=97, device=CPU),
                          tok_kernels.population_counts(programs, arrays))
    assert ds.chunks == 0
    monkeypatch.setenv(gpu.MEMORY, str(int(need / stream.RESIDENT_SHARE) - 1))
    assert gpu_tokens.DeviceTokens(arrays, CPU).streaming       # one byte short: streams


# ------------------------------------------------------------ traces

@pytest.fixture(scope="module")
def sa():
    return TraceArrays.from_split(tracekit.split("train"))


def test_streamed_chunks_are_the_resident_columns(sa, monkeypatch):
    """Every field of a chunk copied from the host, and of a minibatch's chunk gathered
    there, is the resident view's tensor, value for value and in the same layout."""
    resident = gpu_traces.DeviceTrace.of(sa, CPU, streaming=False)
    streamed = gpu_traces.DeviceTrace.of(sa, CPU, streaming=True)
    assert gpu_traces.column_bytes(sa) == sum(getattr(resident, f).nbytes
                                              for f in gpu_traces.FIELDS)
    idx = np.sort(np.random.default_rng(3).choice(sa.n_blocks, 50, replace=False))
    for a, b in ((resident, streamed), (resident.blocks(idx), streamed.blocks(idx))):
        n = a.shape.n_blocks
        for b0, b1 in ((0, 7), (7, n - 1), (n - 1, n)):
            x, y = a.select(b0, b1), b.select(b0, b1)
            assert x.shape.n_blocks == y.shape.n_blocks == b1 - b0
            for f in gpu_traces.FIELDS:
                u, v = getattr(x, f), getattr(y, f)
                assert u.shape == v.shape and u.dtype == v.dtype, f
                assert torch.equal(u, v), f
    assert streamed.copies[0] == 6 and resident.copies is None


@pytest.mark.parametrize("cap", [spec_kernels.TAIL_OFF, 0.05])
def test_streamed_trace_sums_equal_the_numba_kernel(cap, small_budget):
    """A trace split over the budget streams: the exact sums over chunks of blocks
    (forced, and from the budget) and batches of programs, and over minibatches, are
    the kernel's integers; one copy per chunk per population."""
    sa = TraceArrays.from_split(tracekit.split("train"))       # fresh: nothing cached
    programs = trace_programs()
    d = gpu_traces.device_split(sa, CPU)
    assert d.streaming and d.host is not None and not hasattr(d, "X")
    want = spec_kernels.population_sums(programs, sa, with_kl=False, tail_cap=cap)
    got = gpu_traces.population_sums(programs, sa, with_kl=False, tail_cap=cap, chunk_blocks=50,
                                     batch_programs=5, device=CPU)
    assert np.array_equal(got, want)
    assert d.copies[0] == 4                                  # 192 blocks: 50, 50, 50, 42
    blocks = np.sort(np.random.default_rng(1).choice(sa.n_blocks, 40, replace=False))
    got = gpu_traces.population_sums(programs, sa, with_kl=False, tail_cap=cap, blocks=blocks,
                                     chunk_blocks=16, device=CPU)
    assert np.array_equal(got, spec_kernels.population_sums(programs, sa.blocks(blocks),
                                                            with_kl=False, tail_cap=cap))
    assert d.copies[0] == 4 + 3


def test_the_budget_sizes_streamed_chunks(monkeypatch):
    """With a budget of the split's own columns (so it streams), the chunks the budget
    allows are several and hold the copied columns too."""
    sa = TraceArrays.from_split(tracekit.split("train"))
    monkeypatch.setenv(gpu.MEMORY, str(gpu_traces.column_bytes(sa)))
    programs = trace_programs(6)
    d = gpu_traces.device_split(sa, CPU)
    nb, _ = gpu_traces.sizes(programs, d, CPU, None, None)
    assert d.streaming and 1 < nb < sa.n_blocks
    assert nb * d.bytes_per_block <= gpu.memory_budget(CPU) // 2
    assert np.array_equal(gpu_traces.population_sums(programs, sa, with_kl=False, device=CPU),
                          spec_kernels.population_sums(programs, sa, with_kl=False))
    assert d.copies[0] == -(-sa.n_blocks // nb)


# ------------------------------------------------------------ shards

@pytest.mark.parametrize("budget", [None, STREAM_BUDGET])
def test_sharded_traces_on_the_device_equal_the_cpu_paths(shard_data, torch_on_cpu,
                                                          monkeypatch, budget):
    """The device evaluator of a sharded split (every shard resident, or every shard
    streamed) equals the CPU sharded evaluator and the in-memory one bit for bit, on
    the whole split and on minibatches across shard boundaries."""
    if budget:
        monkeypatch.setenv(gpu.MEMORY, budget)
    split = attached(shard_data)["train"]
    programs = trace_programs(8)
    dev = placement.trace_evaluator(split, "train", ON_CUDA, 0.05)
    cpu = split.evaluator("train", None, False, 0.05)
    mem = ArraySplit(tracekit.split("train")).evaluator("train", None, False, 0.05)
    want = mem.run(programs)
    same_bits(cpu.run(programs), want)
    same_bits(dev.run(programs), want)
    sas = [s.sa for s in split.backend.shards]
    states = [gpu_traces.device_split(sa, CPU) for sa in sas]
    assert [d.streaming for d in states] == [bool(budget)] * 3
    whole = spec_kernels.population_sums(programs, TraceArrays.from_split(tracekit.split(
        "train")), with_kl=False, tail_cap=0.05)
    shards = on_device.Shards(sas, CPU)
    assert np.array_equal(shards.sums(programs, False, 0.05), whole)
    blocks = np.array([0, 5, 63, 64, 65, 100, 127, 128, 191])     # edges of the shards
    same_bits(dev.batch(blocks).run(programs), cpu.batch(blocks).run(programs))
    inside = np.arange(70, 90)                                   # one shard only
    same_bits(dev.batch(inside).run(programs), cpu.batch(inside).run(programs))
    assert dev.batch(blocks).arrays.n_blocks == len(blocks)
    if budget:
        assert all(d.copies[0] > 0 for d in states)
    else:
        assert all(d.copies is None for d in states)


def test_sharded_device_sums_miss_no_shard(shard_data, torch_on_cpu):
    """Each shard's sums are part of the total: the total less any one shard differs."""
    split = attached(shard_data)["train"]
    programs = trace_programs(2)
    sas = [s.sa for s in split.backend.shards]
    total = on_device.Shards(sas, CPU).sums(programs, False)
    parts = [gpu_traces.population_sums(programs, sa, with_kl=False, device=CPU) for sa in sas]
    assert np.array_equal(fixed.total(parts), total)
    for i in range(len(parts)):
        assert not np.array_equal(fixed.total(parts[:i] + parts[i + 1:]), total)


def test_a_cluster_split_on_the_device_is_one_line(torch_on_cpu):
    """Shards on a Dask cluster are scored by its workers: the device refuses them in
    one line naming the parameter; anything else is refused too."""
    class Remote:
        def local_arrays(self):     # a ClusterSplit whose shards are on the workers
            return None
    with pytest.raises(gpu.DeviceError) as e:
        placement.trace_evaluator(Remote(), "train", ON_CUDA)
    msg = str(e.value)
    assert msg.startswith("device: 'cuda' scores sharded traces in this process") and \
        "\n" not in msg and "'cpu'" in msg
    with pytest.raises(gpu.DeviceError) as e:
        placement.trace_evaluator(object(), "train", ON_CUDA)
    assert str(e.value).startswith("device: 'cuda' scores trace splits in memory or sharded")


def test_out_of_memory_on_shards_is_one_line(shard_data, torch_on_cpu, monkeypatch):
    split = attached(shard_data)["valid"]
    ev = placement.trace_evaluator(split, "valid", ON_CUDA)

    def short(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB\nmore")
    monkeypatch.setattr(gpu_traces, "population_sums", short)
    with pytest.raises(gpu.DeviceError) as e:
        ev.run(trace_programs(2))
    assert "\n" not in str(e.value) and "out of memory" in str(e.value)


RUN = dict(population=30, seed=2, objective="speed", tv_budget=0.05, tv_p99_cap=0.3,
           batch_blocks=60, writeback=False)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, STREAM_BUDGET])
def test_a_sharded_run_on_the_device_is_the_cpu_run(shard_data, tmp_path, torch_on_cpu,
                                                    monkeypatch, budget):
    """``evolve.run(device="cuda")`` on sharded traces (minibatches, a tail cap), with
    the shards resident or streamed, has the history, hall of fame and champion of the
    CPU run on the same shards."""
    data = shard_data / "shards"
    cpu = evolve.run(generations=2, data_dir=data, runs_dir=tmp_path, name="cpu", **RUN)
    if budget:
        monkeypatch.setenv(gpu.MEMORY, budget)
    made = []
    real = gpu_traces.DeviceTrace.of.__func__
    monkeypatch.setattr(gpu_traces.DeviceTrace, "of", classmethod(
        lambda cls, sa, dev, streaming=None: made.append(streaming) or real(cls, sa, dev,
                                                                            streaming)))
    dev = evolve.run(generations=2, data_dir=data, runs_dir=tmp_path, name="dev",
                     device="cuda", **RUN)
    assert view(dev) == view(cpu)
    assert len(made) == 3 + 8 and set(made) == {bool(budget)}     # train and valid shards


def test_host_columns_are_contiguous_and_pinned_where_cuda_is():
    """A streamed field on the host, blocks first: contiguous (a chunk is one copy),
    pinned when a CUDA device takes the copies (here without one: pageable)."""
    a = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    moved = np.moveaxis(a, 1, 0)
    for dev in (torch.device("cuda"), CPU):
        t = stream.host(moved, dev)
        assert t.is_contiguous() and torch.equal(t, torch.from_numpy(moved.copy()))
        assert t.is_pinned() == (dev.type == "cuda" and torch.cuda.is_available())


@pytest.mark.slow
def test_cuda_with_a_cluster_is_one_line_and_makes_nothing(shard_data, tmp_path, torch_on_cpu):
    pytest.importorskip("distributed")
    from tests.clikit import invoke, one_line_error
    r = invoke("run", "--objective", "speed", "--generations", 1, "--population", 10,
               "--no-writeback", "--device", "cuda", "--cluster", "local:1", "--data",
               shard_data / "shards", "--runs-dir", tmp_path / "runs")
    one_line_error(r, "--device", "Dask cluster", "'cpu'")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
