"""Sharded trace splits: memory-mapped ``.npy`` columns with a manifest.

A sharded trace set is a directory with one sub-directory per split
(``train/``, ``valid/``, ``test/``). A split directory holds ``manifest.json``
and its shards ``shard-00000/`` ... , each a directory of uncompressed NumPy
``.npy`` files, one per schema-v2 field (``evolve.data.traces.ALL_FIELDS``;
with ``schema_version`` 3 also the slot features, ``V3_ALL_FIELDS``), that ``np.load(..., mmap_mode="r")`` maps without reading. Shards hold whole
blocks, in order: the shards of a split, concatenated, are the split.

``manifest.json``::

    {"format": "evolve-trace-shards", "format_version": 1, "schema_version": 2,
     "meta": {block_size, top_k, context_len, ... the trace settings},
     "rows": total rows,
     "shards": [{"dir": "shard-00000", "rows": n,
                 "columns": {field: {"dtype": "<f8", "shape": [n, k],
                                     "sha256": hex digest of the .npy file}}}]}

Task traces (``evolve data task``) shard with their critical-token labels: the
manifest's ``meta.labels`` holds the labels' meta (``evolve.data.labels``: version,
decoding, what mining cost) and every shard one more column, ``critical.npy``
(int8), checked as the labels file is (``labels.check_critical``).

``open_split`` validates a split once: the manifest, every shard's columns
(present, dtype and shape as the manifest says, the same schema in every
shard, the checksum, read in 16 MiB pieces) and every schema-v2 invariant of
each shard in turn (``traces.validate`` on the mapped columns); it never holds
more than one shard's temporaries and never reads a whole split into memory.
Errors are DataError naming the file, the field and the row or value; names
that are not printable (a newline in a directory name) are shown escaped, so
an error stays one line.

Maps are made per use and never kept: ``shard(i)`` maps one shard's columns, and
whoever uses them drops them when done (the scoring backends copy a shard's kernel
arrays once; ``concat`` copies shard after shard into one array per column). Each
map holds a file descriptor, so a split of thousands of shards, mapped all at once,
would run out of them (``RLIMIT_NOFILE``, often 1,024); kept per use, at most one
shard's columns are open at a time, whatever the number of shards. (A cache of open
maps would bound them too, but nothing reads a shard often enough to need one.)

Nothing under a shard set is trusted: ``manifest.json`` is read by the
project's one JSON reader (``evolve.io.jsonio``: a size cap, a depth limit,
finite numbers only) and every field is type-checked; a column is a regular
file (never a symbolic link) whose ``.npy`` header is parsed and checked (a
plain numeric dtype, C order, a shape whose bytes are exactly what the file
holds) before it is mapped, so a damaged column is one DataError, never a
NumPy exception.

Writing (``evolve.data.shard_writer``) never deletes what it did not write.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evolve.data import labels as LB
from evolve.data import traces as T
from evolve.data import vocab_class as VC
from evolve.data.tokens import DataError, read_npy_header
from evolve.errors import first_line
from evolve.io import jsonio
from evolve.io.atomic import sha256_file

FORMAT = "evolve-trace-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CHUNK = 16 << 20
SHARD_NAME = re.compile(r"shard-[0-9]{5,9}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_META = 1 << 20                 # bound of block_size, top_k, context_len (as traces)
NPY_KINDS = "biuf"                 # column dtypes: bool, integers, floats (no objects)
MAX_NPY_HEADER = 10_000


def shown(path) -> str:
    """A path or name for a one-line message: as is when printable, else escaped."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text if text.isprintable() else ascii(text)


