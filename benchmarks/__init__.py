"""The benchmark and experiment scripts of the checkout (not part of the installed package).

Run them as modules from the repository's root, e.g. ``python -m benchmarks.speed.harness``:
``speed/`` measures how fast the harness is, ``experiments/`` reproduces the research results
of docs/results.md and docs/results/, ``checks/`` checks exports and runs against engines and
each other, and ``common`` holds what they share.
"""
