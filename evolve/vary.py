"""DEAP's variation over arrays, drawing the same random numbers.

The engine's variation step is ``algorithms.varAnd`` with ``gp.cxOnePoint`` and
a mutation that picks one of ``gp.mutUniform`` (``genFull``, heights 0-2),
``gp.mutNodeReplacement``, ``gp.mutShrink`` and ``gp.mutEphemeral``, both
operators wrapped in the height and size limits (engine._static_limit). In
Python, on DEAP trees, that costs a few microseconds per tree: at a population
of 1000, more than the kernels that score the trees. Here the same step runs in
one compiled loop over a population stored as arrays: node ids in prefix order
(the ids index ``Table``, built from the DEAP primitive set) with the constant
of each node beside it.

Same draws, same trees: the loop runs CPython's Mersenne Twister on the state
``random.Random.getstate()`` hands out and reads it as CPython does
(evolve.stream: ``random()``, ``_randbelow`` for ``choice``/``randrange``/
``randint``; here also ``uniform`` and ``round(x, 3)``, done exactly). Every operator makes DEAP's
draws in DEAP's order, including the order of ``list(set(...))`` in
crossover, which is read off the running interpreter. The limits reproduce
DEAP's sharing of copies: when both children of a crossover are over a limit
and the same parent is drawn for both, the two offspring are one object, and a
later in-place mutation of one changes the other. Here trees are "objects"
whose content is a version in an append-only arena, so sharing costs nothing
and behaves as in DEAP. tests/test_vary.py checks every operator, the limits
and whole generations against DEAP on random populations.

``Table.build`` returns None for a primitive set the loop does not know (more
than three types or arguments, another constant generator, a type without
terminals or primitives), and ``stream_matches()`` is False on an interpreter
whose random stream reads differently; either way the engine runs DEAP's own
operators on DEAP trees.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass

import numpy as np
from numba import njit

from evolve import primitives as P
from evolve import stream
from evolve.stream import below, uniform01

PRIM, TERM, EPH = 0, 1, 2
MAX_ARGS = 3
MAX_TYPES = 3

# ------------------------------------------------------------------ table

# Columns of the node table (Table.nt) and of the type table (Table.tt).
K_KIND, K_ARITY, K_RET, K_NSAME, K_NSHRINK, K_ARGS = 0, 1, 2, 3, 4, 5
K_SHRINK = K_ARGS + MAX_ARGS
K_SAME = K_SHRINK + MAX_ARGS
T_NTERMS, T_NPRIMS, T_ORDER, T_TERMS = 0, 1, 2, 3
# Columns of the object table: where the tree's current version is, the parent
# an untouched clone came from (-1: a copy made by a limit), fitness valid.
O_START, O_LEN, O_SRC, O_VALID = 0, 1, 2, 3
# The scratch array: type counts, generate's stacks, the limits' copies and
# snapshots, then room for heights (as long as the arena: any tree fits).
S_C1, S_C2, S_COMMON, S_SD, S_ST, S_COPIES, S_SNAP, S_NEW = 0, 3, 6, 9, 73, 137, 139, 147
S_HEIGHTS = 160


@dataclass
class Table:
    """Every node kind of a primitive set, by id, as the loop reads them."""
    nodes: list            # DEAP Primitive / Terminal objects; the ephemeral class for EPH
    text: list             # leaf text (terminals) or name (primitives)
    arity: np.ndarray      # int64 per id (also nt[:, K_ARITY])
    opcode: np.ndarray     # int32 kernel opcode (primitives.OP, input index, OP_CONST)
    eph: int               # id of the ephemeral constant
    index: dict            # DEAP node name -> id
    # per id: kind, arity, return type, then (columns K_*) the argument types, the
    # argument positions typed like the return (mutShrink) and the primitives
    # with the same signature (mutNodeReplacement), -1 past the counts
    nt: np.ndarray
    # per type: terminals and primitives in pset order (columns T_*), and in
    # row r of T_ORDER the r-th type in cxOnePoint's list(common types) order
    tt: np.ndarray
    round_consts: np.ndarray

    @classmethod
    def build(cls, pset) -> "Table | None":
        from deap import gp

        types = list(pset.primitives)
        if set(pset.terminals) - set(types) or len(types) > MAX_TYPES:
            return None
        order = _common_type_order(types)
        if order is None:
            return None
        tix = {t: i for i, t in enumerate(types)}
        nodes, text, kind = [], [], []
        index: dict = {}
        eph = -1
        for t in types:
            for p in pset.primitives[t]:
                if p.arity > MAX_ARGS or p.name in index or p.name not in P.OP:
                    return None
                index[p.name] = len(nodes)
                nodes.append(p)
                text.append(p.name)
                kind.append(PRIM)
        for t in types:
            for term in pset.terminals[t]:
                if isinstance(term, gp.MetaEphemeral):
                    # the loop draws constants as primitives.random_constant does
                    if eph >= 0 or term.func is not P.random_constant or term.ret is not float:
                        return None
                    eph = len(nodes)
                    index[term.__name__] = eph
                    nodes.append(term)
                    text.append(P.CONSTANT_NAME)
                    kind.append(EPH)
                else:
                    if not isinstance(term.value, str) or term.value not in P.INPUT_INDEX:
                        return None
                    index[term.value] = len(nodes)
                    nodes.append(term)
                    text.append(term.format())
                    kind.append(TERM)
        if eph < 0:
            return None
        width = max([len(v) for v in pset.primitives.values()] +
                    [len(v) for v in pset.terminals.values()] + [1])
        nt = np.full((len(nodes), K_SAME + width), -1, dtype=np.int64)
        opcode = np.empty(len(nodes), dtype=np.int32)
        for i, (x, k) in enumerate(zip(nodes, kind)):
            nt[i, K_KIND], nt[i, K_RET] = k, tix[x.ret]
            nt[i, K_ARITY] = nt[i, K_NSAME] = nt[i, K_NSHRINK] = 0
            if k == PRIM:
                opcode[i] = P.OP[x.name]
                nt[i, K_ARITY] = x.arity
                nt[i, K_ARGS:K_ARGS + x.arity] = [tix[a] for a in x.args]
                pos = [j for j, a in enumerate(x.args) if a == x.ret]
                nt[i, K_SHRINK:K_SHRINK + len(pos)] = pos
                same = [index[p.name] for p in pset.primitives[x.ret] if p.args == x.args]
                nt[i, K_SAME:K_SAME + len(same)] = same
                nt[i, K_NSHRINK], nt[i, K_NSAME] = len(pos), len(same)
            else:
                opcode[i] = P.INPUT_INDEX[x.value] if k == TERM else P.OP_CONST
        tt = np.full((len(types), T_TERMS + 2 * width), -1, dtype=np.int64)
        for t in types:
            ti = tix[t]
            tl = [index[x.__name__] if isinstance(x, gp.MetaEphemeral) else index[x.value]
                  for x in pset.terminals.get(t, [])]
            pl = [index[x.name] for x in pset.primitives[t]]
            if not tl or not pl:
                return None    # DEAP's generate would raise for such a type
            tt[ti, T_NTERMS], tt[ti, T_NPRIMS], tt[ti, T_ORDER] = len(tl), len(pl), tix[order[ti]]
            tt[ti, T_TERMS:T_TERMS + len(tl)] = tl
            tt[ti, T_TERMS + width:T_TERMS + width + len(pl)] = pl
        return cls(nodes, text, np.ascontiguousarray(nt[:, K_ARITY]), opcode, eph, index, nt, tt,
                   np.array(P.ROUND_CONSTANTS, dtype=np.float64))


def _common_type_order(types):
    """The order cxOnePoint's ``list(set(types1).intersection(set(types2)))``
    lists types in, as one ranking valid for every subset and insertion order
    on this interpreter; None if there is no such ranking."""
    rank = {t: i for i, t in enumerate(list(set(types)))}
    for r in range(1, len(types) + 1):
        for a in itertools.permutations(types, r):
            for s in range(1, len(types) + 1):
                for b in itertools.permutations(types, s):
                    got = list(set(dict.fromkeys(a).keys()).intersection(set(dict.fromkeys(b).keys())))
                    if got != sorted(got, key=rank.__getitem__):
                        return None
    return sorted(types, key=rank.__getitem__)


# ------------------------------------------------------ the random stream

@njit(cache=True, nogil=True)
def _round3(x):
    """``round(x, 3)`` for a finite float of magnitude <= 2**10, exactly as CPython:
    the decimal nearest to the exact binary value (ties to even), back to float."""
    if x == 0.0:
        return x
    m, e = math.frexp(abs(x))
    big = np.uint64(m * 9007199254740992.0)        # |x| = big * 2**(e - 53), exact
    a = big * np.uint64(1000)                      # < 2**63
    s = 53 - e
    if s >= 64:
        q = np.uint64(0)
    else:
        q = a >> np.uint64(s)
        rem = a - (q << np.uint64(s))
        half = np.uint64(1) << np.uint64(s - 1)
        if rem > half or (rem == half and (q & np.uint64(1)) == np.uint64(1)):
            q += np.uint64(1)
    r = np.float64(q) / 1000.0
    return -r if x < 0.0 else r


@njit(cache=True, nogil=True)
def _constant(mt, pos, round_consts):
    """``primitives.random_constant()``."""
    if uniform01(mt, pos) < 0.5:
        return round_consts[below(mt, pos, round_consts.shape[0])]
    return _round3(-1.0 + 2.0 * uniform01(mt, pos))


@njit(cache=True, nogil=True)
def _constants(mt, pos, m, round_consts):
    out = np.empty(m, dtype=np.float64)
    for i in range(m):
        out[i] = _constant(mt, pos, round_consts)
    return out


@functools.lru_cache(maxsize=1)
def stream_matches() -> bool:
    """Whether the compiled draws are this interpreter's (evolve.stream), the
    constant generator's included: values, signs and the state left behind."""
    if not stream.stream_matches():
        return False
    py = random.Random(20261123)
    mt, pos, version, gauss = stream.state_arrays(py)
    got = _constants(mt, pos, 3000, np.array(P.ROUND_CONSTANTS, dtype=np.float64)).tolist()
    outer = random.getstate()
    random.setstate(py.getstate())
    try:
        want = [P.random_constant() for _ in range(3000)]
        end = random.getstate()
    finally:
        random.setstate(outer)
    ours = random.Random()
    stream.set_state(ours, mt, pos, version, gauss)
    return [(v, math.copysign(1.0, v)) for v in got] == \
        [(v, math.copysign(1.0, v)) for v in want] and ours.getstate() == end


