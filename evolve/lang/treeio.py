"""Trees as text and as integer programs.

``parse`` reads a tree string such as ``pdiv(target_prob, draft_prob)`` with our
own tokenizer against the primitive table: only primitive names, input names
and numeric literals are accepted, arity and types are checked, and size and
nesting are bounded. Nothing is ever evaluated, so a run directory cannot make
us execute code (DEAP's own ``from_string`` evaluates unknown tokens; it is
never fed files).

``linearise`` turns trees into the kernel's programs: reversed prefix order,
one opcode per node, the constant of a const node beside it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from evolve.lang import primitives as P
from evolve.errors import EvolveError

MAX_TEXT = 200_000
MAX_NODES = 5_000
MAX_DEPTH = 100

_TOKEN = re.compile(r"\s*(?:(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<punct>[(),]))")


class TreeError(EvolveError):
    """A tree string that is not a well-formed, well-typed tree of our primitives."""


@dataclass(frozen=True)
class Node:
    kind: str          # "prim", "input" or "const"
    name: str          # primitive or input name; "const" for constants
    value: float = 0.0

    @property
    def arity(self) -> int:
        return P.BY_NAME[self.name].arity if self.kind == "prim" else 0

    @property
    def ret(self):
        if self.kind == "prim":
            return P.BY_NAME[self.name].ret
        if self.kind == "input":
            return P.INPUT_TYPE[self.name]
        return float


def _show(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def parse(text: str) -> list[Node]:
    """Parse a tree string into prefix-ordered nodes; raise TreeError if invalid."""
    if not isinstance(text, str):
        raise TreeError(f"tree must be a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise TreeError(f"tree text is {len(text)} characters, more than {MAX_TEXT}")
    nodes: list[Node] = []
    # Each frame: [expected arg types, index of next arg]
    stack: list[list] = []
    pos = 0
    expect_value = True   # a node is expected next (start, after '(' or ',')
    root_done = False
    n = len(text)
    while True:
        m = _TOKEN.match(text, pos)
        if m is None:
            rest = text[pos:].strip()
            if not rest:
                break
            raise TreeError(f"unexpected character {rest[0]!r} at offset {pos} in tree {_show(text)!r}")
        pos = m.end()
        if m.group("num") is not None or m.group("name") is not None:
            if not expect_value or root_done:
                raise TreeError(f"unexpected token {m.group(0).strip()!r} at offset {m.start()}")
            if m.group("num") is not None:
                value = float(m.group("num"))
                if not math.isfinite(value):
                    raise TreeError(f"constant {m.group('num')!r} is not finite")
                node = Node("const", P.CONSTANT_NAME, value)
            else:
                name = m.group("name")
                if name in P.BY_NAME:
                    node = Node("prim", name)
                elif name in P.INPUT_INDEX:
                    node = Node("input", name)
                else:
                    raise TreeError(f"unknown name {_show(name)!r} in tree (allowed: primitives "
                                    f"and inputs of the primitive table)")
            if stack:
                types, i = stack[-1]
                if node.ret is not types[i]:
                    raise TreeError(f"argument {i + 1} of a primitive must be "
                                    f"{types[i].__name__}, got {node.name} ({node.ret.__name__})")
            elif node.ret is not float:
                raise TreeError(f"a tree must return a number, got {node.name} ({node.ret.__name__})")
            nodes.append(node)
            if len(nodes) > MAX_NODES:
                raise TreeError(f"tree has more than {MAX_NODES} nodes")
            if node.kind == "prim":
                m2 = _TOKEN.match(text, pos)
                if m2 is None or m2.group("punct") != "(":
                    raise TreeError(f"primitive {node.name!r} must be followed by '('")
                pos = m2.end()
                stack.append([P.BY_NAME[node.name].args, 0])
                if len(stack) > MAX_DEPTH:
                    raise TreeError(f"tree is nested deeper than {MAX_DEPTH} levels")
                expect_value = True
            else:
                expect_value = False
                if not stack:
                    root_done = True
            continue
        punct = m.group("punct")
        if expect_value or not stack:
            raise TreeError(f"unexpected {punct!r} at offset {m.start()} in tree {_show(text)!r}")
        frame = stack[-1]
        frame[1] += 1
        if punct == ",":
            if frame[1] >= len(frame[0]):
                raise TreeError(f"too many arguments at offset {m.start()}")
            expect_value = True
        elif punct == ")":
            if frame[1] != len(frame[0]):
                raise TreeError(f"too few arguments at offset {m.start()}")
            stack.pop()
            expect_value = False
            if not stack:
                root_done = True
        else:
            raise TreeError(f"unexpected '(' at offset {m.start()}")
        if pos >= n:
            break
    if not nodes:
        raise TreeError("empty tree")
    if stack or not root_done:
        raise TreeError(f"tree {_show(text)!r} ends early")
    return nodes


def to_string(nodes: list[Node]) -> str:
    """The canonical tree string (the same text DEAP prints)."""
    return render(nodes, lambda n: repr(n.value) if n.kind == "const" else n.name,
                   lambda n, args: f"{n.name}({', '.join(args)})")


def render(nodes, leaf, prim) -> str:
    """Render prefix nodes bottom-up without recursion."""
    out: list[str] = []
    for node in reversed(nodes):
        if node.kind == "prim":
            k = node.arity
            args = [out.pop() for _ in range(k)]
            out.append(prim(node, args))
        else:
            out.append(leaf(node))
    assert len(out) == 1
    return out[0]


def depth(nodes: list[Node]) -> int:
    """Height of the tree (a single leaf has height 0, as in DEAP)."""
    hs: list[int] = []
    for node in reversed(nodes):
        if node.kind == "prim":
            k = node.arity
            h = max(hs.pop() for _ in range(k)) + 1 if k else 0
            hs.append(h)
        else:
            hs.append(0)
    return hs[0]


# ----------------------------------------------------------- DEAP bridging

def from_deap(individual) -> list[Node]:
    from deap import gp    # lazy: start-up (DEAP loads only where it is used)
    nodes = []
    for node in individual:
        if isinstance(node, gp.Primitive):
            nodes.append(Node("prim", node.name))
        elif isinstance(node.value, str):
            nodes.append(Node("input", node.value))
        else:
            nodes.append(Node("const", P.CONSTANT_NAME, float(node.value)))
    return nodes


def to_deap(nodes: list[Node], pset, cls=None):
    """Build a DEAP PrimitiveTree (or ``cls``) from parsed nodes, no evaluation."""
    from deap import gp    # lazy: start-up (DEAP loads only where it is used)
    eph = pset.mapping[P.CONSTANT_NAME]   # the pset's ephemeral constant class
    out = []
    for node in nodes:
        if node.kind == "prim" or node.kind == "input":
            out.append(pset.mapping[node.name])
        else:
            term = eph.__new__(eph)
            gp.Terminal.__init__(term, node.value, False, float)
            out.append(term)
    return (cls or gp.PrimitiveTree)(out)


def deap_from_string(text: str, pset, cls=None):
    return to_deap(parse(text), pset, cls)


# --------------------------------------------------------------- programs

@dataclass
class Programs:
    """A population as one flat program array (see kernels.tokens.population_counts)."""
    ops: np.ndarray       # int32, opcodes in reversed prefix order
    consts: np.ndarray    # float64, constant per node (0 where unused)
    starts: np.ndarray    # int64, first node of each program
    lengths: np.ndarray   # int64
    max_stack: int

    def __len__(self) -> int:
        return int(self.starts.shape[0])


def payload(progs: Programs) -> tuple:
    """A population as plain arrays (what a task sent to a worker carries: kilobytes);
    ``Programs(*payload(progs))`` is ``progs`` again."""
    return (progs.ops, progs.consts, progs.starts, progs.lengths, int(progs.max_stack))


def linearise(trees: list[list[Node]]) -> Programs:
    total = sum(len(t) for t in trees)
    ops = np.empty(total, dtype=np.int32)
    consts = np.zeros(total, dtype=np.float64)
    starts = np.empty(len(trees), dtype=np.int64)
    lengths = np.empty(len(trees), dtype=np.int64)
    k = 0
    max_stack = 1
    for i, nodes in enumerate(trees):
        starts[i] = k
        lengths[i] = len(nodes)
        sp = 0
        for node in reversed(nodes):
            if node.kind == "prim":
                ops[k] = P.OP[node.name]
                sp -= node.arity - 1
            elif node.kind == "input":
                ops[k] = P.INPUT_INDEX[node.name]
                sp += 1
            else:
                ops[k] = P.OP_CONST
                consts[k] = node.value
                sp += 1
            if sp > max_stack:
                max_stack = sp
            k += 1
    return Programs(ops, consts, starts, lengths, max_stack)
