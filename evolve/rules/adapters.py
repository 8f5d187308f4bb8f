"""Rules as the decoder and the offline objectives take them.

A rule maps feature columns to thresholds (``many(F)``):

- ``as_rule(fn)``: a scalar function in the style of ``heuristics/baselines.py``
  (six positional arguments: draft_prob, target_prob, position, draft_entropy,
  target_entropy, top_token_match), or one that also takes ``block_position``,
  ``p_max`` and ``q_max`` (every argument then passed by name); slow, one
  Python call a row, for user functions and tests;
- ``TreeRule``: a parsed tree, evaluated by ``evolve.lang.numpy_eval``;
- ``named_rule``: a rule of the rules table at a parameter, as a TreeRule (which
  carries the rule's ``residual``, read by the decoders and ``evolve.data.emission``).
"""

from __future__ import annotations

import inspect

import numpy as np

from evolve.errors import EvolveError, show
from evolve.lang import numpy_eval
from evolve.lang.features import ALL_INPUT_NAMES as FEATURES, BY_NAME, names_of
from evolve.lang.treeio import parse
from evolve.rules.table import RULES
from evolve.lang import treeio

V1_ARGS = names_of("token")            # a v1 scalar rule's six positional arguments
TRACE_ARGS = names_of("token", "trace")  # an extended rule takes these by name, all of them
EXTRA_ARGS = names_of("trace")
SLOT_ARGS = tuple(n for n in FEATURES if n not in TRACE_ARGS)   # passed where it names them
WHOLE = ("position", "block_position")   # counts, passed to scalar rules as ints


def _scalar(name: str, values):
    """A column as a scalar rule takes it: a list of ints, bools or floats."""
    v = np.asarray(values)
    if name in WHOLE:
        return [int(x) for x in v.tolist()]
    if BY_NAME[name].type is bool:
        return [bool(x) for x in v.tolist()]
    return v.tolist()


class Rule:
    """A scalar rule applied element-wise to feature columns."""

    def __init__(self, fn, extended: bool, name: str = "", slots: tuple = ()):
        self.fn = fn
        self.extended = extended
        self.slots = slots            # the inputs beyond the nine it takes by name
        self.name = name or getattr(fn, "__name__", "rule")

    def __call__(self, **features) -> float:
        if self.extended:
            return float(self.fn(**features))
        return float(self.fn(*(features[f] for f in V1_ARGS)))

    def many(self, F: dict) -> np.ndarray:
        """Thresholds for columns of features (1-D arrays of equal length)."""
        names = (TRACE_ARGS + tuple(f for f in self.slots if f in F)) if self.extended \
            else V1_ARGS
        cols = {f: _scalar(f, F[f]) for f in names}
        n = len(cols[names[0]])
        out = np.empty(n, dtype=np.float64)
        fn = self.fn
        if self.extended:
            for i in range(n):
                out[i] = fn(**{f: v[i] for f, v in cols.items()})
        else:
            args = [cols[f] for f in V1_ARGS]
            for i in range(n):
                out[i] = fn(*(a[i] for a in args))
        return out


class VectorRule:
    """A numpy rule ``fn(features: dict of arrays, **params) -> thresholds``."""

    def __init__(self, fn, name: str = "", **params):
        self.fn = fn
        self.params = params
        self.name = name or getattr(fn, "__name__", "rule")

    def many(self, F: dict) -> np.ndarray:
        F = {f: np.asarray(F[f], dtype=np.float64) for f in FEATURES if f in F}
        with np.errstate(all="ignore"):
            h = np.asarray(self.fn(F, **self.params), dtype=np.float64)
        return np.broadcast_to(h, F["draft_prob"].shape).copy()


def as_rule(fn, name: str = "") -> Rule:
    """Wrap a scalar rule: six positional v1 arguments, or every feature by name."""
    if isinstance(fn, (Rule, VectorRule)) or getattr(fn, "decides_blocks", False):
        return fn          # (a rule that decides whole blocks: evolve.rules.oracle)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return Rule(fn, False, name)
    names = set(params)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extended = var_kw or any(a in names for a in EXTRA_ARGS + SLOT_ARGS)
    if extended and not (var_kw or set(TRACE_ARGS) <= names):
        missing = [f for f in TRACE_ARGS if f not in names]
        raise TypeError(f"rule {getattr(fn, '__name__', fn)!r} takes some of block_position/"
                        f"p_max/q_max but not {missing[0]!r} (extended rules take all nine "
                        f"features by name)")
    return Rule(fn, extended, name, SLOT_ARGS if var_kw else
                tuple(f for f in SLOT_ARGS if f in names))


