"""Several starts of one run (evolve run --starts): champion chosen on valid only."""

import json

from click.testing import CliRunner

from evolve.cli import main
from evolve.io import paths
from tests.conftest import TINY

STARTS = 3


def _run(tmp_path, data, *extra):
    return CliRunner().invoke(main, ["run", "--data", str(data), "--runs-dir", str(tmp_path),
                                     "--generations", str(TINY["generations"]),
                                     "--population", str(TINY["population"]), "--seed", "11",
                                     "--no-writeback", "--json", *extra])


def test_starts_choose_on_valid_and_report_the_spread(tmp_path, small_data_dir):
    r = _run(tmp_path, small_data_dir, "--starts", str(STARTS), "--name", "ms")
    assert r.exit_code == 0, r.output
    champ = json.loads((tmp_path / "ms" / "champion.json").read_text())
    starts = champ["starts"]
    assert [s["seed"] for s in starts] == [11, 12, 13]
    best = max(starts, key=lambda s: (s["valid_score"], -s["size"], -s["seed"]))
    assert champ["chosen_seed"] == best["seed"] and champ["tree"] == best["tree"]
    tests = [s["test"]["fitness"] for s in starts]
    assert champ["over_starts"]["min"] == min(tests) and champ["over_starts"]["max"] == max(tests)
    # each start is the run a single start with that seed gives
    single = _run(tmp_path, small_data_dir, "--seed", "12", "--name", "one")
    assert single.exit_code == 0
    one = json.loads((tmp_path / "one" / "champion.json").read_text())
    assert one["tree"] == starts[1]["tree"]
    assert one["metrics"]["valid"] == starts[1]["valid"] and one["metrics"]["test"] == starts[1]["test"]
    assert (tmp_path / "ms" / "champion.py").is_file()


def test_resume_continues_unfinished_starts(tmp_path, small_data_dir):
    r = _run(tmp_path, small_data_dir, "--starts", "2", "--name", "ms")
    assert r.exit_code == 0
    first = json.loads((tmp_path / "ms" / "champion.json").read_text())
    # forget the second start's finish: resuming runs it again from its checkpoint
    (tmp_path / "ms" / "starts" / "seed12" / "summary.json").unlink()
    (tmp_path / "ms" / "champion.json").unlink()
    r = CliRunner().invoke(main, ["run", "--resume", "ms", "--runs-dir", str(tmp_path),
                                  "--no-writeback", "--json"])
    assert r.exit_code == 0, r.output
    again = json.loads((tmp_path / "ms" / "champion.json").read_text())
    assert again["tree"] == first["tree"] and again["starts"] == first["starts"]


def test_bad_starts_is_one_line(tmp_path, small_data_dir):
    r = _run(tmp_path, small_data_dir, "--starts", "0")
    assert r.exit_code == 2 and "--starts" in r.output
    assert not any(tmp_path.iterdir())
    assert paths.RUNS_DIR.name == "runs"


def test_several_starts_record_the_datas_digests_and_refuse_changed_data(tmp_path,
                                                                        small_data_dir):
    """The parent directory of several starts is opened as every run directory is
    (``evolve.runs.lifecycle``): its config.json records the splits' sha256 (its starts'
    own), and a resume over data changed since is one line naming the split, before any
    start runs again."""
    import shutil

    import numpy as np

    from evolve.data import tokens as data
    d = tmp_path / "data"
    shutil.copytree(small_data_dir, d)
    runs = tmp_path / "runs"
    r = CliRunner().invoke(main, ["run", "--data", str(d), "--runs-dir", str(runs),
                                  "--generations", "1", "--population", "12", "--seed", "11",
                                  "--starts", "2", "--name", "ms", "--no-writeback", "--json"])
    assert r.exit_code == 0, r.output
    parent = json.loads((runs / "ms" / "config.json").read_text())["data"]["sha256"]
    child = json.loads((runs / "ms" / "starts" / "seed12" / "config.json").read_text())
    assert set(parent) == {"train", "valid", "test"} and parent == child["data"]["sha256"]
    valid = data.load_npz(data.split_path(d, "valid"), "valid")
    cols = {k: np.ascontiguousarray(v[::-1]) for k, v in valid.columns().items()}  # its rows
    data.save_npz(data.Dataset(**cols, name="valid"), data.split_path(d, "valid"))
    (runs / "ms" / "starts" / "seed12" / "summary.json").unlink()     # a start to run again
    before = (runs / "ms" / "starts" / "seed12" / "history.jsonl").read_text()
    r = CliRunner().invoke(main, ["run", "--resume", "ms", "--runs-dir", str(runs),
                                  "--no-writeback"])
    assert r.exit_code == 2 and "split 'valid'" in r.output and \
        "has changed since run ms started" in r.output, r.output
    assert (runs / "ms" / "starts" / "seed12" / "history.jsonl").read_text() == before


def test_task_study_continues_a_search_cut_off_and_refuses_other_settings(tmp_path,
                                                                          task_greedy_small):
    """The task world's study (results-real runs it across sittings) with --reuse-runs keeps
    a finished search, continues one that was cut off (its finished starts kept, the same
    champion), and stops in one line on a search of the same name with other settings."""
    import argparse

    import pytest

    from benchmarks.experiments import task_results as TR
    a = argparse.Namespace(starts=2, seed=5, population=TINY["population"],
                           generations=TINY["generations"], reuse_runs=True)
    first = TR.evolve_champion(task_greedy_small, tmp_path, 0.03, a, "greedy")
    run = tmp_path / first["name"]
    kept = (run / "starts" / "seed5" / "history.jsonl").read_bytes()
    for f in (run / "summary.json", run / "champion.json",
              run / "starts" / "seed6" / "summary.json"):
        f.unlink()                  # as a process killed in the second start leaves it
    again = TR.evolve_champion(task_greedy_small, tmp_path, 0.03, a, "greedy")
    assert again["expression"] == first["expression"]
    assert again["chosen_seed"] == first["chosen_seed"]
    assert (run / "starts" / "seed5" / "history.jsonl").read_bytes() == kept
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    a.starts = 3
    with pytest.raises(SystemExit, match="other settings .starts 2, not 3"):
        TR.evolve_champion(task_greedy_small, tmp_path, 0.03, a, "greedy")
