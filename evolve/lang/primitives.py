"""The one table of primitives.

Every consumer reads this table: the DEAP primitive set (engine), the opcodes of
the population kernel (kernels), generated source code and infix text (codegen),
the tree parser (treeio), the numpy reference (the DEAP-style evaluator used
by benchmarks and tests), the sympy reading of `evolve inspect` and the export
templates of numpy, torch and Triton (``exports``; evolve.export). Only the
kernels (Numba and torch) and heuristics/ops.py are written by hand, each tested
against the table. Semantics of the protected operators are written down
once, in ``heuristics/ops.py``; the numpy forms here and the kernel's opcodes
implement the same formulas and are tested against them.

Types: ``float`` for numbers, ``bool`` for truth values (``top_token_match``,
comparisons). The kernel stores booleans as 1.0 / 0.0.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evolve.lang.features import (ALL_INPUT_NAMES, ALL_INPUTS, INPUT_NAMES,  # noqa: F401
                                  INPUTS, LOOKAHEAD_INPUT_NAMES, N_SLOT_INPUTS, N_V2_INPUTS,
                                  SLOT_INPUT_NAMES, SLOT_SIGNATURE, TRACE_INPUT_NAMES,
                                  TRACE_INPUTS, groups_read, offered, reads_any, signature,
                                  signature_of, with_needs)
from heuristics import ops
from numba import vectorize

# ------------------------------------------------------------------ inputs

N_INPUTS = len(INPUTS)
MAX_INPUTS = 32              # opcodes 0..31 are reserved for inputs (the registry's order)
OP_CONST = MAX_INPUTS        # opcode 32: push a constant; the primitives follow it
if len(ALL_INPUTS) > MAX_INPUTS:
    raise ImportError("evolve.lang.primitives: more inputs than MAX_INPUTS opcodes")


# ------------------------------------------------------- numpy reference ops

def _np_pdiv(a, b):
    with np.errstate(all="ignore"):
        return np.where(np.abs(b) > ops.DIV_EPS, np.divide(a, b), 1.0)


_UFUNCS: dict = {}


def _ufunc(name: str):
    """heuristics.ops' scalar ``name`` compiled as a numpy ufunc (made on first use):
    exp and log are that module's own, so the numpy meaning gives the kernel's bits."""
    f = _UFUNCS.get(name)
    if f is None:
        f = _UFUNCS[name] = vectorize(["float64(float64)"], cache=True)(getattr(ops, name))
    return f


def _np_plog(a):
    with np.errstate(all="ignore"):
        return _ufunc("plog")(a)


def _np_pexp(a):
    with np.errstate(all="ignore"):
        return _ufunc("pexp")(a)


def _np_min(a, b):
    return np.where(np.asarray(a) < b, a, b)


def _np_max(a, b):
    return np.where(np.asarray(a) > b, a, b)


def _np_arith(f):
    def g(*args):
        with np.errstate(all="ignore"):
            return f(*args)
    g.__name__ = f.__name__
    return g


@dataclass(frozen=True)
class Primitive:
    name: str                 # name in tree strings (DEAP) and generated code
    opcode: int               # kernel opcode
    args: tuple               # argument types
    ret: type                 # return type
    scalar: Callable          # plain-Python scalar meaning
    numpy: Callable           # numpy meaning (element-wise on arrays)
    code: str                 # Python source template, {0}, {1}, ... are arguments
    infix: str                # human-readable template
    sympy: Callable           # plain meaning in sympy (``S``: the module), a reading aid
    exports: dict             # export backend -> template (numpy, torch, triton)

    @property
    def arity(self) -> int:
        return len(self.args)


def f64(value) -> str:
    # a float64 scalar in Triton: a bare Python float would be a float32 constant
    return f"tl.full([], {float(value)!r}, tl.float64)"


def _same(template: str) -> dict:
    """An export template that reads the same in numpy, torch and Triton."""
    return {"numpy": template, "torch": template, "triton": template}


def _lib(fn: str, triton: str) -> dict:
    """``np.fn`` / ``torch.fn`` element-wise calls, and Triton's template."""
    return {"numpy": f"np.{fn}", "torch": f"torch.{fn}", "triton": triton}


F, B = float, bool