def vector_rule(fn, name: str = "", **params) -> VectorRule:
    return VectorRule(fn, name, **params)


# ------------------------------------------------------------ trees as rules

class TreeRule(VectorRule):
    """A parsed tree (``evolve.lang.treeio.parse`` nodes) as a vectorised rule,
    evaluated by ``evolve.lang.numpy_eval`` (no text is compiled or evaluated). The
    object is both a decoder rule (``many``) and a plain numpy rule
    ``rule(F) -> thresholds``. ``residual`` is what a rejection emits and ``scope``
    which drafts the rule judges (``evolve.rules.table``; "standard" and "top_k"
    unless ``named_rule`` sets others)."""

    residual = "standard"
    scope = "top_k"

    def __init__(self, nodes, name: str = "tree"):
        self.nodes = tuple(nodes)
        try:      # a well-formed, well-typed tree reads back as itself
            ok = treeio.parse(treeio.to_string(list(self.nodes))) == list(self.nodes)
        except (IndexError, KeyError, AssertionError, AttributeError):
            ok = False
        if not ok:
            raise treeio.TreeError("not a well-formed tree of the primitive table")
        super().__init__(self._thresholds, name)

    def _thresholds(self, F: dict) -> np.ndarray:
        return numpy_eval.evaluate(self.nodes, F)

    def __call__(self, F: dict, **params) -> np.ndarray:
        return self._thresholds(F)


def tree_rule(nodes, name: str = "tree") -> TreeRule:
    """A rule from a tree: parsed nodes, or tree text (parsed, never evaluated)."""
    if isinstance(nodes, str):
        nodes = parse(nodes)
    return TreeRule(nodes, name)


# ---------------------------------------------------------- named rules

class RuleError(EvolveError):
    """A rule of the rules table that cannot be made: ``field`` is ``"name"`` (an
    unknown rule) or ``"param"`` (a parameter that does not fit). The message names
    the rule and the parameter but no option: a command adds the option it read them
    from (``--rule``/``--param``, ``--compare``)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownRule(RuleError, KeyError):
    """An unknown rule name (also a KeyError, as a lookup in the table)."""

    def __init__(self, message: str):
        super().__init__(message, "name")


def named_rule(name: str, param: float | None = None, greedy: bool = False):
    """``(rule, info)`` of a rule of the rules table (``evolve.rules.table``) at
    ``param`` (default: the rule's own). An unknown name raises ``UnknownRule`` (a
    KeyError), a parameter that does not fit ``RuleError`` (a ValueError); both
    are ``RuleError`` with ``field`` "name" or "param", and their messages name the
    rule and the value, never an option. ``greedy``: the rule as greedy task decoding
    takes it (``Rule.task_tree``)."""
    if name not in RULES:
        raise UnknownRule(f"unknown rule {show(name)} (rules: {', '.join(RULES)})")
    r = RULES[name]
    if r.param is None and param is not None:
        takers = ", ".join(n for n, x in RULES.items() if x.param)
        raise RuleError(f"the rule {name!r} takes no parameter (rules that do: {takers})",
                        "param")
    value = None
    if r.param is not None:
        value = r.default if param is None else float(param)
        if not np.isfinite(value):
            raise RuleError(f"{name} {r.param}={param!r} is not a finite number", "param")
        if value not in r.range:             # the table's stated range
            raise RuleError(f"{name} {r.param}={value!r} is invalid; expected "
                            f"{r.range.text(r.param)}", "param")
    rule = TreeRule(parse(r.task_tree(value, greedy)), r.label(value))
    rule.residual = r.residual
    rule.scope = r.scope
    info = {"kind": "rule", "name": name, "param": value, "param_name": r.param,
            "label": r.label(value)}
    if r.engine is not None:      # an engine's own knob: its flags, and its residual
        info.update(engine=r.engine, setting=r.engine_setting(value), residual=r.residual)
    return rule, info
