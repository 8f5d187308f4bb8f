"""--batch-blocks: a deterministic sample of draft blocks per generation, the same
in-process and over shards, exact on resume; the hall of fame holds whole-split
train scores."""

import json

import numpy as np
import pytest

from evolve.data import shard_writer as W
from evolve.data import shards as S
from evolve.data import traces as T
from evolve.objectives.spec import TraceArrays
from evolve.search import batches
from evolve.search.config import Config
from evolve.search.engine import Evolution
from tests import tracekit
from tests.test_cluster import run_files, scheduler  # noqa: F401 (a fixture)
from tests.clikit import invoke

BATCH = 40                       # of the 192 train blocks of tracekit.TINY
RUN = ("--objective", "speed", "--generations", 4, "--population", 40, "--no-writeback",
       "--batch-blocks", BATCH)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch_traces")
    for s in T.SPLITS:
        T.save(tracekit.split(s), d / f"{s}.npz")
    W.shard_dir(d, d / "shards", 300)
    assert len(S.open_split(d / "shards" / "train").shards) == 3
    return d


def test_sample_is_seeded_sorted_and_per_generation():
    a = batches.sample_blocks(7, 3, 1000, 50)
    assert np.array_equal(a, batches.sample_blocks(7, 3, 1000, 50))
    assert a.size == 50 and np.all(np.diff(a) > 0) and a.max() < 1000
    assert not np.array_equal(a, batches.sample_blocks(7, 4, 1000, 50))
    assert not np.array_equal(a, batches.sample_blocks(8, 3, 1000, 50))
    assert np.array_equal(batches.sample_blocks(7, 3, 30, 50), np.arange(30))


def test_block_subset_is_those_rows():
    ts = tracekit.split("train")
    idx = np.array([0, 5, 6, 100])
    g = ts.block_size
    rows = (idx[:, None] * g + np.arange(g)).reshape(-1)
    sub = T.TraceSplit({f: ts.columns[f][rows] for f in ts.fields}, ts.meta)
    want, got = TraceArrays.from_split(sub), TraceArrays.from_split(ts).blocks(idx)
    for f in ("X", "cq", "cp", "tq", "tp", "eq", "ep", "dcand", "std_x"):
        assert np.array_equal(getattr(want, f), getattr(got, f)), f
    assert got.n == rows.size


def test_batched_runs_match_over_shards_and_resume_exactly(data, tmp_path):
    r = invoke("run", *RUN, "--data", data, "--runs-dir", tmp_path, "--name", "npz")
    assert r.exit_code == 0, r.output
    want = run_files(tmp_path / "npz")
    r = invoke("run", *RUN, "--data", data / "shards", "--runs-dir", tmp_path, "--name", "sh")
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "sh") == want
    assert want["checkpoint"]["batch"]["blocks"] == BATCH
    # stopped after generation 2, resumed to 4: the same run
    short = [a if a != 4 else 2 for a in RUN]
    r = invoke("run", *short, "--data", data, "--runs-dir", tmp_path, "--name", "part")
    assert r.exit_code == 0, r.output
    r = invoke("run", "--resume", "part", "--generations", 4, "--runs-dir", tmp_path,
               "--no-writeback")
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "part") == want
    # the hall of fame holds whole-split train scores; the run differs from a full-split one
    hof = json.loads((tmp_path / "npz" / "hall_of_fame.json").read_text())
    full = Evolution(Config(objective="speed", population=40), tracekit.split("train"),
                     tracekit.split("valid"))
    exact = full.train_scores([e["tree"] for e in hof])
    assert [e["train_fitness"] for e in hof] == exact.tolist()
    r = invoke("run", *RUN[:-2], "--data", data, "--runs-dir", tmp_path, "--name", "all")
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "all")["history"] != want["history"]


def test_bad_batch_blocks_is_one_line(data, tmp_path):
    for extra, needle in ((("--batch-blocks", -1), "--batch-blocks"),
                          (("--batch-blocks", 5, "--objective", "pareto"), "speed")):
        r = invoke("run", "--generations", 1, "--population", 8, "--objective", "speed",
                   *extra, "--data", data, "--runs-dir", tmp_path)
        assert r.exit_code == 2, r.output
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_batched_run_on_a_cluster_matches(data, scheduler, tmp_path):  # noqa: F811
    r = invoke("run", *RUN, "--data", data, "--runs-dir", tmp_path, "--name", "npz")
    assert r.exit_code == 0, r.output
    r = invoke("run", *RUN, "--data", data / "shards", "--runs-dir", tmp_path, "--name", "c",
               "--scheduler", scheduler)
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "c") == run_files(tmp_path / "npz")