# The export templates: {0}, {1}, ... are arguments. numpy and torch call the
# module's protected helpers (evolve.export.backends HELPERS) where a primitive is
# protected; Triton writes them inline with tl.where (constants as float64 scalars).
PRIMITIVES: tuple[Primitive, ...] = (
    Primitive("add", OP_CONST + 1, (F, F), F, operator.add, _np_arith(np.add), "({0} + {1})",
              "({0} + {1})", lambda S, a, b: a + b, _same("({0} + {1})")),
    Primitive("sub", OP_CONST + 2, (F, F), F, operator.sub, _np_arith(np.subtract),
              "({0} - {1})", "({0} - {1})", lambda S, a, b: a - b, _same("({0} - {1})")),
    Primitive("mul", OP_CONST + 3, (F, F), F, operator.mul, _np_arith(np.multiply),
              "({0} * {1})", "({0} * {1})", lambda S, a, b: a * b, _same("({0} * {1})")),
    Primitive("pdiv", OP_CONST + 4, (F, F), F, ops.pdiv, _np_pdiv, "pdiv({0}, {1})",
              "({0} / {1})",
              lambda S, a, b: a / b,
              {"numpy": "pdiv({0}, {1})", "torch": "pdiv({0}, {1})",
               "triton": f"tl.where(tl.abs({{1}}) > {f64(ops.DIV_EPS)}, {{0}} / {{1}}, "
                         f"{f64(1.0)})"}),
    Primitive("pmin", OP_CONST + 5, (F, F), F, ops.pmin, _np_min, "pmin({0}, {1})", "min({0}, {1})",
              lambda S, a, b: S.Min(a, b),
              {**_lib("where({0} < {1}, {0}, {1})", "tl.where({0} < {1}, {0}, {1})")}),
    Primitive("pmax", OP_CONST + 6, (F, F), F, ops.pmax, _np_max, "pmax({0}, {1})", "max({0}, {1})",
              lambda S, a, b: S.Max(a, b),
              {**_lib("where({0} > {1}, {0}, {1})", "tl.where({0} > {1}, {0}, {1})")}),
    Primitive("neg", OP_CONST + 7, (F,), F, operator.neg, _np_arith(np.negative), "(-{0})",
              "(-{0})",
              lambda S, a: -a, _same("(-{0})")),
    Primitive("absf", OP_CONST + 8, (F,), F, abs, _np_arith(np.abs), "abs({0})", "|{0}|",
              lambda S, a: S.Abs(a), _lib("abs({0})", "tl.abs({0})")),
    Primitive("plog", OP_CONST + 9, (F,), F, ops.plog, _np_plog, "plog({0})", "log({0})",
              lambda S, a: S.log(S.Abs(a)),
              {"numpy": "plog({0})", "torch": "plog({0})",
               "triton": f"tl.where(tl.abs({{0}}) > {f64(ops.LOG_EPS)}, "
                         f"tl.log(tl.abs({{0}})), {f64(ops.LOG_FLOOR)})"}),
    Primitive("pexp", OP_CONST + 10, (F,), F, ops.pexp, _np_pexp, "pexp({0})", "exp({0})",
              lambda S, a: S.exp(a),
              {"numpy": "pexp({0})", "torch": "pexp({0})",
               "triton": f"tl.where({{0}} < {f64(ops.EXP_MAX)}, tl.exp({{0}}), "
                         f"{f64(ops.EXP_CAP)})"}),
    Primitive("psqrt", OP_CONST + 11, (F,), F, ops.psqrt, _np_arith(lambda a: np.sqrt(np.abs(a))),
              "psqrt({0})", "sqrt|{0}|", lambda S, a: S.sqrt(S.Abs(a)),
              {"numpy": "np.sqrt(np.abs({0}))", "torch": "torch.sqrt(torch.abs({0}))",
               "triton": "tl.sqrt(tl.abs({0}))"}),
    Primitive("square", OP_CONST + 12, (F,), F, ops.square, _np_arith(np.square), "square({0})",
              "({0})^2", lambda S, a: a ** 2, _same("({0} * {0})")),
    Primitive("lt", OP_CONST + 13, (F, F), B, operator.lt, _np_arith(np.less), "({0} < {1})",
              "({0} < {1})", lambda S, a, b: S.StrictLessThan(a, b), _same("({0} < {1})")),
    Primitive("ite", OP_CONST + 14, (B, F, F), F, ops.ite, lambda c, a, b: np.where(c, a, b),
              "ite({0}, {1}, {2})", "({1} if {0} else {2})",
              lambda S, c, a, b: S.Piecewise((a, c), (b, True)),
              _lib("where({0}, {1}, {2})", "tl.where({0}, {1}, {2})")),
    Primitive("and_", OP_CONST + 15, (B, B), B, lambda a, b: a and b, np.logical_and,
              "({0} and {1})", "({0} and {1})", lambda S, a, b: S.And(a, b),
              _lib("logical_and({0}, {1})", "({0} & {1})")),
    Primitive("or_", OP_CONST + 16, (B, B), B, lambda a, b: a or b, np.logical_or,
              "({0} or {1})", "({0} or {1})", lambda S, a, b: S.Or(a, b),
              _lib("logical_or({0}, {1})", "({0} | {1})")),
    Primitive("not_", OP_CONST + 17, (B,), B, operator.not_, np.logical_not, "(not {0})",
              "(not {0})",
              lambda S, a: S.Not(a), _lib("logical_not({0})", "(~{0})")),
)
EXPORTS = ("numpy", "torch", "triton")
if any(set(p.exports) != set(EXPORTS) for p in PRIMITIVES):
    raise ImportError("evolve.lang.primitives: a primitive misses an export template")

