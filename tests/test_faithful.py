"""What a user deploys decides as the objectives scored it.

A champion scored on traces keeps its scope in every export (the draft's top-k, the
draft length, the temperature: ``evolve.data.traces.scope_of``). Checked here:

- the acceptance probabilities of the numpy, torch and vLLM exports equal the ones
  the project's exact emission (``evolve.data.emission.acceptance``, what ``evolve
  simulate --compare`` and the objectives use) gives, on random distributions with
  ties, and differ from the rule applied to every token;
- the transformers drop-in inside ``model.generate`` on a small GPT-2 pair (slow):
  the first emitted token's distribution and the first draft's acceptance at a fixed
  prompt match the exact gated emission within Monte Carlo error, with enough draws
  that the same test rejects the drop-in with its gate removed; at every drafted
  position of every call, the drop-in reads the distributions of that position's own
  context and accepts with the exact gated acceptance; ``install`` pins the draft
  length and the sampling settings and puts them back.

Guarantee 34 of docs/reliability.md, What an export decides is what was scored:

A trace champion records its scope (`evolve/data/traces.py` `scope_of`: the draft's
top-k, the draft length, the temperature) and every export keeps it: numpy and torch
(`draft_rank`, `acceptance`, `accept(..., draft_rank=...)`), the transformers drop-
in (ranks from the assistant's probabilities; `install(model, assistant_model)` pins
the draft length, the sampling, and refuses settings that change p), the vLLM module
and the vLLM kernel patch (a rank loop over `draft_probs` and the block position). A
champion without a recorded scope, or with a scope whose values do not fit
(`runs/schema.py` `check_scope`: they are written into code), is refused in one
line. Champions are judged on valid before they are kept (`standing`: infeasible,
loses, wins); only winners are written back unforced, and infeasible ones are not
exported without `--allow-infeasible`. Tests: `tests/test_faithful.py` (the exports'
acceptance equals the objectives' exact acceptance on distributions with ties; the
drop-in inside `model.generate` emits the exact gated distribution and its gate
removed fails the same test, and at every drafted position it reads that position's
own distributions and accepts with the exact gated acceptance; the patch's kernel
lines, with torch playing Triton),
`tests/test_vllm_patch.py` (the patched release kernel in Triton's interpreter, bare
and scoped) and `tests/test_packaging.py` (write-back stays in the project, never
the installed package).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from evolve import standing
from evolve.data import emission as EM
from evolve.data import traces as T
from evolve.export import modules
from evolve.lang import treeio
from evolve.rules.adapters import tree_rule
from tests.clikit import fake_trace_run, invoke

torch = pytest.importorskip("torch")

LENIENT = "pmin(1.0, pdiv(target_prob, mul(0.2, draft_prob)))"     # leniency 0.2
K, V = 4, 24


def load(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def scope(k=K, vocab=V, g=4):
    return {"top_k": k, "vocab_size": vocab, "block_size": g, "temperature": 1.0,
            "truncation": None, "backend": "hf"}


def export(tmp_path, fmt: str, sc, tree: str = LENIENT, name: str = "rule"):
    meta = {"run": "r", "metrics": {}, "scope": sc}
    return load(tmp_path, modules.export_source(treeio.parse(tree), fmt, meta, "t"),
                f"{name}_{fmt}")


def random_pq(rng, rows: int, vocab: int = V):
    """Distributions with ties in q (repeated values) so the rank's tie rule matters."""
    p = rng.dirichlet(np.full(vocab, 0.3), size=rows)
    q = np.floor(rng.dirichlet(np.full(vocab, 0.5), size=rows) * 30) + 1.0    # ties, q > 0
    return p, q / q.sum(axis=1, keepdims=True)


def project_acceptance(p, q, tree: str, k: int):
    """The exact objectives' a(x) for every token (the standard rule outside the top k)."""
    rule = tree_rule(treeio.parse(tree))
    F = EM.vocab_features(p, q, np.zeros(len(p)), np.zeros(len(p)))
    return EM.acceptance(p, q, F, rule, k)


