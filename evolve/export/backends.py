"""Export backends: each target array library's templates and helpers.

A backend's templates are a column of the primitive table
(``evolve.lang.primitives.PRIMITIVES``, ``exports``: ``{0}``, ``{1}``, ... are the
arguments); what a backend adds here is the element-wise helper that each
protected operator's template calls. The helpers are written against the
constants of ``heuristics/ops.py`` (``DIV_EPS``, ``LOG_EPS``, ``LOG_FLOOR``,
``EXP_MAX``, ``EXP_CAP``), which an exported module defines from the same
values, and follow its conventions exactly, NaN included:

- pdiv(a, b) = a / b where |b| > DIV_EPS, else 1      (NaN b gives 1)
- pmin(a, b) = a where a < b, else b                   (NaN a gives b)
- pmax(a, b) = a where a > b, else b                   (NaN a gives b)
- plog(a)    = log|a| where |a| > LOG_EPS, else LOG_FLOOR   (NaN gives LOG_FLOOR)
- pexp(a)    = exp(a) where a < EXP_MAX, else EXP_CAP  (NaN gives EXP_CAP)
- psqrt(a)   = sqrt|a|;   ite(c, a, b) = a where c, else b

exp and log here are the array library's own; heuristics/ops.py has its own
(``exp_poly``, ``log_poly``, within 1 ulp of libm), so an exported rule may differ
from the champion in the last bit of a threshold that goes through exp or log,
which changes a decision only when a uniform falls within that bit of it.

A tree becomes straight-line code, one assignment per primitive node.
Constants of a tree are written as ``K(value)``: a scalar of the working
dtype (numpy) or a 0-dimensional tensor on the inputs' device (torch), so a
float32 evaluation stays float32 and a constant-only subtree still has array
semantics; the helpers' own constants are Python floats, which both libraries
treat as weak scalars (the array's dtype wins). ``tests/test_export.py`` checks that every primitive has a row in
every backend and that the exports agree with the Numba champion.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolve.lang import primitives as P
from evolve.lang.treeio import render


@dataclass(frozen=True)
class Backend:
    name: str
    module: str                 # the array library the exported module imports
    alias: str                  # its name inside the module (np, torch)
    templates: dict             # primitive name -> source template
    helpers: dict               # helper name -> its definition (source)


def from_table(name: str, module: str, alias: str, helpers: dict) -> Backend:
    """A backend whose templates are the primitive table's ``exports[name]`` column."""
    return Backend(name, module, alias, {p.name: p.exports[name] for p in P.PRIMITIVES},
                   helpers)


NUMPY = from_table("numpy", "numpy", "np", helpers={
    "pdiv": ("def pdiv(a, b):\n"
             "    return np.where(np.abs(b) > DIV_EPS, np.divide(a, b), 1.0)\n"),
    "plog": ("def plog(a):\n"
             "    x = np.abs(a)\n"
             "    return np.where(x > LOG_EPS, np.log(x), LOG_FLOOR)\n"),
    "pexp": ("def pexp(a):\n"
             "    return np.where(a < EXP_MAX, np.exp(a), EXP_CAP)\n"),
})

TORCH = from_table("torch", "torch", "torch", helpers={
    "pdiv": ("def pdiv(a, b):\n"
             "    return torch.where(torch.abs(b) > DIV_EPS, a / b, 1.0)\n"),
    "plog": ("def plog(a):\n"
             "    x = torch.abs(a)\n"
             "    return torch.where(x > LOG_EPS, torch.log(x), LOG_FLOOR)\n"),
    "pexp": ("def pexp(a):\n"
             "    return torch.where(a < EXP_MAX, torch.exp(a), EXP_CAP)\n"),
})

BACKENDS = {b.name: b for b in (NUMPY, TORCH)}


def statements(nodes, backend: Backend) -> tuple[list[str], str]:
    """A tree as straight-line code of ``backend``: ``(["v0 = ...", ...], result)``.

    Every primitive node is one assignment (so a template that names an argument
    twice, as pmin does, repeats a variable, never a subtree); leaves are inputs
    by name and constants as ``K(value)``."""
    lines: list[str] = []

    def leaf(n):
        return f"K({float(n.value)!r})" if n.kind == "const" else n.name

    def prim(n, args):
        var = f"v{len(lines)}"
        lines.append(f"{var} = {backend.templates[n.name].format(*args)}")
        return var

    return lines, render(nodes, leaf, prim)


def helpers_used(nodes, backend: Backend) -> list[str]:
    """The helper definitions a tree needs, in a fixed order."""
    names = {n.name for n in nodes if n.kind == "prim"}
    return [backend.helpers[h] for h in sorted(backend.helpers) if h in names]


def check_tables() -> None:
    """Every primitive has a template in every backend (raises AssertionError)."""
    for b in BACKENDS.values():
        missing = set(P.BY_NAME) ^ set(b.templates)
        assert not missing, f"backend {b.name}: templates differ from the primitive table: " \
                            f"{sorted(missing)}"
