"""Generic file I/O that every layer may import: the one reader of untrusted
JSON files (``jsonio``), atomic writes (``atomic``), the directory lock
(``lock``) and the default locations of data, runs and heuristics (``paths``).

The modules here import nothing of the project but ``evolve.errors``.
"""
