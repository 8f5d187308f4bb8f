"""The n-gram pair, trace generation, schema v2 storage and validation."""

import collections
import dataclasses
import json
import math
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from evolve.data import tokens as data
from evolve.data.decode import entropy
from evolve.data.sources import ngram_lm as lm
from evolve.freerun import simulate
from evolve.data import decode as DEC
from evolve.data import traces as T
from evolve.data.sources import ngram as NG
from evolve.data.tokens import DataError
from heuristics import baselines as HB
from tests import tracekit

# ------------------------------------------------------------------ corpus

def test_corpus_rule_top_level_sorted_no_build_files():
    files = lm.corpus_files()
    names = [f.name for f in files]
    assert names == sorted(names) and len(names) > 100
    assert all(f.parent == lm.corpus_dir() and f.suffix == ".py" for f in files)
    assert not any(n.startswith("_sysconfigdata") for n in names)


def test_split_files_partition_is_seeded():
    a = lm.split_files(50, 1, [0.8, 0.1, 0.1])
    b = lm.split_files(50, 1, [0.8, 0.1, 0.1])
    c = lm.split_files(50, 2, [0.8, 0.1, 0.1])
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert sorted(np.concatenate(a).tolist()) == list(range(50))
    assert [len(x) for x in a] == [40, 5, 5]


# ------------------------------------------------------------ Kneser-Ney

def _naive_kn(docs, order, history, V=256):
    """Interpolated Kneser-Ney by dictionaries, straight from the formula."""
    grams = [collections.Counter() for _ in range(order + 1)]
    for d in docs:
        for k in range(1, order + 1):
            for i in range(len(d) - k + 1):
                grams[k][d[i:i + k]] += 1
    counts = {order: grams[order]}
    for k in range(order - 1, 0, -1):        # continuation counts from the order above
        c = collections.Counter()
        for g in counts[k + 1]:
            c[g[1:]] += 1
        counts[k] = c

    def disc(c):
        n1 = sum(1 for v in c.values() if v == 1)
        n2 = sum(1 for v in c.values() if v == 2)
        return 0.5 if n1 == 0 else min(max(n1 / (n1 + 2 * n2), 0.05), 0.95)

    D = {k: disc(counts[k]) for k in counts}

    def prob(w, h, k):
        c = counts[k]
        if k == 1:
            tot = sum(c.values())
            return (max(c.get(bytes([w]), 0) - D[1], 0) + D[1] * len(c) / V) / tot
        lower = prob(w, h[1:], k - 1)
        ent = {g: v for g, v in c.items() if g[:-1] == h}
        if not ent:
            return lower
        tot = sum(ent.values())
        return (max(ent.get(h + bytes([w]), 0) - D[k], 0) + D[k] * len(ent) * lower) / tot

    h = bytes(history[-(order - 1):]) if order > 1 else b""
    return np.array([prob(w, h, order) for w in range(V)])


def test_kneser_ney_matches_the_naive_formula():
    docs = [b"abracadabra abracadabra cadabra", b"the cat sat on the mat; the rat"]
    model = lm.NGramLM.train(docs, 3)
    for hist in (b"ab", b"ra", b"e ", b"zz", b"t;", b"qa"):
        got = model.probs(np.frombuffer(hist, np.uint8))
        want = _naive_kn(docs, 3, hist)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-15), hist
    assert abs(model.probs(np.frombuffer(b"ab", np.uint8)).sum() - 1) < 1e-12


def test_models_are_normalised_positive_and_deterministic():
    p = tracekit.pair()
    ctx = tracekit.split("test").context[:200]
    for m in (p.target, p.draft):
        P = m.probs(ctx)
        assert P.shape == (200, 256)
        assert (P > 0).all() and np.abs(P.sum(axis=1) - 1).max() < 1e-12
    again = NG.build_pair(tracekit.TINY)
    assert np.array_equal(again.target.probs(ctx), p.target.probs(ctx))
    assert np.array_equal(again.draft.probs(ctx), p.draft.probs(ctx))
    assert again.describe() == p.describe()