@pytest.mark.parametrize("fmt", ["numpy", "torch"])
def test_array_exports_accept_as_the_objectives_scored(fmt, tmp_path):
    rng = np.random.default_rng(0)
    p, q = random_pq(rng, 200)
    assert (np.diff(np.sort(q, axis=1), axis=1) == 0).any()          # ties in q
    want = project_acceptance(p, q, LENIENT, K)
    every = project_acceptance(p, q, LENIENT, V)
    assert np.abs(want - every).max() > 0.1         # the scope matters for this rule
    mod = export(tmp_path, fmt, scope())
    assert mod.TOP_K == K and mod.BLOCK_SIZE == 4 and mod.TEMPERATURE == 1.0
    M = p.shape[0]
    tok = np.tile(np.arange(V), (M, 1))
    qq = np.repeat(q[:, None, :], V, axis=1)
    conv = (lambda a: a) if fmt == "numpy" else torch.as_tensor
    rank = np.asarray(mod.draft_rank(conv(qq), conv(tok)))
    feats = EM.vocab_features(p, q, np.zeros(M), np.zeros(M))
    args = [conv(np.asarray(feats[n], dtype=np.float64)) for n in mod.INPUTS]
    got = np.asarray(mod.acceptance(conv(rank), *args))
    np.testing.assert_array_equal(got, want)
    u = rng.random((M, V))
    np.testing.assert_array_equal(np.asarray(mod.accept(conv(u), *args, draft_rank=conv(rank))),
                                  u < want)
    with pytest.raises(ValueError, match="draft_rank"):
        mod.accept(conv(u), *args)
    # a rule scored on every token (top-k = the vocabulary) needs no rank
    full = export(tmp_path, fmt, scope(k=None), name="full")
    np.testing.assert_array_equal(np.asarray(full.accept(conv(u), *args)), u < every)


def test_vllm_module_and_patch_lines_accept_as_the_objectives_scored(tmp_path):
    from tests.test_vllm_patch import kernel_scope_decisions
    rng = np.random.default_rng(1)
    p, q = random_pq(rng, 64)
    want = project_acceptance(p, q, LENIENT, K)
    mod = export(tmp_path, "vllm", scope(g=3))
    # one request of 5 drafts per row: each row's tokens 0..4 at block positions 0..4
    n = 5
    x = np.stack([rng.permutation(V)[:n] for _ in range(len(p))])
    ids = torch.as_tensor(x.reshape(-1))
    P = torch.as_tensor(np.repeat(p, n, axis=0))
    Q = torch.as_tensor(np.repeat(q, n, axis=0))
    cu = torch.arange(1, len(p) + 1) * n
    h = mod.thresholds(ids, Q, P, cu).numpy().reshape(len(p), n)
    a = np.take_along_axis(want, x, axis=1)
    std = np.minimum(1.0, np.take_along_axis(p / q, x, axis=1))
    pos = np.arange(n)[None, :]
    np.testing.assert_allclose(h, np.where(pos < 3, a, std), rtol=0, atol=1e-15)
    # a drafter without probabilities: q one-hot, every draft rank 0
    h1 = mod.thresholds(ids, None, P, cu).numpy().reshape(len(p), n)
    assert np.isfinite(h1).all()
    # the lines the patch puts in vLLM's kernel, with torch playing triton.language
    u = rng.random(x.shape)
    got = kernel_scope_decisions(treeio.parse(LENIENT), scope(g=3), np.repeat(q, n, 0),
                                 np.repeat(p, n, 0), x.reshape(-1), np.tile(np.arange(n),
                                                                            len(p)),
                                 u.reshape(-1))
    np.testing.assert_array_equal(got.reshape(x.shape), u < np.where(pos < 3, a, std))


SLOTTED = ("pmin(1.0, add(mul(0.5, pdiv(target_prob, draft_prob)), mul(0.2, mul(slot_tv, "
           "add(ahead, mul(next_tv, add(slot_kl_pq, slot_kl_qp)))))))")


