"""Heuristics by name, and their Numba-compiled forms.

``compiled(name)`` turns a scalar heuristic (a baseline of
``heuristics/baselines.py`` or the installed ``heuristics/evolved.py``) into a
Numba ufunc over whole columns, cached on disk next to its source
(``__pycache__``), so a warm process pays only the cache load. The ufunc
computes the threshold array; counting decisions is done by one shared kernel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
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


PACKAGE_EVOLVED = Path(__file__).with_name("evolved.py")


def evolved_path(directory=None) -> Path:
    """The installed evolved.py: the one write-back keeps in ``directory`` (a
    project's heuristics directory, ``evolve.io.paths.heuristics_dir``), or this
    package's own (standard rejection until a checkout's run writes one back) when
    that directory holds none."""
    if directory is not None:
        path = Path(directory) / "evolved.py"
        if path.is_file() and path.resolve() != PACKAGE_EVOLVED.resolve():
            return path
    return PACKAGE_EVOLVED


def evolved_module(directory=None):
    """The module of ``evolved_path(directory)``: this package's ``heuristics.evolved``,
    or a project's file loaded by its path (a module of its own name)."""
    path = evolved_path(directory)
    if path == PACKAGE_EVOLVED:
        import heuristics.evolved as mod  # lazy: written back by runs; loaded when asked for
        return mod
    name = "heuristics_evolved_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod            # Numba's on-disk cache finds functions by module
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def get(name: str, directory=None) -> Callable:
    if name == EVOLVED:
        return evolved_module(directory).evolved
    try:
        return BASELINES[name]
    except KeyError:
        raise KeyError(name) from None


def compile_function(fn: Callable):
    """A Numba ufunc of a scalar heuristic, cached on disk."""
    return vectorize([SIGNATURE], cache=True)(fn)


def compiled(name: str, directory=None):
    """The ufunc of ``name`` (the evolved rule: the one ``evolved_path(directory)``
    names, compiled once per file and version of it)."""
    key = name
    if name == EVOLVED and evolved_path(directory) != PACKAGE_EVOLVED:
        path = evolved_path(directory)
        key = (name, str(path.resolve()), path.stat().st_mtime_ns)
    if key not in _compiled:
        _compiled[key] = compile_function(get(name, directory))
    return _compiled[key]
