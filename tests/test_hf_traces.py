"""`evolve data trace --backend hf` on a tiny random-init GPT-2 pair saved in the test
(tests/hfkit.py) and loaded by path through the CLI: recorded probabilities against a
direct forward pass, the exact objectives against free-running decoding, determinism,
evolution and the trade-off on the traces, and the refusals.

Also guarantee 31 of docs/reliability.md, Hugging Face decoding keeps its caches and
stays exact (test_same_seed_same_files_another_seed_others): see tests/test_hf_cache.py.
"""

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evolve.data import traces as T  # noqa: E402
from evolve.data.decode import slot_features  # noqa: E402
from evolve.data.sources import hf# noqa: E402
from evolve.data.sources.hf import decode as hf_decode, prompts as hf_prompts  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from tests import hfkit, rulefns  # noqa: E402
from tests.clikit import one_line_error  # noqa: E402

G, K, BLOCKS, CTX = 3, 8, 4, 64
PROB_TOL = 1e-5        # float32 forward passes (padded batch vs one sequence)
Z_MAX = 3.0            # offline exact vs free-running decoding, standard errors
FREE_PROMPTS, FREE_BLOCKS = 128, 8


invoke = hfkit.invoke
models = hfkit.models_fixture()


def trace_args(models, out, *extra):
    target, draft, prompts = models
    return ("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
            "--prompts", prompts, "--block-size", G, "--top-k", K, "--blocks-per-prompt",
            BLOCKS, "--context-len", CTX, "--batch-size", 5, "--out", out, *extra)


