"""The arrays an ``evolve.Rule`` is given, checked before anything is evaluated.

Each input of a rule has a domain (``evolve.lang.features.DOMAINS``): the values a
recorder gives it. An array is accepted when its dtype can hold that domain and every
value is in it; anything else is one ``RuleInputError`` line naming the argument, the
value (or dtype) and what is expected, never a numpy error or a silently coerced value:

- numbers (probabilities, entropies, KLs, ``ahead``): integers or floats, finite, in the
  domain's range; booleans, strings, complex numbers, objects and dates are refused;
- whole numbers (``position``, ``block_position``, a ``draft_rank``): integers, or floats
  that are whole, >= 0;
- ``top_token_match``: booleans, or integers or floats that are 0 or 1 (the string
  'False' is not False);
- shapes: every array given broadcasts with the others (any shape, numpy's rules).

Accepted arrays come back as float64 (booleans as bool), so a rule decides the same on
any accepted form of the same values.
"""

from __future__ import annotations

import numpy as np

from evolve.errors import EvolveError, show
from evolve.lang.features import DOMAIN_KINDS, DOMAINS

# domain -> (what is expected, in words; lowest value, lowest excluded; highest value):
# the inputs' kinds (the registry's), and the uniforms of ``accept``
EXPECTED = {**DOMAIN_KINDS, "unit": ("uniforms in [0, 1]", 0.0, False, 1.0)}


class RuleInputError(EvolveError):
    """Features a rule cannot be evaluated on: a missing input, a value outside its
    input's domain, shapes that do not broadcast, a draft rank a scoped rule needs; one
    line naming the parameter."""


def _at(a: np.ndarray, bad: np.ndarray) -> str:
    """Where the first bad element is, and its value, for a message."""
    i = int(np.flatnonzero(bad)[0])
    value = a.reshape(-1)[i].item()
    if a.ndim == 0:
        return show(value)
    idx = np.unravel_index(i, a.shape)
    where = idx[0] if len(idx) == 1 else tuple(int(j) for j in idx)
    return f"{show(value)} at index {where}"


def as_array(param: str, value) -> np.ndarray:
    """``value`` as a numpy array, or RuleInputError naming ``param``."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:       # ragged lists and the like
        raise RuleInputError.of(param, f"{show(value)} cannot be read as an array "
                                       f"({str(e).splitlines()[0][:80]})") from None


def check(param: str, value, domain: str) -> np.ndarray:
    """The array ``value`` of argument ``param`` checked against ``domain`` (a key of
    ``EXPECTED``): float64 (bool for "bool"), or RuleInputError naming ``param``."""
    a = as_array(param, value)
    expected, lo, lo_open, hi = EXPECTED[domain]
    kind = a.dtype.kind
    if kind not in "iuf" and not (kind == "b" and domain == "bool"):
        raise RuleInputError.of(param, f"dtype {a.dtype} is invalid; expected {expected}")
    if kind == "b":
        return a
    x = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x)
        if not bad.any():
            if domain == "bool":
                bad = (x != 0.0) & (x != 1.0)
            else:
                bad = (x <= lo if lo_open else x < lo) | (x > hi)
                if domain in ("whole", "class"):
                    bad |= x != np.floor(x)
    if bad.any():
        raise RuleInputError.of(param, f"{_at(a, bad)} is invalid; expected {expected}")
    return x != 0.0 if domain == "bool" else x


def check_input(name: str, value, param: str | None = None) -> np.ndarray:
    """The array of the rule input ``name`` checked against its domain (``DOMAINS``)."""
    return check(param or name, value, DOMAINS[name])


def check_shapes(cols: dict) -> tuple:
    """The shape the arrays of ``cols`` (name -> array) broadcast to, or RuleInputError
    (``features``) naming each array's shape."""
    try:
        return np.broadcast_shapes(*(np.shape(a) for a in cols.values()))
    except ValueError:
        shapes = ", ".join(f"{n} {np.shape(a)}" for n, a in cols.items())
        raise RuleInputError.of("features", f"shapes do not broadcast together: "
                                            f"{shapes}") from None


def check_against(param: str, a: np.ndarray, shape: tuple) -> None:
    """RuleInputError naming ``param`` unless array ``a`` broadcasts with the features'
    ``shape``."""
    try:
        np.broadcast_shapes(a.shape, shape)
    except ValueError:
        raise RuleInputError.of(param, f"shape {a.shape} does not broadcast with the "
                                       f"features' shape {shape}") from None


def check_ranking(q, token) -> tuple[np.ndarray, np.ndarray]:
    """``Rule.draft_rank``'s arguments: ``q`` a distribution over the vocabulary ([...,
    vocab], probabilities), ``token`` token ids 0..vocab - 1 that broadcast with q's
    rows; (q, token as int64), broadcast to the same rows, or RuleInputError."""
    qa = as_array("q", q)
    if qa.ndim == 0 or qa.shape[-1] == 0:
        raise RuleInputError.of("q", f"shape {qa.shape} is invalid; expected the draft's "
                                     "distribution over the vocabulary ([..., vocab])")
    qa = check("q", qa, "prob")
    V = qa.shape[-1]
    t = as_array("token", token)
    kind = t.dtype.kind
    expected = f"token ids, whole numbers 0..{V - 1}"
    if kind not in "iuf":
        raise RuleInputError.of("token", f"dtype {t.dtype} is invalid; expected {expected}")
    x = t.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (x < 0) | (x > V - 1) | (x != np.floor(x))
    if bad.any():
        raise RuleInputError.of("token", f"{_at(t, bad)} is invalid; expected {expected}")
    try:
        rows = np.broadcast_shapes(t.shape, qa.shape[:-1])
    except ValueError:
        raise RuleInputError.of("token", f"shape {t.shape} does not broadcast with q's rows "
                                         f"{qa.shape[:-1]}") from None
    return np.broadcast_to(qa, rows + (V,)), np.broadcast_to(x.astype(np.int64), rows)
