"""The experiments that run two searches a seed (benchmarks/experiments/first_tokens.py,
token_class.py) on more than one trace folder, as their default data is."""

import json
import shutil

from benchmarks.experiments import first_tokens
from tests import tracekit

tiny_dir = tracekit.tiny_dir_fixture()


def test_first_tokens_runs_on_two_trace_folders(tmp_path, tiny_dir):
    """Each folder's searches are its own (the run names repeat from folder to folder)."""
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    out = tmp_path / "first_tokens.json"
    assert first_tokens.main(["--data", str(tiny_dir), str(other), "--budgets", "0.05",
                              "--seeds", "1", "2", "--population", "12", "--generations",
                              "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["data"]) == 2
    a, b = doc["data"].values()                      # the same traces: the same champions
    assert [c["expression"] for c in a[0]["plain"]] == [c["expression"] for c in b[0]["plain"]]
    for r in a + b:
        assert [c["seed"] for c in r["plain"]] == [c["seed"] for c in r["capped"]] == [1, 2]
