"""Trace schema v2 beyond bytes: vocab_size in meta.json, wide token ids, int32
contexts left-padded with -1; byte-level files without vocab_size load as before."""

import dataclasses

import numpy as np
import pytest

from evolve.data import traces as T
from evolve.data.decode import candidate_summary, top_candidates
from evolve.data.tokens import DataError
from tests import tracekit

WIDE_VOCAB = 50_000


def _widened(vocab=WIDE_VOCAB):
    """The tiny n-gram split as a wide-vocabulary file: int32 ids, int32 contexts."""
    ts = tracekit.split("valid")
    cols = dict(ts.columns)
    cols["cand_token"] = cols["cand_token"].astype(np.int32)
    cols["context"] = cols["context"].astype(np.int32)
    meta = {k: v for k, v in ts.meta.items() if k != "source"}
    # the byte table's classes are of another vocabulary: a widened file has none
    meta.pop("vocab_classes", None)
    return dataclasses.replace(ts, columns=cols, meta={**meta, "vocab_size": vocab})


def test_byte_files_default_to_256_and_keep_uint8(tmp_path):
    ts = tracekit.split("valid")
    assert "vocab_size" not in ts.meta and ts.vocab_size == 256 and ts.backend == "ngram"
    T.save(ts, tmp_path / "v.npz")
    back = T.load(tmp_path / "v.npz")
    assert back.columns["cand_token"].dtype == np.uint8 and back.vocab_size == 256


def test_wide_ids_round_trip(tmp_path):
    ts = _widened()
    T.save(ts, tmp_path / "w.npz")
    back = T.load(tmp_path / "w.npz")
    assert back.vocab_size == WIDE_VOCAB and back.columns["cand_token"].dtype == np.int32
    np.testing.assert_array_equal(back.columns["context"], ts.columns["context"])


@pytest.mark.parametrize("field", ["token", "target_top", "cand_token"])
def test_ids_outside_the_vocabulary_are_named(field):
    ts = _widened()
    a = ts.columns[field].copy()
    a.reshape(len(ts), -1)[3, -1] = WIDE_VOCAB
    with pytest.raises(DataError, match=f"field '{field}' row 3: not a token id"):
        T.validate(dataclasses.replace(ts, columns={**ts.columns, field: a}), "f.npz")
    a.reshape(len(ts), -1)[3, -1] = -1
    with pytest.raises(DataError, match=f"field '{field}' row 3: not a token id"):
        T.validate(dataclasses.replace(ts, columns={**ts.columns, field: a}), "f.npz")


def test_context_padding_only_on_the_left():
    ts = _widened()
    cols = dict(ts.columns)
    ctx = cols["context"].copy()
    ctx[5, :2] = T.CONTEXT_PAD
    T.validate(dataclasses.replace(ts, columns={**cols, "context": ctx}), "f.npz")
    ctx[7, 2] = T.CONTEXT_PAD
    with pytest.raises(DataError, match="field 'context' row 7: expected token ids"):
        T.validate(dataclasses.replace(ts, columns={**cols, "context": ctx}), "f.npz")
    ctx = cols["context"].astype(np.int16)
    with pytest.raises(DataError, match="field 'context' must be uint8 or int32, got int16"):
        T.validate(dataclasses.replace(ts, columns={**cols, "context": ctx}), "f.npz")


def test_bad_vocab_size_in_meta():
    ts = _widened()
    for bad in ("many", 1):
        with pytest.raises(DataError, match="vocab_size"):
            T.validate(dataclasses.replace(ts, meta={**ts.meta, "vocab_size": bad}), "f.npz")


def test_partial_sort_candidates_equal_the_full_sort():
    """Large vocabularies take the k largest by a partial sort: same ids and order as a
    stable full sort when there are no ties at the k-th value."""
    rng = np.random.default_rng(0)
    V, k = 20_000, 16
    q = rng.dirichlet(np.full(V, 0.05), size=6)
    p = rng.dirichlet(np.full(V, 0.05), size=6)
    want = np.argsort(-q, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(top_candidates(q, k), want)
    cs = candidate_summary(p, q, k, token_dtype=np.int32)
    assert cs["cand_token"].dtype == np.int32
    np.testing.assert_allclose(cs["cand_draft_prob"].sum(1) + cs["tail_draft_prob"], 1.0,
                               rtol=0, atol=1e-12)
