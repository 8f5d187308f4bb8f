"""The speed objective on the rule's own trajectory (``evolve run --trajectory``):
evolve.kernels.trajectory and evolve.objectives.trajectory_objective against the numpy
estimate of evolve.objectives.trajectory, exact over shards, the ESS guard, and the
command line.

Guarantee 30 of docs/reliability.md, The trajectory objective: exact sums and clear refusals:

The trajectory kernel (`evolve/kernels/trajectory.py`) adds every block's weighted
terms in 128-bit fixed point like the plain kernel, so a split in memory, any
sharding that keeps sequences whole, and a Dask cluster give the same integers and
the same run, bit for bit; the plain sums it returns are the plain kernel's
integers. A weight above 2^15, past which its square would saturate the fixed point,
is counted instead of summed and makes the estimate undefined (score 0), so
saturation never shows as a plausible number. `evolve run --trajectory` with an
objective other than `speed`, with `--batch-blocks N`, with `--ess-floor` outside
[0, 1] or not a number, or on token splits is one line and exit code 2, before any
run directory is made; so is `--ess-floor` without `--trajectory`, which nothing
else reads (`evolve tradeoff --budget abc` is one line too, not click's usage text).
On traces whose blocks are not held per sequence in order, or on shards where a
sequence spans two shards, the run stops before it starts with one line naming the
split, the shard, the field, the row and the value; nothing is written. Tests:
`tests/test_trajectory_objective.py`.
"""

import json

import numpy as np
import pytest

from evolve.cluster.session import Session
from evolve.data import shard_writer
from evolve.data import shards as S
from evolve.data import traces as T
from evolve.kernels.tokens import matrix_thresholds
from evolve.lang import treeio
from evolve.objectives import spec
from evolve.objectives import trajectory as TR
from evolve.objectives import trajectory_objective as TO
from evolve.objectives import bind
from evolve.objectives.trace_objectives import SPEED
from evolve.objectives.splits import as_split
from evolve.search.config import Config
from tests import tracekit
from tests.clikit import invoke, one_line_error

npz_dir = tracekit.npz_dir_fixture()

TREES = ["pmin(1.0, pdiv(target_prob, draft_prob))",                 # standard
         "pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))",        # leniency 0.8
         "pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob)))",        # leniency 0.5
         "0.99", "target_prob", "psqrt(target_prob)"]
# The kernel rounds each block's terms once to 128-bit fixed point (2^-80) and sums
# integers; the reference sums floats in numpy's order and forms the self-normalised
# mean through a linearisation. Both are the same formulas on the same float64 inputs,
# so they differ by a few ulps of the result (observed <= 2e-15 relative); TV of the
# standard rule is float noise (~1e-16) that agrees only absolutely.
REL, ABS = 1e-12, 1e-15


def _progs(trees):
    return treeio.linearise([treeio.parse(t) for t in trees])


def _reference(ts, trees):
    sa = spec.TraceArrays.from_split(ts)
    tb = TR.TraceBlocks.from_split(ts)
    h = matrix_thresholds(_progs(trees), sa.X)
    return [TR.estimate(sa, tb, h[i]) for i in range(len(trees))]


def _config(**kw):
    return Config(objective="speed", trajectory=True, **kw)


@pytest.fixture(scope="module")
def valid():
    return tracekit.split("valid")