# ------------------------------------------------------------- tree arrays



@njit(cache=True, nogil=True)
def _end(codes, begin, nt):
    """End of the subtree rooted at ``begin`` (PrimitiveTree.searchSubtree)."""
    end = begin + 1
    total = nt[codes[begin], K_ARITY]
    while total > 0:
        total += nt[codes[end], K_ARITY] - 1
        end += 1
    return end


@njit(cache=True, nogil=True)
def _height(codes, start, length, nt, sc):
    """PrimitiveTree.height (a leaf: 0)."""
    sp = S_HEIGHTS
    for i in range(start + length - 1, start - 1, -1):
        h = 0
        for _ in range(nt[codes[i], K_ARITY]):
            sp -= 1
            if sc[sp] + 1 > h:
                h = sc[sp] + 1
        sc[sp] = h
        sp += 1
    return sc[S_HEIGHTS]


@njit(cache=True, nogil=True)
def _splice(a_codes, a_vals, pos, s, length, b, e, sb, se):
    """Append a version: tree [s, s+length) with [b, e) replaced by [sb, se).
    Returns its start; the arena has room (checked by the caller)."""
    w = pos[1]
    start = w
    for i in range(s, b):
        a_codes[w] = a_codes[i]
        a_vals[w] = a_vals[i]
        w += 1
    for i in range(sb, se):
        a_codes[w] = a_codes[i]
        a_vals[w] = a_vals[i]
        w += 1
    for i in range(e, s + length):
        a_codes[w] = a_codes[i]
        a_vals[w] = a_vals[i]
        w += 1
    pos[1] = w
    return start