def test_dropin_and_vllm_module_compute_slot_and_lookahead_inputs_as_the_decoders(tmp_path):
    """A rule reading the slot features and the lookahead inputs exports to the
    transformers drop-in and the vLLM module, whose acceptance of every drafted token
    of a block equals the decoders' (``evolve.data.decode.drafted_acceptance``, the
    inputs the objectives score) for the same distributions; vLLM's kernel does not
    hold them and refuses the rule."""
    from evolve.data import decode as DE
    from evolve.export.modules import ExportError
    rng = np.random.default_rng(3)
    B, g, k = 8, 4, V          # the rule judges every draft: each input counts
    p, q = random_pq(rng, B * (g + 1))
    P, Q = p.reshape(B, g + 1, V), q.reshape(B, g + 1, V)[:, :g]
    X = np.stack([[rng.choice(V, p=Q[b, j]) for j in range(g)] for b in range(B)])
    Pg, Qg = P[:, :g].reshape(-1, V), Q.reshape(-1, V)
    qx = np.take_along_axis(Q, X[:, :, None], 2)[:, :, 0]
    px = np.take_along_axis(P[:, :g], X[:, :, None], 2)[:, :, 0]
    rule = tree_rule(treeio.parse(SLOTTED))
    want = DE.drafted_acceptance(rule, Pg, Qg, X, qx, px, np.zeros(B, np.int64),
                                 DE.candidate_summary(Pg, Qg, k, np.int64))
    plain = DE.drafted_acceptance(tree_rule(treeio.parse("pmin(1.0, mul(0.5, pdiv("
                                                         "target_prob, draft_prob)))")), Pg, Qg,
                                  X, qx, px, np.zeros(B, np.int64),
                                  DE.candidate_summary(Pg, Qg, k))
    assert ((want < 1) & (np.abs(want - plain) > 0.05)).mean() > 0.3   # the inputs count
    hf = export(tmp_path, "hf", scope(k=k, g=g), SLOTTED, name="slotted")
    for b in range(B):
        ids = torch.as_tensor(np.concatenate([[1, 2, 3], X[b]]))[None]
        f = hf.candidate_features(ids, torch.as_tensor(Q[b])[None], torch.as_tensor(P[b])[None],
                                  g, 3)
        got = hf.acceptance(f["draft_rank"], *[f[n] for n in hf.INPUTS]).numpy()
        np.testing.assert_allclose(got, want[b], rtol=0, atol=1e-12)
    # vLLM: requests of 1 to g + 2 drafts in one batch; a request's first g drafts are
    # a block as the decoders see it, later ones go by the standard rule
    vl = export(tmp_path, "vllm", scope(k=k, g=g), SLOTTED, name="slotted")
    lens = [2, 1, g, g + 2, 3, g + 1]
    p, q = random_pq(rng, sum(lens))
    x = np.array([rng.choice(V, p=r) for r in q])
    cu = np.cumsum(lens)
    h = vl.thresholds(torch.as_tensor(x), torch.as_tensor(q), torch.as_tensor(p),
                      torch.as_tensor(cu)).numpy()
    for n, end in zip(lens, cu):
        r = np.arange(end - n, end)
        m = min(n, g)
        b = r[:m]
        want = DE.drafted_acceptance(rule, p[b], q[b], x[b][None], q[b, x[b]][None],
                                     p[b, x[b]][None], np.zeros(1, np.int64),
                                     DE.candidate_summary(p[b], q[b], k, np.int64))[0]
        std = np.minimum(1.0, p[r[m:], x[r[m:]]] / q[r[m:], x[r[m:]]])
        np.testing.assert_allclose(h[r], np.concatenate([want, std]), rtol=0, atol=1e-12)
    with pytest.raises(ExportError, match="does not hold"):
        modules.check_format("vllm-patch", treeio.parse(SLOTTED))


def test_exports_refuse_a_trace_champion_without_its_scope(tmp_path):
    runs = tmp_path / "runs"
    run = fake_trace_run(runs, "old", LENIENT)
    champ = json.loads((run / "champion.json").read_text())
    del champ["scope"]
    (run / "champion.json").write_text(json.dumps(champ))
    r = invoke("export", "old", "--format", "torch", "--runs-dir", runs)
    assert r.exit_code == 2 and "records no scope" in r.stderr, r.output
    champ["scope"] = {**scope(), "top_k": 10 ** 9}          # written into code: checked
    (run / "champion.json").write_text(json.dumps(champ))
    r = invoke("export", "old", "--format", "torch", "--runs-dir", runs)
    assert r.exit_code == 2 and "scope.top_k" in r.stderr, r.output


