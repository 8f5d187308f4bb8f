"""Runs with ``device="cuda"`` (the torch kernels, ``evolve.kernels.gpu``) are the CPU
kernels' runs: the same history, hall of fame and champion for the same seed; a run
resumes on the other device and finishes identical; out of device memory and a
missing device or torch are one line, exit code 2, with a good checkpoint.

No GPU here: ``EVOLVE_TORCH_DEVICE=cpu`` makes ``cuda`` mean torch's CPU device, so
the code path of ``--device cuda`` runs unchanged but for the device it names.

Guarantee 28 of docs/reliability.md, Evaluation on a GPU gives the CPU kernels' results, bit for bit:

`evolve run --device cuda` (and `evolve.run(device="cuda")`) scores every population
with the torch kernels of `evolve/kernels/gpu/` and gets the Numba kernels' results
exactly: the same token counts and the same 128-bit fixed-point trace sums, so the
same history, hall of fame, champion and write-back for the same seed. Every
arithmetic step is one torch operation in the Numba kernels' order (no fused
multiply-add), `exp_poly`/`log_poly` are the project's own, `pmin`/`pmax` keep their
NaN meaning, and square roots are corrected to the correctly rounded value. The
device is not part of a run's identity: `--resume RUN --device cpu` (or `cuda`)
continues a run on either device and finishes as if it had never moved. `--device
cpu` is the default and never imports torch. `--device cuda` without torch, without
a CUDA device, with `--trajectory`, or with `--cluster`/`--scheduler` (the workers
score on their CPUs) is one line naming `--device`, exit code 2, before anything is
made (also with `--starts N`). So is a bad `EVOLVE_TORCH_DEVICE` (it takes `cpu`,
`cuda` or `cuda:N`, a CUDA one only where torch has that device) or
`EVOLVE_TORCH_MEMORY` (a whole number of bytes >= 1), naming the variable
(`test_bad_device_override_is_one_line_before_anything_is_made`,
`test_bad_memory_budget_is_one_line_before_anything_is_made`). Running out of GPU
memory mid-generation is one line, exit code 2, the run marked `failed`, the last
checkpoint kept and the resume command printed; resumed, the run finishes identical.
Tests, all without a GPU (`EVOLVE_TORCH_DEVICE=cpu` makes `cuda` mean torch's CPU
device, for tests only): `tests/test_gpu_eval.py` (every primitive, random and edge
programs, trace sums with and without a tail cap, chunked and batched, minibatches,
integer equality, no tolerance) and `tests/test_gpu_runs.py` (whole runs equal to
CPU runs, resume across devices, a simulated `torch.OutOfMemoryError` in generation
2, the refusals, one upload per split, torch never imported on the CPU path). The KL
sums are on the device too. Both trace kernels take the log of the KL terms, `o
log(o / p)`, from `heuristics.ops.log_poly` (the project's own log, plain float64
arithmetic) in the same order of operations, so `--objective speed_kl` on `--device
cuda` gives the history, hall of fame and champion of the same run on `cpu`, and
`evolve tradeoff --device cuda` prints the JSON of `--device cpu` number for number
(all but its `seconds`); `evolve benchmark --device cuda` prints the metrics of
`--device cpu` (only the eval ms differ). An unknown device name, or `cuda` without
torch or without a CUDA device, is one line naming `--device`, exit code 2, before
any data is read. The numpy reference (`evolve/objectives/spec.py`) keeps the C
library's log: it stays an independent check, and the kernels agree with it to
rounding (at most 1.8e-16 relative over 200 random programs on the default traces).
A KL per token computed before this change differs in its last bits only. A rule
that accepts a candidate the target never emits (p = 0 < q) has infinite KL in the
reference; that block's KL now saturates the fixed point on both devices, where the
Numba kernel used to stop with a ZeroDivisionError. Tests: `tests/test_gpu_kl.py`
(the `with_kl` sums of random and edge programs, integer for integer, chunked,
capped, on minibatches and on per-candidate constants that make every addition's
order show; a `speed_kl` run on both devices; the trade-off through the CLI and the
library), `tests/test_benchmark_on_device.py`. Splits larger than the GPU, and shards. A
split whose device columns take more than half the memory budget
(`EVOLVE_TORCH_MEMORY`, or a third of the free GPU memory) stays on the host, in
pinned memory, and each chunk of rows (whole blocks on traces) is copied to the
device once per population (`evolve/kernels/gpu/stream.py`). Sharded traces loaded
in this process are scored shard by shard and their exact sums added. Either way the
results are the integers of the resident path and of the Numba kernels, minibatches
across shard boundaries included (`tests/test_gpu_stream.py`). Running out of device
memory anyway is still one line, exit code 2, with the last checkpoint kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import evolve                                                           # noqa: E402
from evolve.kernels import gpu                                          # noqa: E402
from evolve.kernels.gpu import tokens as gpu_tokens                     # noqa: E402
from evolve.kernels.gpu import traces as gpu_traces                     # noqa: E402
from evolve.runs.rundir import RunError                                 # noqa: E402
from tests import tracekit                                              # noqa: E402
from tests.clikit import invoke, isolated, one_line_error  # noqa: E402,F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated", "one_torch_thread")
npz_dir = tracekit.npz_dir_fixture()

TOKENS = dict(population=40, seed=3, writeback=False)
TRACES = dict(population=40, seed=2, objective="speed", tv_budget=0.05, tv_p99_cap=0.3,
              batch_blocks=60, writeback=False)


@pytest.fixture
def torch_on_cpu(monkeypatch):
    """``cuda`` runs the torch kernels on torch's CPU device; with
    ``EVOLVE_TEST_ON_GPU=1`` on a machine with a GPU, ``cuda`` is the GPU itself (its
    default kernel: the fused one when it passes its probe), so the same whole-run
    comparisons check the compiled kernels there."""
    on_gpu = os.environ.get("EVOLVE_TEST_ON_GPU") == "1" and torch.cuda.is_available()
    monkeypatch.setenv(gpu.OVERRIDE, "cuda" if on_gpu else "cpu")


def view(res) -> dict:
    """What must not depend on the device: history (no timing), hall of fame, champion
    (no eval timing) and the configuration but for the device."""
    hof = json.loads((res.path / "hall_of_fame.json").read_text())
    champ = {k: v for k, v in res.champion.items() if k not in ("created", "run")}
    champ["metrics"] = {s: {k: v for k, v in m.items() if k != "eval_ms"}
                        for s, m in champ["metrics"].items()}
    return {"history": [{k: v for k, v in r.items() if k != "timing"} for r in res.history],
            "hof": hof, "champion": champ,
            "config": {k: v for k, v in res.config.items() if k != "device"}}


def test_token_run_on_the_torch_kernels_is_the_cpu_run(tmp_path, small_data_dir, torch_on_cpu):
    cpu = evolve.run(generations=3, data_dir=small_data_dir, runs_dir=tmp_path, name="cpu",
                     **TOKENS)
    dev = evolve.run(generations=3, data_dir=small_data_dir, runs_dir=tmp_path, name="dev",
                     device="cuda", **TOKENS)
    assert dev.config["device"] == "cuda" and cpu.config["device"] == "cpu"
    assert view(dev) == view(cpu)


def test_trace_run_with_minibatches_and_a_tail_cap_is_the_cpu_run(tmp_path, npz_dir,
                                                                  torch_on_cpu, monkeypatch):
    cpu = evolve.run(generations=3, data_dir=npz_dir, runs_dir=tmp_path, name="cpu", **TRACES)
    real, blocks = gpu_traces.population_sums, []

    def spy(progs, sa, with_kl=True, tail_cap=2.0, blocks_=None, **kw):
        blocks.append(None if blocks_ is None else len(blocks_))
        return real(progs, sa, with_kl, tail_cap, blocks_, **kw)
    monkeypatch.setattr(gpu_traces, "population_sums", spy)
    dev = evolve.run(generations=3, data_dir=npz_dir, runs_dir=tmp_path, name="dev",
                     device="cuda", **TRACES)
    assert view(dev) == view(cpu)
    assert TRACES["batch_blocks"] in blocks and None in blocks     # minibatches and whole


def test_pareto_run_on_the_torch_kernels_is_the_cpu_run(tmp_path, npz_dir, torch_on_cpu):
    opts = dict(population=40, seed=5, objective="pareto", writeback=False)
    cpu = evolve.run(generations=2, data_dir=npz_dir, runs_dir=tmp_path, name="cpu", **opts)
    dev = evolve.run(generations=2, data_dir=npz_dir, runs_dir=tmp_path, name="dev",
                     device="cuda", **opts)
    assert view(dev) == view(cpu)


@pytest.mark.parametrize("first,then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_run_resumes_on_the_other_device_and_finishes_identical(tmp_path, npz_dir,
                                                                  torch_on_cpu, first, then):
    straight = evolve.run(generations=4, data_dir=npz_dir, runs_dir=tmp_path, name="straight",
                          **TRACES)
    evolve.run(generations=2, data_dir=npz_dir, runs_dir=tmp_path, name="moved",
               device=first, **TRACES)
    moved = evolve.run(resume="moved", generations=4, runs_dir=tmp_path, device=then)
    assert moved.config["device"] == then
    assert view(moved) == view(straight)


def test_out_of_device_memory_is_one_line_and_the_run_resumes(tmp_path, small_data_dir,
                                                              torch_on_cpu, monkeypatch):
    """torch.OutOfMemoryError in the middle of generation 2: a one-line error, the
    checkpoint of generation 1 kept; resumed, the run finishes as one never stopped."""
    straight = evolve.run(generations=4, data_dir=small_data_dir, runs_dir=tmp_path,
                          name="straight", **TOKENS)
    real = gpu_tokens.population_counts
    calls = []

    def short_of_memory(progs, arrays, *, chunk_rows=None, kernel=None, device):
        calls.append(len(progs))
        if len(calls) == 5:          # train and valid of generations 0, 1; then train of 2
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\n"
                                         "more lines")
        return real(progs, arrays, chunk_rows=chunk_rows, kernel=kernel, device=device)
    monkeypatch.setattr(gpu_tokens, "population_counts", short_of_memory)
    with pytest.raises(RunError) as e:
        evolve.run(generations=4, data_dir=small_data_dir, runs_dir=tmp_path, name="oom",
                   device="cuda", **TOKENS)
    msg = str(e.value)
    assert "\n" not in msg and "out of memory" in msg and "--device cuda" in msg, msg
    state = json.loads((tmp_path / "oom" / "checkpoint.json").read_text())
    assert state["generation"] == 1
    summary = json.loads((tmp_path / "oom" / "summary.json").read_text())
    assert summary["status"] == "failed"
    monkeypatch.setattr(gpu_tokens, "population_counts", real)
    again = evolve.run(resume="oom", generations=4, runs_dir=tmp_path, device="cuda")
    assert view(again) == view(straight)


def test_cli_out_of_memory_exits_2_with_one_line(tmp_path, small_data_dir, torch_on_cpu,
                                                 monkeypatch):
    def no_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory.")
    monkeypatch.setattr(gpu_tokens, "population_counts", no_memory)
    r = invoke("run", "--population", 20, "--generations", 2, "--device", "cuda", "--name",
               "x", "--data", small_data_dir, "--runs-dir", tmp_path, "--no-writeback")
    one_line_error(r, "out of memory", "resume with")


def test_cuda_without_a_cuda_device_is_one_line_and_makes_nothing(tmp_path, small_data_dir,
                                                                  monkeypatch):
    monkeypatch.delenv(gpu.OVERRIDE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = invoke("run", "--generations", 1, "--device", "cuda", "--data", small_data_dir,
               "--runs-dir", tmp_path / "runs", "--no-writeback")
    one_line_error(r, "--device", "no CUDA device")
    r = invoke("run", "--generations", 1, "--device", "cuda", "--starts", 2, "--data",
               small_data_dir, "--runs-dir", tmp_path / "runs", "--no-writeback")
    one_line_error(r, "--device", "no CUDA device")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cuda_without_torch_is_one_line(tmp_path, small_data_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch fails
    r = invoke("run", "--generations", 1, "--device", "cuda", "--data", small_data_dir,
               "--runs-dir", tmp_path / "runs", "--no-writeback")
    one_line_error(r, "--device", "needs torch", "[gpu]")


def refused_before_any_run(tmp_path, data_dir, var: str, value: str) -> None:
    """``--device cuda`` with ``var=value``, one start and two: one line naming
    ``var``, and no run directory."""
    for starts in ("1", "2"):
        r = invoke("run", "--generations", 1, "--population", 10, "--device", "cuda",
                   "--starts", starts, "--data", data_dir, "--runs-dir", tmp_path / "runs",
                   "--no-writeback", env={var: value})
        one_line_error(r, var)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("value,cuda", [("bogus", False), ("meta", False), ("mps", False),
                                         ("cuda", False), ("cuda:7", False), ("cuda:7", True),
                                         ("cpu:0", False), (" cpu", False)])
def test_bad_device_override_is_one_line_before_anything_is_made(tmp_path, small_data_dir,
                                                                monkeypatch, value, cuda):
    """EVOLVE_TORCH_DEVICE takes cpu, cuda and cuda:N, a CUDA one only where torch has
    that device: anything else is one line naming the variable, and no run directory
    is made (a single run and a run of several starts)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if cuda else 0)
    refused_before_any_run(tmp_path, small_data_dir, gpu.OVERRIDE, value)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1e9", "1.5", " ", "10" * 20])
