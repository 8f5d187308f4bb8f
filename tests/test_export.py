"""`evolve export`: numpy/torch exports against the Numba champion, the engine
formats, trace write-back, and bad input."""

import ast
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from evolve.export import backends, modules
from evolve.lang import primitives as P
from evolve.lang import treeio
from evolve.rules.table import RULES
from heuristics import registry
from heuristics.baselines import BASELINES
from tests.conftest import TINY
from tests.genload import load_module_from
from tests.clikit import fake_trace_run, invoke, one_line_error

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
TRACE_BUDGET = 0.02
FLOAT32_MAX_FLIPS = 1e-3       # share of test rows whose float32 decision may differ


def load(tmp_path, source, name):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_module_from(path, f"_export_{name}_{abs(hash(str(tmp_path)))}")


def numba_vectorised(fn, n_inputs):
    """A scalar champion compiled by Numba over whole columns (nine inputs on traces)."""
    if n_inputs == 6:
        return registry.compile_function(fn)
    from numba import vectorize
    sig = "float64(float64, float64, float64, float64, float64, boolean, float64, float64, " \
          "float64)"
    return vectorize([sig])(fn)


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    from evolve.data import traces
    from tests import tracekit
    d = tmp_path_factory.mktemp("export_traces")
    for split in ("train", "valid", "test"):
        traces.save(tracekit.split(split), d / f"{split}.npz")
    return d


def _run(data_dir, parent, name, heur, force=False, **config):
    from evolve.cli.render import Terminal
    from evolve.runs import runner
    from evolve.search.config import Config
    opts = runner.RunOptions(config=Config(**config), data_dir=data_dir, runs_parent=parent,
                             name=name, force=force, heuristics_dir=heur)
    code, result = runner.execute(opts, Terminal(json_mode=True))
    assert code == 0
    return result


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory, small_data_dir):
    root = tmp_path_factory.mktemp("export_seed")
    heur = root / "heuristics"
    heur.mkdir()
    _run(small_data_dir, root / "runs", "tok", heur, **TINY, seed=5, objective="seed")
    return root / "runs" / "tok"


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory, trace_dir):
    root = tmp_path_factory.mktemp("export_trace")
    heur = root / "heuristics"
    heur.mkdir()
    # forced: a champion of 4 generations need not beat the tuned baselines, and only a
    # champion that does is written back unforced (test_loser_is_not_written_back)
    result = _run(trace_dir, root / "runs", "spd", heur, force=True, **TINY, seed=2,
                  objective="speed", tv_budget=TRACE_BUDGET, seed_baselines=True)
    return root / "runs" / "spd", heur, result


# ------------------------------------------------------------- the tables

def test_every_primitive_has_a_row_in_every_backend():
    backends.check_tables()
    for b in backends.BACKENDS.values():
        assert set(b.templates) == set(P.BY_NAME)
        for name, helper in b.helpers.items():
            assert name in P.BY_NAME and helper.startswith(f"def {name}(")


def test_protected_operators_exact_on_edge_values():
    """Every primitive alone, numpy and torch float64, against heuristics.ops on the edges
    (log, exp and sqrt within one rounding: torch's vectorised sqrt is not always
    correctly rounded; every branch of the protected operators exactly)."""
    from heuristics import ops  # noqa: F401  (the scalar meaning is P.BY_NAME[...].scalar)
    vals = [0.0, 1e-300, 1e300, np.inf, -np.inf, np.nan, -1.0, 0.5, 1.0, 1e-9, -1e-9, 1e-12,
            50.0, 51.0, -1e300, 2.0]
    a, b = (np.array(x, dtype=np.float64) for x in zip(*[(x, y) for x in vals for y in vals]))
    c = a > 0.3
    for prim in P.PRIMITIVES:
        if prim.ret is bool or bool in prim.args and prim.name != "ite":
            continue
        args = {"ite": "ite(lt(draft_prob, 0.3), target_prob, position)"}.get(
            prim.name, f"{prim.name}({', '.join(['draft_prob', 'target_prob'][:prim.arity])})")
        nodes = treeio.parse(args)
        if prim.name == "ite":
            want = np.array([float(prim.scalar(x < 0.3, y, x)) for x, y in zip(a, b)])
        else:
            want = np.array([float(prim.scalar(*[x, y][:prim.arity])) for x, y in zip(a, b)])
        for fmt in ("numpy", "torch"):
            mod = _compiled(nodes, fmt)
            feats = [a, b, a, a, a, c]
            got = mod.threshold(*([torch.from_numpy(f) for f in feats] if fmt == "torch"
                                  else feats))
            got = got.numpy() if fmt == "torch" else got
            if prim.name in TRANSCENDENTAL:   # SIMD libraries may round the last bit
                np.testing.assert_allclose(got, want, rtol=2e-16, atol=0, equal_nan=True,
                                           err_msg=f"{fmt} {prim.name}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {prim.name}")


