"""``python -m benchmarks.speed.gpu_tune``: the fused kernels' launch constants timed
on a GPU, each configuration's results compared with the Numba kernels' first. Here,
without a GPU, ``--smoke`` runs two configurations of each kernel in Triton's
interpreter; a configuration that fails or gives other results is named and not
timed, and the constants are put back whatever happens."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.speed import gpu_tune  # noqa: E402


def test_smoke_checks_and_times_each_configuration(tmp_path):
    out = tmp_path / "tune.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.speed.gpu_tune", "--smoke",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    for kind, n in (("token", 2), ("trace", 2)):
        rows = doc[kind]["configs"]
        assert len(rows) == n and all(row["seconds"] > 0 for row in rows), rows
    assert rows[0]["TRACE_BLOCK"] == 128 and rows[1]["TRACE_BLOCK"] == 256
    lines = r.stdout.splitlines()
    assert "interpreter" in lines[0] and len(lines) == 5
    assert lines[1].startswith("token  TOKEN_BLOCK=256") and "1.00x the default" in lines[1]


def test_a_failing_or_differing_configuration_is_named_and_the_constants_put_back():
    from evolve.kernels.gpu import fused as F
    before = (F.TOKEN_BLOCK, F.WARPS)
    seen = []

    def run():
        seen.append((F.TOKEN_BLOCK, F.WARPS))
        if F.TOKEN_BLOCK == 300:
            raise ValueError("arange's range must be a power of 2\nmore")
        return np.array([1, 2]) if F.TOKEN_BLOCK == 512 else np.array([1, 3])

    spent = iter([1, 1, 1, 0])
    rows = gpu_tune.sweep("token", [(256, 4), (300, 4), (512, 8), (1024, 4)],
                          ("TOKEN_BLOCK", "WARPS"), run, np.array([1, 3]), 10.0, 2,
                          lambda: None, lambda: next(spent), np.array_equal)
    assert rows[0]["seconds"] > 0 and rows[0]["node_evals_per_s"] > 0
    assert rows[1]["failed"] == "ValueError: arange's range must be a power of 2"
    assert rows[2]["failed"] == "results differ from the Numba kernel's"
    assert rows[3] == {"TOKEN_BLOCK": 1024, "WARPS": 4, "not_run": "the budget was spent"}
    assert seen == [(256, 4)] * 3 + [(300, 4), (512, 8)]       # checked, then 2 timed
    assert (F.TOKEN_BLOCK, F.WARPS) == before


def test_a_kernel_that_is_not_swept_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        gpu_tune.main(["--kernels", "token,bogus"])
    assert e.value.code == 2
    assert "--kernels: 'bogus' is not token or trace" in capsys.readouterr().err
