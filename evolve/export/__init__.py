"""Champions that leave Python: standalone modules for numpy, torch, transformers and vLLM.

``modules.export_source`` writes a module for one tree and one format from the
backend tables (``backends``), the array code (``arrays``) and, for the
engines, their fixed glue (``engines``); ``champions`` finds the tree of a run
or of an installed rule. Exported modules import only their array library and
carry the provenance header of written-back modules.

``front.export`` is the front door the command line and ``evolve.export(...)`` share.
Called, the package is that function: ``evolve.export(run, format=...)`` works
whichever of the two the name ``evolve.export`` holds (the function until anything
under ``evolve/export/`` is imported, this package after).
"""

import sys
import types


class _Package(types.ModuleType):
    """This package, callable: calling it is ``front.export``."""

    def __call__(self, *args, **kwargs):
        from evolve.export.front import export    # lazy: loads the exporters when called
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _Package
