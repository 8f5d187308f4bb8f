"""``evolve.Rule`` checks every array it is given before it evaluates anything.

Guarantee 37 of docs/reliability.md, `evolve.Rule` checks what it is given:

Each input has a domain (``evolve.lang.features.DOMAINS``): probabilities in [0, 1]
(the draft's probability of a drafted token in (0, 1]: it was drawn from the draft),
total variations in [0, 1], entropies, KL divergences and ``ahead`` finite and >= 0,
positions whole and >= 0, ``top_token_match`` booleans (or 0/1). ``threshold``,
``acceptance``, ``accept`` and ``draft_rank`` refuse anything else (a string, a
complex number, NaN, a value out of range, arrays whose shapes do not broadcast) with
one ``RuleInputError`` line naming the argument, never a numpy error or a silently
coerced value: ``np.array(['False'])`` as ``top_token_match`` used to keep the draft
as the string's truth, 1.0.
"""

import numpy as np
import pytest

import evolve
from evolve.api.acceptance_rule import RuleInputError
from tests.clikit import SCOPE

LENIENT = "pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))"
EVERY = ("pmin(1.0, add(add(pdiv(target_prob, draft_prob), mul(0.01, add(position, "
         "add(draft_entropy, target_entropy)))), ite(top_token_match, 0.1, 0.0)))")


def _greedy():
    return evolve.Rule(LENIENT, scope=dict(SCOPE, decoding="greedy"))


def _features(n=3):
    return {"draft_prob": np.full(n, 0.5), "target_prob": np.full(n, 0.1),
            "position": np.arange(n), "draft_entropy": np.ones(n),
            "target_entropy": np.ones(n), "top_token_match": np.zeros(n, bool)}


def _refused(call, param, *needles):
    with pytest.raises(RuleInputError) as e:
        call()
    text = str(e.value)
    assert e.value.param == param and "\n" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


@pytest.mark.parametrize("value", [np.array(["False"]), np.array(["0"]), np.array([np.nan]),
                                   np.array([2]), np.array([0.5]), np.array([None]),
                                   np.array([1 + 0j])])
def test_top_token_match_takes_booleans_or_0_and_1_only(value):
    rule = _greedy()
    _refused(lambda: rule.acceptance(draft_prob=[0.5], target_prob=[0.1],
                                     top_token_match=value), "top_token_match", "expected")


@pytest.mark.parametrize("value", [np.array([False]), np.array([0]), np.array([0.0]),
                                   np.array([0], np.uint8), [False], 0])
def test_false_in_any_accepted_form_decides_as_false(value):
    rule = _greedy()
    got = rule.acceptance(draft_prob=[0.5], target_prob=[0.1], top_token_match=value)
    assert np.array_equal(got, [0.25])            # clip(0.1 / (0.8 * 0.5)), not kept
    kept = rule.acceptance(draft_prob=[0.5], target_prob=[0.1], top_token_match=[1])
    assert np.array_equal(kept, [1.0])


@pytest.mark.parametrize("name,value,needle", [
    ("draft_prob", np.array([0.5 + 0.1j]), "complex"),
    ("draft_prob", np.array(["0.5"]), "<U3"),
    ("draft_prob", np.array([None, 0.5]), "object"),
    ("draft_prob", np.array([True]), "bool"),
    ("draft_prob", np.array([np.nan]), "nan"),
    ("draft_prob", np.array([np.inf]), "inf"),
    ("draft_prob", np.array([0.0]), "(0, 1]"),
    ("draft_prob", np.array([1.5]), "(0, 1]"),
    ("target_prob", np.array([-0.1]), "[0, 1]"),
    ("target_prob", np.array([1.0 + 1e-12]), "[0, 1]"),
    ("draft_entropy", np.array([-1.0]), ">= 0"),
    ("target_entropy", np.array([np.nan]), "nan"),
    ("position", np.array([-1]), ">= 0"),
    ("position", np.array([1.5]), "whole"),
    ("position", np.array([np.datetime64("2001-01-01")]), "datetime64"),
])
def test_each_input_is_checked_for_dtype_and_range(name, value, needle):
    rule = evolve.Rule(EVERY)
    feats = _features(1)
    feats[name] = value
    for call in (lambda: rule.threshold(feats), lambda: rule.acceptance(feats),
                 lambda: rule.accept([0.5], feats), lambda: rule.numpy().threshold(
                     *[feats[n] for n in rule.numpy().INPUTS])):
        _refused(call, name, needle)
    _refused(lambda: rule.threshold(**feats), name, needle)      # as keywords too


