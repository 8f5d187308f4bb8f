"""Critical-token labels (evolve.data.labels) on a pair whose answers are known by
construction: the target continues a text by counting up (the next byte is the last
plus one), the answer is the byte at a fixed place of the text; so a substitution
before that place changes the answer (critical) and one after it does not."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from evolve.data import labels as L

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
    labels, cost = L.mine(PAIR, _cols(pos, toks, tops, prompt), answer_of, done_of, True, 12)
    # before byte 6 (positions 2, 5): the answer changes; at 6 itself too; after: not
    assert labels.tolist() == [1, 1, 1, 0, L.UNLABELED]
    assert cost["rows"] == 4 and cost["critical"] == 3 and cost["target_forward_rows"] > 0


def test_sampled_labels_share_the_uniforms_of_both_continuations():
    pos = [2, 8]
    toks, tops = [50, 80], [3, 9]
    cols = _cols(pos, toks, tops)
    labels, _ = L.mine(PAIR, cols, answer_of, done_of, False, 12, seed=4)
    assert labels[1] == 0                        # after the answer's place: never critical
    again, _ = L.mine(PAIR, cols, answer_of, done_of, False, 12, seed=4)
    assert np.array_equal(labels, again)


def test_rows_the_standard_rule_keeps_need_no_label():
    cols = _cols([2, 3], [3, 50], [3, 4])
    cols["target_prob"] = np.array([0.9, 0.9])
    cols["draft_prob"] = np.array([0.5, 0.5])         # p >= q: sampling keeps it
    labels, cost = L.mine(PAIR, cols, answer_of, done_of, False, 12)
    assert labels.tolist() == [L.UNLABELED, L.UNLABELED] and cost["rows"] == 0
