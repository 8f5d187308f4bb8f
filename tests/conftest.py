import os

# Under pytest-xdist (make test: a process per core) torch computes on one thread in each
# process. Its OpenMP threads spin while they wait, so two processes' thread pools on the
# same two cores slow each other several times over: recording a task on the real pair
# took 196 s (profiled) with two threads beside another busy process, 41 s with one. Set
# before anything imports torch; the tests' subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

from evolve.data import tokens as data  # noqa: E402
from evolve.io.paths import DATA_DIR  # noqa: E402
from evolve.data.sources import synthetic as synth  # noqa: E402

# Tiny budgets for unit tests, kept in one place.
TINY = {"generations": 4, "population": 40}
SMALL_SEQUENCES = {"train": 30, "valid": 10, "test": 10}

os.environ.setdefault("COLUMNS", "160")
os.environ.setdefault("NO_COLOR", "1")


@pytest.fixture(scope="session")
def small_splits():
    return synth.generate_splits(sequences=SMALL_SEQUENCES)


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory, small_splits):
    d = tmp_path_factory.mktemp("small_data")
    for name, ds in small_splits.items():
        data.save_npz(ds, data.split_path(d, name))
    return d


@pytest.fixture(scope="session")
def default_splits():
    return data.load_splits(DATA_DIR)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: torch's CPU thread pool on a busy shared
    machine costs more than it gives on tiny sizes (results do not depend on it)."""
    import torch  # lazy: only the torch tests ask for it
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def edited_evolved(tmp_path, monkeypatch):
    """Make `import heuristics.evolved` find a file of the test's choosing: returns
    ``write(text)``, which puts that text where the import looks first."""
    import importlib
    import sys

    import heuristics
    from heuristics import registry
    d = tmp_path / "edited"
    d.mkdir()
    # the installed module first, so that both the import table and the package's
    # attribute get it back afterwards (not the test's file)
    installed = importlib.import_module("heuristics.evolved")
    monkeypatch.setattr(heuristics, "evolved", installed)
    monkeypatch.setattr(heuristics, "__path__", [str(d)] + list(heuristics.__path__))
    monkeypatch.delitem(sys.modules, "heuristics.evolved")
    monkeypatch.setattr(registry, "_compiled", {k: v for k, v in registry._compiled.items()
                                                if k != registry.EVOLVED})

    def write(text: str):
        (d / "evolved.py").write_text(text)
    return write


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, small_data_dir):
    """A small finished run (3 generations), to copy and tamper with."""
    from tests.clikit import invoke
    from tests.runkit import POP
    parent = tmp_path_factory.mktemp("finished")
    r = invoke("run", "--population", POP, "--generations", 3, "--seed", 1, "--name", "done",
               "--data", small_data_dir, "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    return parent / "done"


@pytest.fixture(scope="session")
def data_copy(tmp_path_factory, small_data_dir):
    """The small splits in a directory of their own (other data than
    ``small_data_dir`` for --resume, and free to be copied and tampered with)."""
    import shutil
    d = tmp_path_factory.mktemp("data") / "splits"
    shutil.copytree(small_data_dir, d)
    return d


@pytest.fixture(scope="session")
def finished(tmp_path_factory, data_copy):
    """A finished run of ``tests.runkit.GENS`` generations on ``data_copy``, to copy
    and tamper with."""
    from tests.clikit import invoke
    from tests.runkit import GENS, POP
    parent = tmp_path_factory.mktemp("finished")
    r = invoke("run", "--population", POP, "--generations", GENS, "--seed", 1, "--name", "done",
               "--data", data_copy, "--runs-dir", parent, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    return parent / "done"


@pytest.fixture(scope="session")
def task_pair_small():
    """The built-in task pair at a test's size (60 / 24 / 24 problems)."""
    from evolve.data.sources.task import pair as TP
    return TP.build_pair(TP.TaskPairConfig(train_prompts=60, valid_prompts=24,
                                           test_prompts=24))


@pytest.fixture(scope="session")
def task_greedy_small(task_pair_small, tmp_path_factory):
    """Greedy task traces of ``task_pair_small`` with their labels, recorded once for
    every test module that reads them (leave them unchanged: copy to alter)."""
    from evolve.data.sources.task import record
    d = tmp_path_factory.mktemp("task-greedy")
    for split in ("train", "valid", "test"):
        record.save(record.record_split(task_pair_small, split, "greedy", 0), d)
    return d


def pytest_collection_modifyitems(config, items):
    """The modules with a long test (marked slow) first, each kept whole (its module
    fixtures are made once): on several processes (make test) the short tests then fill
    in around the long ones, and no process is left running a long test at the end."""
    slow = {it.module.__name__ for it in items if it.get_closest_marker("slow")}
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (it.module.__name__ not in slow, order[id(it)]))
