"""The README's trace-results script runs end to end at tiny sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_trace_results_quick(tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_results.py"), "--quick",
                        "--data", str(tmp_path / "traces"), "--runs-dir", str(tmp_path / "runs"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [b["budget"] for b in doc["budgets"]] == [0.01, 0.03]
    for b in doc["budgets"]:
        assert set(b["offline_test"]) == {"leniency (tuned)", "per-position leniency (tuned)",
                                          "evolved", "evolved, slot TV capped",
                                          "evolved, slot TV p99 capped"}
        assert b["free_running_test"]["reference"] == "leniency (tuned)"
        for o in b["offline_test"].values():
            assert o["oracle_share"] <= 1.0 + 1e-9
        for run in b["runs"].values():
            assert "--budget-tv" in run["command"] and len(run["starts"]) == 2
        assert "--cap-tv-p99" in b["runs"]["evolved, slot TV p99 capped"]["command"]
    assert "| leniency (tuned) |" in r.stdout


@pytest.mark.slow
def test_trajectory_gap_quick(tmp_path):
    out = tmp_path / "gap.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trajectory_gap.py"), "--quick",
                        "--traces", str(tmp_path / "traces"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [b["budget"] for b in doc["budgets"]] == [0.01, 0.03]
    for b in doc["budgets"]:
        ref = b["rules"]["leniency (tuned)"]
        assert "margin" not in ref and ref["free_running"]["se"] > 0
        for label, row in b["rules"].items():
            if label != "leniency (tuned)":
                assert set(row["margin"]) == {"offline", "trajectory", "free"}
    assert "trajectory-aware minus free-running" in r.stdout
