"""`evolve benchmark --device cuda` (``evolve.runs.device_bench``): every rule's tree
scored and timed by the device token kernel gives the CPU benchmark's metrics exactly;
the output says which device timed the rows; a hand-edited evolved.py is timed on the
CPU by its own code; a missing torch or device, or an unknown name, is one line.

No GPU here: ``EVOLVE_TORCH_DEVICE=cpu`` makes ``cuda`` mean torch's CPU device.

Also guarantee 28 of docs/reliability.md, Evaluation on a GPU gives the CPU kernels'
results, bit for bit: see tests/test_gpu_runs.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from evolve.kernels import gpu                                          # noqa: E402
from evolve.lang import codegen, treeio                                 # noqa: E402
from evolve.rules import table                                          # noqa: E402
from evolve.runs import device_bench, report                            # noqa: E402
from heuristics import registry                                         # noqa: E402
from tests.clikit import invoke, one_line_error                         # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIG = "draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match"


@pytest.fixture
def torch_on_cpu(monkeypatch):
    """``cuda`` runs the torch kernel on torch's CPU device."""
    monkeypatch.setenv(gpu.OVERRIDE, "cpu")


def bench_json(data_dir, *args, env=None) -> dict:
    r = invoke("benchmark", "--data", data_dir, "--json", "--repeats", 1, *args, env=env)
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)


def metrics(result: dict) -> dict:
    """Every row's metrics but the timing."""
    return {split: {n: {k: v for k, v in m.items() if k != "eval_ms"}
                    for n, m in body["heuristics"].items()}
            for split, body in result["splits"].items()}


def test_device_metrics_are_the_cpu_metrics(small_data_dir, torch_on_cpu):
    cpu = bench_json(small_data_dir)
    dev = bench_json(small_data_dir, "--device", "cuda")
    assert set(dev["splits"]["train"]["heuristics"]) == set(registry.names())
    assert metrics(dev) == metrics(cpu)
    assert [s["tokens"] for s in dev["splits"].values()] == \
        [s["tokens"] for s in cpu["splits"].values()]
    assert dev["skipped"] == cpu["skipped"] == {}
    assert cpu["timing"]["device"] == "cpu" and "Numba" in cpu["timing"]["by"]
    t = dev["timing"]
    assert t["device"] == "cuda" and t["torch_device"] == "cpu" and "torch" in t["by"]
    assert t["fallback"] == {}                  # the installed evolved.py: its tree, on the device
    assert all(m["eval_ms"] > 0 for body in dev["splits"].values()
               for m in body["heuristics"].values())


def test_the_device_scores_every_split_and_rule_apart(small_data_dir, torch_on_cpu):
    """The rows differ where the splits and rules do (the test above would pass if
    every split were scored as train, were the splits alike)."""
    dev = metrics(bench_json(small_data_dir, "--device", "cuda"))
    train, valid = dev["train"], dev["valid"]
    assert train["standard_rejection"]["fitness"] != valid["standard_rejection"]["fitness"]
    assert train["conservative"] != train["standard_rejection"]
    fr = {n: m["false_rejects"] for n, m in train.items()}
    fa = {n: m["false_accepts"] for n, m in train.items()}
    assert fr != fa and len(set(fr.values())) > 2


def test_the_table_says_which_device_timed_the_rows(small_data_dir, torch_on_cpu):
    args = ("benchmark", "--data", small_data_dir, "--repeats", 1,
            "--heuristic", "standard_rejection", "--heuristic", "conservative")
    cpu = invoke(*args)
    dev = invoke(*args, "--device", "cuda")
    assert cpu.exit_code == 0 and dev.exit_code == 0, (cpu.output, dev.output)
    assert "eval ms (--device" not in cpu.stdout       # the cpu table as it always was
    line = [ln for ln in dev.stdout.splitlines() if ln.startswith("eval ms (--device cuda)")]
    assert len(line) == 1 and "timed on cpu (cpu, torch threads: 1)" in line[0], dev.stdout
    assert "torch token kernel" in line[0] and "(cpu)" not in dev.stdout.replace(line[0], "")


def test_a_generated_evolved_py_is_scored_from_its_tree(small_data_dir, torch_on_cpu,
                                                        edited_evolved):
    nodes = treeio.parse(table.get("entropy_aware").tree())
    edited_evolved(codegen.module_source(nodes, "evolved", {"tree": treeio.to_string(nodes)},
                                         "test"))
    cpu = report.benchmark(small_data_dir, ["evolved", "standard_rejection"], 1)
    dev = report.benchmark(small_data_dir, ["evolved", "standard_rejection"], 1, device="cuda")
    assert dev["timing"]["fallback"] == {}
    assert metrics(dev) == metrics(cpu)
    train = metrics(dev)["train"]
    assert train["evolved"] != train["standard_rejection"]


