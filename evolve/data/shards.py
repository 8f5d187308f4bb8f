"""Sharded trace splits: memory-mapped ``.npy`` columns with a manifest.

A sharded trace set is a directory with one sub-directory per split
(``train/``, ``valid/``, ``test/``). A split directory holds ``manifest.json``
and its shards ``shard-00000/`` ... , each a directory of uncompressed NumPy
``.npy`` files, one per schema-v2 field (``evolve.data.traces.ALL_FIELDS``),
that ``np.load(..., mmap_mode="r")`` maps without reading. Shards hold whole
blocks, in order: the shards of a split, concatenated, are the split.

``manifest.json``::

    {"format": "evolve-trace-shards", "format_version": 1, "schema_version": 2,
     "meta": {block_size, top_k, context_len, ... the trace settings},
     "rows": total rows,
     "shards": [{"dir": "shard-00000", "rows": n,
                 "columns": {field: {"dtype": "<f8", "shape": [n, k],
                                     "sha256": hex digest of the .npy file}}}]}

``open_split`` validates a split once: the manifest, every shard's columns
(present, dtype and shape as the manifest says, the same schema in every
shard, the checksum, read in 16 MiB pieces) and every schema-v2 invariant of
each shard in turn (``traces.validate`` on the mapped columns); it never holds
more than one shard's temporaries and never reads a whole split into memory.
Errors are DataError naming the file, the field and the row or value.
Shards are written into a temporary directory renamed into place, so a split
directory is complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evolve.data import traces as T
from evolve.data.tokens import DataError

FORMAT = "evolve-trace-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CHUNK = 16 << 20


def is_sharded(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a sharded trace set (its train split has a manifest)."""
    return (Path(directory) / "train" / MANIFEST).is_file()


# ----------------------------------------------------------------- writing