_CACHE = {}
TRANSCENDENTAL = ("plog", "pexp", "psqrt")


def _compiled(nodes, fmt):
    """An exported module kept in memory (compiled from its text, as a user imports it)."""
    import types
    key = (treeio.to_string(nodes), fmt)
    if key not in _CACHE:
        src = modules.export_source(nodes, fmt, {"run": "t", "metrics": {}}, "test")
        mod = types.ModuleType("exported")
        code = compile(src, "<exported>", "exec")
        exec(code, mod.__dict__)        # tests only; the package never runs text
        _CACHE[key] = mod
    return _CACHE[key]


# ---------------------------------------------- exports = the Numba champion

def _check_rows(nodes, numba_fn, columns, rand, label):
    """numpy and torch float64 decide exactly as Numba on every row; float32 is measured."""
    h = numba_fn(*columns)
    want = rand < h
    out = {}
    for fmt in ("numpy", "torch"):
        mod = _compiled(nodes, fmt)
        for dtype in ("float64", "float32"):
            cols = [c if c.dtype == np.bool_ else c.astype(dtype) for c in columns]
            if fmt == "torch":
                got = mod.accept(torch.from_numpy(rand.astype(dtype)),
                                 *[torch.from_numpy(np.ascontiguousarray(c)) for c in cols])
                got = got.numpy()
            else:
                got = mod.accept(rand.astype(dtype), *cols)
            if dtype == "float64":
                assert np.array_equal(got, want), f"{label}: {fmt} float64 decisions differ"
            out[(fmt, dtype)] = int((got != want).sum())
    flips32 = max(out[("numpy", "float32")], out[("torch", "float32")])
    assert flips32 <= FLOAT32_MAX_FLIPS * len(rand) + 1, f"{label}: float32 flips {out}"
    return out


@pytest.mark.parametrize("name", list(BASELINES))
def test_baselines_exports_decide_as_numba_on_test(name, default_splits):
    ds = default_splits["test"]
    r = RULES[name]
    nodes = treeio.parse(r.tree(r.default))
    _check_rows(nodes, registry.compiled(name), ds.features(), ds.rand_value, name)


def test_seed_champion_exports_decide_as_numba_on_test(seed_run, small_splits, tmp_path):
    mod = load(tmp_path, (seed_run / "champion.py").read_text(), "seed_champ")
    nodes = treeio.parse(json.loads((seed_run / "champion.json").read_text())["tree"])
    ds = small_splits["test"]
    _check_rows(nodes, numba_vectorised(mod.evolved, 6), ds.features(), ds.rand_value, "seed")


def test_trace_champion_exports_decide_as_numba_on_test(trace_run, tmp_path):
    from tests import tracekit
    run, _, _ = trace_run
    mod = load(tmp_path, (run / "champion.py").read_text(), "trace_champ")
    nodes = treeio.parse(json.loads((run / "champion.json").read_text())["tree"])
    ts = tracekit.split("test")
    cols = [np.ascontiguousarray(getattr(ts, f), dtype=np.bool_ if f == "top_token_match"
                                 else np.float64) for f in P.TRACE_INPUT_NAMES]
    _check_rows(nodes, numba_vectorised(mod.evolved, 9), cols, ts.rand_value, "trace")


def test_exports_keep_shape_dtype_and_import_nothing_of_the_project():
    nodes = treeio.parse("pmax(1.0, 1.0)")        # constant-only: still an array of the shape
    mod = _compiled(nodes, "numpy")
    x = np.zeros((2, 3), dtype=np.float32)
    h = mod.threshold(x, x, x, x, x, x > 0)
    assert h.shape == (2, 3) and h.dtype == np.float32 and (h == 1).all()
    t = torch.zeros((4, 1), dtype=torch.float32)
    h = _compiled(nodes, "torch").threshold(t, t.T, t, t, t, t > 0)
    assert h.shape == (4, 4) and h.dtype == torch.float32      # broadcast together
    trace_nodes = treeio.parse("pmin(1.0, add(pdiv(target_prob, draft_prob), p_max))")
    for fmt in modules.FORMATS:
        src = modules.export_source(trace_nodes, fmt, {"run": "r", "seed": 1, "metrics": {}},
                                    "t")
        tree = ast.parse(src)
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom)}
        # the array libraries and Python's own modules (hf's install() reads a signature
        # with inspect), nothing of this project
        assert imported - set(sys.stdlib_module_names) <= {"numpy", "torch", "transformers"}, \
            (fmt, imported)
        assert "run: r" in src and "seed: 1" in src and "Formula:" in src


