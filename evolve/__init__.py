"""Evolve acceptance rules for speculative decoding.

The Python API is ``evolve.run(...)`` and ``evolve.load_run(path)`` (see
``evolve.api``); the command line is ``evolve`` (``evolve.cli``).
"""

__version__ = "0.1.0"


def run(**kwargs):
    """Evolve (or resume) a run; see ``evolve.api.run``."""
    from evolve.api import run as _run  # lazy: start-up (import evolve loads no Numba)
    return _run(**kwargs)


def load_run(path):
    """A run directory read back; see ``evolve.api.load_run``."""
    from evolve.api import load_run as _load_run  # lazy: start-up (as run)
    return _load_run(path)
