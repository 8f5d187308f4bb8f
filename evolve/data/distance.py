"""Distance from the prompt: the bins every report by distance uses.

The first tokens after the prompt matter most to an instruction model (the first word
of its answer), so reports of distortion (``evolve simulate --compare``: TV by distance)
and of changed answers (a task run: accepted critical tokens by distance) keep them
apart from the rest. 0 is the first token after the prompt.
"""

from __future__ import annotations

import numpy as np

DISTANCE_BINS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, None))


def bin_label(lo: int, hi) -> str:
    return f"{lo}+" if hi is None else str(lo) if lo == hi else f"{lo}-{hi}"


def bins(distance) -> list:
    """(label, mask) of each bin of ``DISTANCE_BINS`` over ``distance`` (an array of
    distances from the prompt), in order."""
    d = np.asarray(distance)
    return [(bin_label(lo, hi), (d >= lo) & (d <= hi) if hi is not None else d >= lo)
            for lo, hi in DISTANCE_BINS]