def test_kernel_equals_the_numpy_estimate(valid):
    ev = TO.evaluator(as_split(valid), "valid")
    m = TO.measures(ev.run(_progs(TREES)), valid.block_size, ev.trajectory)
    ref = _reference(valid, TREES)
    assert ev.trajectory.sequences == ref[0].sequences == 64
    for i, e in enumerate(ref):
        assert not m["undefined"][i]
        assert m["tokens"][i] == pytest.approx(e.tokens_per_call, rel=REL, abs=ABS)
        assert m["tv"][i] == pytest.approx(e.tv_per_token, rel=REL, abs=ABS)
        assert m["ess"][i] == pytest.approx(e.effective_sequences, rel=REL, abs=ABS)
    # and the fitness is speed_fitness of those numbers (budget 1: every rule feasible)
    cfg = _config(tv_budget=1.0, ess_floor=0.0)
    assert bind(cfg) is TO.SPEED_TRAJECTORY and bind(Config(objective="speed")) is SPEED
    v = bind(cfg).values(ev, TREES, cfg)[:, 0]
    assert v == pytest.approx([e.tokens_per_call for e in ref], rel=REL)
    # the leniencies gain offline tokens the trajectory estimate gives back in part
    assert m["tokens"][1] != pytest.approx(spec.objectives(
        spec.TraceArrays.from_split(valid), matrix_thresholds(_progs(TREES[1:2]), ev.arrays.X)[0]
    ).tokens_per_call, rel=1e-6)


def test_the_plain_sums_are_the_plain_kernels(valid):
    """The trajectory kernel's first columns are the plain kernel's sums, bit for bit."""
    from evolve.kernels import layout
    ev = TO.evaluator(as_split(valid), "valid")
    plain = as_split(valid).evaluator("valid")
    rows = ev.run(_progs(TREES))
    assert np.array_equal(rows[:, :layout.width(valid.block_size)], plain.run(_progs(TREES)))


def test_the_standard_rule_scores_as_the_plain_objective(valid):
    std = TREES[:1]
    traj = TO.SPEED_TRAJECTORY.values(TO.SPEED_TRAJECTORY.evaluator(valid, "valid", _config()),
                                      std, _config())[0, 0]
    plain_cfg = Config(objective="speed")
    plain = SPEED.values(SPEED.evaluator(valid, "valid", plain_cfg), std, plain_cfg)[0, 0]
    assert traj == pytest.approx(plain, rel=REL)
    ev = TO.evaluator(as_split(valid), "valid")
    m = TO.measures(ev.run(_progs(std)), valid.block_size, ev.trajectory)
    assert m["ess"][0] == ev.trajectory.sequences          # every weight exactly 1


def test_the_ess_guard_makes_a_rule_infeasible(valid):
    ev = TO.evaluator(as_split(valid), "valid")
    trees = ["0.99", TREES[1]]
    m = TO.measures(ev.run(_progs(trees)), valid.block_size, ev.trajectory)
    frac = m["ess"] / ev.trajectory.sequences
    assert frac[0] < 0.1 < frac[1]             # the near-always-accept rule: few sequences
    free = TO.SPEED_TRAJECTORY.values(ev, trees, _config(tv_budget=1.0, ess_floor=0.0))[:, 0]
    guarded = TO.SPEED_TRAJECTORY.values(ev, trees, _config(tv_budget=1.0, ess_floor=0.1))[:, 0]
    assert free[0] == pytest.approx(m["tokens"][0]) and free[0] > 1.0
    assert guarded[0] == pytest.approx(1.0 - (0.1 - frac[0]))     # penalised as the budget
    assert guarded[0] < 1.0 <= guarded[1] == free[1]


def test_an_undefined_estimate_scores_zero(valid):
    """Always accepting rejects nothing, so every recorded rejection has weight 0: the
    last block index keeps no weight (the reference's estimate is NaN)."""
    ev = TO.evaluator(as_split(valid), "valid")
    m = TO.measures(ev.run(_progs(["1.0"])), valid.block_size, ev.trajectory)
    assert m["undefined"][0]
    assert np.isnan(_reference(valid, ["1.0"])[0].tokens_per_call)
    assert TO.SPEED_TRAJECTORY.values(ev, ["1.0"], _config(tv_budget=1.0,
                                                           ess_floor=0.0))[0, 0] == 0.0


