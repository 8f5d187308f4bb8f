"""`python -m benchmarks.speed.hf_speed --smoke`: the Hugging Face decoder benchmark runs end
to end and reports every figure for every decoder and prompt length. Nothing is timed
against a target here (the figures are in docs/own-pair.md)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.speed.hf_speed"]
DECODERS = {"minimal", "record", "free", "free+track"}


@pytest.mark.slow
def test_hf_speed_smoke_reports_every_figure():
    proc = subprocess.run([sys.executable, *SCRIPT, "--smoke", "--json", "--device", "cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["device"] == "cpu" and set(doc["lengths"]) == {"8", "32"}
    for res in doc["lengths"].values():
        assert set(res) == DECODERS
        for r in res.values():
            for f in ("total_tokens_per_s", "steady_tokens_per_s", "total_vs_minimal",
                      "steady_vs_minimal"):
                assert math.isfinite(r[f]) and r[f] > 0, (f, r)
        assert res["minimal"]["total_vs_minimal"] == 1.0
    assert set(doc["steady_cost_ratio_longest_vs_shortest"]) == DECODERS


@pytest.mark.slow
def test_hf_speed_times_a_saved_pair(tmp_path):
    """``--pair DIR``: the models saved under DIR/target and DIR/draft (as ``evolve data
    pair`` saves them) are the ones timed."""
    from tests import hfkit
    hfkit.tiny_pair(tmp_path)
    proc = subprocess.run([sys.executable, *SCRIPT, "--smoke", "--json", "--device", "cpu",
                           "--pair", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["models"] == str(tmp_path) and set(doc["lengths"]["8"]) == DECODERS