# --------------------------------------------------------------------- vllm

def test_vllm_features_and_accept_line():
    from evolve.data.decode import entropy
    g = torch.Generator().manual_seed(0)
    n, vocab = 7, 11
    p = torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3, -1)
    q = torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3, -1)
    ids = torch.randint(0, vocab, (n,), generator=g)
    cu = torch.tensor([3, 3, 7])             # requests of 3, 0 and 4 drafted tokens
    u = torch.rand(n, generator=g, dtype=torch.float64)
    nodes = treeio.parse("ite(top_token_match, pmax(p_max, q_max), "
                         "pmin(1.0, pdiv(target_prob, mul(add(0.5, block_position), "
                         "draft_prob))))")
    mod = _compiled(nodes, "vllm")
    f = mod.token_features(ids, q, p, cu)
    P_, Q_ = p.numpy(), q.numpy()
    r = np.arange(n)
    np.testing.assert_array_equal(f["block_position"].numpy(), [0, 1, 2, 0, 1, 2, 3])
    np.testing.assert_array_equal(f["target_prob"].numpy(), P_[r, ids.numpy()])
    np.testing.assert_array_equal(f["draft_prob"].numpy(), Q_[r, ids.numpy()])
    np.testing.assert_allclose(f["target_entropy"].numpy(), entropy(P_), rtol=1e-12)
    np.testing.assert_allclose(f["draft_entropy"].numpy(), entropy(Q_), rtol=1e-12)
    np.testing.assert_array_equal(f["top_token_match"].numpy(), ids.numpy() == P_.argmax(1))
    np.testing.assert_array_equal(f["p_max"].numpy(), P_.max(1))
    want = _compiled(nodes, "numpy").accept(u.numpy(), *[f[k].numpy() for k in mod.INPUTS])
    np.testing.assert_array_equal(mod.accepted(u, ids, q, p, cu).numpy(), want)
    f0 = mod.token_features(ids, None, p, cu)          # a draft without probabilities
    assert (f0["draft_prob"] == 1).all() and (f0["q_max"] == 1).all()


# ----------------------------------------------------------------- hf (transformers)

HF_VOCAB = 8
HF_SAMPLES = 400
CHI2_999_DF7 = 24.322          # 0.999 quantile of chi-square with 7 degrees of freedom


def _tiny_pair():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    models = []
    for seed, scale in ((0, 12.0), (1, 2.0)):     # a peaked target, a flatter draft
        torch.manual_seed(seed)
        cfg = transformers.GPT2Config(vocab_size=HF_VOCAB, n_positions=64, n_embd=16, n_layer=1,
                                      n_head=2, bos_token_id=0, eos_token_id=HF_VOCAB + 1,
                                      pad_token_id=0)
        m = transformers.GPT2LMHeadModel(cfg).eval()
        with torch.no_grad():
            m.transformer.wte.weight.mul_(scale)
        m.generation_config.num_assistant_tokens = 4
        m.generation_config.num_assistant_tokens_schedule = "constant"
        m.generation_config.assistant_confidence_threshold = 0.0   # always draft 4
        models.append(m)
    return models


def _generate(target, draft, prompt, new_tokens):
    return target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft,
                           do_sample=True, max_new_tokens=new_tokens, top_k=0, top_p=1.0,
                           pad_token_id=0)


def _first_tokens(mod, target, draft, prompt, n):
    mod.install(prompt_length=prompt.shape[1])
    try:
        torch.manual_seed(11)
        return np.bincount([_generate(target, draft, prompt, 2)[0, prompt.shape[1]].item()
                            for _ in range(n)], minlength=HF_VOCAB)
    finally:
        mod.uninstall()


def _chi2(counts, p):
    e = counts.sum() * p
    return float(((counts - e) ** 2 / e).sum())