def test_infeasible_champions_are_not_exported_unless_asked(tmp_path):
    runs = tmp_path / "runs"
    fake_trace_run(runs, "bad", LENIENT, standing={"verdict": "infeasible",
                                                    "why": "over the run's budget"})
    r = invoke("export", "bad", "--format", "torch", "--runs-dir", runs)
    assert r.exit_code == 2 and "infeasible" in r.stderr and "--allow-infeasible" in r.stderr
    r = invoke("export", "bad", "--format", "torch", "--runs-dir", runs, "--allow-infeasible")
    assert r.exit_code == 0 and "def acceptance(" in r.stdout
    fake_trace_run(runs, "lost", LENIENT, standing={"verdict": "loses",
                                                     "why": "leniency decodes more"})
    r = invoke("export", "lost", "--format", "torch", "--runs-dir", runs)
    assert r.exit_code == 0 and "loses" in r.stderr


# ------------------------------------------------- inside transformers' generate

G = 4
DRAWS = 400
Z = 4.0                                  # acceptance within Z standard errors


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM
    from tests import hfkit
    root = tmp_path_factory.mktemp("faithful_pair")
    t, d = hfkit.tiny_pair(root)
    target = AutoModelForCausalLM.from_pretrained(t).eval()
    draft = AutoModelForCausalLM.from_pretrained(d).eval()
    return target, draft


def _first_tokens(mod, target, draft, prompt, n: int):
    """First new token and first-draft acceptance of n generations of one block."""
    torch.manual_seed(7)
    first = np.empty(n, dtype=np.int64)
    acc = np.empty(n, dtype=bool)
    decided, accept = [], mod.accept

    def spy(*args, **kwargs):           # the drop-in's decisions, passed on unchanged
        out = accept(*args, **kwargs)
        decided.append(bool(out[0]))
        return out
    mod.accept = spy
    try:
        for i in range(n):
            decided.clear()
            out = mod.generate(target, draft, prompt, attention_mask=torch.ones_like(prompt),
                               max_new_tokens=G + 1, pad_token_id=0)
            first[i] = out[0, prompt.shape[1]].item()
            acc[i] = decided[0]             # the first call's first draft
    finally:
        mod.accept = accept
    return first, acc


def _log_likelihood(tokens, dist):
    return float(np.log(np.maximum(dist[tokens], 1e-300)).sum())


def _chi2_fits(tokens, dist) -> tuple[float, float]:
    """Pearson's chi-square of the tokens' counts against ``dist`` (tokens expected
    fewer than 5 times pooled into one bin), and its 0.999 quantile (Wilson-Hilferty)."""
    n = len(tokens)
    counts = np.bincount(tokens, minlength=dist.size).astype(float)
    big = dist * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(dist[big] * n, dist[~big].sum() * n)
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.090232306167813                 # the 0.999 normal quantile
    return stat, df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.slow
