"""Data worlds (evolve.tasks): a new world is one Task and one registry line, and
single and multi-start runs end by one path (evolve.runs.finalise)."""

import json
import re
from pathlib import Path

import pytest

import evolve
from evolve import tasks
from evolve.objectives import OBJECTIVES
from evolve.objectives.tokens import TokenObjective
from evolve.tasks.writeback import module_metadata
from tests import tracekit
from tests.clikit import invoke, isolated  # noqa: F401 (isolated: a fixture)
from tests.conftest import TINY

pytestmark = pytest.mark.usefixtures("isolated")

npz_dir = tracekit.npz_dir_fixture()
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ a third data world

class ToyTask(tasks.Task):
    """Token splits seen as another world: its own header metrics, report file,
    runs columns and no heuristics module to write back to."""
    name = "toy"
    figure = "toy_score"
    metric_keys = ("toy_score",)

    def default_data(self):
        return tasks.TASKS["tokens"].default_data()

    def load_splits(self, config, data_dir, session=None):
        return tasks.TASKS["tokens"].load_splits(config, data_dir, session)

    def report(self, result):
        return {"champion": {"toy_note": len(result.hof_trees)},
                "files": {"toy.json": {"trees": result.hof_trees}}}

    def header_metrics(self, m):
        return {"toy_score": m["toy_score"]}


class ToyObjective(TokenObjective):
    data = "toy"

    def metrics(self, nodes, splits, evaluators):
        out = super().metrics(nodes, splits, evaluators)
        return {k: {**m, "toy_score": 100 * m["fitness"]} for k, m in out.items()}


@pytest.fixture
def toy_world(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "toy", ToyTask())            # the registry line
    monkeypatch.setitem(OBJECTIVES, "toy", ToyObjective("toy", True, "a toy world"))


def test_a_third_data_world_is_a_task_and_a_registry_line(toy_world, small_data_dir, tmp_path):
    res = evolve.run(objective="toy", data_dir=small_data_dir, runs_dir=tmp_path, name="t",
                     seed=3, threads=1, **TINY)
    assert res.status == "finished" and res.writeback is None     # the world has no module
    champ = res.champion
    assert champ["objective"] == "toy" and champ["toy_note"] >= 1
    assert json.loads((res.path / "toy.json").read_text())["trees"]
    meta = module_metadata(res.path / "champion.py")
    assert meta["metrics"] == {k: {"toy_score": champ["metrics"][k]["toy_score"]}
                               for k in ("train", "valid", "test")}
    header = (res.path / "champion.py").read_text().split('"""')[1]
    assert re.search(r"^valid: toy_score \d", header, re.M), header
    # the command line shows it through the generic view, and lists it by its figure
    r = invoke("inspect", "t", "--runs-dir", tmp_path)
    assert r.exit_code == 0, r.output
    assert "champion metrics" in r.output and "toy_score" in r.output
    r = invoke("runs", "--runs-dir", tmp_path, "--json")
    assert json.loads(r.output)[0]["valid_toy_score"] == champ["metrics"]["valid"]["toy_score"]
    # several starts take the same path
    multi = evolve.run(objective="toy", data_dir=small_data_dir, runs_dir=tmp_path, name="m",
                       seed=3, threads=1, starts=2, **TINY)
    assert multi.champion["over_starts"]["figure"] == "test toy_score"


WORLD_FREE = ["evolve/runs/runner.py", "evolve/runs/multistart.py", "evolve/runs/finalise.py",
              "evolve/runs/report.py", "evolve/cli/runs.py", "evolve/export/champions.py",
              "evolve/lang/codegen.py", "evolve/api/runs.py"]
WORLD_TESTS = [r'"tokens_per_call" in', r"\.traces\b", r'"evolved_trace"', r"is_trace",
               r"hasattr\(", r"TRACES_DIR"]


@pytest.mark.parametrize("path", WORLD_FREE)
def test_orchestration_never_asks_which_world(path):
    text = (ROOT / path).read_text()
    for pattern in WORLD_TESTS:
        assert not re.search(pattern, text), (path, pattern)


# ------------------------------------------------------------ one finalisation path

def _shape(path: Path) -> tuple:
    meta = module_metadata(path / "champion.py")
    summary = json.loads((path / "summary.json").read_text())
    return ([k for k in meta if k != "starts"],
            {k: sorted(v) for k, v in meta["metrics"].items()},
            [k for k in summary if k not in ("starts", "chosen_seed", "generation")])


@pytest.mark.parametrize("world", ["tokens", "traces"])
def test_single_and_multi_start_runs_write_the_same_shapes(world, small_data_dir, npz_dir,
                                                           tmp_path):
    kw = dict(objective="speed", data_dir=npz_dir) if world == "traces" else \
        dict(data_dir=small_data_dir)
    one = evolve.run(runs_dir=tmp_path, name="one", seed=5, threads=1, **kw, **TINY)
    many = evolve.run(runs_dir=tmp_path, name="many", seed=5, threads=1, starts=2, **kw,
                      **TINY)
    assert _shape(one.path) == _shape(many.path)
    assert module_metadata(many.path / "champion.py")["starts"] == 2
    # and the header metrics are the champion's, filtered the same way
    for run in (one, many):
        meta = module_metadata(run.path / "champion.py")
        task = tasks.task_of(meta["objective"])
        assert meta["metrics"] == {k: task.header_metrics(run.champion["metrics"][k])
                                   for k in ("train", "valid", "test")}
        assert meta["generation"] == run.champion["generation"]


@pytest.fixture(scope="module")
def sharded(npz_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "shards"
    r = invoke("data", "shard", npz_dir, "--rows-per-shard", 200, "--out", out)
    assert r.exit_code == 0, r.output
    return out


def test_sharded_trace_run_writes_back(sharded, npz_dir, tmp_path):
    """The write-back scores on the split's own arrays (it failed on a sharded split,
    whose evaluator holds only the shape), with the decision an in-memory run makes."""
    # forced: a champion of a few generations need not beat the tuned baselines
    kw = dict(objective="speed", seed=2, threads=1, runs_dir=tmp_path, force=True, **TINY)
    res = evolve.run(data_dir=sharded, name="sh", **kw)
    assert res.status == "finished" and res.writeback["written"]
    mem = evolve.run(data_dir=npz_dir, name="mem", **kw)
    assert mem.champion["tree"] == res.champion["tree"]
    assert mem.writeback["new_valid_score"] == res.writeback["new_valid_score"]


def test_in_memory_and_sharded_splits_offer_one_protocol(npz_dir, sharded):
    """Shape, sums (all blocks or some) and evaluators agree, bit for bit."""
    import numpy as np

    from evolve.cluster.session import Session
    from evolve.data import shards, traces
    from evolve.lang import treeio
    from evolve.objectives.splits import as_split
    progs = treeio.linearise([treeio.parse(t) for t in
                              ("target_prob", "pdiv(target_prob, draft_prob)")])
    mem = as_split(traces.load_splits(npz_dir)["valid"])
    with Session() as session:
        sh = session.attach(shards.load_splits(sharded))["valid"]
        shape = lambda s: (s.shape.g, s.shape.k, s.shape.n, s.shape.n_blocks)  # noqa: E731
        assert shape(mem) == shape(sh)
        for blocks in (None, np.arange(0, mem.shape.n_blocks, 3)):
            assert np.array_equal(mem.sums(progs, True, blocks), sh.sums(progs, True, blocks))
            a, b = (s.evaluator("valid", blocks) for s in (mem, sh))
            assert np.array_equal(a.run(progs), b.run(progs))
