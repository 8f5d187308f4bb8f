"""`evolve data trace`, `evolve simulate` and `evolve tradeoff` through click's CliRunner,
on tiny trace splits (tests/tracekit.TINY).

Guarantee 42 of docs/reliability.md, The trade-off reads traces in either form
(`test_tradeoff_reads_shards_as_it_reads_npz_splits`).

Guarantee 22 of docs/reliability.md, A trace recording owns its output directory:

`evolve data trace` (both backends, .npz output, and straight into shards with
`--rows-per-shard`) takes an exclusive OS lock (`evolve/io/lock.py`) on `--out` for
the whole recording; a second recording into the same directory meanwhile is refused
with one line, exit code 2, and writes nothing; it also leaves `--out` alone when it
had made that directory itself a moment before the other recording locked it (it
used to remove it, empty, from under the other recording). Two real recordings
started together: one records, the other is refused, and the directory ends with the
three complete splits
(`test_a_refused_recording_leaves_the_directory_another_one_holds`,
`test_two_recordings_into_one_directory_at_once`). `--force` overwrites only splits
that differ and first keeps each replaced file as `<out>/previous/<split>-<sha256
prefix>.npz` (a hard link where possible), as `data generate --force` does. Tests:
`test_a_second_recording_into_a_locked_directory_is_refused`,
`test_force_keeps_the_replaced_traces_in_previous`,
`test_trace_into_shards_owns_its_output_directory`.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import evolve.api.record as REC
import evolve.cli.trace_data as CT
from evolve.rules import tuning as pareto
from evolve.rules.table import RULES, families
from tests import rulefns
from evolve.freerun import simulate as S
from evolve.rules import adapters
from evolve.objectives import spec
from evolve.data import traces as T
from evolve.data.sources import ngram as NG
from evolve.lang import treeio
from tests import tracekit
from tests.clikit import invoke, one_line_error

Z_MAX = 4.0                      # simulation vs offline: within this many standard errors
FAST = ("--contexts", "60", "--reps", "1500")    # a lighter output sample than the default
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# tracekit.TINY through the command's options
TINY_OPTIONS = ("--seed", 3, "--max-files", 60, "--max-bytes-per-file", 40_000,
                "--train-prompts", 24, "--valid-prompts", 64, "--test-prompts", 16,
                "--blocks-per-prompt", 8)

# first block position: leniency l = 0.5; the others: EARS beta = 0.2
HAND_TREE = ("ite(lt(block_position, 0.5), pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob))), "
             "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.2, sub(1.0, p_max)))))")
EARS_TREE = "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.2, sub(1.0, p_max))))"


def _hand_np(F):
    return np.where(F["block_position"] < 0.5, rulefns.leniency(F, l=0.5), rulefns.ears(F, beta=0.2))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_traces")
    NG.build_splits(tracekit.TINY, d)
    return d


def _run_dir(parent: Path, name: str, tree: str) -> Path:
    path = parent / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(
        {"format": "evolve-run", "version": 1, "name": name, "config": {}, "data": {"dir": ""}}))
    (path / "champion.json").write_text(json.dumps(      # scored on the tiny traces' scope
        {"tree": tree, "objective": "speed", "tv_budget": 0.03,
         "scope": T.scope_of(tracekit.split("valid").meta)}))
    return path


# ------------------------------------------------------------------- data trace

def test_trace_defaults_are_the_configs():
    cfg = NG.TraceConfig()
    assert CT.TRACE_DEFAULTS == {k: getattr(cfg, k) for k in CT.TRACE_DEFAULTS}
    # the hf options' defaults, always passed to the Hugging Face config: its own
    import dataclasses
    from evolve.data.sources.hf import HFTraceConfig
    own = {f.name: f.default for f in dataclasses.fields(HFTraceConfig)}
    options = {o.name: o.default for o in CT.data_trace.params}
    for name in ("device", "dtype", "batch_size", "prompt_len", "context_len"):
        assert options[name] == own[name], name


def test_data_trace_writes_loadable_splits_and_refuses_to_clobber(tmp_path, tiny_dir):
    out = tmp_path / "traces"
    r = invoke("data", "trace", "--out", out, *TINY_OPTIONS)
    assert r.exit_code == 0, r.output
    assert r.stdout == ""                                   # notes go to stderr
    splits = T.load_splits(out)
    for name, ts in splits.items():
        assert NG.config_of(ts) == tracekit.TINY
        # the same bytes as the library writes for the same configuration
        assert (out / f"{name}.npz").read_bytes() == (tiny_dir / f"{name}.npz").read_bytes()
    assert len(splits["valid"]) == 64 * 8 * tracekit.TINY.block_size

    again = invoke("data", "trace", "--out", out, *TINY_OPTIONS)
    assert again.exit_code == 0 and again.stderr.count("unchanged") == 3, again.output

    before = {p.name: p.read_bytes() for p in out.glob("*.npz")}
    other = [str(a) for a in TINY_OPTIONS]
    other[1] = "4"                                          # --seed 4
    r = invoke("data", "trace", "--out", out, *other)
    one_line_error(r, "exists and differs", "--force")
    assert {p.name: p.read_bytes() for p in out.glob("*.npz")} == before
    # same configuration, other content (a file from another corpus, say): refused too
    victim = T.load(out / "valid.npz")
    cols = dict(victim.columns, rand_value=victim.columns["rand_value"][::-1].copy())
    T.save(T.TraceSplit(cols, victim.meta, name="valid"), out / "valid.npz")
    changed = (out / "valid.npz").read_bytes()
    r = invoke("data", "trace", "--out", out, *TINY_OPTIONS)
    assert r.exit_code == 2 and "valid.npz: exists and differs" in r.stderr, r.output
    assert (out / "valid.npz").read_bytes() == changed
    assert (out / "train.npz").read_bytes() == before["train.npz"]

    r = invoke("data", "trace", "--out", out, *other, "--force")
    assert r.exit_code == 0, r.output
    assert NG.config_of(T.load(out / "test.npz")).seed == 4


def test_a_refused_recording_leaves_the_directory_another_one_holds(tmp_path, monkeypatch):
    """The directory did not exist when the command looked, and another recording made
    and locked it first: the refused command must not remove it (it used to rmdir the
    directories it thought it had made, pulling the other recording's directory away)."""
    out = tmp_path / "new" / "out"

    class HeldElsewhere:
        def __init__(self, directory):
            pass

        def __enter__(self):
            raise REC.Busy(str(out))

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(REC, "DirLock", HeldElsewhere)
    one_line_error(invoke("data", "trace", "--out", out, *TINY_OPTIONS), "--out", str(out),
                   "another process")
    assert out.is_dir()


@pytest.mark.slow
def test_two_recordings_into_one_directory_at_once(tmp_path):
    """Two real `evolve data trace --out SAME` started together: one records, the other
    is refused in one line while it does, and leaves its directory alone; the directory
    ends with the three complete splits and nothing else."""
    import os
    import subprocess
    import sys
    import time
    out = tmp_path / "new" / "out"
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "EVOLVE_RUNS_DIR": str(tmp_path / "runs"),
           "EVOLVE_HEURISTICS_DIR": str(tmp_path / "heuristics")}
    cmd = [sys.executable, "-m", "evolve", "data", "trace", "--out", str(out), "--seed", "3",
           "--train-prompts", "256", "--max-files", "120"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    deadline = time.monotonic() + 300
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    first = next((p for p in procs if p.poll() is not None), None)
    other = next(p for p in procs if p is not first)
    if first is not None and first.returncode == 2 and other.poll() is None:
        assert out.is_dir()                # the recording still going keeps its directory
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    err = next(e for code, e in results if code == 2)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --out") and \
        "another process" in lines[0], err
    assert sorted(p.name for p in out.iterdir()) == ["test.npz", "train.npz", "valid.npz"]
    for s in T.SPLITS:
        assert len(T.load(out / f"{s}.npz")) > 0


@pytest.mark.parametrize("opt, value, needle", [
    ("--block-size", 0, "expected 1..64"),
    ("--top-k", 300, "expected 1..256"),
    ("--temperature", 0, "expected > 0"),
    ("--valid-prompts", 0, "expected >= 1"),
    ("--max-files", 2, "at least 4"),
    ("--seed", -1, "expected an integer >= 0"),
])
def test_data_trace_bad_option_is_one_line(tmp_path, opt, value, needle):
    r = invoke("data", "trace", "--out", tmp_path, opt, value)
    one_line_error(r, opt, needle)
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------- simulate

def _simulate_json(*args):
    r = invoke("simulate", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _assert_agrees(doc):
    agr = doc["agreement"]
    tok = agr["tokens_per_call"]
    assert abs(tok["z"]) < Z_MAX, doc
    assert abs(doc["simulated"]["tokens_per_call"] - doc["offline"]["tokens_per_call"]) \
        < Z_MAX * tok["se"]
    assert agr["tv_at_contexts"]["z"] is not None and abs(agr["tv_at_contexts"]["z"]) < Z_MAX


def test_simulate_baseline_json(tiny_dir):
    doc = _simulate_json("--heuristic", "standard_rejection", "--data", tiny_dir,
                         "--split", "valid", "--prompts", 64, *FAST)
    assert set(doc) >= {"rule", "data", "split", "settings", "simulated", "offline",
                        "agreement", "corpus_matches_trace", "seconds"}
    assert doc["rule"] == {"kind": "rule", "name": "standard_rejection", "param": None, "param_name": None,
                           "label": "standard_rejection"}
    assert doc["corpus_matches_trace"] is True
    assert doc["settings"] == {"prompts": 64, "blocks": 8, "contexts": 60, "reps": 1500,
                               "seed": 1}
    sim, off = doc["simulated"], doc["offline"]
    assert sim["n_sequences"] == 64 and sim["n_blocks"] == 64 * 8
    assert len(sim["acceptance"]) == len(off["acceptance"]) == tracekit.TINY.block_size
    assert {"tv_witness", "tv_witness_se", "tv_plugin", "tv_plugin_floor"} <= set(sim["output"])
    # the standard rule does not distort: exactly offline, within noise when sampled
    assert off["tv_per_token"] < 1e-12 and off["tv_at_contexts"] < 1e-12
    sa = spec.TraceArrays.from_split(T.load(tiny_dir / "valid.npz"))
    ref = pareto.evaluate("standard_rejection", sa)
    assert off["tokens_per_call"] == pytest.approx(ref.tokens, abs=1e-12)
    _assert_agrees(doc)


def test_simulate_family_with_param(tiny_dir):
    doc = _simulate_json("--heuristic", "leniency", "--param", 0.7, "--data", tiny_dir,
                         "--split", "valid", "--prompts", 64, *FAST)
    assert doc["rule"]["kind"] == "rule" and doc["rule"]["param"] == 0.7
    assert doc["rule"]["label"] == "leniency(l=0.7)"
    sa = spec.TraceArrays.from_split(T.load(tiny_dir / "valid.npz"))
    ref = pareto.evaluate("leniency", sa, 0.7)
    off = doc["offline"]
    assert off["tokens_per_call"] == pytest.approx(ref.tokens, abs=1e-12)
    assert off["tv_per_token"] == pytest.approx(ref.tv, abs=1e-12)
    assert off["tv_at_contexts"] > 0.01           # a lenient rule distorts, measurably
    assert doc["simulated"]["output"]["tv_plugin"] > doc["simulated"]["output"]["tv_plugin_floor"]
    _assert_agrees(doc)


def test_simulate_table(tiny_dir):
    r = invoke("simulate", "--heuristic", "ears", "--param", 0.2, "--data", tiny_dir, *FAST)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "ears(beta=0.2)" in out and "split test" in out
    for text in ("tokens per target call", "TV at 60 contexts", "acceptance at block position 3",
                 "offline on the whole split", "simulation and offline estimate"):
        assert text in out, text
    assert "rebuilding the draft/target pair" in r.stderr


def test_simulate_run_champion(tmp_path, tiny_dir):
    runs = tmp_path / "runs"
    _run_dir(runs, "hand", HAND_TREE)
    _run_dir(runs, "ears", EARS_TREE)
    doc = _simulate_json("--run", "hand", "--runs-dir", runs, "--data", tiny_dir,
                         "--split", "valid", "--prompts", 64, *FAST)
    assert doc["rule"]["kind"] == "run" and doc["rule"]["name"] == "hand"
    assert doc["rule"]["tree"] == HAND_TREE and "p_max" in doc["rule"]["tree"]
    sa = spec.TraceArrays.from_split(T.load(tiny_dir / "valid.npz"))
    ref = spec.objectives(sa, spec.rule_thresholds(_hand_np, sa))
    assert doc["offline"]["tokens_per_call"] == pytest.approx(ref.tokens_per_call, abs=1e-12)
    assert doc["offline"]["tv_per_token"] == pytest.approx(ref.tv_per_token, abs=1e-12)
    _assert_agrees(doc)
    # a champion equal to a family member gives that member's offline numbers exactly
    a = _simulate_json("--run", "ears", "--runs-dir", runs, "--data", tiny_dir, *FAST)
    b = _simulate_json("--heuristic", "ears", "--param", 0.2, "--data", tiny_dir, *FAST)
    assert a["offline"] == b["offline"]
    assert a["simulated"] == b["simulated"]          # same seed, same rule: same draws


def test_tree_rule_is_the_kernel_and_the_numpy_reference():
    ts = tracekit.split("valid")
    sa = spec.TraceArrays.from_split(ts)
    nodes = treeio.parse(HAND_TREE)
    rule = adapters.tree_rule(nodes)
    h = spec.rule_thresholds(rule, sa)
    assert np.array_equal(h, spec.rule_thresholds(_hand_np, sa))
    assert np.array_equal(S.offline_thresholds(rule, sa), h)
    ours = spec.objectives(sa, h)
    kernel = spec.population_results(treeio.linearise([nodes]), sa, with_kl=True)[0]
    assert ours.tokens_per_call == pytest.approx(kernel.tokens_per_call, rel=1e-12)
    assert ours.tv_per_token == pytest.approx(kernel.tv_per_token, rel=1e-9)
    # constants broadcast; boolean inputs and comparisons work inside ite
    const = adapters.tree_rule("0.25")
    assert np.all(spec.rule_thresholds(const, sa) == 0.25)
    m = adapters.tree_rule("ite(and_(top_token_match, lt(q_max, 2.0)), 1.0, 0.0)")
    assert np.array_equal(spec.rule_thresholds(m, sa), sa.features()["top_token_match"].reshape(-1))
    with pytest.raises(treeio.TreeError):
        adapters.TreeRule([treeio.Node("prim", "add"), treeio.Node("input", "p_max")])


def test_simulate_rejects_a_crafted_tree(tmp_path, tiny_dir):
    runs = tmp_path / "runs"
    marker = tmp_path / "pwned"
    _run_dir(runs, "evil", f"__import__('os').system('touch {marker}')")
    r = invoke("simulate", "--run", "evil", "--runs-dir", runs, "--data", tiny_dir)
    one_line_error(r, "champion.json", "tree", "__import__")
    assert not marker.exists()


@pytest.mark.parametrize("args, needles", [
    ((), ("--rule", "--run")),
    (("--heuristic", "standard_rejection", "--run", "x"), ("--rule", "--run")),
    (("--rule", "nope"), ("--rule", "'nope'")),
    (("--heuristic", "standard_rejection", "--param", "0.5"), ("--param", "no parameter")),
    (("--heuristic", "leniency", "--param", "0"), ("--param", "0 < l <= 1")),
    (("--heuristic", "standard_rejection", "--split", "dev"), ("--split", "'dev'")),
    (("--heuristic", "standard_rejection", "--reps", "1"), ("--reps",)),
    (("--run", "missing"), ("no such run directory",)),
])
def test_simulate_bad_options_are_one_line(tmp_path, tiny_dir, args, needles):
    r = invoke("simulate", *args, "--data", tiny_dir, "--runs-dir", tmp_path)
    one_line_error(r, *needles)


def test_simulate_missing_data_is_one_line(tmp_path):
    r = invoke("simulate", "--heuristic", "standard_rejection", "--data", tmp_path / "nowhere")
    one_line_error(r, "nowhere")


# --------------------------------------------------------------------- tradeoff

def test_tradeoff_json(tmp_path, tiny_dir):
    runs = tmp_path / "runs"
    _run_dir(runs, "hand", HAND_TREE)
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.01, "--budget", 0.03,
               "--run", "hand", "--runs-dir", runs, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [e["budget"] for e in doc["budgets"]] == [0.01, 0.03]
    # the target-only (SGLang) families are not scored on top-k 16 traces
    scored = [n for n in families() if RULES[n].residual == "standard"]
    assert set(doc["series"]) == set(scored) | {"run hand"}
    for s in ("valid", "test"):
        assert {p["rule"] for p in doc["sweeps"][s]} == set(scored)
        assert len(doc["sweeps"][s]) == sum(max(1, len(RULES[n].grid)) for n in scored)
    assert doc["runs"][0]["name"] == "hand" and doc["runs"][0]["tree"] == HAND_TREE
    tuned = {}
    for entry in doc["budgets"]:
        b, rows = entry["budget"], entry["rows"]
        assert {r_["rule"] for r_ in rows} == set(families()) | {
            "run hand", "position_leniency", "knapsack_oracle", *pareto.GATES}
        oracle = next(r_ for r_ in rows if r_["kind"] == "oracle")
        assert oracle["oracle_share"] == pytest.approx(1.0)
        assert all(r_["oracle_share"] is None or r_["oracle_share"] <= 1.0 + 1e-9
                   for r_ in rows if r_["kind"] == "family" and r_["test"] and
                   not r_["over_budget_test"])
        toks = [r_["test"]["tokens_per_call"] for r_ in rows if r_["test"]]
        assert toks == sorted(toks, reverse=True)                  # sorted by test tokens
        assert all(r_["test"] for r_ in rows[:len(toks)])          # unfitted rows last
        for r_ in rows:
            if r_["kind"] == "family" and r_["fits_valid"]:
                assert r_["valid"]["tv_per_token"] <= b            # tuned within budget
                assert r_["over_budget_test"] == (r_["test"]["tv_per_token"] > b)
                tuned.setdefault(r_["rule"], []).append(r_)
            elif r_["kind"] == "family":
                assert r_["test"] is None and r_["valid"] is None
        std = next(r_ for r_ in rows if r_["rule"] == "standard_rejection")
        assert std["fits_valid"] and std["test"]["tv_per_token"] < 1e-12
        hand = next(r_ for r_ in rows if r_["rule"] == "run hand")
        assert hand["kind"] == "extra" and hand["param"] is None
    # a larger budget never buys fewer tokens on valid; lenient families spend it
    for name in ("standard_rejection", "leniency", "ears"):
        small, large = tuned[name]
        assert large["valid"]["tokens_per_call"] >= small["valid"]["tokens_per_call"]
        assert large["valid"]["tv_per_token"] >= small["valid"]["tv_per_token"]
    for name in ("leniency", "ears"):
        assert tuned[name][1]["valid"]["tv_per_token"] > 0.9 * 0.03
    sa = spec.TraceArrays.from_split(T.load(tiny_dir / "test.npz"))
    ref = spec.objectives(sa, spec.rule_thresholds(_hand_np, sa))
    assert doc["extra"]["run hand"]["test"]["tokens_per_call"] == \
        pytest.approx(ref.tokens_per_call, abs=1e-12)


def test_tradeoff_reads_shards_as_it_reads_npz_splits(tmp_path, tiny_dir):
    """What `evolve data shard` wrote is traces too: the trade-off of the shards is the
    trade-off of the .npz splits they came from (it said only "valid.npz: file not
    found"); a directory of neither says what a trace directory holds."""
    from evolve.data import shard_writer
    shards = tmp_path / "shards"
    shard_writer.shard_dir(tiny_dir, shards, len(tracekit.split("valid")) // 3)
    assert not (shards / "valid.npz").exists()
    docs = []
    for d in (tiny_dir, shards):
        r = invoke("tradeoff", "--data", d, "--budget", 0.02, "--engine", "transformers",
                   "--json")                    # few families: the reading is the point
        assert r.exit_code == 0, r.output
        docs.append({k: v for k, v in json.loads(r.stdout).items()
                     if k not in ("data", "seconds")})
    assert docs[0] == docs[1]
    r = invoke("tradeoff", "--data", tmp_path, "--budget", 0.02)
    one_line_error(r, "valid.npz", "not found", "evolve data shard")


def test_tradeoff_table_and_png(tmp_path, tiny_dir, monkeypatch):
    from evolve.runs import pictures
    png = tmp_path / "pic" / "tradeoff.png"
    png.parent.mkdir()
    titles = []
    draw = pictures.render_png
    monkeypatch.setattr(pictures, "render_png", lambda series, path, title, *a:
                        titles.append(title) or draw(series, path, title, *a))
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--png", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    # the picture names the data by its directory, not its absolute path
    assert titles == [f"{tiny_dir.name}: test split (g = 4, k = 16)"], titles
    out = r.stdout
    assert "TV budget 0.02 per token" in out
    assert "no parameter fits on valid" in out       # bild / typical at 0.02
    rows = {l.split()[0]: l for l in out.splitlines()
            if l.split() and l.split()[0] in families()}
    assert set(rows) == set(families())
    assert "no parameter fits" not in rows["standard_rejection"] + rows["leniency"] + rows["ears"]
    assert "tokens per call" in out and "TV per token" in out    # the terminal picture
    legend = out.splitlines()[-2]                                 # its legend: the
    assert "S standard_rejection" in legend and "t typical_acceptance" in legend   # styles
    assert f"picture: {png}" in out


def test_tradeoff_trajectory_column(tmp_path, tiny_dir):
    """--trajectory adds each rule's own-trajectory estimate on test: the standard rule's
    is the plain one, the oracle (a bound) has none; without the flag nothing is added."""
    from evolve.objectives import trajectory
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--trajectory", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["budgets"][0]["rows"]
    by = {r_["rule"]: r_ for r_ in rows}
    std = by["standard_rejection"]["test"]
    assert std["trajectory"]["tokens_per_call"] == pytest.approx(std["tokens_per_call"],
                                                                 rel=1e-12)
    assert "trajectory" not in by["knapsack_oracle"]["test"]
    ts = T.load(tiny_dir / "test.npz")
    sa = spec.TraceArrays.from_split(ts)
    lenient = by["leniency"]
    want = trajectory.estimate(sa, trajectory.TraceBlocks.from_split(ts),
                               pareto.thresholds("leniency", sa, lenient["param"]))
    assert lenient["test"]["trajectory"] == pytest.approx(want.to_dict(), rel=1e-12)
    assert by["position_leniency"]["test"]["trajectory"]["effective_sequences"] > 0
    table = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--trajectory")
    assert table.exit_code == 0 and "own trajectory" in table.stdout
    plain = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--json")
    assert all("trajectory" not in (r_["test"] or {})
               for r_ in json.loads(plain.stdout)["budgets"][0]["rows"])


@pytest.mark.parametrize("value", ["-0.1", "abc", "0.1x", "", "nan"])
def test_tradeoff_bad_budget_is_one_line(tiny_dir, value):
    """Out of range, or not a number at all (that was click's three-line usage
    error): one line naming --budget."""
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--budget", 0.01, "--budget", value),
                   "--budget")


def test_a_first_tokens_cap_is_recorded_shown_and_named(tmp_path, tiny_dir):
    """`evolve run --cap-tv-first C --first-tokens K`: the champion records both, its
    first-tokens TV by k, the run prints it, and a champion over the cap on valid says
    so in its verdict; sharded traces are refused in one line naming the option."""
    from evolve.data import shard_writer
    r = invoke("run", "--data", tiny_dir, "--objective", "speed", "--budget-tv", 0.05,
               "--cap-tv-first", 0.001, "--first-tokens", 2, "--generations", 2,
               "--population", 20, "--seed", 3, "--runs-dir", tmp_path, "--name", "cap",
               "--no-writeback")
    assert r.exit_code == 0, r.output
    ch = json.loads((tmp_path / "cap" / "champion.json").read_text())
    assert ch["tv_first_cap"] == 0.001 and ch["first_tokens"] == 2
    first = ch["metrics"]["valid"]["tv_first"]
    assert len(first) == 16 and "over the first 2 tokens after the prompt: test" in r.output
    assert first[1] > 0.001 and ch["standing"]["verdict"] == "infeasible"
    assert f"TV over the first 2 tokens after the prompt {first[1]:.5f} > 0.001" in \
        ch["standing"]["why"]
    shards = tmp_path / "shards"
    shard_writer.shard_dir(tiny_dir, shards, len(tracekit.split("valid")) // 3)
    r = invoke("run", "--data", shards, "--objective", "speed", "--cap-tv-first", 0.05,
               "--generations", 1, "--population", 20, "--runs-dir", tmp_path, "--name",
               "sharded", "--no-writeback")
    one_line_error(r, "--cap-tv-first", "not a sharded split")
