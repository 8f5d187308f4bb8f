"""At one slot, a lenient rule's TV from the target equals its extra acceptance mass.

Take a rule with a(x) >= r(x) = min(1, p(x)/q(x)) for every x, under the residual
norm(max(0, p - q)) (``evolve.data.emission.exact_output``). The emitted token is
``out = q a + (1 - beta) res``; on tokens with q > p it puts ``p + q (a - r)``, on
tokens with p > q it puts ``p - E (p - q) / TV``, where ``E = sum q (a - r)`` is
the acceptance mass the rule adds over the standard rule and ``TV = TV(p, q)``.
So TV(out, p) = E exactly: no lenient rule buys acceptance more cheaply in TV at
a single slot; it can only choose where to spend. The tests below check this
identity on random slots and show where it stops holding: for a rule that
rejects more than the standard rule on tokens with p > q (its TV is less than the
acceptance it loses), under SGLang's target-only
residual, and for KL (two lenient rules with the same E have different KL).
"""

from __future__ import annotations

import numpy as np
import pytest

from evolve.data.decode import STANDARD, WITHOUT_DRAFT
from evolve.data.emission import distortion, exact_output


def _slots(seed: int, m: int = 200, v: int = 12):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(v, 0.5), size=m)
    q = rng.dirichlet(np.full(v, 0.5), size=m)
    return rng, p, q


def _standard(p, q):
    return np.minimum(1.0, p / q)


def _extra(q, a, r):
    return (q * (a - r)).sum(axis=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_lenient_rule_pays_exactly_its_extra_acceptance_in_tv(seed):
    rng, p, q = _slots(seed)
    r = _standard(p, q)
    a = r + rng.uniform(0.0, 1.0, size=p.shape) * (1.0 - r)    # any a in [r, 1]
    a[:5] = 1.0                                                 # always accept: E = TV(p, q)
    a[5:10] = r[5:10]                                           # standard: E = 0
    tv, _ = distortion(p, exact_output(p, q, a, STANDARD))
    extra = _extra(q, a, r)
    np.testing.assert_allclose(tv, extra, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tv[:5], 0.5 * np.abs(p[:5] - q[:5]).sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(tv[5:10], 0.0, atol=1e-12)


def test_a_stricter_rule_is_not_held_to_its_acceptance_change():
    """A rule that rejects more than the standard rule (a <= r) loses acceptance D;
    the residual returns that mass in proportion to p - q, so the TV is at most D,
    and strictly less where it also rejects tokens with p > q."""
    rng, p, q = _slots(3)
    r = _standard(p, q)
    a = r * rng.uniform(0.0, 1.0, size=p.shape)                  # a <= r: not lenient
    tv, _ = distortion(p, exact_output(p, q, a, STANDARD))
    lost = -_extra(q, a, r)
    assert np.all(tv <= lost + 1e-12)
    assert np.mean(tv < lost - 1e-6) > 0.5
    b = np.where(p < q, a, 1.0)                                  # stricter on q > p only
    tv_b, _ = distortion(p, exact_output(p, q, b, STANDARD))
    np.testing.assert_allclose(tv_b, -_extra(q, b, r), atol=1e-12)


def test_the_target_only_residual_breaks_the_identity():
    rng, p, q = _slots(4)
    r = _standard(p, q)
    a = r + rng.uniform(0.0, 1.0, size=p.shape) * (1.0 - r)
    tv, _ = distortion(p, exact_output(p, q, a, WITHOUT_DRAFT))
    assert np.mean(np.abs(tv - _extra(q, a, r)) > 1e-6) > 0.5


def test_kl_is_not_fixed_by_the_extra_acceptance():
    """Two lenient rules spending the same extra mass E at a slot, on different tokens
    with q > p, have the same TV and different KL."""
    p = np.array([[0.5, 0.3, 0.1, 0.1]])
    q = np.array([[0.2, 0.2, 0.3, 0.3]])
    r = _standard(p, q)
    e = 0.05
    a1, a2 = r.copy(), r.copy()
    a1[0, 2] += e / q[0, 2]                      # all on token 2
    a2[0, 2] += 0.5 * e / q[0, 2]                # split over tokens 2 and 3
    a2[0, 3] += 0.5 * e / q[0, 3]
    tv1, kl1 = distortion(p, exact_output(p, q, a1, STANDARD))
    tv2, kl2 = distortion(p, exact_output(p, q, a2, STANDARD))
    np.testing.assert_allclose([tv1[0], tv2[0]], [e, e], atol=1e-12)
    assert kl1[0] > kl2[0] + 1e-4                # concentrating the spend costs more KL