def digest(path: Path) -> str:
    """sha256 of a file, read in CHUNK pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)


def write_shard(directory: Path, columns: dict) -> dict:
    """Write one shard's columns as .npy files; its manifest entry."""
    directory.mkdir(parents=True)
    cols = {}
    for f in T.ALL_FIELDS:
        a = np.ascontiguousarray(columns[f])
        path = directory / f"{f}.npy"
        with open(path, "wb") as fh:
            np.lib.format.write_array(fh, a, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        cols[f] = {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": digest(path)}
    return {"dir": directory.name, "rows": int(columns["draft_prob"].shape[0]), "columns": cols}


class SplitWriter:
    """Writes a sharded split piece by piece (whole blocks), then commits it atomically."""

    def __init__(self, out: str | os.PathLike, meta: dict, rows_per_shard: int):
        self.out = Path(out)
        self.meta = {k: v for k, v in meta.items() if k != "source"}
        g = int(self.meta["block_size"])
        self.rows_per_shard = max(g, rows_per_shard // g * g)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        self.entries: list[dict] = []
        self.pending: list[dict] = []
        self.pending_rows = 0

    def add(self, columns: dict) -> None:
        """Append rows (a dict of schema-v2 columns, whole blocks)."""
        self.pending.append(columns)
        self.pending_rows += int(columns["draft_prob"].shape[0])
        while self.pending_rows >= self.rows_per_shard:
            self._flush(self.rows_per_shard)

    def _flush(self, rows: int) -> None:
        cols = {f: np.concatenate([p[f] for p in self.pending]) for f in T.ALL_FIELDS}
        head = {f: a[:rows] for f, a in cols.items()}
        rest = {f: a[rows:] for f, a in cols.items()}
        self.entries.append(write_shard(self.tmp / f"shard-{len(self.entries):05d}", head))
        self.pending_rows -= rows
        self.pending = [rest] if self.pending_rows else []

    def commit(self) -> Path:
        if self.pending_rows:
            self._flush(self.pending_rows)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "schema_version": T.FORMAT_VERSION, "meta": self.meta,
                    "rows": sum(e["rows"] for e in self.entries), "shards": self.entries}
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        old = None
        if self.out.exists():      # moved aside first: the split is the old or the new one
            old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old.", dir=self.out.parent))
            os.replace(self.out, old / "split")
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_split(ts: T.TraceSplit, out: str | os.PathLike, rows_per_shard: int) -> Path:
    """Write a loaded split as shards of ``rows_per_shard`` rows (rounded down to
    whole blocks, at least one block)."""
    w = SplitWriter(out, ts.meta, rows_per_shard)
    try:
        n, step = len(ts), w.rows_per_shard
        for a in range(0, n, step):
            w.add({f: ts.columns[f][a:a + step] for f in T.ALL_FIELDS})
        return w.commit()
    except BaseException:
        w.abort()
        raise


# ----------------------------------------------------------------- reading

@dataclass
class ShardedSplit:
    """A validated sharded split: the manifest and the shard directories (nothing loaded)."""
    directory: Path
    meta: dict
    rows: int
    shards: list = field(default_factory=list)     # manifest entries
    name: str = ""

    def __len__(self) -> int:
        return self.rows

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])

    @property
    def n_blocks(self) -> int:
        return self.rows // self.block_size

    def shard_paths(self) -> list[Path]:
        return [self.directory / e["dir"] for e in self.shards]

    def content_digest(self) -> str:
        """sha256 over every shard's column checksums, in shard order (the manifest's,
        checked against the files when the split was opened)."""
        h = hashlib.sha256()
        for e in self.shards:
            for f, c in sorted(e.get("columns", {}).items()):
                h.update(f"{f}|{c.get('dtype')}|{c.get('shape')}|{c.get('sha256')}\n"
                         .encode("ascii"))
        return h.hexdigest()

    def shard(self, i: int) -> T.TraceSplit:
        """Shard i, its columns memory-mapped (already validated by ``open_split``)."""
        return map_shard(self.shard_paths()[i], self.meta, self.name)

    def concat(self) -> T.TraceSplit:
        """The whole split in memory (for reports that need every row at once)."""
        parts = [self.shard(i) for i in range(len(self.shards))]
        cols = {f: np.concatenate([p.columns[f] for p in parts]) for f in T.ALL_FIELDS}
        return T.TraceSplit(cols, dict(self.meta, source=str(self.directory)), self.name)


def map_shard(path: str | os.PathLike, meta: dict, name: str = "") -> T.TraceSplit:
    """A shard's columns memory-mapped read-only (no validation: see ``open_split``)."""
    path = Path(path)
    cols = {}
    for f in T.ALL_FIELDS:
        try:
            cols[f] = np.load(path / f"{f}.npy", mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"{path / (f + '.npy')}: field '{f}' cannot be read "
                            f"({type(e).__name__}: {e})") from None
    return T.TraceSplit(cols, dict(meta, source=str(path)), name)


def _manifest(directory: Path) -> dict:
    src = directory / MANIFEST
    if not src.is_file():
        raise DataError(f"{src}: file not found (not a sharded split)")
    try:
        m = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{src}: not readable JSON ({type(e).__name__})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(f"{src}: field 'format' is not {FORMAT!r}")
    for key, want in (("format_version", FORMAT_VERSION), ("schema_version", T.FORMAT_VERSION)):
        if m.get(key) != want:
            raise DataError(f"{src}: field '{key}' is {m.get(key)!r}, expected {want}")
    meta, shards, rows = m.get("meta"), m.get("shards"), m.get("rows")
    if not isinstance(meta, dict) or not isinstance(shards, list) or not shards:
        raise DataError(f"{src}: fields 'meta' (an object) and 'shards' (a non-empty list) "
                        "are required")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise DataError(f"{src}: field 'rows' must be a whole number, got {rows!r}")
    for i, e in enumerate(shards):
        if not (isinstance(e, dict) and isinstance(e.get("dir"), str)
                and isinstance(e.get("rows"), int) and isinstance(e.get("columns"), dict)
                and "/" not in e["dir"] and e["dir"] not in ("", ".", "..")):
            raise DataError(f"{src}: shard {i}: expected an object with dir, rows, columns")
    total = sum(e["rows"] for e in shards)
    if total != rows:
        raise DataError(f"{src}: field 'rows' is {rows}, but the shards hold {total} rows")
    return m


