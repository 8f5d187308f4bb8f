"""Champions that leave Python: standalone modules for numpy, torch, transformers and vLLM.

``modules.export_source`` writes a module for one tree and one format from the
backend tables (``backends``), the array code (``arrays``) and, for the
engines, their fixed glue (``engines``); ``champions`` finds the tree of a run
or of an installed rule. Exported modules import only their array library and
carry the provenance header of written-back modules.
"""
