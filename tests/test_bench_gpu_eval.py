"""benchmarks/speed/gpu_eval.py runs (``--smoke``, torch on the CPU): both kernels' results
are compared before any timing, and the figures and ratios come out."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_benchmark_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.speed.gpu_eval", "--smoke",
                        "--device", "cpu", "--torch-threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "torch on CPU" in r.stdout and r.stdout.count("identical") == 2, r.stdout
    doc = json.loads(out.read_text())
    for part in ("token", "trace"):
        assert doc[part]["identical"] is True
        assert doc[part]["numba_node_evals_per_s"] > 0 and doc[part]["torch_node_evals_per_s"] > 0
    assert doc["trace"]["generation_speedup"] == pytest.approx(
        doc["trace"]["numba_generation_s"] / doc["trace"]["torch_generation_s"])
