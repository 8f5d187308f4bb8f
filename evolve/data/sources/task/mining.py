"""Mining a split's labels in parts: resumable, split across processes, on a cluster.

The labels of a problem's rows depend on that problem's rows alone, and each labelled
row's uniforms on its number in the split (``labels.row_uniforms``), so a split is
mined in *parts* of ``CHUNK`` problems, each written as soon as it is mined to
``<split>.labels.parts/<lo>-<hi>.npz`` beside the traces (atomically: a part is there
whole or not at all). The labels file is the parts put together once every part is
there, then the parts are removed. So:

- an interrupted mining resumes (``evolve data task --resume``) with the parts it left
  and gives the same labels as one that was never interrupted;
- ``--shard I/N`` mines the I-th of N runs of parts (of every split), in as many
  processes or on as many machines as there are shards; whichever finds every part
  there writes the labels;
- ``--cluster local:N`` / ``--scheduler ADDRESS`` hand the parts to Dask workers
  (``evolve.cluster.mining``), each holding the pair once.

A part names the traces it labels (checksum) and its settings; parts of other traces
are refused, one line naming the file. For the built-in pair the labels are the same
bits however the split is cut (tested); a Hugging Face pair's to float rounding, as
its batches differ.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np

from evolve.data import labels as LB
from evolve.data import tokens as D
from evolve.data import traces as T
from evolve.data.tokens import DataError
from evolve.io.atomic import sha256_file

CHUNK = 64                  # problems a part holds (the grid every process shares)
PARTS_SUFFIX = ".labels.parts"


def parts_dir(directory, split: str) -> Path:
    return Path(directory) / f"{split}{PARTS_SUFFIX}"


def chunks(problems: int, chunk: int | None = None) -> list:
    """The parts of a split of ``problems`` problems: (lo, hi) on a grid of ``chunk``
    (default ``CHUNK``)."""
    chunk = chunk or CHUNK
    return [(lo, min(lo + chunk, problems)) for lo in range(0, problems, chunk)]


def shard_of(parts: list, shard) -> list:
    """The parts of shard (i, n): the i-th of n contiguous runs (all: None)."""
    if shard is None:
        return list(parts)
    i, n = shard
    return parts[len(parts) * i // n:len(parts) * (i + 1) // n]


def parse_shard(text: str) -> tuple:
    """``I/N`` -> (I, N), 0 <= I < N; ValueError naming what is wrong."""
    i, sep, n = str(text).partition("/")
    if not sep or not i.isdigit() or not n.isdigit():
        raise ValueError("expected I/N with whole numbers, e.g. 0/4")
    i, n = int(i), int(n)
    if not 1 <= n <= 1_000_000 or not 0 <= i < n:
        raise ValueError(f"expected 0 <= I < N (N at most 1,000,000); got {i}/{n}")
    return i, n


_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def parse_memory(text: str) -> int:
    """``40GB``, ``512MiB``, ``2.5GB`` or a number of bytes -> bytes (at least 1 MB);
    ValueError saying what is expected."""
    t = str(text).strip().upper().replace(" ", "")
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError("expected a size such as 40GB, 512MiB or a number of bytes") \
            from None
    if not 1e6 <= value <= 1e15:
        raise ValueError("expected a size from 1MB to 1000TB")
    return int(value)


class Miner:
    """One split's mining: its traces, their checksum and the pair, in one process (a
    Dask worker holds one, ``evolve.cluster.mining``). ``seed``: the labels' uniforms
    (default: the recording's seed); ``max_memory``: bytes a batch of continuations may
    take (default: the pair's ``mining_memory``)."""

    def __init__(self, pair, traces_path, max_memory=None, ts=None, seed=None):
        self.pair = pair
        self.path = Path(traces_path)
        self.ts = ts if ts is not None else T.load(self.path, name=self.path.stem)
        self.sha = sha256_file(self.path)
        self.greedy = self.ts.meta["decoding"] == "greedy"
        self.seed = int(self.ts.meta["config"]["seed"] if seed is None else seed)
        self.max_new = pair.max_new(self.ts.name)
        self.max_memory = max_memory
        seq = np.asarray(self.ts.columns["sequence"])
        self.problems = int(self.ts.meta["task"]["problems"])
        self.bounds = np.searchsorted(seq, np.arange(self.problems + 1))

    def need(self, part) -> int:
        """Rows of a part that need a label."""
        lo, hi = self.bounds[part[0]], self.bounds[part[1]]
        cols = {f: self.ts.columns[f][lo:hi] for f in
                ("token", "target_top", "target_prob", "draft_prob")}
        return int(LB.could_reject(cols, self.greedy).sum())

    def mine(self, part, tick=None):
        """(the labels of the part's rows, the cost) of one part."""
        pair = self.pair
        labels, cost = LB.mine(pair, self.ts.columns, pair.answer_of, pair.done_of,
                               self.greedy, self.max_new, self.seed, pad=pair.pad,
                               max_tokens=pair.max_tokens, tick=tick, problems=part,
                               max_memory=self.max_memory)
        lo, hi = self.bounds[part[0]], self.bounds[part[1]]
        return labels[lo:hi], cost

    def part_meta(self, part, cost: dict) -> dict:
        lo, hi = int(self.bounds[part[0]]), int(self.bounds[part[1]])
        return {"labels_version": LB.LABELS_VERSION, "traces_sha256": self.sha,
                "split": self.ts.name, "decoding": self.ts.meta["decoding"],
                "problems": [int(part[0]), int(part[1])], "rows": [lo, hi],
                "seed": self.seed, "max_new": int(self.max_new), "mined": cost}


def part_path(directory, split: str, part) -> Path:
    return parts_dir(directory, split) / f"{part[0]}-{part[1]}.npz"


def write_part(directory, miner: Miner, part, labels, cost: dict) -> None:
    """One part's labels, written atomically."""
    d = parts_dir(directory, miner.ts.name)
    d.mkdir(parents=True, exist_ok=True)
    D.write_npz(part_path(directory, miner.ts.name, part), miner.part_meta(part, cost),
                {f"{LB.COLUMN}.npy": np.asarray(labels, dtype=np.int8)})


def read_part(path: Path, miner: Miner, part):
    """(labels, cost) of a part file, checked against the miner's traces and settings;
    DataError naming the file and field otherwise."""
    meta, crit = LB.read_labels(path)
    want = miner.part_meta(part, {})
    for key in ("labels_version", "traces_sha256", "decoding", "problems", "rows", "seed",
                "max_new"):
        if meta.get(key) != want[key]:
            raise DataError(f"{path}: field '{key}' is {meta.get(key)!r:.60}, not "
                            f"{want[key]!r:.60}: a part of other traces or settings (remove "
                            f"{path.parent} or record again with --force)")
    n = want["rows"][1] - want["rows"][0]
    if crit.dtype != np.int8 or crit.shape != (n,):
        raise DataError(f"{path}: field '{LB.COLUMN}' must be int8 of shape ({n},)")
    return crit, meta.get("mined") or {}


def done_parts(directory, miner: Miner) -> dict:
    """part -> its file, of the parts already mined (each checked)."""
    out = {}
    for part in chunks(miner.problems):
        p = part_path(directory, miner.ts.name, part)
        if p.is_file():
            read_part(p, miner, part)
            out[part] = p
    return out


def assemble(directory, miner: Miner) -> dict | None:
    """Write ``<split>.labels.npz`` from the parts once every part is there (then remove
    them); its meta, or None while parts are missing."""
    parts = chunks(miner.problems)
    crit = np.full(len(miner.ts), LB.UNLABELED, dtype=np.int8)
    costs = []
    for part in parts:
        p = part_path(directory, miner.ts.name, part)
        if not p.is_file():
            return None
        labels, cost = read_part(p, miner, part)
        lo, hi = miner.bounds[part[0]], miner.bounds[part[1]]
        crit[lo:hi] = labels
        costs.append(cost)
    src = str(LB.labels_path(directory, miner.ts.name))
    LB.check_critical(miner.ts.columns, crit, miner.greedy, src)
    meta = {"labels_version": LB.LABELS_VERSION, "kind": "answer change",
            "decoding": miner.ts.meta["decoding"], "rows": len(miner.ts),
            "mined": LB.add_costs(costs), "traces_sha256": miner.sha}
    D.write_npz(LB.labels_path(directory, miner.ts.name), meta, {f"{LB.COLUMN}.npy": crit})
    shutil.rmtree(parts_dir(directory, miner.ts.name), ignore_errors=True)
    return meta


def mine_split(directory, miner: Miner, shard=None, backend=None, meter=None,
               note=None) -> dict | None:
    """Mine the parts of a split's traces (those of ``shard`` (i, n), all: None) that are
    not there yet, each written as it is done, in this process or through ``backend``
    (``evolve.cluster.mining.DaskMining``), then write the labels file if every part is
    there. Returns its meta, or None while parts are missing. ``meter(label, total,
    unit)`` counts the drafts labelled; ``note(text)`` says what was found."""
    name = miner.ts.name
    have = done_parts(directory, miner)
    mine = [p for p in shard_of(chunks(miner.problems), shard) if p not in have]
    if have and note is not None:
        note(f"{name}: {len(have)} of {len(chunks(miner.problems))} parts already mined "
             f"({parts_dir(directory, name)})")
    total = sum(miner.need(p) for p in mine)
    with (meter(f"{name}: mining labels", total, "drafts") if meter
          else contextlib.nullcontext()) as m:
        tick = None if m is None else m.advance
        if backend is None:
            for part in mine:
                labels, cost = miner.mine(part, tick)
                write_part(directory, miner, part, labels, cost)
        else:
            for part, labels, cost in backend.mine(miner, mine):
                write_part(directory, miner, part, labels, cost)
                if tick is not None:
                    tick(cost.get("rows", 0))
    return assemble(directory, miner)
