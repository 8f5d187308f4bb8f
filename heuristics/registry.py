"""Heuristics by name, and their Numba-compiled forms.

``compiled(name)`` turns a scalar heuristic into a Numba ufunc over whole
columns, cached on disk next to its source (``__pycache__``), so a warm process
pays only the cache load. The ufunc computes the threshold array; counting
decisions is done by one shared kernel.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

from heuristics.baselines import BASELINES

EVOLVED = "evolved"
# position is compiled as float64 (the kernel's type too): integer arithmetic in
# a generated formula would wrap around on overflow where the kernel does not.
SIGNATURE = "float64(float64, float64, float64, float64, float64, boolean)"

_compiled: dict[str, object] = {}


def evolved_module():
    import heuristics.evolved as mod
    return mod


def names(include_evolved: bool = True) -> list[str]:
    return list(BASELINES) + ([EVOLVED] if include_evolved else [])


def get(name: str) -> Callable:
    if name == EVOLVED:
        return evolved_module().evolved
    try:
        return BASELINES[name]
    except KeyError:
        raise KeyError(name) from None


def compile_function(fn: Callable):
    """A Numba ufunc of a scalar heuristic, cached on disk."""
    from numba import vectorize
    return vectorize([SIGNATURE], cache=True)(fn)


def compiled(name: str):
    if name not in _compiled:
        _compiled[name] = compile_function(get(name))
    return _compiled[name]


def evolved_metadata(path: str | Path | None = None) -> dict:
    """METADATA of an evolved.py, read as a literal without importing it."""
    path = Path(path) if path else Path(__file__).with_name("evolved.py")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "METADATA"):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}