def test_bad_memory_budget_is_one_line_before_anything_is_made(tmp_path, small_data_dir,
                                                               torch_on_cpu, value):
    """EVOLVE_TORCH_MEMORY is a whole number of bytes >= 1, checked with the device
    (it used to be refused at generation 1, leaving a failed run behind)."""
    refused_before_any_run(tmp_path, small_data_dir, gpu.MEMORY, value)


def test_a_good_override_and_budget_are_accepted(monkeypatch):
    monkeypatch.setenv(gpu.OVERRIDE, "cpu")
    monkeypatch.setenv(gpu.MEMORY, "300000")
    assert gpu.torch_device("cuda") == torch.device("cpu")
    assert gpu.memory_budget(torch.device("cpu")) == 300000
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv(gpu.OVERRIDE, "cuda:1")
    assert gpu.torch_device("cuda") == torch.device("cuda:1")


def test_bad_device_names_and_the_trajectory_are_refused(tmp_path, small_data_dir, npz_dir):
    r = invoke("run", "--generations", 1, "--device", "tpu", "--data", small_data_dir,
               "--runs-dir", tmp_path)
    one_line_error(r, "--device", "'tpu'")
    r = invoke("run", "--generations", 1, "--device", "cuda", "--objective", "speed",
               "--trajectory", "--data", npz_dir, "--runs-dir", tmp_path)
    one_line_error(r, "--device", "cpu only")


