"""Content checksums of the splits a run uses, recorded in its config.json.

A checksum is the sha256 of every column of a split (name, dtype, shape and
bytes, columns in name order), so it follows the data's content whatever the
file form (.npz or JSON) it was read from. ``--resume`` compares the recorded
checksums with the data it finds and refuses data that changed, naming the
split: a run must not go on over other data than it started on.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

HEX = re.compile(r"[0-9a-f]{64}")


def columns_of(split) -> dict:
    cols = split.columns
    return cols() if callable(cols) else cols      # Dataset: a method; TraceSplit: a dict


def split_digest(split) -> str:
    if hasattr(split, "content_digest"):          # sharded: from its checked manifest
        return split.content_digest()
    h = hashlib.sha256()
    for name, arr in sorted(columns_of(split).items()):
        a = np.ascontiguousarray(arr)
        h.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode("ascii"))
        h.update(a.tobytes())
    return h.hexdigest()


def digests(splits: dict) -> dict:
    return {name: split_digest(s) for name, s in splits.items()}


def changed_split(recorded: dict, splits: dict) -> str | None:
    """The first split whose content differs from its recorded checksum, or None.
    Splits without a recorded checksum (runs made before checksums) are not checked."""
    for name, split in splits.items():
        want = recorded.get(name)
        if want is not None and split_digest(split) != want:
            return name
    return None


def well_formed(recorded) -> bool:
    return isinstance(recorded, dict) and all(
        isinstance(k, str) and isinstance(v, str) and HEX.fullmatch(v)
        for k, v in recorded.items())
