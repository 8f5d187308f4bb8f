"""The same run on npz files, on shards in this process and on a Dask cluster, for
every objective and option that changes what the search may use (the primitive set):
plain traces (schema v3, with the slot features), ``--trajectory``, ``--lookahead``,
both, the KL objective, NSGA-II, schema-v2 traces without slot features, and
``--inputs``. Equal history, hall of fame, checkpoint and champion, and the primitive
set is the one the npz files give (a variant that silently drops inputs on shards
would still match itself, so each case also checks which inputs the run offered).

Token splits have one storage form (``evolve data shard`` takes traces only), so the
token objectives have no sharded run to compare; ``test_token_splits_are_not_sharded``
holds that refusal. Task traces with their critical-token labels shard too, and the
task objectives give the same run on them.

Guarantee 33 of docs/reliability.md, The same run on npz files, shards and a cluster, for every objective:

A split held in this process, the same split sharded (`evolve data shard`) and
scored in this process, and the shards scored on a Dask cluster give the same
history, hall of fame, checkpoint and champion for the same seed, and offer the
search the same inputs. Every split's shape says whether it has the slot features
(its `missing`, one definition for arrays, devices and shards), and the engine reads
it with no default, so an evaluator that does not say is an error, never a search
quietly without the slot inputs. The inputs a run offered are recorded in every
checkpoint, and a resume on data that would offer others is refused.

Tested, per objective and option (in-process shards; a Dask cluster, slow):

- ``speed`` on schema v3 (slot features): shards; cluster (``test_cluster.py``);
- ``speed --trajectory``, ``speed --lookahead``: shards; cluster;
- ``speed --trajectory --lookahead``, ``speed_kl``, ``pareto``, ``speed --inputs``:
  shards;
- schema v2 traces (no slot features): shards; cluster;
- ``task_speed``, ``task_seed`` (task traces with labels): shards; cluster
  (``task_speed``);
- token objectives: token splits have one storage form, and ``evolve data shard``
  refuses them in one line.

Each trace case also checks which inputs the run offered, so a case that silently
drops inputs on both sides still fails. Before this guarantee, ``--trajectory`` on
shards lost the slot inputs (its sharded evaluator carried a shape without
``missing``, read as "missing"). Task traces shard with their labels
(``critical.npy``), checked in every shard as in the labels file; their sums are
exact in fixed point on any split of the blocks, and the answers are counted over
the whole split.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolve.data import shards as S
from evolve.data import traces as T
from evolve.data.shard_writer import shard_dir
from evolve.lang import features as FT
from tests import tracekit
from tests.clikit import invoke, one_line_error
from tests.conftest import TINY
from tests.test_cluster import run_files

BASE = ("--generations", TINY["generations"], "--population", TINY["population"],
        "--no-writeback", "--json", "--seed", "2")
SLOTS = set(FT.SLOT_INPUT_NAMES)
LOOK = set(FT.LOOKAHEAD_INPUT_NAMES)
TRACE = {"block_position", "p_max", "q_max"}
RANK = set(FT.names_of("rank"))           # the target's ranks (the tiny traces record them)
# the token's class (the tiny traces' meta carries the byte table, and so do their shards)
VOCAB = set(FT.names_of("vocab"))

# name -> (options, the inputs the run must offer beyond the six of a token record)
CASES = {
    "speed": (("--objective", "speed"), TRACE | SLOTS | RANK | VOCAB),
    "trajectory": (("--objective", "speed", "--trajectory"), TRACE | SLOTS | RANK | VOCAB),
    "lookahead": (("--objective", "speed", "--lookahead"),
                  TRACE | SLOTS | LOOK | RANK | VOCAB),
    "trajectory-lookahead": (("--objective", "speed", "--trajectory", "--lookahead"),
                             TRACE | SLOTS | LOOK | RANK | VOCAB),
    "speed_kl": (("--objective", "speed_kl"), TRACE | SLOTS | RANK | VOCAB),
    "pareto": (("--objective", "pareto"), TRACE | SLOTS | RANK | VOCAB),
    "inputs": (("--objective", "speed", "--inputs", "draft_prob,target_prob,block_position"),
               {"block_position"}),
    "v2": (("--objective", "speed"), TRACE | VOCAB),
}


def offered(run_dir) -> set:
    """The inputs a run offered its search (its checkpoint records them)."""
    return set(json.loads((run_dir / "checkpoint.json").read_text())["inputs"])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny traces (v4, and v2 with the slot features and ranks dropped) as npz files and
    as shards of whole sequences (2 shards of train, so the trajectory runs too)."""
    root = tmp_path_factory.mktemp("everywhere")
    out = {}
    for kind in ("v3", "v2"):
        d = root / kind
        d.mkdir()
        for s in T.SPLITS:
            ts = tracekit.split(s)
            if kind == "v2":
                cols = {f: v for f, v in ts.columns.items() if f not in T.V3_FIELDS and f not in T.V4_FIELDS}
                ts = T.TraceSplit(cols, dict(ts.meta), ts.name)
            T.save(ts, d / f"{s}.npz")
        per_seq = tracekit.TINY.blocks_per_prompt * int(ts.meta["block_size"])
        rows = len(tracekit.split("train"))
        shard_dir(d, root / f"{kind}-shards", per_seq * -(-rows // per_seq // 2))
        assert len(S.open_split(root / f"{kind}-shards" / "train").shards) == 2
        out[kind] = (d, root / f"{kind}-shards")
    return out


def _run(opts, data_dir, runs, name, *extra):
    r = invoke("run", *BASE, *opts, "--data", data_dir, "--runs-dir", runs, "--name", name,
               *extra)
    assert r.exit_code == 0, r.output
    return runs / name


@pytest.mark.parametrize("case", sorted(CASES))
def test_npz_and_in_process_shards_give_the_same_run(case, data, tmp_path):
    opts, inputs = CASES[case]
    npz, sharded = data["v2" if case == "v2" else "v3"]
    a = _run(opts, npz, tmp_path, "npz")
    b = _run(opts, sharded, tmp_path, "shards")
    if case == "inputs":
        assert offered(a) == {"draft_prob", "target_prob", "block_position"}
    else:
        assert offered(a) == set(FT.INPUT_NAMES) | inputs
    assert offered(b) == offered(a)
    assert run_files(b) == run_files(a)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["trajectory", "lookahead", "v2"])
def test_a_local_cluster_gives_the_same_run(case, data, tmp_path):
    pytest.importorskip("distributed")
    opts, _ = CASES[case]
    npz, sharded = data["v2" if case == "v2" else "v3"]
    a = _run(opts, npz, tmp_path, "npz")
    b = _run(opts, sharded, tmp_path, "cluster", "--cluster", "local:2")
    assert offered(a) == offered(b)
    assert run_files(b) == run_files(a)


def test_token_splits_are_not_sharded(tmp_path):
    """Token splits have one storage form: sharding them is refused in one line."""
    r = invoke("data", "generate", "--out", tmp_path / "tok", "--sequences", "20")
    assert r.exit_code == 0, r.output
    one_line_error(invoke("data", "shard", tmp_path / "tok", "--rows-per-shard", "64",
                          "--out", tmp_path / "sh"), "trace")
    assert not (tmp_path / "sh").exists()


def test_bad_inputs_are_one_line_and_make_nothing(data, tmp_path):
    npz, _ = data["v3"]
    v2, _ = data["v2"]
    runs = tmp_path / "runs"
    for opts, data_dir, words in (
            (("--inputs", "draft_prob,bogus"), npz, ("--inputs", "bogus")),
            (("--inputs", "draft_prob,draft_prob"), npz, ("--inputs", "twice")),
            (("--inputs", "next_tv"), npz, ("--inputs", "--lookahead")),
            (("--inputs", "slot_tv,draft_prob"), v2, ("--inputs", "slot_tv")),
            (("--engine", "sglang"), npz, ("--engine", "vllm")),
            (("--engine", "vllm", "--inputs", "draft_prob"), npz, ("--engine", "inputs"))):
        one_line_error(invoke("run", *BASE, "--objective", "speed", *opts, "--data", data_dir,
                              "--runs-dir", runs), *words)
    one_line_error(invoke("run", *BASE, "--objective", "expected", "--inputs", "p_max",
                          "--runs-dir", runs), "--inputs", "p_max")
    assert not runs.exists()


def test_an_engine_run_exports_to_that_engine(data, tmp_path):
    """``--engine vllm``: the champion reads only what vLLM's kernel holds, so the
    vllm-patch export (which refuses any other input) takes it."""
    npz, _ = data["v3"]
    run = _run(("--objective", "speed", "--engine", "vllm", "--generations", "6"), npz,
               tmp_path, "vllm")
    assert offered(run) == {"draft_prob", "target_prob", "block_position"}
    champion = json.loads((run / "champion.json").read_text())
    from evolve.lang import treeio
    read = {n.name for n in treeio.parse(champion["tree"]) if n.kind == "input"}
    assert read <= {"draft_prob", "target_prob", "block_position"}
    r = invoke("export", str(run), "--format", "vllm-patch", "--allow-infeasible")
    assert r.exit_code == 0, r.output
    assert "+++ b/vllm/v1/sample/rejection_sampler.py" in r.output


def test_an_engine_run_on_traces_offers_what_the_traces_and_the_engine_both_hold(data, tmp_path):
    """``--engine transformers`` on traces: the drop-in computes inputs the traces do not
    offer (the task world's answer inputs); the run offers only what both hold: the
    target's rank and the token's class where the traces hold them, and no refusal
    where they do not (on v2 traces, which hold neither)."""
    from evolve.lang.features import offered as offered_by
    npz, _ = data["v3"]
    run = _run(("--objective", "speed", "--engine", "transformers", "--generations", "2"),
               npz, tmp_path, "transformers")
    assert offered(run) == set(offered_by(True, True, False)) | RANK | VOCAB
    old = tmp_path / "v2-bare"
    old.mkdir()
    for s in T.SPLITS:
        ts = T.load(data["v2"][0] / f"{s}.npz")
        T.save(T.TraceSplit(ts.columns, {k: v for k, v in ts.meta.items()
                                         if k not in ("vocab_classes", "source")}, s),
               old / f"{s}.npz")
    run = _run(("--objective", "speed", "--engine", "transformers", "--generations", "2"),
               old, tmp_path, "transformers-v2")
    assert offered(run) == set(FT.INPUT_NAMES) | TRACE


# ------------------------------------------------------------ the task world

@pytest.fixture(scope="module")
def task_data(task_greedy_small, tmp_path_factory):
    """Greedy task traces with their labels, as npz files and as shards of a third of
    a split each (so a problem's blocks fall into two shards)."""
    from evolve.data.sources.task import record
    root = tmp_path_factory.mktemp("task-everywhere")
    rows = len(record.load(task_greedy_small, "train"))
    shard_dir(task_greedy_small, root / "shards", rows // 3 + 2)
    sp = S.open_split(root / "shards" / "train")
    assert len(sp.shards) >= 3 and sp.shards[0]["rows"] % 100
    return task_greedy_small, root / "shards"


@pytest.mark.parametrize("objective", ["task_speed", "task_seed", "speed"])
def test_task_traces_on_npz_and_shards_give_the_same_run(objective, task_data, tmp_path):
    """The task objectives' sums are exact on any split of the blocks, and the answers
    (the critical budget's denominator) are counted over the whole split: a run on the
    shards is the run on the npz files. Planted, each fails it: the answers counted per
    shard and added (a problem cut by a shard counts twice), one shard left out. Task
    traces are traces too: the trace objectives run on their shards as on the files."""
    npz, sharded = task_data
    # (the free-running choice of the champion on 6 valid problems: the same on both)
    opts = ("--objective", objective) + (("--budget-critical", "0.05", "--select-problems",
                                          "6") if objective.startswith("task") else ())
    a = _run(opts, npz, tmp_path, "npz")
    b = _run(opts, sharded, tmp_path, "shards")
    own = set(FT.names_of("answer", "verify")) if objective.startswith("task") else set()
    assert offered(a) == set(FT.INPUT_NAMES) | TRACE | SLOTS | RANK | VOCAB | own
    assert run_files(b) == run_files(a)


@pytest.mark.slow
def test_task_traces_on_a_local_cluster_give_the_same_run(task_data, tmp_path):
    pytest.importorskip("distributed")
    npz, sharded = task_data
    opts = ("--objective", "task_speed", "--budget-critical", "0.05", "--select-problems", "6")
    a = _run(opts, npz, tmp_path, "npz")
    b = _run(opts, sharded, tmp_path, "cluster", "--cluster", "local:2")
    assert run_files(b) == run_files(a)


def test_task_shards_check_their_labels_and_traces_without_labels_are_refused(
        task_data, data, tmp_path):
    """Shards of task traces carry the labels' column, checked as the labels file is
    (a draft the standard rule could reject without a label is one line naming the
    shard's column and row); a task run on shards of plain traces is one line."""
    import shutil
    from evolve.data import labels as LB
    _, sharded = task_data
    bad = shutil.copytree(sharded, tmp_path / "bad")
    sp = S.open_split(bad / "valid")
    path = sp.shard_paths()[1] / "critical.npy"
    crit = np.load(path)
    row = int(np.flatnonzero(crit >= 0)[0])
    crit[row] = LB.UNLABELED
    np.save(path, crit)
    man = json.loads((bad / "valid" / S.MANIFEST).read_text())
    man["shards"][1]["columns"]["critical"]["sha256"] = S.digest(path)
    (bad / "valid" / S.MANIFEST).write_text(json.dumps(man))
    runs = tmp_path / "runs"
    one_line_error(invoke("run", *BASE, "--objective", "task_speed", "--data", bad,
                          "--runs-dir", runs), "critical.npy", f"row {row}", "no label")
    _, plain = data["v3"]
    one_line_error(invoke("run", *BASE, "--objective", "task_speed", "--data", plain,
                          "--runs-dir", runs), "meta.labels", "evolve data task")
    other = shutil.copytree(sharded, tmp_path / "other")
    man = json.loads((other / "test" / S.MANIFEST).read_text())
    man["meta"]["labels"]["labels_version"] = 99
    (other / "test" / S.MANIFEST).write_text(json.dumps(man))
    one_line_error(invoke("data", "shard", other, "--verify"), "manifest.json",
                   "meta.labels", "labels_version", "99")
    man["meta"]["labels"].update(labels_version=1, decoding="sample")
    (other / "test" / S.MANIFEST).write_text(json.dumps(man))
    one_line_error(invoke("data", "shard", other, "--verify"), "manifest.json",
                   "meta.labels.decoding", "'sample'", "'greedy'")
    assert not runs.exists()


def test_sharding_task_traces_checks_every_split_s_labels_before_writing(task_data,
                                                                         tmp_path):
    """Labels missing for one split: one line, and no split is sharded."""
    import shutil
    npz, _ = task_data
    d = shutil.copytree(npz, tmp_path / "task")
    (d / "test.labels.npz").unlink()
    one_line_error(invoke("data", "shard", d, "--rows-per-shard", "400", "--out",
                          tmp_path / "sh"), "test.labels.npz", "missing")
    assert not (tmp_path / "sh").exists()
