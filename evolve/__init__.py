"""Evolve acceptance rules for speculative decoding.

The Python API (``evolve.api``): ``evolve.run``, ``evolve.load_run``,
``evolve.tradeoff``, ``evolve.compare``, ``evolve.trace``, ``evolve.export`` and
``evolve.Rule``; the command line is ``evolve`` (``evolve.cli``), a thin layer over
them. ``import evolve`` loads nothing else: each name loads its module on first use.
"""

__version__ = "0.1.0"

API = ("run", "load_run", "tradeoff", "compare", "trace", "export", "Rule", "RunResult",
       "Tradeoff", "Comparison", "TraceResult", "Export")
__all__ = list(API)


def __getattr__(name: str):
    """``evolve.run``, ``evolve.Rule``, ...: the names of ``evolve.api``, on first use."""
    if name not in API:
        raise AttributeError(f"module 'evolve' has no attribute {name!r}")
    import evolve.api    # lazy: start-up (import evolve loads no Numba)
    return getattr(evolve.api, name)