@pytest.mark.slow
def test_hf_dropin_standard_keeps_target_distribution(tmp_path):
    import transformers.generation.utils as gu
    target, draft = _tiny_pair()
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        p = target(prompt).logits[0, -1].double().softmax(-1).numpy()
        q = draft(prompt).logits[0, -1].double().softmax(-1).numpy()
    assert 0.5 * np.abs(p - q).sum() > 0.3        # the draft is far from the target
    original = gu._speculative_sampling
    std = _compiled(treeio.parse(RULES["standard_rejection"].tree()), "hf")
    counts = _first_tokens(std, target, draft, prompt, HF_SAMPLES)
    assert gu._speculative_sampling is original           # uninstall put it back
    assert std.STATS["calls"] >= HF_SAMPLES and std.STATS["candidates"] >= HF_SAMPLES
    stat = _chi2(counts, p)
    print(f"chi-square standard {stat:.2f}")
    assert stat < CHI2_999_DF7, (counts, p)
    # the same test rejects a rule that does change the distribution
    always = _compiled(treeio.parse(RULES["always_accept"].tree()), "hf")
    assert _chi2(_first_tokens(always, target, draft, prompt, HF_SAMPLES // 2), p) \
        > CHI2_999_DF7


def test_hf_lenient_trace_champion_accepts_more_per_call(tmp_path):
    target, draft = _tiny_pair()
    runs = tmp_path / "runs"
    _fake_run(runs, "lenient", "pmin(1.0, add(pdiv(target_prob, mul(0.3, draft_prob)), "
                               "mul(0.5, sub(1.0, p_max))))")
    out = tmp_path / "rule_hf.py"
    r = invoke("export", "lenient", "--format", "hf", "--out", out, "--runs-dir", runs)
    assert r.exit_code == 0, r.output
    lenient = load(tmp_path, out.read_text(), "lenient_hf")
    std = load(tmp_path, modules.export_source(
        treeio.parse(RULES["standard_rejection"].tree()), "hf", {"metrics": {}}, "std"), "std_hf")
    prompts = [torch.tensor([[1 + i % 6, (3 * i) % 8, 2]]) for i in range(6)]
    per_call = {}
    for name, mod in (("standard", std), ("lenient", lenient)):
        mod.install(target, draft, prompt_length=3)
        try:
            torch.manual_seed(5)
            for prompt in prompts:
                _generate(target, draft, prompt, 24)
        finally:
            mod.uninstall()
        per_call[name] = mod.STATS["accepted"] / mod.STATS["calls"]
    assert per_call["lenient"] > per_call["standard"], per_call


def _fake_run(parent: Path, name: str, tree: str, objective="speed"):
    return fake_trace_run(parent, name, tree, objective)


# ------------------------------------------------------------ trace write-back

def test_trace_writeback_rules_and_tradeoff_shows_installed(trace_run, trace_dir, tmp_path):
    run, heur, result = trace_run
    wb = result["writeback"]
    assert wb["written"] and wb["current_valid_score"] is None and wb["backup"] is None
    text = (heur / "evolved_trace.py").read_text()
    champ = json.loads((run / "champion.json").read_text())
    assert "run: spd" in text and f"tv_budget: {TRACE_BUDGET}" in text
    mod = load(tmp_path, text, "installed_trace")
    assert mod.METADATA["tree"] == champ["tree"] and mod.METADATA["seed"] == 2
    assert mod.evolved_trace.__code__.co_varnames[:9] == P.TRACE_INPUT_NAMES
    # a worse champion (always accept, far over budget) is refused, then forced
    from evolve.objectives.spec import TraceArrays
    from evolve.tasks import writeback
    from tests import tracekit
    sa = TraceArrays.from_split(tracekit.split("valid"))
    bad = treeio.parse("pmax(1.0, 1.0)")
    kept = writeback.write_back_trace("X = 1\n", bad, sa, TRACE_BUDGET, "bad", directory=heur)
    assert not kept["written"] and (heur / "evolved_trace.py").read_text() == text
    forced = writeback.write_back_trace("X = 1\n", bad, sa, TRACE_BUDGET, "bad", force=True,
                                        directory=heur)
    assert forced["written"] and Path(forced["backup"]).read_text() == text
    assert Path(forced["backup"]).parent == heur / "history"
    shutil.copy(forced["backup"], heur / "evolved_trace.py")
    # evolve tradeoff shows the installed rule with exactly its run's numbers
    r = invoke("tradeoff", "--data", trace_dir, "--budget", TRACE_BUDGET, "--json",
               env={"EVOLVE_HEURISTICS_DIR": str(heur)})
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (label, got), = [(k, v) for k, v in doc["extra"].items() if k.startswith("installed *")]
    assert "run spd" in label
    for split in ("valid", "test"):     # the slot-TV tail too: not a sum of the kernel's
        for key in ("tokens_per_call", "tv_per_token", "kl_per_token", "tv_p99"):
            assert got[split][key] == champ["metrics"][split][key], (split, key)
    r = invoke("tradeoff", "--data", trace_dir, "--budget", TRACE_BUDGET,
               env={"EVOLVE_HEURISTICS_DIR": str(heur)})
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("installed * (run spd)"))
    assert f"{champ['metrics']['test']['tv_p99']:.4f}" in row, row    # as `evolve run` shows it
    # and `evolve export --installed` takes it from there
    r = invoke("export", "--installed", "--format", "torch",
               env={"EVOLVE_HEURISTICS_DIR": str(heur)})
    assert r.exit_code == 0, r.output
    assert "run: spd" in r.stdout and "def threshold(" in r.stdout


# ------------------------------------------------------------------ bad input

def one_line(r):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


def test_bad_input_one_line_exit_2(tmp_path):
    runs = tmp_path / "runs"
    _fake_run(runs, "ok", "pmin(1.0, pdiv(target_prob, draft_prob))")
    _fake_run(runs, "pos", "pmin(1.0, pdiv(target_prob, mul(position, draft_prob)))")
    (runs / "empty").mkdir()
    (runs / "empty" / "config.json").write_text((runs / "ok" / "config.json").read_text())
    line = one_line(invoke("export", "ok", "--format", "onnx", "--runs-dir", runs))
    assert "--format" in line and "'onnx'" in line
    line = one_line(invoke("export", "empty", "--format", "numpy", "--runs-dir", runs))
    assert "champion" in line
    line = one_line(invoke("export", "pos", "--format", "vllm", "--runs-dir", runs))
    assert "--format vllm" in line and "'position'" in line and "hf" in line
    line = one_line(invoke("export", "--installed", "--format", "numpy",
                           env={"EVOLVE_HEURISTICS_DIR": str(tmp_path / "none")}))
    assert "--installed trace" in line and "evolved_trace.py" in line
    line = one_line(invoke("export", "--format", "numpy", "--runs-dir", runs))
    assert "RUN or --installed" in line
    out = tmp_path / "keep.py"
    out.write_text("mine\n")
    one_line(invoke("export", "pos", "--format", "vllm", "--out", out, "--runs-dir", runs))
    assert out.read_text() == "mine\n"
    r = invoke("export", "pos", "--format", "hf", "--out", out, "--force", "--runs-dir", runs)
    assert r.exit_code == 0 and "def speculative_sampling(" in out.read_text()


@pytest.mark.parametrize("fmt", ["numpy", "torch", "hf", "vllm", "vllm-patch"])
def test_the_export_header_and_inspect_say_what_the_rule_was_scored_with(tmp_path, fmt):
    """A trace champion scored on the draft's top 16 at temperature 0.7, g = 3: every
    export's header and `evolve inspect` state that scope, as the code keeps it."""
    scope = {"top_k": 16, "vocab_size": 256, "block_size": 3, "temperature": 0.7,
             "truncation": None, "backend": "ngram"}
    fake_trace_run(tmp_path, "sc", "pmin(1.0, pdiv(target_prob, draft_prob))", scope=scope)
    r = invoke("export", "sc", "--format", fmt, "--runs-dir", tmp_path)
    assert r.exit_code == 0, r.output
    head = r.stdout[:4000]
    assert "Scope (what the rule was scored with, and keeps here)" in head, head
    assert "top 16" in head and "3 drafted tokens per target call" in head
    assert "temperature 0.7" in head
    r = invoke("inspect", "sc", "--runs-dir", tmp_path)
    assert r.exit_code == 0, r.output
    assert ("scored with: the rule decides drafts among the draft's top 16 (standard rule "
            "outside); 3 drafted tokens per call; temperature 0.7") in r.output


@pytest.mark.parametrize("fmt", ["hf", "vllm", "vllm-patch"])
def test_an_engine_export_of_traces_without_a_temperature_is_refused(tmp_path, fmt):
    """Traces that do not record their sampling temperature: an engine format, which must
    set one, is refused in one line (nothing written); numpy and torch, which set none,
    export."""
    scope = {"top_k": 16, "vocab_size": 256, "block_size": 3, "temperature": None,
             "truncation": None, "backend": "ngram"}
    fake_trace_run(tmp_path, "nt", "pmin(1.0, pdiv(target_prob, draft_prob))", scope=scope)
    out = tmp_path / "rule.py"
    one_line_error(invoke("export", "nt", "--format", fmt, "--out", out, "--runs-dir",
                          tmp_path), f"--format {fmt}", "temperature", "champion.json")
    assert not out.exists()
    assert invoke("export", "nt", "--format", "numpy", "--runs-dir", tmp_path).exit_code == 0