@pytest.fixture(scope="module")
def traced(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_traces")
    r = invoke(*trace_args(models, out))
    assert r.exit_code == 0, r.output
    return out


def _direct(path, contexts):
    """softmax (float64) of a model run on each row's context alone, unpadded: one
    forward pass per block, on the context of its last row (rows of a block extend
    each other's contexts by the drafted tokens, which the test checks)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    out = np.empty((len(contexts), hfkit.VOCAB))
    with torch.no_grad():
        for b in range(0, len(contexts), G):
            last = contexts[b + G - 1]
            ids = torch.tensor(last[last >= 0], dtype=torch.long)[None]
            logits = model(ids).logits[0, -G:].double()
            out[b:b + G] = torch.softmax(logits, -1).numpy()
    return out


def test_recorded_probabilities_are_the_models_softmax(models, traced):
    from transformers import AutoTokenizer
    from evolve.data import vocab_class as VC
    target, draft, _ = models
    for split in T.SPLITS:
        ts = T.load(traced / f"{split}.npz")
        c = ts.columns
        assert ts.vocab_size == hfkit.VOCAB and ts.backend == "hf"
        # the vocabulary's classes: each id of the pair's tokenizer decoded alone
        tok = AutoTokenizer.from_pretrained(target)
        want = [VC.token_class(tok.decode([i], skip_special_tokens=True))
                for i in range(hfkit.VOCAB)]
        assert VC.from_text(ts.meta[VC.META_KEY]).tolist() == want
        assert c["cand_token"].dtype == np.int32 and c["context"].dtype == np.int32
        assert (c["context"][:, 0] == T.CONTEXT_PAD).all()      # whole histories stored
        P, Q = _direct(target, c["context"]), _direct(draft, c["context"])
        r = np.arange(len(ts))
        x, cand = c["token"], c["cand_token"].astype(np.int64)
        close = dict(rtol=0, atol=PROB_TOL)
        np.testing.assert_allclose(c["target_prob"], P[r, x], **close)
        np.testing.assert_allclose(c["draft_prob"], Q[r, x], **close)
        np.testing.assert_allclose(c["cand_target_prob"], np.take_along_axis(P, cand, 1), **close)
        np.testing.assert_allclose(c["cand_draft_prob"], np.take_along_axis(Q, cand, 1), **close)
        np.testing.assert_allclose(c["p_max"], P.max(1), **close)
        np.testing.assert_allclose(c["q_max"], Q.max(1), **close)
        # candidates are q's top k; tail masses are the sums outside them
        assert (np.sort(Q, 1)[:, -K:][:, ::-1] - c["cand_draft_prob"] < PROB_TOL).all()
        tail = np.ones_like(P, dtype=bool)
        np.put_along_axis(tail, cand, False, axis=1)
        plus = tail & (P > Q)
        np.testing.assert_allclose(c["tail_draft_prob"], (Q * tail).sum(1), **close)
        np.testing.assert_allclose(c["tail_target_prob"], (P * tail).sum(1), **close)
        np.testing.assert_allclose(c["tail_excess_target_prob"], (P * plus).sum(1), **close)
        np.testing.assert_allclose(c["tail_excess_draft_prob"], (Q * plus).sum(1), **close)
        np.testing.assert_allclose(c["cand_draft_prob"].sum(1) + c["tail_draft_prob"], 1.0,
                                   rtol=0, atol=1e-12)
        np.testing.assert_allclose(c["cand_target_prob"].sum(1) + c["tail_target_prob"], 1.0,
                                   rtol=0, atol=1e-12)
        # schema v3: the slot features of the full distributions
        assert ts.meta["format_version"] == T.RANK_VERSION and ts.has_slot_features
        ref = slot_features(P, Q)
        for f in T.V3_FIELDS:
            assert c[f].dtype == T.V3_FIELDS[f][1], f
        np.testing.assert_allclose(c["slot_tv"], ref["slot_tv"], **close)
        for f in ("slot_kl_pq", "slot_kl_qp"):
            np.testing.assert_allclose(c[f], ref[f], rtol=1e-3, atol=1e-4)
        near = np.abs(P - Q) < PROB_TOL       # a count may differ where p and q nearly tie
        assert (np.abs(c["slot_n_q_gt_p"] - ref["slot_n_q_gt_p"]) <= near.sum(1)).all()
        ent = lambda A: -(A * np.log(A)).sum(1)  # noqa: E731
        np.testing.assert_allclose(c["target_entropy"], ent(P), rtol=0, atol=1e-4)
        np.testing.assert_allclose(c["draft_entropy"], ent(Q), rtol=0, atol=1e-4)
        # within a block, each context is the previous one plus the drafted token
        nxt = (c["block_position"][:-1] < G - 1)
        assert (c["context"][1:][nxt, -1] == x[:-1][nxt]).all()
        assert (c["context"][1:][nxt, :-1] == c["context"][:-1][nxt, 1:]).all()


def test_standard_rejection_has_no_distortion(traced):
    for split in T.SPLITS:
        sa = spec.TraceArrays.from_split(T.load(traced / f"{split}.npz"))
        o = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
        assert o.tv_per_token < 1e-12 and abs(o.kl_per_token) < 1e-12
        assert 1.0 < o.tokens_per_call < G + 1


def test_same_seed_same_files_another_seed_others(models, traced, tmp_path, monkeypatch):
    # the same models and prompts named by relative paths: the files name them by
    # absolute path (found again from any directory), so they are the same bytes
    monkeypatch.chdir(models[0].parent)
    r = invoke(*trace_args([m.name for m in models], tmp_path / "again"))
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(tmp_path)
    for split in T.SPLITS:
        a = (traced / f"{split}.npz").read_bytes()
        assert (tmp_path / "again" / f"{split}.npz").read_bytes() == a
    r = invoke(*trace_args(models, tmp_path / "other", "--seed", 1))
    assert r.exit_code == 0, r.output
    a, b = T.load(traced / "train.npz"), T.load(tmp_path / "other" / "train.npz")
    assert not np.array_equal(a.columns["token"], b.columns["token"])


@pytest.mark.slow
def test_exact_tokens_per_call_agree_with_free_running_decoding(models):
    """Offline Rao-Blackwellised tokens per call of standard rejection (seed 0's traces)
    against counted acceptances of free-running decoding with fresh draws (seed 1)."""
    target, draft, _ = models
    cfg = hf.HFTraceConfig(target=str(target), draft=str(draft), block_size=G, top_k=K,
                           blocks_per_prompt=FREE_BLOCKS, train_prompts=FREE_PROMPTS,
                           prompt_len=24, max_files=40, max_bytes_per_file=4000,
                           batch_size=32)
    pair = hf.load_pair(cfg)
    corpus = hf_prompts.load_corpus(cfg)
    ids, rngs = hf_prompts.split_prompts(pair, "train", corpus=corpus)
    cols, _ = hf_decode.decode(pair, ids, rngs, FREE_BLOCKS)
    ts = T.TraceSplit(cols, hf.meta(pair, "train", len(cols["draft_prob"]), {}), name="train")
    T.validate(ts, "<train>")
    sa = spec.TraceArrays.from_split(ts)
    o = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
    fresh = [np.random.default_rng([1, i]) for i in range(len(ids))]
    _, acc = hf_decode.decode(pair, ids, fresh, FREE_BLOCKS, record=False)
    counted = (acc + 1).ravel().astype(float)
    se = np.sqrt(o.tokens_se ** 2 + counted.var(ddof=1) / counted.size)
    assert abs(o.tokens_per_call - counted.mean()) < Z_MAX * se, (o, counted.mean(), se)
    assert 0.1 < counted.mean() - 1 < G - 0.1       # the pair neither always agrees nor never


def test_evolution_tradeoff_and_simulate_on_hf_traces(traced, tmp_path):
    r = invoke("run", "--objective", "speed", "--budget-tv", 0.03, "--data", traced,
               "--population", 16, "--generations", 2, "--no-writeback",
               "--runs-dir", tmp_path, "--name", "hf")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "hf" / "champion.json").exists()
    r = invoke("run", "--objective", "pareto", "--data", traced, "--population", 16,
               "--generations", 2, "--no-writeback", "--runs-dir", tmp_path, "--name", "hfp")
    assert r.exit_code == 0, r.output
    r = invoke("tradeoff", "--data", traced, "--run", "hf", "--runs-dir", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    r = invoke("simulate", "--heuristic", "standard_rejection", "--data", traced)
    one_line_error(r, "hf backend", "n-gram")


# ------------------------------------------------------------------ refusals

def _refused(r, out, *needles):
    one_line_error(r, *needles)
    assert not out.exists() or not any(out.iterdir())


def test_refuses_a_draft_with_a_larger_vocabulary(models, tmp_path):
    big = hfkit.save_model(tmp_path / "big", 3, hfkit.DRAFT, vocab=300)
    target, _, prompts = models
    out = tmp_path / "out"
    r = invoke(*trace_args((target, big, prompts), out))
    _refused(r, out, "different vocabularies", str(target), str(big), "256", "300")


def test_refuses_a_draft_that_numbers_tokens_differently(models, tmp_path):
    perm = {b: (b + 1) % hfkit.VOCAB for b in range(hfkit.VOCAB)}
    other = hfkit.save_model(tmp_path / "perm", 3, hfkit.DRAFT, ids=perm)
    target, _, prompts = models
    out = tmp_path / "out"
    r = invoke(*trace_args((target, other, prompts), out))
    _refused(r, out, "different vocabularies", "probe", str(other))


def test_refuses_models_that_do_not_load(models, tmp_path):
    target, draft, prompts = models
    out = tmp_path / "out"
    r = invoke(*trace_args((target, tmp_path / "missing", prompts), out))
    _refused(r, out, "--draft", str(tmp_path / "missing"), "cannot load")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    r = invoke(*trace_args((broken, draft, prompts), out))
    _refused(r, out, "--target", str(broken), "cannot load")
    # a pickled checkpoint is never read (unpickling can run code): safetensors only
    from transformers import AutoConfig
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    AutoConfig.from_pretrained(draft).save_pretrained(pickled)
    torch.save({}, pickled / "pytorch_model.bin")
    r = invoke(*trace_args((target, pickled, prompts), out))
    _refused(r, out, "--draft", str(pickled), "cannot load", "safetensors")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_refuses_cuda_without_a_gpu(models, tmp_path):
    out = tmp_path / "out"
    r = invoke(*trace_args(models, out, "--device", "cuda"))
    _refused(r, out, "--device cuda", "no CUDA GPU")


def test_refuses_without_torch_with_the_install_command(models, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)     # import torch now fails
    out = tmp_path / "out"
    r = invoke(*trace_args(models, out))
    _refused(r, out, "torch and transformers", hf.INSTALL_HINT)


def test_refuses_bad_options_and_prompt_files(models, tmp_path):
    out = tmp_path / "out"
    one_line_error(invoke("data", "trace", "--backend", "hf", "--out", out), "--target")
    one_line_error(invoke(*trace_args(models, out, "--device", "tpu")), "--device", "tpu")
    one_line_error(invoke(*trace_args(models, out, "--dtype", "int8")), "--dtype")
    one_line_error(invoke("data", "trace", "--draft", models[1], "--out", out), "--draft",
                   "--backend hf")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no text"}\n')
    target, draft, _ = models
    _refused(invoke(*trace_args((target, draft, bad), out)), out, str(bad), "line 2", "text")
    one_line_error(invoke(*trace_args(models, out, "--blocks-per-prompt", 500)),
                   "--target", "at most 256")
    assert not out.exists()


def test_corpus_directory_prompts(models, tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    for i in range(6):
        (corpus / ("sub" if i % 2 else "") / f"f{i}.txt").write_text(
            "".join(f"line {j} of file {i}: some text\n" for j in range(40)))
    (corpus / ".hidden").write_text("never read")
    target, draft, _ = models
    out = tmp_path / "out"
    r = invoke("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
               "--corpus", corpus, "--prompt-len", 20, "--train-prompts", 3, "--valid-prompts",
               2, "--test-prompts", 2, "--blocks-per-prompt", 2, "--context-len", 40,
               "--out", out)
    assert r.exit_code == 0, r.output
    ts = T.load(out / "valid.npz")
    assert ts.meta["prompts"]["files"] == 6 and len(ts) == 2 * 2 * 4
    first = ts.columns["context"][ts.columns["position"] == 0]
    assert ((first >= 0).sum(axis=1) == 20).all()         # prompts of --prompt-len tokens
    text = bytes(first[0][first[0] >= 0].astype(np.uint8).tolist()).decode()
    assert "of file" in text or "line" in text
    one_line_error(invoke("data", "trace", "--backend", "hf", "--target", target, "--draft",
                          draft, "--corpus", tmp_path / "nowhere", "--out", tmp_path / "o2"),
                   "corpus directory not found")


def test_recording_reports_drafted_tokens_per_second_and_eta(models, tmp_path, monkeypatch):
    """Not a terminal: plain progress lines (here after every block) with the rate and
    the ETA, on stderr only; one line per split at the end either way."""
    from evolve.cli import render
    monkeypatch.setattr(render._Meter, "PLAIN_EVERY", 0.0)
    r = invoke(*trace_args(models, tmp_path / "out"))
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("train: ") and "eta" in x]
    assert lines and all("drafted tokens/s" in x for x in lines), r.stderr
    rows = len(T.load(tmp_path / "out" / "train.npz"))
    assert lines[-1].startswith(f"train: {rows}/{rows} ")
    assert len(lines) == BLOCKS * -(-rows // (BLOCKS * G * 5))     # every block of every batch
    assert "drafted tokens" not in r.stdout


def test_each_split_line_reports_its_own_time_and_rate(models, monkeypatch):
    """Every split takes 100 s on a fake clock: each split's line says 100 s and its own
    rows per 100 s (the time so far would say 100, 200, 300 s)."""
    now = [0.0]
    monkeypatch.setattr(hf.time, "perf_counter", lambda: now[0])
    real = hf.hf_decode.decode

    def slow(*args, **kwargs):
        now[0] += 100.0
        return real(*args, **kwargs)
    monkeypatch.setattr(hf.hf_decode, "decode", slow)
    target, draft, prompts = models
    cfg = hf.HFTraceConfig(target=str(target), draft=str(draft), prompts_file=str(prompts),
                           block_size=G, top_k=K, blocks_per_prompt=1, context_len=CTX,
                           batch_size=5)
    said = []
    out = hf.build_splits(cfg, progress=said.append)
    lines = [s for s in said if s.split(":")[0] in out]
    assert lines == [f"{s}: {len(ts)} rows (100.0 s recording, {len(ts) / 100:.0f} drafted "
                     "tokens/s)" for s, ts in out.items()], said


def test_on_a_terminal_the_progress_is_a_live_bar_with_rate_and_eta():
    import io

    from rich.console import Console

    from evolve.cli import render
    term = render.Terminal()
    buf = io.StringIO()
    term.err = Console(file=buf, force_terminal=True, width=120)
    with term.meter("valid", 96, "drafted tokens") as m:
        for _ in range(8):
            m.advance(12)
    shown = buf.getvalue()
    assert "valid" in shown and "96/96" in shown and "drafted tokens/s" in shown
    assert "eta" in shown