def test_temperature_is_power_and_renormalise():
    m = tracekit.pair().target
    ctx = tracekit.split("test").context[:50]
    P1 = m.probs(ctx)
    P2 = m.with_temperature(0.5).probs(ctx)
    want = P1 ** 2 / (P1 ** 2).sum(axis=1, keepdims=True)
    assert np.allclose(P2, want, rtol=1e-9, atol=1e-300)


def test_target_beats_draft_on_held_out_text():
    p = tracekit.pair()
    doc = p.corpus.docs[p.pools["test"][0]]
    assert lm.cross_entropy(p.target, doc, limit=5000) < lm.cross_entropy(p.draft, doc, limit=5000)


def test_files_are_split_disjointly():
    p = tracekit.pair()
    groups = [set(p.lm_files.tolist())] + [set(p.pools[s].tolist()) for s in T.SPLITS]
    assert sum(len(g) for g in groups) == len(p.corpus)
    assert len(set().union(*groups)) == len(p.corpus)
    assert set(p.draft_files.tolist()) <= groups[0]


# ------------------------------------------------------------------ traces

def test_trace_build_is_deterministic_bytes(tmp_path):
    a = tracekit.split("valid")
    b = NG.build_split(NG.build_pair(tracekit.TINY), "valid", batch=7)   # another batching
    T.save(a, tmp_path / "a.npz")
    T.save(b, tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    c = NG.build_split(NG.build_pair(dataclasses.replace(tracekit.TINY, seed=4)), "valid")
    assert not np.array_equal(a.draft_prob, c.draft_prob[:len(a)])


def test_trace_shape_and_meaning():
    ts = tracekit.split("valid")
    cfg = tracekit.TINY
    g, k, C = cfg.block_size, cfg.top_k, cfg.context_len
    assert len(ts) == cfg.valid_prompts * cfg.blocks_per_prompt * g
    assert ts.cand_token.shape == (len(ts), k) and ts.context.shape == (len(ts), C)
    assert ts.meta["format_version"] == 4 and ts.has_ranks
    assert ts.meta["models"]["python_version"] == lm.python_version()
    # within a block the context slides over the drafted bytes
    blk = ts.context.reshape(-1, g, C)
    tok = ts.token.reshape(-1, g)
    for j in range(1, g):
        assert np.array_equal(blk[:, j, :-1], blk[:, j - 1, 1:])
        assert np.array_equal(blk[:, j, -1], tok[:, j - 1])
    # across blocks: accepted prefix, then one byte; position advances by n_acc + 1
    acc = ts.baseline_accepts.reshape(-1, g)
    n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
    seq = ts.sequence.reshape(-1, g)[:, 0]
    pos = ts.position.reshape(-1, g)[:, 0]
    same = seq[1:] == seq[:-1]
    assert np.array_equal(pos[1:][same], (pos[:-1] + n_acc[:-1] + 1)[same])
    for b in np.flatnonzero(same)[:200]:
        m = min(n_acc[b], C - 1)
        if m:
            assert np.array_equal(blk[b + 1, 0, C - 1 - m:C - 1], tok[b, n_acc[b] - m:n_acc[b]])
    assert (ts.position[ts.block_index == 0] == ts.block_position[ts.block_index == 0]).all()


def test_recorded_probabilities_are_the_models():
    p = tracekit.pair()
    ts = tracekit.split("valid")
    rows = np.arange(0, len(ts), 7)
    P = p.target.probs(ts.context[rows])
    Q = p.draft.probs(ts.context[rows])
    r = np.arange(rows.size)
    assert np.array_equal(P[r, ts.token[rows]], ts.target_prob[rows])
    assert np.array_equal(Q[r, ts.token[rows]], ts.draft_prob[rows])
    assert np.array_equal(np.take_along_axis(Q, ts.cand_token[rows].astype(np.int64), 1),
                          ts.cand_draft_prob[rows])
    assert np.array_equal(np.take_along_axis(P, ts.cand_token[rows].astype(np.int64), 1),
                          ts.cand_target_prob[rows])
    assert np.array_equal(P.max(axis=1), ts.p_max[rows])
    assert np.array_equal(np.argmax(P, axis=1), ts.target_top[rows])
    assert np.allclose(entropy(P), ts.target_entropy[rows], rtol=0, atol=1e-12)
    plus = P > Q
    tail = np.ones_like(plus)
    np.put_along_axis(tail, ts.cand_token[rows].astype(np.int64), False, axis=1)
    assert np.allclose((P * (tail & plus)).sum(1), ts.tail_excess_target_prob[rows], atol=1e-15)
    assert np.allclose((Q * (tail & plus)).sum(1), ts.tail_excess_draft_prob[rows], atol=1e-15)
    assert np.allclose((Q * tail).sum(1), ts.tail_draft_prob[rows], atol=1e-15)


def test_rejections_resample_from_the_residual():
    """The byte after a rejection has p > q at the rejected position."""
    p = tracekit.pair()
    ts = tracekit.split("valid")
    g, C = tracekit.TINY.block_size, tracekit.TINY.context_len
    acc = ts.baseline_accepts.reshape(-1, g)
    n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
    seq = ts.sequence.reshape(-1, g)[:, 0]
    b = np.flatnonzero((n_acc < g)[:-1] & (seq[1:] == seq[:-1]))
    ctx = ts.context.reshape(-1, g, C)[b, n_acc[b]]
    y = ts.context.reshape(-1, g, C)[b + 1, 0, -1].astype(np.int64)
    r = np.arange(b.size)
    assert b.size > 50
    assert (p.target.probs(ctx)[r, y] > p.draft.probs(ctx)[r, y]).all()


def test_standard_rule_redecoding_reproduces_the_trace():
    """The decoder with the standard scalar rule (as simulations run it) makes
    exactly the recorded decisions: same uniforms, same accepts, same bytes."""
    pair = tracekit.pair()
    ts = tracekit.split("test")
    prompts, rngs = NG.prompt_starts(pair, "test")
    _, accepted = DEC.decode(pair, prompts, rngs, tracekit.TINY.blocks_per_prompt,
                           rule=simulate.as_rule(HB.standard_rejection), record=False)
    g = tracekit.TINY.block_size
    acc = ts.baseline_accepts.reshape(-1, g)
    n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
    assert np.array_equal(accepted.reshape(-1), n_acc)


def test_v2_split_is_a_v1_split(tmp_path):
    ts = tracekit.split("valid")
    for s in T.SPLITS:
        T.save(tracekit.split(s), tmp_path / f"{s}.npz")
    v1 = data.load_npz(tmp_path / "valid.npz")
    view = ts.dataset()
    for f in data.FIELDS:
        assert np.array_equal(getattr(v1, f), getattr(view, f)), f
    assert len(data.load_split(tmp_path, "train")) == len(tracekit.split("train"))
    back = T.load(tmp_path / "valid.npz")
    for f in T.ALL_FIELDS:
        assert np.array_equal(back.columns[f], ts.columns[f]), f
    assert T.is_trace_file(tmp_path / "valid.npz")
    from evolve.cli import main
    res = CliRunner().invoke(main, ["benchmark", "--data", str(tmp_path), "--repeats", "1",
                                    "--heuristic", "standard_rejection", "--json"])
    assert res.exit_code == 0, res.output
    assert "standard_rejection" in res.output


def test_v1_file_is_not_a_trace_file(tmp_path, small_splits):
    data.save_npz(small_splits["valid"], tmp_path / "v1.npz")
    assert not T.is_trace_file(tmp_path / "v1.npz")
    with pytest.raises(DataError, match=r"v1\.npz: format_version 1 is not supported"):
        T.load(tmp_path / "v1.npz")


# -------------------------------------------------------------- validation

_corrupt = tracekit.saved_with


def _set(i, v, col=None):
    def f(a):
        if col is None:
            a[i] = v
        else:
            a[i, col] = v
        return a
    return f


@pytest.mark.parametrize("field, fn, pattern", [
    ("cand_draft_prob", _set(5, 1e-9, 0), r"field 'cand_draft_prob' row 5: candidates must be sorted"),
    ("tail_draft_prob", _set(9, 0.5), r"field 'tail_draft_prob' row 9: candidates \+ tail"),
    ("block_position", _set(2, 0), r"field 'block_position' row 2:"),
    ("draft_cand", _set(0, -1), r"field 'draft_cand' row 0:"),
    ("top_token_match", lambda a: ~a, r"field 'top_token_match' row 0:"),
    ("baseline_accepts", lambda a: ~a, r"field 'baseline_accepts' row 0:"),
    ("cand_target_prob", _set(3, float("nan"), 2), r"field 'cand_target_prob' row 3: not finite"),
    ("p_max", _set(7, 1e-6), r"field 'p_max' row 7:"),
    ("sequence", _set(1, 99), r"field 'sequence' row 0: differs within one block"),
    ("token", lambda a: a.astype(np.int32), r"field 'token' must be int64"),
    ("context", lambda a: a[:, :2], r"field 'context' has shape"),
    ("target_rank", _set(4, -1), r"field 'target_rank' row 4: a rank must be 0\.\.255"),
    ("cand_target_rank", _set(6, 256, 1), r"field 'cand_target_rank' row 6: a rank must be"),
    ("target_rank", lambda a: np.where(a == 0, 1, a),
     r"field 'target_rank' row \d+: rank 0 is the target's top token, and only it"),
    ("cand_target_rank", lambda a: np.where(a > 0, a + 1, a),
     r"field 'target_rank' row \d+: differs from its candidate's rank"),
    ("cand_target_rank", lambda a: a.astype(np.int64), r"field 'cand_target_rank' must be int32"),
])
def test_validation_names_file_field_and_row(tmp_path, field, fn, pattern):
    path = _corrupt(tmp_path, field, fn)
    with pytest.raises(DataError, match=r"bad\.npz: " + pattern):
        T.load(path)


def test_candidate_ranks_follow_the_target_s_probabilities(tmp_path):
    """Two candidates' ranks swapped (neither the drafted token, the target prefers
    one): the file is refused naming the field and the row."""
    ts = tracekit.split("test")
    c = ts.columns
    cp, crk, dc = c["cand_target_prob"], c["cand_target_rank"], c["draft_cand"]
    r, i, j = next((r, i, j) for r in range(len(dc)) for i in range(cp.shape[1])
                   for j in range(cp.shape[1]) if i != dc[r] and j != dc[r]
                   and cp[r, i] > cp[r, j] and crk[r, i] > 0)

    def swap(a):
        a[r, i], a[r, j] = a[r, j], a[r, i]
        return a
    with pytest.raises(DataError, match=rf"bad\.npz: field 'cand_target_rank' row {r}: a "
                                        "candidate the target finds more probable"):
        T.load(_corrupt(tmp_path, "cand_target_rank", swap))


def test_a_split_without_ranks_is_schema_v3_and_loads(tmp_path):
    """Traces recorded before the ranks (schema v3) still load, without them, and a
    split with one rank field only is refused when it is written."""
    ts = tracekit.split("test")
    cols = {f: v for f, v in ts.columns.items() if f not in T.V4_FIELDS}
    T.save(T.TraceSplit(cols, dict(ts.meta), "v3"), tmp_path / "v3.npz")
    back = T.load(tmp_path / "v3.npz")
    assert back.meta["format_version"] == 3 and not back.has_ranks
    assert back.fields == T.V3_ALL_FIELDS
    with pytest.raises(DataError, match="field 'cand_target_rank' is missing"):
        T.save(T.TraceSplit({**cols, "target_rank": ts.columns["target_rank"]},
                            dict(ts.meta), "half"), tmp_path / "half.npz")


def test_missing_and_extra_members(tmp_path):
    path = _corrupt(tmp_path, "token", lambda a: a)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    for drop, add, pattern in [("v2/p_max", None, "field 'p_max' is missing"),
                               (None, "v2/extra", "member 'v2/extra' is not part of schema v4")]:
        out = tmp_path / "m.npz"
        with zipfile.ZipFile(out, "w") as zf:
            for n, b in members.items():
                if n != drop:
                    zf.writestr(n, b)
            if add:
                zf.writestr(add, members["v2/p_max"])
        with pytest.raises(DataError, match=pattern):
            T.load(out)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="junk.npz: not a readable trace file"):
        T.load(tmp_path / "junk.npz")
    meta = json.loads(members["meta.json"])
    assert meta["config"] == dataclasses.asdict(tracekit.TINY)
    assert NG.TraceConfig.from_dict(meta["config"]) == tracekit.TINY


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="top_k=0"):
        NG.TraceConfig(top_k=0).validate()
    with pytest.raises(ValueError, match="unknown key 'g'"):
        NG.TraceConfig.from_dict({"g": 3})