BY_NAME: dict[str, Primitive] = {p.name: p for p in PRIMITIVES}
BY_OPCODE: dict[int, Primitive] = {p.opcode: p for p in PRIMITIVES}
INPUT_INDEX = {i[0]: k for k, i in enumerate(ALL_INPUTS)}
INPUT_TYPE = {i[0]: i[2] for i in ALL_INPUTS}
INPUT_SHORT = {i[0]: i[1] for i in ALL_INPUTS}
MAX_OPCODE = max(BY_OPCODE)

# Opcodes, by name, for the kernel (plain ints so Numba sees constants).
OP = {p.name: p.opcode for p in PRIMITIVES}

# Names a tree string may contain; anything else is rejected by the parser.
RESERVED = set(BY_NAME) | set(INPUT_INDEX)

# Constants the generator draws from half of the time (the rest uniform in [-1, 1]).
ROUND_CONSTANTS = (0.0, 0.1, 0.5, 1.0, 2.0, 10.0)
CONSTANT_NAME = "const"


def random_constant() -> float:
    """The ephemeral constant generator (module-level, so it pickles)."""
    if random.random() < 0.5:
        return random.choice(ROUND_CONSTANTS)
    return round(random.uniform(-1.0, 1.0), 3)


def input_names(trace: bool = False, slots: bool = False, lookahead: bool = False) -> tuple:
    """The inputs (and the heuristic's signature): six, nine on trace data, twelve
    with the slot features (``slots``: a tree that reads one), fourteen with the
    lookahead inputs (``lookahead``: a tree that reads one)."""
    groups = set()
    if trace:
        groups.add("trace")
        if slots:
            groups.add("slot")
        if lookahead:
            groups.add("lookahead")
    return signature({"token"} | groups)


def uses_slot_inputs(nodes) -> bool:
    """Whether parsed tree nodes read an input that needs the slot features: a slot
    feature (slot_tv, slot_kl_pq, slot_kl_qp) or a lookahead input (next_tv, ahead,
    computed from the slot TVs)."""
    return "slot" in with_needs(groups_read(nodes))


def uses_lookahead_inputs(nodes) -> bool:
    """Whether parsed tree nodes read a lookahead input (next_tv, ahead): the exact
    objectives are then an estimate (``evolve.lang.features``)."""
    return "lookahead" in groups_read(nodes)


def offered_inputs(trace: bool = False, slots: bool = True, lookahead: bool = False,
                   extra=(), ranks: bool = False) -> tuple:
    """The inputs data of a kind offers a search, in table order
    (``evolve.lang.features.offered``)."""
    return offered(trace, slots, lookahead, extra, ranks)


def primitives_for(inputs) -> tuple:
    """The primitives a search over ``inputs`` uses: all of them, except that without
    a truth-valued input (``top_token_match``) the primitives that take or make a
    truth value (comparison, branch, and/or/not) are left out: DEAP's typed
    generators need a leaf of every type they may have to place."""
    if any(INPUT_TYPE[n] is bool for n in inputs):
        return PRIMITIVES
    return tuple(p for p in PRIMITIVES if p.ret is not bool and bool not in p.args)


def make_pset(trace: bool = False, slots: bool = True, lookahead: bool = False,
              only=None, extra=(), ranks: bool = False):
    """The strongly typed DEAP primitive set, built from the table.

    ``trace=True`` adds the trace features (block_position, p_max, q_max) and,
    with ``slots``, the slot features (the split must have them); ``lookahead``
    (with ``slots``) also the lookahead inputs; ``ranks`` the target's rank (the
    splits record it). ``only`` (input names, each among those offered) keeps just
    those inputs (``evolve run --inputs``)."""
    from deap import gp    # lazy: start-up (DEAP loads only where it is used)

    names = offered_inputs(trace, slots, lookahead, extra, ranks)
    if only is not None:
        extra = [n for n in only if n not in names]
        if extra:
            raise ValueError(f"input {extra[0]!r} is not among those offered: {names}")
        names = tuple(n for n in names if n in set(only))
    inputs = [ALL_INPUTS[INPUT_INDEX[n]] for n in names]
    pset = gp.PrimitiveSetTyped("heuristic", [i[2] for i in inputs], float)
    pset.renameArguments(**{f"ARG{k}": i[0] for k, i in enumerate(inputs)})
    for p in primitives_for(names):
        pset.addPrimitive(p.numpy, list(p.args), p.ret, name=p.name)
    pset.addEphemeralConstant(CONSTANT_NAME, random_constant, float)
    return pset


# The sympy column, by name (`evolve inspect`'s simplified formula): protected
# operators read as their plain counterparts (pdiv as /, plog as log|x|, ...), so the
# text reads as the rule does on ordinary inputs; a reading aid, never evaluated.
SYMPY: dict[str, Callable] = {p.name: p.sympy for p in PRIMITIVES}