def _sharded(npz_dir, tmp_path, rows, splits=T.SPLITS):
    out = tmp_path / f"s{rows}"
    shard_writer.shard_dir(npz_dir, out, rows, splits=splits)
    return Session().attach(S.load_splits(out, splits=splits))


def test_one_shard_equals_many_shards_bit_for_bit(npz_dir, tmp_path):
    one = _sharded(npz_dir, tmp_path, 10 ** 6)["valid"]
    many = _sharded(npz_dir, tmp_path, 96)["valid"]         # 3 sequences (8 blocks of 4)
    assert len(one.split.shards) == 1 and len(many.split.shards) == 22
    progs = _progs(TREES)
    a = TO.evaluator(one, "valid").run(progs)
    b = TO.evaluator(many, "valid").run(progs)
    c = TO.evaluator(as_split(T.load(npz_dir / "valid.npz")), "valid").run(progs)
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_sequence_split_between_shards_is_refused(npz_dir, tmp_path):
    from evolve.data.tokens import DataError
    split = _sharded(npz_dir, tmp_path, 80, ("valid",))["valid"]   # 2.5 sequences a shard
    with pytest.raises(DataError, match="valid shard 1: field 'sequence' row 0: sequence 2 "
                                        "spans two shards"):
        TO.evaluator(split, "valid")


def test_a_sequence_out_of_order_is_refused(valid):
    from evolve.data.tokens import DataError
    cols = dict(valid.columns)
    bi = cols["block_index"].copy()
    bi[4 * 3:4 * 4] = 5                      # block 3 of sequence 0 claims index 5
    cols["block_index"] = bi
    with pytest.raises(DataError, match="field 'block_index' row 12 is 5, expected 3"):
        TO.split_blocks(T.TraceSplit(cols, valid.meta, name="valid"))


# ------------------------------------------------------------------ command line

def _run(npz_dir, runs, name, *extra):
    return invoke("run", "--objective", "speed", "--trajectory", "--data", npz_dir,
                  "--generations", 3, "--population", 30, "--seed", 5, "--no-writeback",
                  "--runs-dir", runs, "--name", name, "--budget-tv", 0.03, *extra)


def _strip(path):
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        rec.pop("timing", None)
        out.append(rec)
    return out


def test_a_trajectory_run_is_deterministic(npz_dir, tmp_path):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        r = _run(npz_dir, runs, name, "--seed-baselines")
        assert r.exit_code == 0, r.output
    ca, cb = (json.loads((runs / n / "champion.json").read_text()) for n in ("a", "b"))
    assert ca == cb
    history = _strip(runs / "a" / "history.jsonl")
    assert history == _strip(runs / "b" / "history.jsonl")
    assert len(history) == 4 and history[-1]["best_train"] > 1.0      # feasible rules met
    cfg = json.loads((runs / "a" / "config.json").read_text())
    cfg = cfg.get("config", cfg)
    assert cfg["trajectory"] is True and cfg["ess_floor"] == 0.1
    for split in ("train", "valid", "test"):
        t = ca["metrics"][split]["trajectory"]
        assert t["sequences"] > 0 and t["tokens_per_call"] > 1.0
    # the champion's valid score is the trajectory score of its valid metrics
    est = ca["metrics"]["valid"]["trajectory"]
    assert est["effective_sequences"] <= est["sequences"]


def test_the_ess_floor_option_reaches_the_config(npz_dir, tmp_path):
    r = _run(npz_dir, tmp_path / "runs", "f", "--ess-floor", 0.25, "--generations", 1)
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "runs" / "f" / "config.json").read_text())
    assert cfg.get("config", cfg)["ess_floor"] == 0.25


