"""The input registry (evolve/lang/features.py) and its one computation (evolve/data/inputs.py).

Every input is declared once and computed once, at drafted slots (numpy, torch) and from a
trace's columns; these tests hold each computation to a slow reference written row by row
from the definitions, and the free-running decoder's ``mismatches`` to a recount from
the decoded text.
"""

import math

import numpy as np
import pytest

from evolve.data import inputs as I
from evolve.lang import features as FT
from evolve.lang import primitives as P

RNG = np.random.default_rng(11)


def _dists(M, V, rng):
    p = rng.dirichlet(np.ones(V) * 0.3, size=M)
    q = rng.dirichlet(np.ones(V) * 0.3, size=M)
    return np.maximum(p, 1e-300), np.maximum(q, 1e-300)


def test_every_input_is_declared_once_and_computed_both_ways():
    names = [i.name for i in FT.REGISTRY]
    assert len(set(names)) == len(names) == len(P.ALL_INPUT_NAMES) <= P.MAX_INPUTS
    assert set(I.AT_SLOTS) == set(I.FROM_COLUMNS) == set(names)
    assert [P.INPUT_INDEX[n] for n in names] == list(range(len(names)))   # opcode = row
    # a rule's signature: its world's groups and the groups it reads, with their needs
    from evolve.lang import treeio
    assert FT.signature_of(treeio.parse("pmin(1.0, ahead)")) == \
        FT.names_of("token", "trace", "slot", "lookahead")
    assert FT.signature_of(treeio.parse("pmin(1.0, logp_margin)")) == \
        FT.names_of("token", "trace", "answer")


def _slow_at_slots(p, q, x, g, before):
    """Each new input at each drafted slot, one row at a time from its definition."""
    M, V = p.shape
    out = {"logp_margin": [], "next_matches": [], "mismatches": []}
    for i in range(M):
        out["logp_margin"].append(math.log(p[i].max()) - math.log(p[i, x[i]]))
        b, j = divmod(i, g)
        later = 0
        for m in range(j + 1, g):
            r = b * g + m
            if x[r] != int(np.argmax(p[r])):
                break
            later += 1
        out["next_matches"].append(later)
        earlier = sum(x[b * g + m] != int(np.argmax(p[b * g + m])) for m in range(j))
        out["mismatches"].append(before[b] + earlier)
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


@pytest.mark.parametrize("g", [1, 3, 5])
def test_new_inputs_at_slots_equal_a_slow_reference(g):
    B, V = 7, 13
    p, q = _dists(B * g, V, RNG)
    x = RNG.integers(0, V, B * g)
    x[::2] = np.argmax(p[::2], axis=1)            # many matches, some runs of them
    before = RNG.integers(0, 4, B).astype(np.float64)
    s = I.Slots(p, q, x, np.zeros(B * g), np.tile(np.arange(g), B), g=g,
                history={"mismatches": np.repeat(before, g)})
    got = I.at_slots(s, ("logp_margin", "next_matches", "mismatches"))
    want = _slow_at_slots(p, q, x, g, before)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0, err_msg=name)
    # without the history the decoder keeps, mismatches is not made up
    assert "mismatches" not in I.at_slots(I.Slots(p, q, x, np.zeros(B * g),
                                                  np.tile(np.arange(g), B), g=g))


def test_new_inputs_in_torch_are_the_numpy_bits():
    torch = pytest.importorskip("torch")
    from evolve.data.sources.hf import device as DV
    B, g, V, k = 5, 4, 17, 3
    p, q = _dists(B * g, V, RNG)
    X = RNG.integers(0, V, (B, g))
    X[:, ::2] = np.argmax(p.reshape(B, g, V)[:, ::2], axis=2)
    before = RNG.integers(0, 3, B).astype(np.float64)
    T = torch.from_numpy
    F = DV.block_features(T(p), T(q), T(X), torch.zeros(B, dtype=torch.int64), k, T(before))
    s = I.Slots(p, q, X.reshape(-1), np.zeros(B * g, np.int64), np.tile(np.arange(g), B), g=g,
                history={"mismatches": np.repeat(before, g)})
    want = I.at_slots(s)
    for name in ("logp_margin", "next_matches", "mismatches"):
        np.testing.assert_array_equal(F[name].numpy(), want[name], err_msg=name)


