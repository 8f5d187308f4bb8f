"""The one error of the model pairs (``evolve.data.sources.pairs``), apart from the
registry so that a pair's module can raise it without importing the registry back."""

from __future__ import annotations

from evolve.errors import EvolveError


class PairError(EvolveError):
    """A pair that cannot be built here: one line saying what is missing and what to do."""