def is_sharded(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a sharded trace set (its train split has a manifest)."""
    return (Path(directory) / "train" / MANIFEST).is_file()


# ----------------------------------------------------------------- files


def digest(path: Path) -> str:
    """sha256 of a file, read in CHUNK pieces."""
    return sha256_file(path, CHUNK)


def path_stat(path: Path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def st_is_dir(st) -> bool:
    return st is not None and stat.S_ISDIR(st.st_mode)


def st_is_file(st) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)


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
        """The whole split in memory (for reports that need every row at once), copied
        one shard at a time: only that shard's columns are mapped meanwhile."""
        fields = shard_fields(self.meta)
        first = self.shards[0]["columns"]
        cols = {f: np.empty([self.rows] + first[f]["shape"][1:], np.dtype(first[f]["dtype"]))
                for f in fields}
        at = 0
        for i, e in enumerate(self.shards):
            part = self.shard(i)
            for f in fields:
                cols[f][at:at + e["rows"]] = part.columns[f]
            at += e["rows"]
            del part                   # its maps (and their file descriptors) go here
        return T.TraceSplit(cols, dict(self.meta, source=str(self.directory)), self.name)


def local_blocks(counts, blocks) -> list:
    """Block numbers of a whole split (sorted) -> each shard's own block numbers, for
    shards of ``counts`` blocks each in order (None for all: every shard's None)."""
    if blocks is None:
        return [None] * len(counts)
    edges = np.cumsum([0] + list(counts))
    blocks = np.asarray(blocks, dtype=np.int64)
    return [blocks[(blocks >= a) & (blocks < b)] - a for a, b in zip(edges[:-1], edges[1:])]


def read_column(path: str | os.PathLike, f: str) -> np.ndarray:
    """Column ``f`` of a shard, memory-mapped read-only, after checking that the file
    is a regular file (not a link) holding exactly one plain numeric C-order array:
    the .npy header is parsed here and the bytes it declares must be the bytes the
    file holds. Any other file is a DataError naming it and the field."""
    path = Path(path)
    where = f"{shown(path)}: field '{f}'"
    st = path_stat(path)
    if st is None:
        raise DataError(f"{where} is missing")
    if stat.S_ISLNK(st.st_mode):
        raise DataError(f"{where} is a symbolic link (shards hold regular files only)")
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{where} is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise DataError(f"{where} cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise DataError(f"{where} is not a regular file")
        if size == 0:
            raise DataError(f"{where} is an empty file (expected a .npy array)")
        try:
            shape, fortran, dtype = read_npy_header(fh, MAX_NPY_HEADER)
        except Exception as e:             # noqa: BLE001 (any header NumPy refuses)
            raise DataError(f"{where} is not a .npy array ({first_line(e, 120)})") \
                from None
        offset = fh.tell()
    if dtype.hasobject or dtype.kind not in NPY_KINDS or dtype.fields or dtype.subdtype:
        raise DataError(f"{where} has dtype {str(dtype)[:40]!r}; a column is a plain "
                        "bool, integer or float array")
    if fortran:
        raise DataError(f"{where} is stored in Fortran order; expected C order")
    if not (1 <= len(shape) <= 2 and all(type(x) is int and x >= 0 for x in shape)):
        raise DataError(f"{where} has shape {str(shape)[:60]}; expected 1 or 2 "
                        "non-negative dimensions")
    count = 1
    for x in shape:
        count *= x
    if offset + count * dtype.itemsize != size:
        raise DataError(f"{where}: the header declares {dtype.str} {list(shape)} "
                        f"({count * dtype.itemsize} bytes), the file holds {size - offset}")
    if count == 0:
        return np.zeros(shape, dtype)
    try:
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="C")
    except (OSError, ValueError, OverflowError, MemoryError) as e:
        raise DataError(f"{where} cannot be mapped ({type(e).__name__}: "
                        f"{first_line(e, 120)})") from None


def check_shard_dir(path: Path) -> None:
    """DataError unless ``path`` is a directory (not a symbolic link)."""
    st = path_stat(path)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise DataError(f"{shown(path)}: the shard directory is a symbolic link (shards "
                        "hold regular files only)")
    if not st_is_dir(st):
        raise DataError(f"{shown(path)}: the shard directory is missing")


def map_shard(path: str | os.PathLike, meta: dict, name: str = "") -> T.TraceSplit:
    """A shard's columns memory-mapped read-only (each column file checked by
    ``read_column``; the rows are validated by ``open_split``)."""
    path = Path(path)
    check_shard_dir(path)
    cols = {f: read_column(path / f"{f}.npy", f) for f in shard_fields(meta)}
    return T.TraceSplit(cols, dict(meta, source=str(path)), name)


def shard_fields(meta: dict) -> tuple:
    """The columns of a split's shards: with the slot features where its manifest's
    ``schema_version`` (copied into ``meta["format_version"]`` by ``open_split``) is 3
    or 4 (and the ranks where it is 4),
    and with the critical-token labels where its meta has ``labels`` (task traces)."""
    base = T.fields_for(meta.get("format_version"))
    return base + (LB.COLUMN,) if "labels" in meta else base


def column_fields(columns: dict) -> tuple:
    """The columns to write of a piece of a split: its trace fields, and its labels when
    it has them."""
    return T.fields_of(columns) + ((LB.COLUMN,) if LB.COLUMN in columns else ())


def _whole(v, lo: int = 0, hi: int | None = None) -> bool:
    return type(v) is int and v >= lo and (hi is None or v <= hi)


def _manifest(directory: Path) -> dict:
    """The manifest of a split directory, read by ``jsonio`` and every field checked."""
    src = directory / MANIFEST
    where = shown(src)
    st = path_stat(src)
    if st is None:
        raise DataError(f"{where}: file not found (not a sharded split)")
    if stat.S_ISLNK(st.st_mode):
        raise DataError(f"{where}: the manifest is a symbolic link (shards hold regular "
                        "files only)")
    m = jsonio.read_json(src, "shard manifest", DataError, where=where)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(f"{where}: field 'format' is not {FORMAT!r}")
    if type(m.get("format_version")) is not int or m.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{where}: field 'format_version' is {m.get('format_version')!r:.40}, "
                        f"expected {FORMAT_VERSION}")
    if type(m.get("schema_version")) is not int or m["schema_version"] not in T.FORMAT_VERSIONS:
        raise DataError(f"{where}: field 'schema_version' is {m.get('schema_version')!r:.40}, "
                        f"expected one of {', '.join(map(str, T.FORMAT_VERSIONS))}")
    unknown = sorted(set(m) - {"format", "format_version", "schema_version", "meta", "rows",
                               "shards"})
    if unknown:
        raise DataError(f"{where}: unknown field {unknown[0]!r:.60}")
    meta, shards, rows = m.get("meta"), m.get("shards"), m.get("rows")
    if not isinstance(meta, dict) or not isinstance(shards, list) or not shards:
        raise DataError(f"{where}: fields 'meta' (an object) and 'shards' (a non-empty list) "
                        "are required")
    if not _whole(rows):
        raise DataError(f"{where}: field 'rows' must be a whole number, got {rows!r:.40}")
    g = meta.get("block_size")
    if not _whole(g, 1, MAX_META):
        raise DataError(f"{where}: field 'meta.block_size' must be a whole number "
                        f"1..{MAX_META}, got {g!r:.40}")
    for key in ("top_k", "context_len"):
        if not _whole(meta.get(key), 0, MAX_META):
            raise DataError(f"{where}: field 'meta.{key}' must be a whole number "
                            f"0..{MAX_META}, got {meta.get(key)!r:.40}")
    if "vocab_size" in meta and not _whole(meta["vocab_size"], 2):
        raise DataError(f"{where}: field 'meta.vocab_size' must be a whole number >= 2, "
                        f"got {meta['vocab_size']!r:.40}")
    if VC.META_KEY in meta:
        why = VC.check_text(meta[VC.META_KEY], T.vocab_size(meta))
        if why:
            raise DataError(f"{where}: field 'meta.{VC.META_KEY}' {why}")
    if "labels" in meta:
        if m["schema_version"] < T.SLOT_VERSION:
            raise DataError(f"{where}: field 'meta.labels': labelled task traces have schema "
                            f"{T.SLOT_VERSION} or {T.RANK_VERSION}, the manifest says "
                            f"{m['schema_version']}")
        LB.check_version(meta["labels"], where, meta.get("decoding"), "meta.labels.")
    fields = set(shard_fields(dict(meta, format_version=m["schema_version"])))
    seen = set()
    for i, e in enumerate(shards):
        at = f"{where}: shard {i}"
        if not (isinstance(e, dict) and set(e) == {"dir", "rows", "columns"}):
            raise DataError(f"{at}: expected an object with exactly dir, rows, columns")
        d, n, cols = e["dir"], e["rows"], e["columns"]
        if not (isinstance(d, str) and SHARD_NAME.fullmatch(d)):
            raise DataError(f"{at}: field 'dir' is {d!r:.60}, expected a name shard-NNNNN")
        if d in seen:
            raise DataError(f"{at}: field 'dir' {d!r} is listed twice")
        seen.add(d)
        if not _whole(n):
            raise DataError(f"{at} ({d}): field 'rows' must be a whole number, got {n!r:.40}")
        if n == 0:
            raise DataError(f"{at} ({d}): has 0 rows; a shard holds at least one block "
                            f"({g} rows) and the writer never writes an empty one")
        if n % g:
            raise DataError(f"{at} ({d}): {n} rows is not a whole number of blocks of {g}")
        if not isinstance(cols, dict):
            raise DataError(f"{at} ({d}): field 'columns' must be an object")
        extra = sorted(set(cols) - fields, key=str)
        if extra:
            raise DataError(f"{at} ({d}): unknown column {extra[0]!r:.60}")
        for f, c in cols.items():
            cat = f"{at} ({d}): column '{f}'"
            if not (isinstance(c, dict) and set(c) == {"dtype", "shape", "sha256"}):
                raise DataError(f"{cat}: expected an object with exactly dtype, shape, sha256")
            if not (isinstance(c["dtype"], str) and len(c["dtype"]) <= 8):
                raise DataError(f"{cat}: field 'dtype' is {c['dtype']!r:.40}, expected a "
                                "NumPy dtype string such as '<f8'")
            shape = c["shape"]
            if not (isinstance(shape, list) and 1 <= len(shape) <= 2
                    and all(_whole(x) for x in shape)):
                raise DataError(f"{cat}: field 'shape' is {shape!r:.60}, expected 1 or 2 "
                                "whole numbers")
            if not (isinstance(c["sha256"], str) and SHA256.fullmatch(c["sha256"])):
                raise DataError(f"{cat}: field 'sha256' is {c['sha256']!r:.80}, expected 64 "
                                "hex digits")
    total = sum(e["rows"] for e in shards)
    if total != rows:
        raise DataError(f"{where}: field 'rows' is {rows}, but the shards hold {total} rows")
    return m