def test_transformers_dropin_emits_the_scored_distribution(pair, tmp_path):
    from tests import hfkit
    target, draft = pair
    k = 8
    sc = scope(k=k, vocab=hfkit.VOCAB, g=G)
    prompt = torch.tensor([[100, 101, 32, 40]])
    with torch.no_grad():
        p = target(prompt).logits[0, -1].double().softmax(-1).numpy()[None]
        q = draft(prompt).logits[0, -1].double().softmax(-1).numpy()[None]
    a = project_acceptance(p, q, LENIENT, k)
    a_all = project_acceptance(p, q, LENIENT, hfkit.VOCAB)
    e = EM.exact_output(p, q, a)[0]
    e_all = EM.exact_output(p, q, a_all)[0]
    tv, tv_all = (0.5 * np.abs(x - p[0]).sum() for x in (e, e_all))
    assert tv_all > 1.5 * tv, (tv, tv_all)      # the gate matters here, as in practice
    gated = export(tmp_path, "hf", sc)
    ungated = export(tmp_path, "hf", sc, name="ungated")
    ungated.TOP_K = None                      # the planted bug: every token by the rule
    results = {}
    for name, mod in (("gated", gated), ("ungated", ungated)):
        first, acc = _first_tokens(mod, target, draft, prompt, DRAWS)
        # (calls after the first may draft fewer near the maximum length or after a
        # drafted end-of-sequence token; never more: the drop-in refuses that)
        assert mod.STATS["calls"] >= DRAWS and mod.STATS["candidates"] > DRAWS * G / 2
        results[name] = (first, acc)
    A, A_all = float((q[0] * a[0]).sum()), float((q[0] * a_all[0]).sum())
    for name, (first, acc) in results.items():
        se = np.sqrt(A * (1 - A) / DRAWS)
        llr = _log_likelihood(first, e) - _log_likelihood(first, e_all)
        print(f"{name}: first-draft acceptance {acc.mean():.4f} (gated exact {A:.4f}, "
              f"ungated {A_all:.4f}, se {se:.4f}); log-likelihood ratio gated/ungated "
              f"{llr:.1f}; TV exact {tv:.4f} vs ungated {tv_all:.4f}")
        stat, limit = _chi2_fits(first, e)
        print(f"  chi-square of the first tokens against the exact gated emission {stat:.1f} "
              f"(0.999 quantile {limit:.1f})")
        if name == "gated":
            assert abs(acc.mean() - A) < Z * se
            assert llr > 0 and stat < limit
        else:
            assert abs(acc.mean() - A) >= Z * se and llr < 0 and stat > limit


