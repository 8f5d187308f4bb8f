"""Critical-token labels (evolve.data.labels) on a pair whose answers are known by
construction: the target continues a text by counting up (the next byte is the last
plus one), the answer is the byte at a fixed place of the text; so a substitution
before that place changes the answer (critical) and one after it does not. Also
against a direct one-row-at-a-time continuation, greedy and sampled, on that target
and on one that ignores the history (where shared uniforms leave the answer alone
unless the substitution is the answer itself); the reference catches continuations
that do not share their uniforms, the target's own draw from another uniform, a
generated text cut one token short and one uniform stream for every batch."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from evolve.data import labels as L
from evolve.data.decode import sample_rows

C, END, AT = 12, 10, 6          # context bytes; texts end at 10 bytes; the answer is byte 6


class Counting:
    """Next byte: the last one plus one, with probability 0.9 (the rest spread)."""

    def probs(self, H):
        H = np.asarray(H)
        out = np.full((H.shape[0], 256), 0.1 / 255)
        out[np.arange(H.shape[0]), (H[:, -1].astype(np.int64) + 1) % 256] = 0.9
        return out


PAIR = SimpleNamespace(target=Counting(), context_len=C)


def answer_of(text: bytes):
    return text[AT] if len(text) > AT else None


def done_of(text: bytes) -> bool:
    return len(text) >= END


def _cols(positions, tokens, tops, prompt=()):
    """Rows drafted at text position k (0-based) of the text 1, 2, ..., k (after the
    ``prompt`` bytes)."""
    ctx = np.zeros((len(positions), C), dtype=np.uint8)          # left-padded with 0
    for i, k in enumerate(positions):
        row = list(prompt) + list(range(1, k + 1))
        if row:
            ctx[i, -len(row):] = row
    return {"context": ctx, "token": np.asarray(tokens), "target_top": np.asarray(tops),
            "position": np.asarray(positions),
            "target_prob": np.full(len(tokens), 0.1), "draft_prob": np.full(len(tokens), 0.5)}


@pytest.mark.parametrize("prompt", [(), (200, 201)])
def test_greedy_labels_follow_the_answer(prompt):
    # drafts at text positions 2, 5, 6, 8: the target's argmax is k + 1 there; the
    # answer and the end are read from the generated text alone (the prompt's bytes
    # are not text: they would move the answer's place)
    pos = [2, 5, 6, 8, 3]
    tops = [k + 1 for k in pos]
    toks = [50, 60, 70, 80, tops[4]]                 # the last is the target's own: no label
    labels, cost = L.mine(PAIR, _cols(pos, toks, tops, prompt), answer_of, done_of, True, 12,
                          reuse=False)
    # before byte 6 (positions 2, 5): the answer changes; at 6 itself too; after: not
    assert labels.tolist() == [1, 1, 1, 0, L.UNLABELED]
    assert cost["rows"] == 4 and cost["critical"] == 3 and cost["target_forward_rows"] > 0


def test_sampled_labels_share_the_uniforms_of_both_continuations():
    pos = [2, 8]
    toks, tops = [50, 80], [3, 9]
    cols = _cols(pos, toks, tops)
    labels, _ = L.mine(PAIR, cols, answer_of, done_of, False, 12, seed=4, reuse=False)
    assert labels[1] == 0                        # after the answer's place: never critical
    again, _ = L.mine(PAIR, cols, answer_of, done_of, False, 12, seed=4)
    assert np.array_equal(labels, again)


def test_rows_the_standard_rule_keeps_need_no_label():
    cols = _cols([2, 3], [3, 50], [3, 4])
    cols["target_prob"] = np.array([0.9, 0.9])
    cols["draft_prob"] = np.array([0.5, 0.5])         # p >= q: sampling keeps it
    labels, cost = L.mine(PAIR, cols, answer_of, done_of, False, 12, reuse=False)
    assert labels.tolist() == [L.UNLABELED, L.UNLABELED] and cost["rows"] == 0


class IID:
    """Next byte: independent of the history (bytes 1..4, the answer's place reads
    one), so two continuations that share their uniforms write the same bytes."""

    def probs(self, H):
        out = np.zeros((np.asarray(H).shape[0], 256))
        out[:, 1:5] = [0.4, 0.3, 0.2, 0.1]
        return out


def _direct_labels(pair, cols, greedy: bool, max_new: int, seed: int, batch: int) -> tuple:
    """Each label by a direct loop, one row at a time: the draft's token substituted,
    and the target's argmax (greedy) or its own draw from the row's first uniform
    (sampling) in its place; both continued one token a step, the k-th generated token
    from the row's (k+1)-th uniform, until the text ends or ``max_new`` tokens; critical
    when the answers differ. The uniforms are ``mine``'s with ``uniform_rows=batch``:
    per ``batch`` labelled rows starting at s, ``default_rng((seed, s))``, max_new + 1 a
    row. Also the target rows a miner that computes both texts of every row reads: one
    per generated token, and in sampling one for each own draw."""
    rows = np.flatnonzero(L.could_reject(cols, greedy))
    out, steps = [], []
    for i, r in enumerate(rows):
        s = i - i % batch
        n = min(batch, rows.size - s)
        u = np.random.default_rng((seed, s)).random((n, max_new + 1))[i - s]
        ctx = [int(b) for b in cols["context"][r]]
        k = int(cols["position"][r])
        text0 = ctx[len(ctx) - k:] if k else []
        own = (int(cols["target_top"][r]) if greedy
               else int(sample_rows(pair.target.probs(np.array([ctx])), u[:1])[0]))
        answers, made = [], []
        for first in (int(cols["token"][r]), own):
            hist, text = ctx + [first], text0 + [first]
            for step in range(max_new):
                if done_of(text):
                    break
                P = pair.target.probs(np.array([hist[-C:]]))
                b = int(P[0].argmax()) if greedy else int(sample_rows(P, u[1 + step:2 + step])[0])
                hist.append(b)
                text.append(b)
            answers.append(answer_of(text))
            made.append(len(text) - len(text0) - 1)
        out.append(int(answers[0] != answers[1]))
        steps.append(made)
    steps = np.array(steps).reshape(-1, 2)
    return out, int(steps.sum()) + (0 if greedy else rows.size)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sample"])
@pytest.mark.parametrize("target", [Counting(), IID()], ids=["counting", "iid"])
def test_labels_are_a_direct_continuation_of_each_row(greedy, target):
    """``mine`` (batched, both continuations of a batch at once) against
    ``_direct_labels``, on drafts at every text position. With the history-free target
    and shared uniforms a substitution before the answer's place cannot change it, nor
    one after, so only rows at the place itself are critical."""
    pair = SimpleNamespace(target=target, context_len=C)
    rng = np.random.default_rng(7)
    pos = list(range(0, END)) * 2 + [AT] * 16
    # at the answer's place, drafts the target might draw itself: whether the answer
    # changes then depends on the target's own draw
    toks = np.where(np.array(pos) == AT, rng.integers(1, 5, len(pos)),
                    rng.integers(20, 200, len(pos)))
    cols = _cols(pos, toks, [k + 1 for k in pos])
    cols["target_prob"] = np.full(len(pos), 0.05)        # p < q: sampling could reject
    labels, cost = L.mine(pair, cols, answer_of, done_of, greedy, 12, seed=3, uniform_rows=7,
                          max_rows=5, reuse=False)
    assert cost["rows"] == len(pos)
    want, read = _direct_labels(pair, cols, greedy, 12, 3, 7)
    assert labels.tolist() == want and cost["target_forward_rows"] == read
    at = np.array(pos) == AT
    assert labels[at].sum() > 0
    if isinstance(target, IID):
        assert (labels[~at] == 0).all()
        if not greedy:     # the target's own draw decides these: some agree with the draft
            assert set(labels[at].tolist()) == {0, 1}


@pytest.mark.parametrize("target", [Counting(), IID()], ids=["counting", "iid"])
def test_labels_mined_by_problems_are_the_whole_split_s(target):
    """Sampled, uniform streams of 7 labelled rows: the rows of each problem mined alone
    (``problems``) get the labels mining the whole split gives them, as each row draws
    the uniforms of its number among the split's labelled rows. Planted, it fails: rows
    numbered from the start of the problems mined."""
    pair = SimpleNamespace(target=target, context_len=C)
    rng = np.random.default_rng(8)
    pos = list(range(0, END)) * 3 + [AT] * 12
    toks = np.where(np.array(pos) == AT, rng.integers(1, 5, len(pos)),
                    rng.integers(20, 200, len(pos)))
    cols = _cols(pos, toks, [k + 1 for k in pos])
    cols["target_prob"] = np.full(len(pos), 0.05)
    cols["sequence"] = np.arange(len(pos)) // 6             # 7 problems of 6 rows
    kw = dict(seed=2, uniform_rows=7, reuse=False)
    whole, _ = L.mine(pair, cols, answer_of, done_of, False, 12, **kw)
    parts = np.full_like(whole, L.UNLABELED)
    for s in range(7):
        got, cost = L.mine(pair, cols, answer_of, done_of, False, 12, problems=(s, s + 1), **kw)
        mine = cols["sequence"] == s
        assert (got[~mine] == L.UNLABELED).all() and cost["rows"] == mine.sum()
        parts[mine] = got[mine]
    assert np.array_equal(parts, whole) and set(whole.tolist()) == {0, 1}