def open_split(directory: str | os.PathLike, name: str = "", check: bool = True) -> ShardedSplit:
    """Open and validate (once) a sharded split directory; see the module docstring."""
    directory = Path(directory)
    m = _manifest(directory)
    src = shown(directory / MANIFEST)
    meta = dict(m["meta"], format_version=m["schema_version"])
    schema = None
    for i, e in enumerate(m["shards"]):
        sdir = directory / e["dir"]
        check_shard_dir(sdir)
        n = e["rows"]
        for f in shard_fields(meta):
            path = sdir / f"{f}.npy"
            where = shown(path)
            want = e["columns"].get(f)
            if not isinstance(want, dict):
                raise DataError(f"{src}: shard {e['dir']}: field '{f}' is not in the manifest")
            a = read_column(path, f)
            if a.dtype.str != want["dtype"] or list(a.shape) != want["shape"]:
                raise DataError(f"{where}: field '{f}' is {a.dtype.str} {list(a.shape)}, the "
                                f"manifest says {want['dtype']} {want['shape']}")
            if a.shape[0] != n:
                raise DataError(f"{where}: field '{f}' has {a.shape[0]} rows, the manifest "
                                f"says {n}")
            kind = (a.dtype.str, list(a.shape[1:]))
            if schema is not None and schema[f] != kind:
                raise DataError(f"{where}: field '{f}' is {kind[0]} {kind[1]} per row, shard "
                                f"{m['shards'][0]['dir']} has {schema[f][0]} {schema[f][1]} "
                                "(mismatched shard schemas)")
            if check:
                try:
                    same = digest(path) == want["sha256"]
                except OSError as err:
                    raise DataError(f"{where}: field '{f}' cannot be read "
                                    f"({err.strerror or err})") from None
                if not same:
                    raise DataError(f"{where}: field '{f}': checksum differs from the manifest "
                                    "(the file changed or is corrupt)")
        if schema is None:
            schema = {f: (e["columns"][f]["dtype"], e["columns"][f]["shape"][1:])
                      for f in shard_fields(meta)}
        if check:
            ts = map_shard(sdir, meta, name)
            T.validate(ts, shown(sdir))
            if "labels" in meta:
                LB.check_critical(ts.columns, ts.columns[LB.COLUMN],
                                  meta["labels"]["decoding"] == "greedy",
                                  shown(sdir / f"{LB.COLUMN}.npy"))
    return ShardedSplit(directory, meta, m["rows"], list(m["shards"]), name or directory.name)


def load_splits(directory: str | os.PathLike, splits=T.SPLITS) -> dict:
    directory = Path(directory)
    return {s: open_split(directory / s, name=s) for s in splits}


def load_in_memory(directory: str | os.PathLike, splits=T.SPLITS) -> dict:
    """The trace splits of ``directory`` in memory, whichever form they are in: .npz
    files, or a sharded set (``evolve data shard``) read whole, for a reader that needs
    every row at once; DataError saying what a trace directory holds when it is
    neither."""
    directory = T.trace_dir(directory)
    if all((directory / s / MANIFEST).is_file() for s in splits):
        return {s: open_split(directory / s, name=s).concat() for s in splits}
    missing = next((s for s in splits if not os.path.lexists(directory / f"{s}.npz")), None)
    if missing is not None:
        raise DataError(f"{directory / missing}.npz: file not found (a trace directory holds "
                        f"{', '.join(splits)} as .npz splits, or the shards `evolve data "
                        "shard` writes)")
    return T.load_splits(directory, splits)