@pytest.mark.slow
def test_the_cpu_path_never_imports_torch(small_data_dir):
    code = ("import sys, evolve; evolve.run(generations=1, population=10, writeback=False, "
            f"data_dir={str(small_data_dir)!r}, runs_dir=sys.argv[1]); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'triton' not in sys.modules, 'triton imported'")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_split_goes_to_the_device_once_per_run(tmp_path, npz_dir, small_data_dir,
                                                 torch_on_cpu, monkeypatch):
    """Train and valid are uploaded once each, whatever the generations and minibatches
    (the tensors are cached on the split's kernel arrays)."""
    made = []
    of = gpu_traces.DeviceTrace.of.__func__
    monkeypatch.setattr(gpu_traces.DeviceTrace, "of",
                        classmethod(lambda cls, sa, dev, *a: made.append("trace")
                                    or of(cls, sa, dev, *a)))
    init = gpu_tokens.DeviceTokens.__init__

    def counted(self, arrays, dev):
        made.append("tokens")
        init(self, arrays, dev)
    monkeypatch.setattr(gpu_tokens.DeviceTokens, "__init__", counted)
    evolve.run(generations=3, data_dir=npz_dir, runs_dir=tmp_path, name="t", device="cuda",
               **TRACES)
    evolve.run(generations=3, data_dir=small_data_dir, runs_dir=tmp_path, name="k",
               device="cuda", **TOKENS)
    assert made == ["trace", "trace", "tokens", "tokens"]


def test_a_small_memory_budget_chunks_and_gives_the_same_run(tmp_path, npz_dir, torch_on_cpu,
                                                             monkeypatch):
    """EVOLVE_TORCH_MEMORY of 300 kB: splits are scored in many chunks of blocks and
    batches of programs; the run is the CPU run."""
    cpu = evolve.run(generations=2, data_dir=npz_dir, runs_dir=tmp_path, name="cpu", **TRACES)
    monkeypatch.setenv(gpu.MEMORY, "300000")
    real, sizes = gpu_traces.sizes, []
    monkeypatch.setattr(gpu_traces, "sizes", lambda *a: sizes.append(real(*a)) or sizes[-1])
    dev = evolve.run(generations=2, data_dir=npz_dir, runs_dir=tmp_path, name="dev",
                     device="cuda", **TRACES)
    assert view(dev) == view(cpu)
    assert max(nb for nb, _ in sizes) < TRACES["batch_blocks"]      # several chunks