def open_split(directory: str | os.PathLike, name: str = "", check: bool = True) -> ShardedSplit:
    """Open and validate (once) a sharded split directory; see the module docstring."""
    directory = Path(directory)
    m = _manifest(directory)
    src = str(directory / MANIFEST)
    meta = dict(m["meta"])
    schema = None
    for i, e in enumerate(m["shards"]):
        sdir = directory / e["dir"]
        n = e["rows"]
        for f in T.ALL_FIELDS:
            path = sdir / f"{f}.npy"
            want = e["columns"].get(f)
            if not isinstance(want, dict):
                raise DataError(f"{src}: shard {e['dir']}: field '{f}' is not in the manifest")
            if not path.is_file():
                raise DataError(f"{path}: field '{f}' is missing")
            a = np.load(path, mmap_mode="r", allow_pickle=False)
            if a.dtype.str != want.get("dtype") or list(a.shape) != want.get("shape"):
                raise DataError(f"{path}: field '{f}' is {a.dtype.str} {list(a.shape)}, the "
                                f"manifest says {want.get('dtype')} {want.get('shape')}")
            if a.shape[0] != n:
                raise DataError(f"{path}: field '{f}' has {a.shape[0]} rows, the manifest "
                                f"says {n}")
            kind = (a.dtype.str, list(a.shape[1:]))
            if schema is not None and schema[f] != kind:
                raise DataError(f"{path}: field '{f}' is {kind[0]} {kind[1]} per row, shard "
                                f"{m['shards'][0]['dir']} has {schema[f][0]} {schema[f][1]} "
                                "(mismatched shard schemas)")
            if check and digest(path) != want.get("sha256"):
                raise DataError(f"{path}: field '{f}': checksum differs from the manifest "
                                "(the file changed or is corrupt)")
        if schema is None:
            schema = {f: (e["columns"][f]["dtype"], e["columns"][f]["shape"][1:])
                      for f in T.ALL_FIELDS}
        if check:
            ts = map_shard(sdir, meta, name)
            T.validate(ts, str(sdir))
    return ShardedSplit(directory, meta, m["rows"], list(m["shards"]), name or directory.name)


def reshard(split: ShardedSplit, out: str | os.PathLike, rows_per_shard: int) -> Path:
    """Write ``split`` again with another shard size, one shard in memory at a time."""
    w = SplitWriter(out, split.meta, rows_per_shard)
    try:
        for i in range(len(split.shards)):
            w.add({f: np.array(a) for f, a in split.shard(i).columns.items()})
        return w.commit()
    except BaseException:
        w.abort()
        raise


def load_splits(directory: str | os.PathLike, splits=T.SPLITS) -> dict:
    directory = Path(directory)
    return {s: open_split(directory / s, name=s) for s in splits}


def shard_dir(src: str | os.PathLike, out: str | os.PathLike, rows_per_shard: int,
              splits=T.SPLITS) -> dict:
    """Shard the .npz trace splits of ``src`` into ``out``; split -> number of shards."""
    src, out = Path(src), Path(out)
    if rows_per_shard < 1:
        raise DataError(f"--rows-per-shard: {rows_per_shard!r} is invalid; expected >= 1")
    for s in splits:                       # every split readable before anything is written
        if not T.is_trace_file(src / f"{s}.npz"):
            T.load(src / f"{s}.npz", name=s)     # raises the precise DataError
    done = {}
    for s in splits:                       # one split in memory at a time
        write_split(T.load(src / f"{s}.npz", name=s), out / s, rows_per_shard)
        done[s] = len(open_split(out / s, name=s, check=False).shards)
    return done
