"""The Python API: evolve.run and evolve.load_run.

Also guarantee 25 of docs/reliability.md, Configuration from any caller
(test_load_run_of_what_is_not_a_path_is_one_line,
test_tradeoff_refuses_bad_arguments_in_one_line): see tests/test_hostile_config.py.
"""

import json
import math

import pytest

import evolve
from evolve.errors import EvolveError
from evolve.search.config import ConfigError
from tests import tracekit
from tests.conftest import TINY


def test_run_and_load_run(tmp_path, small_data_dir):
    seen, said = [], []
    res = evolve.run(data_dir=small_data_dir, runs_dir=tmp_path, name="api", writeback=False,
                     seed=5, on_generation=seen.append, progress=said.append, **TINY)
    assert res.status == "finished" and res.name == "api"
    assert [r["generation"] for r in seen] == list(range(TINY["generations"] + 1))
    # progress=print style: the lines `evolve run` prints when piped, first and last
    last = TINY["generations"]
    assert said[0].startswith(f"gen 0/{last} train ") and said[-1].startswith(f"gen {last}/")
    assert said[-1].endswith(" done") and all(isinstance(x, str) for x in said)
    assert res.champion["metrics"]["test"]["fitness"] >= 0
    back = evolve.load_run(res.path)
    assert back.champion == res.champion and back.history == res.history
    # the hall of fame in memory: hall_of_fame.json's trees, best on train first, as
    # flat records (pandas.DataFrame(res.hall_of_fame)); the champion's row carries its
    # verdict
    hof = json.loads((res.path / "hall_of_fame.json").read_text())
    assert hof and back.hall_of_fame == res.hall_of_fame
    assert [(r["tree"], r["formula"], r["size"], r["generation"], r["train_fitness"],
             r["valid_fitness"]) for r in res.hall_of_fame] == [
        (e["tree"], e["expression"], e["size"], e["born"], e["train_fitness"],
         e["valid_fitness"]) for e in hof]
    for r in res.hall_of_fame:
        assert r["champion"] == (r["tree"] == res.champion["tree"])
        assert r["standing"] == (res.champion["standing"]["verdict"] if r["champion"]
                                 else None)
    assert back.config["seed"] == 5
    # same seed, same champion and history
    again = evolve.run(data_dir=small_data_dir, runs_dir=tmp_path, name="api2", writeback=False,
                       seed=5, **TINY)
    strip = [{k: v for k, v in r.items() if k != "timing"} for r in res.history]
    assert [{k: v for k, v in r.items() if k != "timing"} for r in again.history] == strip
    assert again.champion["tree"] == res.champion["tree"]


def test_run_rejects_unknown_options(tmp_path, small_data_dir):
    with pytest.raises(ConfigError, match="populaton"):
        evolve.run(data_dir=small_data_dir, runs_dir=tmp_path, populaton=10)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("path", [123, None, b"runs/x", ["runs/x"], 1.5])
def test_load_run_of_what_is_not_a_path_is_one_line(path):
    with pytest.raises(EvolveError) as e:
        evolve.load_run(path)
    assert e.value.param == "path" and "\n" not in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def trace_arrays():
    from evolve.objectives import spec
    return {s: spec.TraceArrays.from_split(tracekit.split(s)) for s in ("valid", "test")}


@pytest.mark.parametrize("param,value", [
    ("budgets", [math.nan]), ("budgets", [-1]), ("budgets", [math.inf]), ("budgets", [-0.5]),
    ("budgets", ["abc"]), ("budgets", [True]), ("budgets", [10 ** 400]), ("budgets", None),
    ("budgets", 0.01), ("budgets", "0.01"), ("budgets", {0.01: 1}),
    ("extra", ["pmin(1.0, 2.0)"]), ("extra", {"x": "pmin(1.0, 2.0)"}), ("extra", {1: []}),
    ("extra", {"x": [1, 2]}), ("blocks_test", "abc"), ("blocks_test", "other split"),
    ("sa_valid", None), ("sa_test", "abc"),
])
def test_tradeoff_refuses_bad_arguments_in_one_line(trace_arrays, param, value):
    """evolve.rules.tuning.tradeoff: budgets of the wrong type or range (NaN, -1 and
    inf made a report with "budget": NaN), an ``extra`` that is not names of parsed
    trees, a ``blocks_test`` that is not the test split's: one line naming the
    parameter, never a ValueError, TypeError or AttributeError from deep inside."""
    from evolve.objectives import trajectory
    from evolve.rules import tuning
    args = {"sa_valid": trace_arrays["valid"], "sa_test": trace_arrays["test"],
            "budgets": [0.02], "extra": None, "blocks_test": None}
    if value == "other split":       # the blocks of another split: a count that differs
        value = trajectory.TraceBlocks.from_split(tracekit.split("valid"))
    args[param] = value
    with pytest.raises(EvolveError) as e:
        tuning.tradeoff(**args)
    assert e.value.param == param and "\n" not in str(e.value), str(e.value)


def test_run_progress_goes_to_a_terminal_and_nowhere_else(monkeypatch):
    """``evolve.run(progress=None)``: lines on stderr when it is a terminal, nothing when it
    is a file (a script's log stays clean); ``progress=False``: nothing even then."""
    import io
    import sys
    from evolve.api import runs

    class Err(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty
    record = {"generation": 0, "best_train": 0.5, "median_train": 0.4, "best_valid": 0.5,
              "mean_size": 7.0, "timing": {"evals_per_s": 1000.0}}
    for tty, progress, said in ((True, None, True), (False, None, False),
                                (True, False, False)):
        err = Err(tty)
        monkeypatch.setattr(sys, "stderr", err)
        with runs.terminal_of(progress, None).progress(3) as bar:
            bar.update(record)
        assert err.getvalue().startswith("gen 0/3 train 0.5000") == said, (tty, progress)
        assert bool(err.getvalue()) == said