def test_a_hand_edited_evolved_py_is_timed_on_the_cpu_by_its_own_code(
        small_data_dir, torch_on_cpu, edited_evolved):
    """The METADATA tree says standard rejection, the function accepts half: the
    function is what is benchmarked, on the CPU, and the output says so."""
    edited_evolved("from heuristics.ops import pdiv, pmin  # noqa: F401\n"
                   "METADATA = {'tree': 'pmin(1.0, pdiv(target_prob, draft_prob))'}\n"
                   f"def evolved({SIG}):\n    return 0.5\n")
    cpu = bench_json(small_data_dir, "--heuristic", "evolved")
    r = invoke("benchmark", "--data", small_data_dir, "--json", "--repeats", 1,
               "--heuristic", "evolved", "--device", "cuda")
    assert r.exit_code == 0, r.output
    dev = json.loads(r.stdout)
    assert metrics(dev) == metrics(cpu)
    assert metrics(dev)["train"]["evolved"]["accept_rate"] < 0.6      # 0.5, not min(1, t/d)
    assert "not the code of the tree" in dev["timing"]["fallback"]["evolved"]
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: evolved timed on")]
    assert len(warn) == 1 and "heuristics/evolved.py: its function" in warn[0], r.stderr
    table_out = invoke("benchmark", "--data", small_data_dir, "--repeats", 1,
                       "--heuristic", "evolved", "--device", "cuda").stdout
    assert table_out.count(" (cpu)") == 3 + 1, table_out     # a cell per split, the note


@pytest.mark.parametrize("text,why", [
    ("METADATA = {}\n" f"def evolved({SIG}):\n    return 0.5\n", "no tree"),
    ("METADATA = {'tree': 'nope('}\n" f"def evolved({SIG}):\n    return 0.5\n", "does not parse"),
    ("def pdiv(a, b):\n    return 0.0\nfrom heuristics.ops import pmin\n"
     "METADATA = {'tree': 'pmin(1.0, pdiv(target_prob, draft_prob))'}\n"
     f"def evolved({SIG}):\n    return pmin(1.0, pdiv(target_prob, draft_prob))\n",
     "its pdiv is not heuristics.ops.pdiv"),
], ids=["no-tree", "bad-tree", "own-helper"])
def test_evolved_without_a_matching_tree_falls_back(small_data_dir, torch_on_cpu,
                                                    edited_evolved, text, why):
    edited_evolved(text)
    cpu = report.benchmark(small_data_dir, ["evolved"], 1)
    dev = report.benchmark(small_data_dir, ["evolved"], 1, device="cuda")
    assert why in dev["timing"]["fallback"]["evolved"]
    assert metrics(dev) == metrics(cpu)


def test_a_edited_evolved_py_is_skipped_as_on_the_cpu(small_data_dir, torch_on_cpu,
                                                      edited_evolved):
    edited_evolved("def evolved(:\n")
    dev = invoke("benchmark", "--data", small_data_dir, "--repeats", 1, "--device", "cuda")
    assert dev.exit_code == 0, dev.output
    warn = [ln for ln in dev.stderr.splitlines() if ln.startswith("warning: evolved skipped")]
    assert len(warn) == 1 and "SyntaxError" in warn[0], dev.stderr
    assert "standard_rejection" in dev.stdout and "evolved *" not in dev.stdout


def test_unknown_device_is_one_line(small_data_dir):
    one_line_error(invoke("benchmark", "--data", small_data_dir, "--device", "tpu"),
                   "--device", "'tpu'", "cpu, cuda")
    with pytest.raises(gpu.DeviceError) as e:
        report.benchmark(small_data_dir, None, 1, device="CUDA")
    assert str(e.value).startswith("device: 'CUDA' is invalid")


def test_cuda_without_torch_is_one_line_before_the_data_is_read(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch fails
    r = invoke("benchmark", "--data", tmp_path / "missing", "--device", "cuda")
    one_line_error(r, "--device", "needs torch", "[gpu]")


def test_cuda_without_a_cuda_device_is_one_line(small_data_dir, monkeypatch):
    monkeypatch.delenv(gpu.OVERRIDE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_line_error(invoke("benchmark", "--data", small_data_dir, "--device", "cuda"),
                   "--device", "no CUDA device")
    with pytest.raises(gpu.DeviceError) as e:
        report.benchmark(small_data_dir, None, 1, device="cuda")
    assert str(e.value).startswith("device: 'cuda': torch finds no CUDA device")


def test_splits_larger_than_the_budget_are_streamed_and_say_so(small_data_dir, torch_on_cpu,
                                                              monkeypatch):
    """A memory budget of 100 kB: no split is resident; the same metrics, and the
    output names the streamed splits."""
    pytest.importorskip("evolve.kernels.gpu.stream")       # the kernel's streaming mode
    names = ["standard_rejection", "typical_acceptance"]
    cpu = report.benchmark(small_data_dir, names, 1)
    monkeypatch.setenv(gpu.MEMORY, "100000")
    dev = report.benchmark(small_data_dir, names, 1, device="cuda")
    assert metrics(dev) == metrics(cpu)
    assert dev["timing"]["streamed"] == ["test", "train", "valid"]


def test_out_of_device_memory_is_one_line(small_data_dir, torch_on_cpu, monkeypatch):
    from evolve.kernels.gpu import tokens as gpu_tokens

    def no_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory.")
    monkeypatch.setattr(gpu_tokens, "population_counts", no_memory)
    one_line_error(invoke("benchmark", "--data", small_data_dir, "--device", "cuda"),
                   "--device", "out of memory")


def test_evolved_tree_reads_the_installed_module():
    """The installed heuristics/evolved.py is generated code: its tree is found."""
    nodes, why = device_bench.evolved_tree(registry.get(registry.EVOLVED))
    assert why == "" and nodes is not None


@pytest.mark.slow
def test_the_cpu_benchmark_never_imports_torch(small_data_dir):
    code = ("import sys; from evolve.runs import report; "
            f"report.benchmark({str(small_data_dir)!r}, ['standard_rejection'], 1); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