def _slow_recorded(c, g, greedy):
    """next_matches and mismatches along a recorded path, row by row."""
    n = len(c["token"])
    match = np.asarray(c["token"]) == np.asarray(c["target_top"])
    kept = match if greedy else np.asarray(c["baseline_accepts"], dtype=bool)
    nm, mm = np.zeros(n), np.zeros(n)
    count, seq = 0, None
    for b in range(n // g):
        rows = range(b * g, b * g + g)
        if c["sequence"][b * g] != seq:
            seq, count = c["sequence"][b * g], 0
        for j, r in enumerate(rows):
            later = 0
            for m in range(j + 1, g):
                if not match[b * g + m]:
                    break
                later += 1
            nm[r] = later
            mm[r] = count + sum(not match[b * g + m] for m in range(j))
        for r in rows:                     # what the recorded rule kept of this block
            if not kept[r]:
                break
            count += int(not match[r])
    return nm, mm


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_new_inputs_from_a_recorded_task_split_equal_a_slow_reference(
        mode, task_greedy_small, task_pair_small, tmp_path_factory):
    from evolve.data.sources.task import record
    if mode == "greedy":
        d = task_greedy_small
    else:
        d = tmp_path_factory.mktemp("task-sample-inputs")
        record.save(record.record_split(task_pair_small, "valid", "sample", 0), d)
    ts = record.load(d, "valid")
    c, meta = ts.traces.columns, ts.meta
    cols = I.readable(c, meta)
    g = int(meta["block_size"])
    nm, mm = _slow_recorded(c, g, mode == "greedy")
    np.testing.assert_array_equal(I.FROM_COLUMNS["next_matches"].drafted(cols), nm)
    np.testing.assert_array_equal(I.FROM_COLUMNS["mismatches"].drafted(cols), mm)
    want = np.log(c["p_max"]) - np.log(c["target_prob"])
    np.testing.assert_allclose(I.FROM_COLUMNS["logp_margin"].drafted(cols), want, rtol=1e-12)
    assert (nm > 0).any() and (mm > 0).any()
    if mode == "sample":            # the lossless rule keeps mismatches when it samples
        assert (np.diff(mm) != 0).any()


def _decoded_mismatches(pair, hist, lens, C):
    """Emitted tokens that are not the target's argmax at their place, per problem:
    recounted from the decoded text (greedy: every correction and bonus is the argmax,
    so these are exactly the accepted mismatching drafts)."""
    out = []
    for i in range(hist.shape[0]):
        text = hist[i, :lens[i]]
        H = np.stack([text[j - C:j] for j in range(C, lens[i])])
        top = np.argmax(pair.target.probs(H), axis=1)
        out.append(int((text[C:lens[i]] != top).sum()))
    return np.array(out)


def test_the_decoder_tracks_accepted_mismatches_along_each_answer(task_pair_small):
    """Greedy decoding with a rule that keeps a mismatch only while the answer has none
    (``mismatches`` < 0.5) keeps at most one per answer; keeping every mismatch keeps
    more. Fails if the decoder's count is not carried across blocks or misses the
    block's earlier drafts."""
    from evolve.rules.adapters import tree_rule
    pair = task_pair_small
    H, rngs = pair.prompts("valid", 12)
    C = H.shape[1]
    counts = {}
    for name, tree in (("once", "ite(lt(mismatches, 0.5), 1.0, 0.0)"), ("always", "1.0")):
        _, _, hist, lens = pair.decode(H, rngs, pair.max_new("valid"), None,
                                       rule=tree_rule(tree), record=False, history=True,
                                       greedy=True, end=pair.end, max_tokens=pair.max_tokens)
        counts[name] = _decoded_mismatches(pair, hist, lens, C)
    assert counts["once"].max() == 1 and counts["always"].max() > 1, counts


def test_fly_keeps_a_mismatch_the_window_confirms():
    """FLy's rule (fly, W): in a block of greedy drafts, a mismatch is kept when the next
    W - 1 drafts match the target's argmax (the pattern (miss, match, ..., match) of its
    source), and the block's last W - 1 drafts keep the strict test."""
    from evolve.rules.adapters import named_rule
    g, V = 6, 5
    for W in (2, 3):
        rule, _ = named_rule("fly", W, greedy=True)
        for pattern in range(1 << g):
            match = np.array([(pattern >> j) & 1 for j in range(g)], dtype=bool)
            p = np.full((g, V), 0.1)
            p[:, 0] = 0.6
            x = np.where(match, 0, 1)
            s = I.Slots(p, p, x, np.arange(g), np.arange(g), g=g,
                        history={"mismatches": np.zeros(g)})
            h = rule.many(I.at_slots(s))
            a = np.where(match, 1.0, np.clip(h, 0, 1))
            want = match.copy()
            for j in range(g - W + 1):
                if not match[j] and match[j + 1:j + W].all():
                    want[j] = True
            assert np.array_equal(a > 0.5, want), (W, match.astype(int), a)


@pytest.mark.parametrize("fmt", ["hf", "vllm"])
def test_every_exported_input_is_the_registry_s_computation(tmp_path, fmt):
    """An engine export computes each input it provides from its registry expression;
    for a rule that reads every one of them, the exported glue's inputs at each drafted
    position are the decoders' (``evolve.data.inputs.at_slots``), to rounding."""
    torch = pytest.importorskip("torch")
    from evolve.export import formats
    from tests.test_faithful import export, scope
    names = formats.provides(fmt)
    leaf = [f"ite({n}, 1.0, 0.0)" if FT.BY_NAME[n].type is bool else n for n in names]
    tree = "pmin(1.0, " + "add(" * (len(leaf) - 1) + leaf[0] + "".join(
        f", {n})" for n in leaf[1:]) + ")"
    g, V = 4, 23
    mod = export(tmp_path, fmt, scope(k=V - 1, vocab=V, g=g), tree, name=f"all_{fmt}")
    assert set(mod.INPUTS) >= set(names)
    p, q = _dists(g, V, RNG)
    x = RNG.integers(0, V, g)
    x[1] = np.argmax(p[1])
    x[2], x[3] = V - 1, 2          # past the test tokenizer's ids; a number
    classes = None
    if fmt == "hf":
        assert "token_class" in names       # from the tokenizer install() is given
        ids = torch.as_tensor(np.concatenate([[1, 2, 3], x]))[None]
        with pytest.raises(ValueError, match="tokenizer"):
            mod.candidate_features(ids, torch.as_tensor(q)[None], torch.as_tensor(p)[None],
                                   g, 3)
        mod.use_tokenizer(_Tokenizer())     # 17 tokens: ids 17 .. 22 are other
        classes = np.array(I.VC.tokenizer_table(_Tokenizer(), V), dtype=np.float64)
        f = mod.candidate_features(ids, torch.as_tensor(q)[None], torch.as_tensor(p)[None],
                                   g, 3)
    else:
        f = mod.token_features(torch.as_tensor(x), torch.as_tensor(q), torch.as_tensor(p),
                               torch.as_tensor([g]))
    want = I.at_slots(I.Slots(p, q, x, np.arange(g), np.arange(g), g=g, classes=classes))
    for name in names:
        np.testing.assert_allclose(np.asarray(f[name], dtype=np.float64), want[name],
                                   rtol=1e-12, atol=1e-15, err_msg=name)


# ------------------------------------------------------------ the target's rank

def _tied(M, V, rng):
    """Distributions with ties (probabilities on a coarse grid), where a rank counts
    only the strictly more probable tokens."""
    p, q = _dists(M, V, rng)
    p = np.round(p * 8) + 1.0
    return p / p.sum(axis=1, keepdims=True), q


def test_target_rank_at_slots_and_recorded_equals_a_count():
    """target_rank: how many tokens the target finds strictly more probable than the
    drafted one, counted row by row; at slots for the drafted tokens, for candidates
    and for the whole vocabulary, and in the recorder's columns (drafted and
    candidates) of a block."""
    from evolve.data import decode as DC
    B, g, V, k = 6, 3, 11, 4
    p, q = _tied(B * g, V, RNG)
    X = RNG.integers(0, V, (B, g))
    X[:, 0] = np.argmax(p.reshape(B, g, V)[:, 0], axis=1)
    x = X.reshape(-1)

    def slow(i, tok):
        return sum(p[i, y] > p[i, tok] for y in range(V))
    want = np.array([slow(i, x[i]) for i in range(B * g)], dtype=np.float64)
    s = I.Slots(p, q, x, np.zeros(B * g), np.tile(np.arange(g), B), g=g)
    np.testing.assert_array_equal(I.at_slots(s, ("target_rank",))["target_rank"], want)
    assert (want[::g] == 0).all() and (want > 0).any() and len(np.unique(p)) < p.size
    every = I.at_slots(I.Slots(p, q, None, np.zeros(B * g), np.tile(np.arange(g), B)),
                       ("target_rank",))["target_rank"]
    np.testing.assert_array_equal(every, [[slow(i, y) for y in range(V)]
                                          for i in range(B * g)])
    cs = DC.candidate_summary(p, q, k)
    px = np.take_along_axis(p, x[:, None], axis=1)[:, 0]
    qx = np.take_along_axis(q, x[:, None], axis=1)[:, 0]
    rec = DC.block_records(p, q, X, qx.reshape(B, g), px.reshape(B, g), np.zeros((B, g)),
                           np.zeros((B, g), bool), cs, np.zeros(B, np.int64), np.arange(B), 0)
    np.testing.assert_array_equal(rec["target_rank"], want)
    np.testing.assert_array_equal(rec["cand_target_rank"],
                                  [[slow(i, int(t)) for t in cs["cand_token"][i]]
                                   for i in range(B * g)])


def test_target_rank_in_torch_is_the_numpy_bits():
    torch = pytest.importorskip("torch")
    from evolve.data import decode as DC
    from evolve.data.sources.hf import device as DV
    B, g, V, k = 5, 4, 17, 6
    p, q = _tied(B * g, V, RNG)
    X = RNG.integers(0, V, (B, g))
    T = torch.from_numpy
    F = DV.block_features(T(p), T(q), T(X), torch.zeros(B, dtype=torch.int64), k)
    s = I.Slots(p, q, X.reshape(-1), np.zeros(B * g, np.int64), np.tile(np.arange(g), B), g=g)
    np.testing.assert_array_equal(F["target_rank"].numpy(), I.at_slots(s)["target_rank"])
    assert F["target_rank"].dtype == torch.int32
    cs = DC.candidate_summary(p, q, k)
    np.testing.assert_array_equal(F["cand_token"].numpy(), cs["cand_token"])
    np.testing.assert_array_equal(F["cand_target_rank"].numpy(),
                                  I.ranks(p, cs["cand_target_prob"]))


# ------------------------------------------------------------ the token's class

class _Tokenizer:
    """A tokenizer of a few texts (special tokens decode to nothing when skipped)."""
    TEXTS = ["Paris", " the", " 12", "3.5", ".", " ,", "\n", "  ", "<|end|>", "x1", "+",
             " é", "1,000", "?!", "", "Ġ", " \ufffd"]

    def __len__(self):
        return len(self.TEXTS)

    def decode(self, ids, skip_special_tokens=False):
        (i,) = ids
        t = self.TEXTS[i]
        return "" if skip_special_tokens and t.startswith("<|") else t


def test_token_class_of_a_text_and_of_a_vocabulary():
    """A token's class from its text: word, number, punctuation, other (white space,
    special tokens skipped, empty); a tokenizer's table, ids past it other; the byte
    table, bytes of UTF-8 sequences other; the meta text round trip and its checks."""
    from evolve.data import vocab_class as VC
    want = [0, 0, 1, 1, 2, 2, 3, 3, 3, 0, 2, 0, 1, 2, 3, 0, 3]
    assert [VC.token_class(t) for t in _Tokenizer.TEXTS[:8]] == want[:8]
    assert VC.tokenizer_table(_Tokenizer(), 20) == want + [3, 3, 3]
    b = VC.byte_table()
    assert b[ord("a")] == b[ord("Z")] == 0 and b[ord("7")] == 1 and b[ord(";")] == 2
    assert b[ord(" ")] == b[0] == b[0xC3] == 3 and b.shape == (256,)
    text = VC.to_text(want)
    assert np.array_equal(VC.from_text(text), want) and VC.check_text(text, 17) is None
    assert "has 17 classes; the vocabulary has 18" in VC.check_text(text, 18)
    assert "'4' at token 2" in VC.check_text("0040", 4)
    assert "is list" in VC.check_text(want, 17)


@pytest.mark.parametrize("x_kind", ["drafted", "candidates", "vocabulary"])
def test_token_class_at_slots_is_the_table_in_numpy_and_torch(x_kind):
    """token_class at slots is the vocabulary's class of each token asked (drafted,
    several a slot, or every token), counted here token by token, in numpy and torch."""
    torch = pytest.importorskip("torch")
    from evolve.data.sources.hf.device import OPS
    M, V = 6, 17
    p, q = _dists(M, V, RNG)
    table = np.array(I.VC.tokenizer_table(_Tokenizer(), V), dtype=np.float64)
    x = {"drafted": RNG.integers(0, V, M), "candidates": RNG.integers(0, V, (M, 3)),
         "vocabulary": None}[x_kind]
    tokens = np.broadcast_to(np.arange(V), (M, V)) if x is None else x
    want = np.vectorize(lambda t: I.VC.token_class(_Tokenizer().decode(
        [int(t)], skip_special_tokens=True)))(tokens)
    s = I.Slots(p, q, x, np.arange(M), np.arange(M) % 3, classes=table)
    np.testing.assert_array_equal(I.at_slots(s, ["token_class"])["token_class"], want)
    st = I.Slots(torch.as_tensor(p), torch.as_tensor(q),
                 None if x is None else torch.as_tensor(x), torch.arange(M),
                 torch.arange(M) % 3, ops=OPS, classes=torch.as_tensor(table))
    np.testing.assert_array_equal(I.at_slots(st, ["token_class"])["token_class"].numpy(), want)
    assert "token_class" not in I.at_slots(I.Slots(p, q, x, np.arange(M), np.arange(M) % 3))


def test_recorded_traces_carry_the_byte_classes_and_a_bad_table_is_refused(tmp_path):
    """The n-gram pair's traces carry the byte table in their meta; the input read from
    the columns is the table at each token; a table of the wrong length or with a
    digit above 3 is refused in one line naming the file and the field."""
    from evolve.data import traces as T
    from evolve.data import vocab_class as VC
    from evolve.data.tokens import DataError
    from tests import tracekit
    ts = tracekit.split("valid")
    assert ts.meta[VC.META_KEY] == VC.to_text(VC.byte_table())
    cols = I.readable(ts.columns, ts.meta)
    got = I.FROM_COLUMNS["token_class"].drafted(cols)
    assert [int(v) for v in got] == [VC.token_class(chr(t)) if t < 128 else 3
                                     for t in ts.columns["token"]]
    for bad, why in (("0" * 255, "has 255 classes"),
                     ("5" + "0" * 255, "'5' at token 0")):
        T.save(T.TraceSplit(ts.columns, dict(ts.meta, vocab_classes=bad), "b"),
               tmp_path / "b.npz")
        with pytest.raises(DataError) as e:
            T.load(tmp_path / "b.npz")
        msg = str(e.value)
        assert "b.npz" in msg and "'vocab_classes'" in msg and why in msg and "\n" not in msg


def test_the_decoder_reads_each_drafted_token_s_class(task_pair_small):
    """Greedy decoding with a rule that keeps a mismatching draft only when it is a word
    byte (``token_class`` 0) emits mismatches that are all word bytes, and the converse
    rule only other bytes: recounted from the decoded text. Fails if a decoder reads
    another table, or none."""
    from evolve.data import vocab_class as VC
    from evolve.rules.adapters import tree_rule
    pair = task_pair_small
    H, rngs = pair.prompts("valid", 12)
    C = H.shape[1]
    for tree, word in (("ite(lt(token_class, 0.5), 1.0, 0.0)", True),
                       ("ite(lt(token_class, 0.5), 0.0, 1.0)", False)):
        _, _, hist, lens = pair.decode(H, rngs, pair.max_new("valid"), None,
                                       rule=tree_rule(tree), record=False, history=True,
                                       greedy=True, end=pair.end, max_tokens=pair.max_tokens)
        kept = []
        for i in range(hist.shape[0]):
            text = hist[i, :lens[i]]
            top = np.argmax(pair.target.probs(np.stack([text[j - C:j]
                                                        for j in range(C, lens[i])])), axis=1)
            kept += [int(t) for t in text[C:lens[i]][text[C:lens[i]] != top]]
        classes = VC.byte_table()[kept]
        assert len(kept) > 0 and ((classes == 0) == word).all(), (tree, kept)