@njit(cache=True, nogil=True)
def _nth(a_codes, s, length, r, nt, t):
    """Index (from 1) of the r-th non-root node of type t."""
    c = 0
    for i in range(1, length):
        if nt[a_codes[s + i], K_RET] == t:
            if c == r:
                return i
            c += 1
    return -1


@njit(cache=True, nogil=True)
def _cx_one_point(o1, o2, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """gp.cxOnePoint on two distinct objects, in place (new versions)."""
    l1, l2 = obj[o1, O_LEN], obj[o2, O_LEN]
    if l1 < 2 or l2 < 2:
        return
    s1, s2 = obj[o1, O_START], obj[o2, O_START]
    for t in range(MAX_TYPES):
        sc[S_C1 + t] = 0
        sc[S_C2 + t] = 0
    for i in range(1, l1):
        sc[S_C1 + nt[a_codes[s1 + i], K_RET]] += 1
    for i in range(1, l2):
        sc[S_C2 + nt[a_codes[s2 + i], K_RET]] += 1
    nc = 0
    for r in range(tt.shape[0]):
        t = tt[r, T_ORDER]
        if sc[S_C1 + t] > 0 and sc[S_C2 + t] > 0:
            sc[S_COMMON + nc] = t
            nc += 1
    if nc == 0:
        return
    t = sc[S_COMMON + below(mt, pos, nc)]
    i1 = _nth(a_codes, s1, l1, below(mt, pos, sc[S_C1 + t]), nt, t)
    i2 = _nth(a_codes, s2, l2, below(mt, pos, sc[S_C2 + t]), nt, t)
    b1, b2 = s1 + i1, s2 + i2
    e1, e2 = _end(a_codes, b1, nt), _end(a_codes, b2, nt)
    n1 = _splice(a_codes, a_vals, pos, s1, l1, b1, e1, b2, e2)
    n2 = _splice(a_codes, a_vals, pos, s2, l2, b2, e2, b1, e1)
    obj[o1, O_START], obj[o1, O_LEN] = n1, l1 - (e1 - b1) + (e2 - b2)
    obj[o2, O_START], obj[o2, O_LEN] = n2, l2 - (e2 - b2) + (e1 - b1)


@njit(cache=True, nogil=True)
def _terminal(t, mt, pos, nt, tt, rc):
    """random.choice(pset.terminals[t]), an ephemeral called: (id, value)."""
    term = tt[t, T_TERMS + below(mt, pos, tt[t, T_NTERMS])]
    if nt[term, K_KIND] == EPH:
        return term, _constant(mt, pos, rc)
    return term, 0.0


@njit(cache=True, nogil=True)
def _mut_uniform(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """gp.mutUniform with expr = gp.genFull(min_=0, max_=2)."""
    s, length = obj[o, O_START], obj[o, O_LEN]
    b = s + below(mt, pos, length)
    e = _end(a_codes, b, nt)
    height = below(mt, pos, 3)             # randint(0, 2)
    t_prims = T_TERMS + (tt.shape[1] - T_TERMS) // 2
    # gp.generate, written to the arena, then spliced in
    g0 = pos[1]
    w = g0
    sc[S_SD] = 0
    sc[S_ST] = nt[a_codes[b], K_RET]
    sp = 1
    while sp > 0:
        sp -= 1
        d, t = sc[S_SD + sp], sc[S_ST + sp]
        if d == height:
            node, v = _terminal(t, mt, pos, nt, tt, rc)
            a_codes[w] = node
            a_vals[w] = v
        else:
            node = tt[t, t_prims + below(mt, pos, tt[t, T_NPRIMS])]
            a_codes[w] = node
            a_vals[w] = 0.0
            for j in range(nt[node, K_ARITY] - 1, -1, -1):
                sc[S_SD + sp] = d + 1
                sc[S_ST + sp] = nt[node, K_ARGS + j]
                sp += 1
        w += 1
    pos[1] = w
    new = _splice(a_codes, a_vals, pos, s, length, b, e, g0, w)
    obj[o, O_START], obj[o, O_LEN] = new, length - (e - b) + (w - g0)


@njit(cache=True, nogil=True)
def _mut_node_replacement(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """gp.mutNodeReplacement."""
    s, length = obj[o, O_START], obj[o, O_LEN]
    if length < 2:
        return
    i = s + 1 + below(mt, pos, length - 1)   # randrange(1, len)
    node = a_codes[i]
    if nt[node, K_ARITY] == 0:
        new_node, v = _terminal(nt[node, K_RET], mt, pos, nt, tt, rc)
    else:
        new_node, v = nt[node, K_SAME + below(mt, pos, nt[node, K_NSAME])], 0.0
    new = _splice(a_codes, a_vals, pos, s, length, i, i, i, i)
    a_codes[new + i - s] = new_node
    a_vals[new + i - s] = v
    obj[o, O_START] = new


@njit(cache=True, nogil=True)
def _mut_shrink(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """gp.mutShrink."""
    s, length = obj[o, O_START], obj[o, O_LEN]
    if length < 3 or _height(a_codes, s, length, nt, sc) <= 1:
        return
    count = 0
    for i in range(s + 1, s + length):
        if nt[a_codes[i], K_KIND] == PRIM and nt[a_codes[i], K_NSHRINK] > 0:
            count += 1
    if count == 0:
        return
    r = below(mt, pos, count)
    index = -1
    for i in range(s + 1, s + length):
        if nt[a_codes[i], K_KIND] == PRIM and nt[a_codes[i], K_NSHRINK] > 0:
            if r == 0:
                index = i
                break
            r -= 1
    node = a_codes[index]
    arg = nt[node, K_SHRINK + below(mt, pos, nt[node, K_NSHRINK])]
    rb = index + 1
    re = rb
    for _ in range(arg + 1):
        rb = re
        re = _end(a_codes, rb, nt)
    e = _end(a_codes, index, nt)
    new = _splice(a_codes, a_vals, pos, s, length, index, e, rb, re)
    obj[o, O_START], obj[o, O_LEN] = new, length - (e - index) + (re - rb)


@njit(cache=True, nogil=True)
def _mut_ephemeral(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """gp.mutEphemeral(mode="one")."""
    s, length = obj[o, O_START], obj[o, O_LEN]
    count = 0
    for i in range(s, s + length):
        if nt[a_codes[i], K_KIND] == EPH:
            count += 1
    if count == 0:
        return
    r = below(mt, pos, count)
    index = -1
    for i in range(s, s + length):
        if nt[a_codes[i], K_KIND] == EPH:
            if r == 0:
                index = i
                break
            r -= 1
    v = _constant(mt, pos, rc)
    new = _splice(a_codes, a_vals, pos, s, length, index, index, index, index)
    a_vals[new + index - s] = v
    obj[o, O_START] = new


@njit(cache=True, nogil=True)
def _mutate(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc):
    """Evolution._mutate (synthetic data)."""
    r = uniform01(mt, pos)
    if r < 0.5:
        _mut_uniform(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)
    elif r < 0.7:
        _mut_node_replacement(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)
    elif r < 0.85:
        _mut_shrink(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)
    else:
        _mut_ephemeral(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)


@njit(cache=True, nogil=True)
def _limit(nargs, obj, a_codes, mt, pos, max_height, max_size, nt, sc):
    """engine._static_limit after an operator on ``nargs`` trees (the new ones at
    sc[S_NEW:], their snapshots at sc[S_SNAP:], 3 numbers each): an offspring
    over the height limit, then one over the size limit, becomes a copy of a
    random parent as it was before the operator; one copy per parent and
    level, shared as in DEAP."""
    for level in range(2):
        sc[S_COPIES] = -1
        sc[S_COPIES + 1] = -1
        for i in range(nargs):
            o = sc[S_NEW + i]
            if level == 0:
                over = obj[o, O_LEN] > max_height + 1 and \
                    _height(a_codes, obj[o, O_START], obj[o, O_LEN], nt, sc) > max_height
            else:
                over = obj[o, O_LEN] > max_size
            if over:
                j = below(mt, pos, nargs)
                if sc[S_COPIES + j] < 0:
                    c = pos[2]
                    pos[2] += 1
                    obj[c, O_START] = sc[S_SNAP + 3 * j]
                    obj[c, O_LEN] = sc[S_SNAP + 3 * j + 1]
                    obj[c, O_SRC] = -1
                    obj[c, O_VALID] = sc[S_SNAP + 3 * j + 2]
                    sc[S_COPIES + j] = c
                sc[S_NEW + i] = sc[S_COPIES + j]


@njit(cache=True, nogil=True)
def _snap(obj, o, j, sc):
    sc[S_SNAP + 3 * j] = obj[o, O_START]
    sc[S_SNAP + 3 * j + 1] = obj[o, O_LEN]
    sc[S_SNAP + 3 * j + 2] = obj[o, O_VALID]
    sc[S_NEW + j] = o


@njit(cache=True, nogil=True)
def _vary(codes, values, starts, lens, chosen, mt, pos, cxpb, mutpb, max_height, max_size,
          nt, tt, rc, a_codes, a_vals, sc, n_obj):
    """varAnd(chosen parents): returns (status, slot objects, object table).
    pos: [generator index, arena fill, objects]. Status 1: the arena is too
    small, 2: more than ``n_obj`` objects are needed (retry larger). The
    parents are copied to the arena's start, and the clones point there."""
    k = chosen.shape[0]
    cap = a_codes.shape[0]
    n = codes.shape[0]
    # k clones, then the limits' copies (at most 4 per crossover, 2 per mutation)
    obj = np.empty((max(n_obj, k + 4), 4), dtype=np.int64)
    slot = np.empty(k, dtype=np.int64)
    if n + 64 > cap:
        return 1, slot, obj
    a_codes[:n] = codes
    a_vals[:n] = values
    for i in range(k):
        p = chosen[i]
        obj[i, O_START], obj[i, O_LEN], obj[i, O_SRC], obj[i, O_VALID] = starts[p], lens[p], p, 1
        slot[i] = i
    pos[1], pos[2] = n, k
    for i in range(1, k, 2):
        if uniform01(mt, pos) < cxpb:
            o1, o2 = slot[i - 1], slot[i]
            if pos[1] + obj[o1, O_LEN] + obj[o2, O_LEN] > cap:
                return 1, slot, obj
            if pos[2] + 4 > obj.shape[0]:
                return 2, slot, obj
            _snap(obj, o1, 0, sc)
            _snap(obj, o2, 1, sc)
            _cx_one_point(o1, o2, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)
            _limit(2, obj, a_codes, mt, pos, max_height, max_size, nt, sc)
            slot[i - 1], slot[i] = sc[S_NEW], sc[S_NEW + 1]
            obj[slot[i - 1], O_VALID] = 0
            obj[slot[i], O_VALID] = 0
    for i in range(k):
        if uniform01(mt, pos) < mutpb:
            o = slot[i]
            # mutUniform writes the generated subtree (at most 1 + 3 + 9 nodes),
            # then the tree with it spliced in
            if pos[1] + 2 * obj[o, O_LEN] + 32 > cap:
                return 1, slot, obj
            if pos[2] + 2 > obj.shape[0]:
                return 2, slot, obj
            _snap(obj, o, 0, sc)
            _mutate(o, obj, a_codes, a_vals, mt, pos, nt, tt, rc, sc)
            _limit(1, obj, a_codes, mt, pos, max_height, max_size, nt, sc)
            slot[i] = sc[S_NEW]
            obj[slot[i], O_VALID] = 0
    return 0, slot, obj


# ------------------------------------------------------------- populations

@dataclass
class Population:
    """Trees as arrays: node ids and constants in prefix order, one slice per
    individual; train fitness (weighted, as DEAP's wvalues), generation born,
    and a 128-bit hash of each tree's content (its identity in caches)."""
    codes: np.ndarray      # int64
    values: np.ndarray     # float64
    starts: np.ndarray     # int64
    lens: np.ndarray       # int64
    fit: np.ndarray        # float64; NaN where not evaluated yet
    born: np.ndarray       # int64
    h1: np.ndarray         # int64
    h2: np.ndarray         # int64

    def __len__(self) -> int:
        return int(self.starts.shape[0])


@njit(cache=True, nogil=True)
def _mix(h):
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(cache=True, nogil=True)
def _hashes(codes, bits, starts, lens, h1, h2):
    """Two independent 64-bit hashes of each tree (node ids and constant bits)."""
    for i in range(starts.shape[0]):
        a = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(lens[i])
        b = np.uint64(0xD6E8FEB86659FD93) ^ np.uint64(lens[i])
        for j in range(starts[i], starts[i] + lens[i]):
            c = np.uint64(codes[j])
            a = _mix(a + c * np.uint64(0xA0761D6478BD642F))
            a = _mix(a ^ bits[j])
            b = _mix((b ^ bits[j]) + c * np.uint64(0xE7037ED1A0B428DB) + np.uint64(1))
        h1[i] = np.int64(a)
        h2[i] = np.int64(b)


def hash_trees(pop: "Population") -> None:
    _hashes(pop.codes, pop.values.view(np.uint64), pop.starts, pop.lens, pop.h1, pop.h2)


@njit(cache=True, nogil=True)
def _gather(slot, obj, a_codes, a_vals, elites, starts, lens, fit, born, generation):
    """The offspring (each slot's object as it ends) then copies of the elites
    (the parents are at the arena's start), with each tree's two hashes."""
    k = slot.shape[0]
    n = k + elites.shape[0]
    src = np.empty(n, dtype=np.int64)
    out_lens = np.empty(n, dtype=np.int64)
    out_fit = np.empty(n, dtype=np.float64)
    out_born = np.empty(n, dtype=np.int64)
    for i in range(k):
        o = slot[i]
        src[i], out_lens[i] = obj[o, O_START], obj[o, O_LEN]
        if obj[o, O_VALID]:
            p = obj[o, O_SRC]     # an untouched clone of parent p
            out_fit[i], out_born[i] = fit[p], born[p]
        else:
            out_fit[i], out_born[i] = np.nan, generation
    for i in range(elites.shape[0]):
        p = elites[i]
        src[k + i], out_lens[k + i] = starts[p], lens[p]
        out_fit[k + i], out_born[k + i] = fit[p], born[p]
    out_starts = np.empty(n, dtype=np.int64)
    total = 0
    for i in range(n):
        out_starts[i] = total
        total += out_lens[i]
    out_codes = np.empty(total, dtype=np.int64)
    out_vals = np.empty(total, dtype=np.float64)
    for i in range(n):
        w, s = out_starts[i], src[i]
        for j in range(out_lens[i]):
            out_codes[w + j] = a_codes[s + j]
            out_vals[w + j] = a_vals[s + j]
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    _hashes(out_codes, out_vals.view(np.uint64), out_starts, out_lens, h1, h2)
    return out_codes, out_vals, out_starts, out_lens, out_fit, out_born, h1, h2


class Workspace:
    """The arena and scratch the variation loop writes, kept from one generation
    to the next: fresh half-megabyte arrays each time would cost page faults."""

    def __init__(self):
        self.cap = 0
        self.retries = 0

    def arena(self, cap: int):
        if cap > self.cap:
            self.cap = cap
            self.codes = np.empty(cap, dtype=np.int64)
            self.values = np.empty(cap, dtype=np.float64)
            self.scratch = np.zeros(S_HEIGHTS + cap + 1, dtype=np.int64)
        return self.codes, self.values, self.scratch


def vary(table: Table, pop: Population, chosen: np.ndarray, elites: np.ndarray, mt, pos,
         cx_prob: float, mut_prob: float, max_height: int, max_size: int,
         generation: int, work: Workspace | None = None, room: tuple | None = None
         ) -> Population:
    """``varAnd`` on ``pop[chosen]`` with the engine's operators and limits, then
    copies of ``pop[elites]``. Draws from the generator state (mt, pos) of
    ``stream.state_arrays`` exactly as DEAP would, advancing it in place.
    Offspring changed by an operator have fitness NaN and are born in
    ``generation``. ``room``: the arena and object-table sizes to start with
    (grown as needed; for tests)."""
    work = work or Workspace()
    chosen = np.ascontiguousarray(chosen, dtype=np.int64)
    nt, tt, rc = table.nt, table.tt, table.round_consts
    # the parents, then new versions of trees: two per crossover, two per mutation
    cap = 3 * len(pop.codes) + 16 * len(chosen) + 256
    n_obj = len(chosen) + len(chosen) // 8 + 64     # copies by the limits are rare
    if room is not None:
        cap, n_obj = room
    while True:
        m = mt.copy()
        p = np.array([pos[0], 0, 0], dtype=np.int64)
        a_codes, a_vals, scratch = work.arena(cap)
        status, slot, obj = _vary(pop.codes, pop.values, pop.starts, pop.lens, chosen, m, p,
                                  float(cx_prob), float(mut_prob), int(max_height),
                                  int(max_size), nt, tt, rc, a_codes, a_vals, scratch, n_obj)
        if status == 0:
            break
        # out of room: again, from the same state, with more
        if status == 1:
            cap = 4 * max(cap, work.cap)
        else:
            n_obj = 5 * len(chosen) + 8
        work.retries += 1
    mt[:] = m
    pos[0] = p[0]
    return Population(*_gather(slot, obj, a_codes, a_vals,
                               np.ascontiguousarray(elites, dtype=np.int64), pop.starts,
                               pop.lens, pop.fit, pop.born, int(generation)))


# ------------------------------------------------------------ conversions

def from_deap(table: Table, individuals, fit=None, born=None) -> Population:
    """Arrays for DEAP trees (fitness NaN and born 0 unless given)."""
    lens = np.fromiter(map(len, individuals), dtype=np.int64, count=len(individuals))
    starts = np.zeros(len(individuals), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    codes = np.empty(int(lens.sum()), dtype=np.int64)
    values = np.zeros(len(codes), dtype=np.float64)
    from deap import gp
    index, eph = table.index, table.eph
    w = 0
    for ind in individuals:
        for node in ind:
            if isinstance(node, gp.Primitive):
                codes[w] = index[node.name]
            elif isinstance(type(node), gp.MetaEphemeral):
                codes[w] = eph
                values[w] = float(node.value)
            else:
                codes[w] = index[node.value]
            w += 1
    n = len(individuals)
    pop = Population(codes, values, starts, lens,
                     np.full(n, np.nan) if fit is None else np.asarray(fit, dtype=np.float64),
                     np.zeros(n, dtype=np.int64) if born is None
                     else np.asarray(born, dtype=np.int64),
                     np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
    hash_trees(pop)
    return pop


def to_deap(table: Table, pop: Population, i: int, cls):
    """Individual i as a DEAP tree of class ``cls`` (fitness and born set if known)."""
    from deap import gp
    s, n = int(pop.starts[i]), int(pop.lens[i])
    eph_cls = table.nodes[table.eph]
    out = []
    for code, v in zip(pop.codes[s:s + n].tolist(), pop.values[s:s + n].tolist()):
        if code == table.eph:
            term = eph_cls.__new__(eph_cls)
            gp.Terminal.__init__(term, v, False, float)
            out.append(term)
        else:
            out.append(table.nodes[code])
    ind = cls(out)
    if not math.isnan(pop.fit[i]):
        ind.fitness.wvalues = (float(pop.fit[i]),)
    ind.born = int(pop.born[i])
    return ind


def text(table: Table, pop: Population, i: int) -> str:
    """``str()`` of individual i as a DEAP tree."""
    s, n = int(pop.starts[i]), int(pop.lens[i])
    codes = pop.codes[s:s + n].tolist()
    values = pop.values[s:s + n].tolist()
    arity, names, eph = table.arity, table.text, table.eph
    out: list[str] = []
    for code, v in zip(reversed(codes), reversed(values)):
        k = int(arity[code])
        if k:
            args = [out.pop() for _ in range(k)]
            out.append(f"{names[code]}({', '.join(args)})")
        else:
            out.append(repr(v) if code == eph else names[code])
    return out[0]


@njit(cache=True, nogil=True)
def _programs(codes, values, starts, lens, which, opcode, arity):
    """Kernel programs (treeio.linearise's layout) for individuals ``which``."""
    m = which.shape[0]
    p_starts = np.empty(m, dtype=np.int64)
    p_lens = np.empty(m, dtype=np.int64)
    total = 0
    for j in range(m):
        p_starts[j] = total
        p_lens[j] = lens[which[j]]
        total += p_lens[j]
    ops = np.empty(total, dtype=np.int32)
    consts = np.zeros(total, dtype=np.float64)
    max_stack = 1
    w = 0
    for j in range(m):
        i = which[j]
        sp = 0
        for q in range(starts[i] + lens[i] - 1, starts[i] - 1, -1):
            c = codes[q]
            ops[w] = opcode[c]
            if arity[c] > 0:
                sp -= arity[c] - 1
            else:
                consts[w] = values[q]
                sp += 1
            if sp > max_stack:
                max_stack = sp
            w += 1
    return ops, consts, p_starts, p_lens, max_stack


def programs(table: Table, pop: Population, which):
    from evolve.treeio import Programs
    ops, consts, starts, lens, max_stack = _programs(
        pop.codes, pop.values, pop.starts, pop.lens,
        np.ascontiguousarray(which, dtype=np.int64), table.opcode, table.arity)
    return Programs(ops, consts, starts, lens, int(max_stack))


# ------------------------------------------------------------ fitness cache

from numba import types as _t           # noqa: E402
from numba.typed import Dict as _Dict   # noqa: E402

_KEY = _t.UniTuple(_t.int64, 2)
_KEY3 = _t.UniTuple(_t.int64, 3)


@njit(cache=True, nogil=True)
def _lookup(h1, h2, fit, known):
    """For the unevaluated (NaN) individuals: fill in the fitness of trees in
    ``known``; list the first individual of each other distinct tree (``new``)
    and, for every individual left, the position of its tree in ``new``.
    Returns (unevaluated, distinct among them, new, position)."""
    n = h1.shape[0]
    seen = _Dict.empty(key_type=_KEY, value_type=_t.int64)
    rep = np.full(n, -1, dtype=np.int64)
    new = np.empty(n, dtype=np.int64)
    m = 0
    todo = 0
    for i in range(n):
        if not np.isnan(fit[i]):
            continue
        todo += 1
        key = (h1[i], h2[i])
        if key in seen:
            j = seen[key]
            if j < 0:
                fit[i] = known[key]
            else:
                rep[i] = j
            continue
        if key in known:
            seen[key] = -1
            fit[i] = known[key]
        else:
            seen[key] = m
            rep[i] = m
            new[m] = i
            m += 1
    return todo, len(seen), new[:m], rep


@njit(cache=True, nogil=True)
def _store(h1, h2, fit, new, new_fit, rep, known, ring, ctr):
    """Set the fitness of individuals waiting for ``new``'s and remember the new
    trees, forgetting the oldest beyond the ring's length."""
    for i in range(h1.shape[0]):
        if rep[i] >= 0:
            fit[i] = new_fit[rep[i]]
    limit = ring.shape[0]
    for j in range(new.shape[0]):
        i = new[j]
        key = (h1[i], h2[i])
        head = ctr[0]
        if ctr[1] == limit:
            old = (ring[head, 0], ring[head, 1])
            if old in known:
                del known[old]
        else:
            ctr[1] += 1
        known[key] = new_fit[j]
        ring[head, 0], ring[head, 1] = key
        ctr[0] = (head + 1) % limit


@njit(cache=True, nogil=True)
def _first_each(h1, h2, born, cand):
    """The candidates whose (tree, born) was not met earlier in ``cand``."""
    seen = _Dict.empty(key_type=_KEY3, value_type=_t.int64)
    out = np.empty(cand.shape[0], dtype=np.int64)
    m = 0
    for i in cand:
        key = (h1[i], h2[i], born[i])
        if key not in seen:
            seen[key] = i
            out[m] = i
            m += 1
    return out[:m]


class FitnessCache:
    """Train fitness by tree (hash), the oldest forgotten past ``limit`` trees."""

    def __init__(self, limit: int):
        self.known = _Dict.empty(key_type=_KEY, value_type=_t.float64)
        self.ring = np.empty((limit, 2), dtype=np.int64)
        self.ctr = np.zeros(2, dtype=np.int64)   # next ring slot, entries

    def __len__(self) -> int:
        return len(self.known)

    def evaluate(self, pop: Population, score) -> tuple[int, int]:
        """Fill in every NaN fitness of ``pop``: known trees from the cache,
        each other distinct tree once through ``score(indices) -> fitness``.
        Returns (unevaluated individuals, distinct trees among them)."""
        todo, unique, new, rep = _lookup(pop.h1, pop.h2, pop.fit, self.known)
        if len(new):
            new_fit = np.ascontiguousarray(score(new), dtype=np.float64)
            _store(pop.h1, pop.h2, pop.fit, new, new_fit, rep, self.known, self.ring, self.ctr)
        return int(todo), int(unique)


def first_each(pop: Population, cand: np.ndarray) -> np.ndarray:
    return _first_each(pop.h1, pop.h2, pop.born, np.ascontiguousarray(cand, dtype=np.int64))
