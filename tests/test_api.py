"""The Python API: evolve.run and evolve.load_run."""

import pytest

import evolve
from evolve.search.config import ConfigError
from tests.conftest import TINY


def test_run_and_load_run(tmp_path, small_data_dir):
    seen = []
    res = evolve.run(data_dir=small_data_dir, runs_dir=tmp_path, name="api", writeback=False,
                     seed=5, progress=seen.append, **TINY)
    assert res.status == "finished" and res.name == "api"
    assert [r["generation"] for r in seen] == list(range(TINY["generations"] + 1))
    assert res.champion["metrics"]["test"]["fitness"] >= 0
    back = evolve.load_run(res.path)
    assert back.champion == res.champion and back.history == res.history
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