@pytest.mark.slow
def test_dropin_reads_every_drafted_position_s_own_distributions(pair, tmp_path):
    """Beyond the first draft: inside ``generate``, at every drafted position of every
    call, the drop-in reads the target's and the assistant's distributions of that
    position's own context (checked against a forward pass of each model on it) and
    accepts each drafted token with the exact gated acceptance at them. Planted, it
    fails: the target's distributions read one position late."""
    from tests import hfkit
    target, draft = pair
    k = 8
    mod = export(tmp_path, "hf", scope(k=k, vocab=hfkit.VOCAB, g=G))
    seen, feats = [], mod.candidate_features

    def spy(candidate_input_ids, q, p, candidate_length, prompt_length=0):
        seen.append((candidate_input_ids.clone(), q.clone(), p.clone(), int(candidate_length)))
        return feats(candidate_input_ids, q, p, candidate_length, prompt_length)
    mod.candidate_features = spy
    prompt = torch.tensor([[100, 101, 32, 40]])
    torch.manual_seed(3)
    try:
        for _ in range(3):
            mod.generate(target, draft, prompt, attention_mask=torch.ones_like(prompt),
                         max_new_tokens=3 * G + 1, pad_token_id=0)
    finally:
        mod.candidate_features = feats
    assert len(seen) >= 6 and sum(n for *_, n in seen) >= 6 * G
    for ids, q, p, n in seen:
        start = ids.shape[1] - n
        tokens = ids[0, start:]
        with torch.no_grad():
            ctx = [ids[:, :start + j] for j in range(n)]
            pt = torch.stack([target(c).logits[0, -1].double().softmax(-1) for c in ctx])
            qd = torch.stack([draft(c).logits[0, -1].double().softmax(-1) for c in ctx])
        np.testing.assert_allclose(p[0, :n].double().numpy(), pt.numpy(), atol=1e-6)
        np.testing.assert_allclose(q[0, :n].double().numpy(), qd.numpy(), atol=1e-6)
        f = feats(ids, q, p, n)
        got = mod.acceptance(f["draft_rank"], *[f[name] for name in mod.INPUTS]).numpy()
        exact = project_acceptance(p[0, :n].double().numpy(), q[0, :n].double().numpy(),
                                   LENIENT, k)[np.arange(n), tokens.numpy()]
        np.testing.assert_allclose(got, exact, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_dropin_reads_the_token_class_from_the_tokenizer_as_the_traces_do(pair, tmp_path):
    """A rule that reads token_class, inside ``generate``: install() without the
    tokenizer refuses in one line; with it, every drafted token is accepted with the
    exact acceptance at its class in the table the recorders write for this pair
    (``evolve.data.vocab_class.table`` of the tokenizer), at every call."""
    from transformers import AutoTokenizer
    from evolve.data import vocab_class as VC
    from tests import hfkit
    target, draft = pair
    tok = AutoTokenizer.from_pretrained(target.name_or_path)
    tree = "ite(lt(token_class, 0.5), pmin(1.0, pdiv(target_prob, mul(0.3, draft_prob))), " \
           "pdiv(target_prob, draft_prob))"
    k = 8
    mod = export(tmp_path, "hf", scope(k=k, vocab=hfkit.VOCAB, g=G), tree, name="cls")
    prompt = torch.tensor([[100, 101, 32, 40]])
    with pytest.raises(ValueError, match="tokenizer"):
        mod.install(target, draft)
    table = np.asarray(VC.tokenizer_table(tok, hfkit.VOCAB), dtype=np.float64)
    assert len(set(table)) >= 3
    seen, feats = [], mod.candidate_features

    def spy(candidate_input_ids, q, p, candidate_length, prompt_length=0):
        seen.append((candidate_input_ids.clone(), q.clone(), p.clone(), int(candidate_length),
                     prompt_length))
        return feats(candidate_input_ids, q, p, candidate_length, prompt_length)
    mod.candidate_features = spy
    torch.manual_seed(5)
    try:
        for _ in range(3):
            mod.generate(target, draft, prompt, attention_mask=torch.ones_like(prompt),
                         max_new_tokens=3 * G + 1, pad_token_id=0, tokenizer=tok)
    finally:
        mod.candidate_features = feats
    assert len(seen) >= 6
    rule, classes_seen = tree_rule(treeio.parse(tree)), set()
    for ids, q, p, n, plen in seen:
        tokens = ids[0, ids.shape[1] - n:].numpy()
        classes_seen |= set(table[tokens])
        f = feats(ids, q, p, n, plen)
        np.testing.assert_array_equal(f["token_class"].numpy(), table[tokens])
        got = mod.acceptance(f["draft_rank"], *[f[name] for name in mod.INPUTS]).numpy()
        pn, qn = p[0, :n].double().numpy(), q[0, :n].double().numpy()
        F = EM.vocab_features(pn, qn, f["position"].numpy(), np.arange(n), classes=table)
        exact = EM.acceptance(pn, qn, F, rule, k)[np.arange(n), tokens]
        np.testing.assert_allclose(got, exact, rtol=1e-12, atol=1e-15)
    assert len(classes_seen) >= 2, classes_seen


@pytest.mark.slow
def test_install_pins_the_scored_decoding_and_puts_it_back(pair, tmp_path):
    import transformers.generation.utils as gu
    target, draft = pair
    mod = export(tmp_path, "hf", scope(k=8, vocab=256, g=3))
    before = (draft.generation_config.num_assistant_tokens,
              draft.generation_config.num_assistant_tokens_schedule,
              target.generation_config.top_k, target.generation_config.do_sample)
    original = gu._speculative_sampling
    with pytest.raises(ValueError, match="install\\(model, assistant_model\\)"):
        mod.install()
    mod.install(target, draft)
    assert draft.generation_config.num_assistant_tokens == 3
    assert draft.generation_config.num_assistant_tokens_schedule == "constant"
    assert draft.generation_config.assistant_confidence_threshold == 0.0
    assert target.generation_config.top_k == 0 and target.generation_config.do_sample
    mod.uninstall()
    assert gu._speculative_sampling is original
    assert (draft.generation_config.num_assistant_tokens,
            draft.generation_config.num_assistant_tokens_schedule,
            target.generation_config.top_k, target.generation_config.do_sample) == before
    prompt = torch.tensor([[100, 101, 32]])
    with pytest.raises(ValueError, match="temperature"):
        mod.generate(target, draft, prompt, temperature=0.5)
    # more drafted tokens than the scored block: refused in one line
    draft.generation_config.num_assistant_tokens = 5
    mod.install(target, draft)
    draft.generation_config.num_assistant_tokens = 5      # overridden after install
    try:
        with pytest.raises(ValueError, match="blocks of 3"):
            target.generate(prompt, attention_mask=torch.ones_like(prompt),
                            assistant_model=draft, max_new_tokens=8, pad_token_id=0)
    finally:
        mod.uninstall()
    target.generation_config.repetition_penalty = 1.3
    try:
        with pytest.raises(ValueError, match="repetition_penalty"):
            mod.install(target, draft)
    finally:
        target.generation_config.repetition_penalty = 1.0
    assert gu._speculative_sampling is original


# ------------------------------------------------------- champions judged first

def test_standing_of_a_champion_against_standard_and_tuned_rules():
    from evolve.objectives import OBJECTIVES
    from evolve.objectives.spec import TraceArrays
    from evolve.rules import tuning
    from evolve.search.config import Config
    from evolve.tasks.traces import standing
    from tests import tracekit
    sa = TraceArrays.from_split(tracekit.split("valid"))
    std = tuning.evaluate("standard_rejection", sa).tokens
    cfg = Config(objective="speed", tv_budget=0.02)
    tuned = {"leniency": {"param": 0.9, "valid": {"tokens_per_call": std + 0.1}},
             "typical_acceptance": None}

    def m(tokens, tv):
        return {"tokens_per_call": tokens, "tv_per_token": tv, "kl_per_token": 0.0,
                "tv_by_position": [tv] * 4, "tv_p99": tv}
    cases = [(m(std + 0.5, 0.03), "infeasible", "TV per token 0.03000 > 0.02"),
             (m(std - 0.05, 0.0), "infeasible", "below standard rejection"),
             (m(std + 0.05, 0.01), "loses", "leniency(l=0.9)"),
             (m(std + 0.2, 0.02), "wins", "beats standard rejection")]
    for valid, verdict, words in cases:
        st = standing(OBJECTIVES["speed"], cfg, valid, sa, tuned)
        assert st["verdict"] == verdict and words in st["why"], st
        assert st["standard_rejection"] == std
    assert standing(OBJECTIVES["speed"], cfg, m(std + 0.05, 0.01), sa,
                    {"leniency": None})["verdict"] == "wins"


def test_only_a_winning_champion_is_written_back(tmp_path):
    """A short run's champion that does not beat the tuned baselines is not written
    back, and the run says why; --force writes it back."""
    from evolve.data import traces
    from tests import tracekit
    from tests.conftest import TINY
    data = tmp_path / "traces"
    data.mkdir()
    for s in traces.SPLITS:
        traces.save(tracekit.split(s), data / f"{s}.npz")
    heur = tmp_path / "heuristics"
    env = {"EVOLVE_HEURISTICS_DIR": str(heur)}
    args = ("run", "--objective", "speed", "--data", data, "--runs-dir", tmp_path / "runs",
            "--generations", TINY["generations"], "--population", TINY["population"],
            "--seed", "2")
    r = invoke(*args, "--name", "a", env=env)
    assert r.exit_code == 0, r.output
    champ = json.loads((tmp_path / "runs" / "a" / "champion.json").read_text())
    verdict = champ["standing"]["verdict"]
    assert verdict != "wins", champ["standing"]        # 4 generations do not win here
    assert ("not written back to heuristics/evolved_trace.py: the champion "
            f"{standing.sentence(verdict, champ['standing']['why'])}") in r.stdout
    assert not (heur / "evolved_trace.py").exists()
    assert champ["scope"] == T.scope_of(tracekit.split("valid").meta)
    r = invoke(*args, "--name", "b", "--force", env=env)
    assert r.exit_code == 0 and (heur / "evolved_trace.py").exists(), r.output
    r = invoke("export", "--installed", "--format", "torch", *(
        ("--allow-infeasible",) if verdict == "infeasible" else ()), env=env)
    assert r.exit_code == 0 and f"TOP_K = {champ['scope']['top_k']}" in r.stdout, r.output