@pytest.mark.parametrize("objective", ["expected", "pareto", "speed_kl"])
def test_trajectory_with_another_objective_is_refused(npz_dir, tmp_path, objective):
    r = invoke("run", "--objective", objective, "--trajectory", "--data", npz_dir,
               "--generations", 1, "--population", 12, "--no-writeback",
               "--runs-dir", tmp_path / "runs")
    one_line_error(r, "--trajectory", objective)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_trajectory_on_a_token_split_is_refused(small_data_dir, tmp_path):
    r = invoke("run", "--objective", "speed", "--trajectory", "--data", small_data_dir,
               "--generations", 1, "--population", 12, "--no-writeback",
               "--runs-dir", tmp_path / "runs")
    one_line_error(r, "token splits")


def test_trajectory_with_sampled_blocks_or_a_bad_floor_is_refused(npz_dir, tmp_path):
    one_line_error(_run(npz_dir, tmp_path / "runs", "x", "--batch-blocks", 8),
                   "--batch-blocks", "8")
    one_line_error(_run(npz_dir, tmp_path / "runs", "y", "--ess-floor", 1.5),
                   "--ess-floor", "1.5")
    for value in ("abc", "0.1x", ""):       # not a number: one line too, not click's usage
        one_line_error(_run(npz_dir, tmp_path / "runs", "y", "--ess-floor", value),
                       "--ess-floor", repr(value))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_ess_floor_without_the_trajectory_is_refused(npz_dir, tmp_path):
    """--ess-floor guards the trajectory estimate only; without --trajectory it was
    silently unused."""
    r = invoke("run", "--objective", "speed", "--ess-floor", 0.2, "--data", npz_dir,
               "--generations", 1, "--population", 12, "--no-writeback",
               "--runs-dir", tmp_path / "runs")
    one_line_error(r, "--ess-floor", "only with trajectory")
    assert not (tmp_path / "runs").exists()


def test_a_sharded_run_with_a_split_sequence_is_refused(npz_dir, tmp_path):
    out = tmp_path / "s80"
    shard_writer.shard_dir(npz_dir, out, 80)
    r = _run(out, tmp_path / "runs", "z")
    one_line_error(r, "spans two shards", "--rows-per-shard")
    assert not (tmp_path / "runs" / "z").exists()


@pytest.mark.slow
def test_a_dask_cluster_gives_the_local_sums(npz_dir, tmp_path):
    """Scored on a local Dask cluster (two worker processes), the sums are those of the
    shards scored in this process, bit for bit."""
    out = tmp_path / "s96"
    shard_writer.shard_dir(npz_dir, out, 96)
    local = Session().attach(S.load_splits(out))["train"]
    progs = _progs(TREES)
    want = TO.evaluator(local, "train").run(progs)
    with Session(cluster="local:2") as s:
        got = TO.evaluator(s.attach(S.load_splits(out))["train"], "train").run(progs)
    assert np.array_equal(want, got)


@pytest.mark.parametrize("variant", ["trajectory", "lookahead"])
def test_the_benchmark_runs_at_smoke_size(tmp_path, variant):
    """benchmarks/experiments/trajectory_objective.py end to end on tiny traces: both objectives'
    champions, their margins over the tuned reference and the comparison by seed."""
    from benchmarks.experiments import trajectory_objective as bench
    out = tmp_path / "out.json"
    assert bench.main(["--smoke", "--variant", variant, "--traces", str(tmp_path / "t"),
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (b,) = doc["budgets"]
    assert set(b["seeds"]) == {"0", "1"} and doc["variant"] == variant
    for row in b["seeds"].values():
        for obj in ("plain", variant):
            r = row[obj]
            gap = r["margin"]["offline"]["mean"] - r["margin"]["free"]["mean"]
            assert r["gap"]["offline"]["mean"] == pytest.approx(gap)
            treeio.parse(r["tree"])
    d = b["summary"][f"{variant}_minus_plain"]["gap"]["mean"]
    assert d == pytest.approx(b["summary"][variant]["gap"]["mean"]
                              - b["summary"]["plain"]["gap"]["mean"])
    assert doc["train_kernel_ms_per_program"][variant] > 0
