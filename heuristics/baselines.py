"""Baseline acceptance rules as plain scalar functions (generated).

Generated from the rules table (evolve/rules/table.py) by
`python -m evolve.rules.source --write`; do not edit by hand. Each takes the
reference signature and returns the threshold; a token is accepted iff
rand_value < threshold. ``heuristics.registry`` compiles them with Numba.
"""

from heuristics.ops import ite, pdiv, pexp, plog, pmax, pmin, psqrt  # noqa: F401


def standard_rejection(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """speculative sampling: accept with min(1, t/d)"""
    return pmin(1.0, pdiv(target_prob, draft_prob))


def always_accept(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """accept every drafted token"""
    return pmax(1.0, 1.0)


def conservative(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """accept only where t >= d"""
    return ite((target_prob < draft_prob), 0.0, 1.0)


def top_token_match(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """0.95 where draft and target agree on the top token, else min(1, t/d)"""
    return ite(top_token_match, 0.95, pmin(1.0, pdiv(target_prob, draft_prob)))


def entropy_aware(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """min(1, t/d) scaled down by the mean entropy"""
    return pmin(1.0, (pmin(1.0, pdiv(target_prob, draft_prob)) * (1.0 - (0.5 * pmin(1.0,
        pdiv(pdiv((draft_entropy + target_entropy), 2.0), 10.0))))))


def position_aware(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """min(1, t/d) scaled up by the position"""
    return pmin(1.0, (pmin(1.0, pdiv(target_prob, draft_prob)) * (1.0 + pdiv(pmin(position,
        50.0), 100.0))))


def ratio_floor_0_3(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """min(1, t/d), at least 0.3"""
    return pmax(pmin(1.0, pdiv(target_prob, draft_prob)), 0.3)


def typical_acceptance(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """Medusa / vLLM typical acceptance: t > min(eps, sqrt(eps) exp(-te)); deterministic (eps = 0.09)"""
    return ite((pmin(0.09, (psqrt(0.09) * pexp((-target_entropy)))) < target_prob),
        1.0, 0.0)


def bild_rollback(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """BiLD rollback: keep the token iff -log t <= alpha; deterministic (alpha = 5)"""
    return ite((5.0 < (-plog(target_prob))), 0.0, 1.0)


def leniency(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """lenient (mentored) rejection: min(1, t / (l d)), l in (0, 1] (l = 0.5)"""
    return pmin(1.0, pdiv(target_prob, (0.5 * draft_prob)))


def hf_ensemble(draft_prob, target_prob, position, draft_entropy, target_entropy, top_token_match):
    """transformers static ensemble verification: min(1, 1 - w + w t/d), w in [0, 1] (w = 1)"""
    return pmin(1.0, ((1.0 - 1.0) + (1.0 * pdiv(target_prob, draft_prob))))


# Registry names, in the order of the rules table.
BASELINES = {
    'standard_rejection': standard_rejection,
    'always_accept': always_accept,
    'conservative': conservative,
    'top_token_match': top_token_match,
    'entropy_aware': entropy_aware,
    'position_aware': position_aware,
    'ratio_floor_0.3': ratio_floor_0_3,
    'typical_acceptance': typical_acceptance,
    'bild_rollback': bild_rollback,
    'leniency': leniency,
    'hf_ensemble': hf_ensemble,
}
