"""Heuristics by name, and their Numba-compiled forms.

``compiled(name)`` turns a scalar heuristic (a baseline of
``heuristics/baselines.py`` or the installed ``heuristics/evolved.py``) into a
Numba ufunc over whole columns, cached on disk next to its source
(``__pycache__``), so a warm process pays only the cache load. The ufunc
computes the threshold array; counting decisions is done by one shared kernel.
"""

from __future__ import annotations

from typing import Callable

from numba import vectorize

from heuristics.baselines import BASELINES

EVOLVED = "evolved"
# position is compiled as float64 (the kernel's type too): integer arithmetic in
# a generated formula would wrap around on overflow where the kernel does not.
SIGNATURE = "float64(float64, float64, float64, float64, float64, boolean)"

_compiled: dict[str, object] = {}


def names(include_evolved: bool = True) -> list[str]:
    return list(BASELINES) + ([EVOLVED] if include_evolved else [])


def get(name: str) -> Callable:
    if name == EVOLVED:
        import heuristics.evolved as mod  # lazy: written back by runs; loaded when asked for
        return mod.evolved
    try:
        return BASELINES[name]
    except KeyError:
        raise KeyError(name) from None


def compile_function(fn: Callable):
    """A Numba ufunc of a scalar heuristic, cached on disk."""
    return vectorize([SIGNATURE], cache=True)(fn)


def compiled(name: str):
    if name not in _compiled:
        _compiled[name] = compile_function(get(name))
    return _compiled[name]