def test_sampling_helpers():
    P = np.array([[0.0, 0.5, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]])
    assert DEC.sample_rows(P, np.array([0.0, 0.999999])).tolist() == [1, 0]
    assert DEC.sample_rows(P, np.array([0.5, 0.3])).tolist() == [3, 0]
    assert DEC.sample_rows(P, np.array([1.0 - 2 ** -53, 0.0])).tolist() == [3, 0]
    p = np.array([[0.2, 0.8]])
    assert np.array_equal(DEC.residual(p, p.copy()), p)          # p == q: fall back to p
    assert np.allclose(DEC.residual(p, np.array([[0.5, 0.5]])), [[0.0, 0.3]])
    assert math.isclose(float(DEC.residual(p, np.array([[0.5, 0.5]])).sum()), 0.3)


def test_each_split_reports_its_own_time_not_the_time_so_far(monkeypatch):
    """Progress of `evolve data trace`: every split takes 100 s on a fake clock, and
    each line says 100 s (the time so far would say 100, 200, 300)."""
    now = [0.0]
    monkeypatch.setattr(NG.time, "perf_counter", lambda: now[0])
    real = NG.build_split

    def slow(pair, split):
        now[0] += 100.0
        return real(pair, split)
    monkeypatch.setattr(NG, "build_split", slow)
    said = []
    NG.build_splits(tracekit.TINY, progress=said.append)
    assert [s for s in said if s.startswith(NG.SPLITS)] == [
        f"{s}: {n} rows (100.0 s)" for s, n in zip(NG.SPLITS, [
            int(x.split()[1]) for x in said if x.startswith(NG.SPLITS)])]


