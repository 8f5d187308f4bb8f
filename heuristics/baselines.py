"""Baseline acceptance rules: the original benchmark's seven and literature anchors.

Plain scalar functions with the reference signature. ``heuristics.registry``
compiles each with Numba on first use (cached on disk).
"""

import math


def standard_rejection(draft_prob, target_prob, position, draft_entropy, target_entropy,
                       top_token_match):
    """Speculative sampling's rule: accept with probability min(1, t/d)."""
    return min(1.0, target_prob / draft_prob)


def always_accept(draft_prob, target_prob, position, draft_entropy, target_entropy,
                  top_token_match):
    return 1.0


def conservative(draft_prob, target_prob, position, draft_entropy, target_entropy,
                 top_token_match):
    """Accept only where the target likes the token at least as much as the draft."""
    return 1.0 if target_prob >= draft_prob else 0.0


def top_token_match(draft_prob, target_prob, position, draft_entropy, target_entropy,
                    top_token_match):
    return 0.95 if top_token_match else min(1.0, target_prob / draft_prob)


def entropy_aware(draft_prob, target_prob, position, draft_entropy, target_entropy,
                  top_token_match):
    ratio = min(1.0, target_prob / draft_prob)
    mean_entropy = (draft_entropy + target_entropy) / 2.0
    return min(1.0, ratio * (1.0 - 0.5 * min(1.0, mean_entropy / 10.0)))


def position_aware(draft_prob, target_prob, position, draft_entropy, target_entropy,
                   top_token_match):
    ratio = min(1.0, target_prob / draft_prob)
    return min(1.0, ratio * (1.0 + min(position, 50) / 100.0))


def ratio_floor_0_3(draft_prob, target_prob, position, draft_entropy, target_entropy,
                    top_token_match):
    return max(min(1.0, target_prob / draft_prob), 0.3)


TYPICAL_EPS = 0.09
TYPICAL_DELTA = 0.3


def typical_acceptance(draft_prob, target_prob, position, draft_entropy, target_entropy,
                       top_token_match):
    """Medusa / vLLM typical acceptance: t > min(eps, delta * exp(-H_target)); deterministic.

    t > min(eps, x) is (t > eps) or (t > x); testing t > eps first skips most exp calls.
    """
    if target_prob > TYPICAL_EPS:
        return 1.0
    return 1.0 if target_prob > TYPICAL_DELTA * math.exp(-target_entropy) else 0.0


BILD_ALPHA = 5.0


def bild_rollback(draft_prob, target_prob, position, draft_entropy, target_entropy,
                  top_token_match):
    """BiLD's rollback test: keep the token iff -log(t) <= alpha; deterministic.

    For t >= 0.01, -log(t) <= 4.61 < alpha, so the log is only taken below that.
    """
    if target_prob >= 0.01:
        return 1.0
    return 1.0 if -math.log(target_prob) <= BILD_ALPHA else 0.0


LENIENCY = 0.5


def leniency_0_5(draft_prob, target_prob, position, draft_entropy, target_entropy,
                 top_token_match):
    """Mentored / lenient rejection: min(1, t / (l d)) with l = 0.5."""
    return min(1.0, target_prob / (LENIENCY * draft_prob))


# Registry names, in the order of the reference table.
BASELINES = {
    "standard_rejection": standard_rejection,
    "always_accept": always_accept,
    "conservative": conservative,
    "top_token_match": top_token_match,
    "entropy_aware": entropy_aware,
    "position_aware": position_aware,
    "ratio_floor_0.3": ratio_floor_0_3,
    "typical_acceptance": typical_acceptance,
    "bild_rollback": bild_rollback,
    "leniency_0.5": leniency_0_5,
}