def test_what_is_accepted_evaluates_as_float64():
    rule = evolve.Rule(EVERY)
    feats = _features(3)
    want = rule.threshold(feats)
    alt = dict(feats, draft_prob=feats["draft_prob"].astype(np.float32),
               position=feats["position"].astype(np.float64),      # whole floats
               draft_entropy=feats["draft_entropy"].astype(np.int8),
               top_token_match=feats["top_token_match"].astype(np.int64))
    assert np.array_equal(rule.threshold(alt), want)
    assert np.array_equal(rule.threshold({k: list(v) for k, v in feats.items()}), want)
    scalar = {k: v[0].item() for k, v in feats.items()}
    assert rule.threshold(scalar).shape == () and rule.threshold(scalar) == want[0]
    assert rule.threshold(dict(feats, target_prob=np.zeros(3))).shape == (3,)  # p = 0 is fine
    empty = {k: np.asarray(v)[:0] for k, v in feats.items()}
    assert rule.threshold(empty).shape == (0,)


def test_shapes_broadcast_together_or_are_refused_naming_them():
    rule = evolve.Rule(LENIENT)
    h = rule.threshold(draft_prob=np.full((3, 1), 0.5), target_prob=np.full(4, 0.1))
    assert h.shape == (3, 4)
    text = _refused(lambda: rule.threshold(draft_prob=np.full(2, 0.5),
                                           target_prob=np.full(3, 0.1)), "features",
                    "draft_prob (2,)", "target_prob (3,)")
    assert "broadcast" in text
    scoped = evolve.Rule(LENIENT, scope=dict(SCOPE, top_k=16))
    _refused(lambda: scoped.acceptance(draft_prob=np.full(2, 0.5), target_prob=np.full(2, 0.1),
                                       draft_rank=np.zeros(3, int)), "draft_rank",
             "(3,)", "(2,)")
    _refused(lambda: rule.accept(np.zeros(3), draft_prob=np.full(2, 0.5),
                                 target_prob=np.full(2, 0.1)), "u", "(3,)")


def test_an_unknown_keyword_is_refused_naming_it():
    rule = evolve.Rule(LENIENT)
    _refused(lambda: rule.threshold(draft_prob=[0.5], target_prob=[0.1], target_porb=[0.2]),
             "target_porb", "not an input")


@pytest.mark.parametrize("rank,needle", [(np.array([-1]), ">= 0"), (np.array([np.nan]), "nan"),
                                         (np.array([1.5]), "whole"),
                                         (np.array([1 + 0j]), "complex"),
                                         (np.array(["a"]), "<U1"), (np.array([True]), "bool")])
def test_draft_ranks_are_whole_numbers_from_0(rank, needle):
    rule = evolve.Rule(LENIENT, scope=dict(SCOPE, top_k=16))
    _refused(lambda: rule.acceptance(draft_prob=[0.5], target_prob=[0.1], draft_rank=rank),
             "draft_rank", needle)
    ok = rule.acceptance(draft_prob=[0.5, 0.5], target_prob=[0.1, 0.1],
                         draft_rank=np.array([3.0, 20.0]))          # whole floats are ranks
    assert np.array_equal(ok, [0.25, 0.2])


def test_the_uniforms_of_accept_are_in_0_1():
    rule = evolve.Rule(LENIENT)
    for u, needle in (([np.nan], "nan"), ([1.5], "[0, 1]"), ([0.5j], "complex")):
        _refused(lambda: rule.accept(u, draft_prob=[0.5], target_prob=[0.1]), "u", needle)


@pytest.mark.parametrize("q,token,param,needle", [
    (np.array([[0.5, np.nan]]), [0], "q", "nan"),
    (np.array([[0.5, -0.5]]), [0], "q", "[0, 1]"),
    (np.array([[0.5, 0.5j]]), [0], "q", "complex"),
    (np.array(0.5), [0], "q", "vocabulary"),
    (np.array([[0.5, 0.5]]), [-1], "token", "0..1"),
    (np.array([[0.5, 0.5]]), [2], "token", "0..1"),
    (np.array([[0.5, 0.5]]), [0.5], "token", "whole"),
    (np.full((2, 2), 0.5), [0, 1, 0], "token", "(3,)"),
])
def test_draft_rank_checks_the_distribution_and_the_tokens(q, token, param, needle):
    _refused(lambda: evolve.Rule.draft_rank(q, token), param, needle)


def test_draft_rank_broadcasts_a_token_over_the_batch():
    q = np.array([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    assert np.array_equal(evolve.Rule.draft_rank(q, 2), [1, 1])
    assert np.array_equal(evolve.Rule.draft_rank(q, np.array([1.0, 0.0])), [0, 0])
    assert np.array_equal(evolve.Rule.draft_rank(q[:1], [0, 1, 2]), [2, 0, 1])   # one q