def test_the_default_traces_have_the_sums_the_data_page_gives(tmp_path):
    """datasets/TRACES.md gives the sha256 sums of `evolve data trace` with the default
    settings for one corpus (its CRC-32) and NumPy version: where this installation has
    both, a recording here has exactly those sums."""
    import hashlib
    import re
    from evolve.io import paths
    page = (paths.DATA_DIR / "TRACES.md").read_text()
    crc = re.search(r"CRC-32 `([0-9a-f]{8})`", page).group(1)
    numpy_version = re.search(r"NumPy (\d+\.\d+\.\d+)", page).group(1)
    sums = dict((name, digest) for digest, name in
                re.findall(r"^([0-9a-f]{64})  (\w+\.npz)", page, flags=re.M))
    assert set(sums) == {"train.npz", "valid.npz", "test.npz"}
    if np.__version__ != numpy_version:
        pytest.skip(f"the page's sums are for NumPy {numpy_version}, not {np.__version__}")
    from evolve.cli import main
    r = CliRunner().invoke(main, ["data", "trace", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    models = json.loads(zipfile.ZipFile(tmp_path / "test.npz").read("meta.json"))["models"]
    if models["corpus_crc32"] != crc:
        pytest.skip(f"this Python's corpus is {models['corpus_crc32']}, the page's {crc}")
    for name, digest in sums.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest, name
