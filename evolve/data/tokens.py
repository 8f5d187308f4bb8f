"""Datasets: one split is a struct of numpy arrays, one row per drafted token.

Splits are stored as uncompressed ``.npz`` files with a fixed zip timestamp, so
the same data always gives the same bytes. The original benchmark's JSON array
form (one object per token, field names as in ``FIELDS``) imports and exports
exactly. Everything that reads data validates it and raises ``DataError`` with
one line naming the file, the field and the first bad row.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.errors import EvolveError, first_line, show
from evolve.lang.features import INPUT_NAMES
from evolve.io import jsonio
from evolve.io.atomic import atomic_write_bytes

SPLITS = ("train", "valid", "test")

# Field name -> numpy dtype, in the original schema's order.
FIELDS: dict[str, np.dtype] = {
    "draft_prob": np.dtype(np.float64),
    "target_prob": np.dtype(np.float64),
    "position": np.dtype(np.int64),
    "draft_entropy": np.dtype(np.float64),
    "target_entropy": np.dtype(np.float64),
    "top_token_match": np.dtype(np.bool_),
    "rand_value": np.dtype(np.float64),
    "baseline_accepts": np.dtype(np.bool_),
}

# The six inputs a heuristic sees, in signature order.
FEATURES = INPUT_NAMES

FORMAT_VERSION = 1
# Reading limits: no split may declare more array bytes than this, and a JSON
# split or a meta.json member may be at most this long (evolve.io.jsonio reads them).
MAX_SPLIT_BYTES = 4 * 1024 ** 3
MAX_JSON_SPLIT_BYTES = 1024 ** 3
MAX_META_BYTES = 1024 * 1024
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


class DataError(EvolveError):
    """Bad input data; the message is one line naming file, field and row."""


@dataclass(frozen=True)
class Dataset:
    draft_prob: np.ndarray
    target_prob: np.ndarray
    position: np.ndarray
    draft_entropy: np.ndarray
    target_entropy: np.ndarray
    top_token_match: np.ndarray
    rand_value: np.ndarray
    baseline_accepts: np.ndarray
    name: str = ""

    def __len__(self) -> int:
        return int(self.draft_prob.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in FIELDS}

    def features(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f) for f in FEATURES)

    def standard_threshold(self) -> np.ndarray:
        """min(1, target/draft): the standard rule's acceptance probability."""
        return np.minimum(1.0, self.target_prob / self.draft_prob)

    def feature_matrix(self) -> np.ndarray:
        """The six features as one C-contiguous float64 (6, N) matrix."""
        m = np.empty((len(FEATURES), len(self)), dtype=np.float64)
        for i, f in enumerate(FEATURES):
            m[i] = getattr(self, f)
        return m


def from_columns(columns: dict[str, np.ndarray], source: str = "<memory>",
                 name: str = "") -> Dataset:
    """Build a validated Dataset from a mapping of field -> array."""
    missing = [f for f in FIELDS if f not in columns]
    if missing:
        raise DataError(f"{source}: field '{missing[0]}' is missing")
    extra = [k for k in columns if k not in FIELDS]
    if extra:
        raise DataError(f"{source}: field '{extra[0]}' is not part of the schema "
                        f"(expected {', '.join(FIELDS)})")
    arrays = {}
    n = None
    for f, dtype in FIELDS.items():
        a = np.asarray(columns[f])
        if a.ndim != 1:
            raise DataError(f"{source}: field '{f}' must be one-dimensional, got shape {a.shape}")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise DataError(f"{source}: field '{f}' has {a.shape[0]} rows, "
                            f"'{next(iter(FIELDS))}' has {n}")
        arrays[f] = _coerce(a, f, dtype, source)
    ds = Dataset(**arrays, name=name)
    validate(ds, source)
    return ds


def _coerce(a: np.ndarray, field: str, dtype: np.dtype, source: str) -> np.ndarray:
    if dtype == np.bool_:
        if a.dtype != np.bool_:
            raise DataError(f"{source}: field '{field}' must be boolean, got {a.dtype}")
        return np.ascontiguousarray(a)
    if dtype == np.int64:
        if a.dtype.kind not in "iu":
            raise DataError(f"{source}: field '{field}' must be an integer, got {a.dtype}")
        return np.ascontiguousarray(a, dtype=np.int64)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise DataError(f"{source}: field '{field}' must be a number, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float64)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def validate(ds: Dataset, source: str) -> None:
    """Check every documented invariant; raise DataError on the first failure."""
    n = len(ds)
    if n == 0:
        raise DataError(f"{source}: the split is empty (no rows)")
    for f in ("draft_prob", "target_prob", "draft_entropy", "target_entropy", "rand_value"):
        a = getattr(ds, f)
        bad = ~np.isfinite(a)
        if bad.any():
            i = _first_bad(bad)
            raise DataError(f"{source}: field '{f}' row {i}: value {a[i]!r} is not finite")
    for f in ("draft_prob", "target_prob"):
        a = getattr(ds, f)
        bad = ~((a > 0.0) & (a <= 1.0))
        if bad.any():
            i = _first_bad(bad)
            raise DataError(f"{source}: field '{f}' row {i}: value {a[i]!r} is outside (0, 1]")
    for f in ("draft_entropy", "target_entropy", "position"):
        a = getattr(ds, f)
        bad = a < 0
        if bad.any():
            i = _first_bad(bad)
            raise DataError(f"{source}: field '{f}' row {i}: value {a[i]!r} is negative")
    r = ds.rand_value
    bad = ~((r >= 0.0) & (r < 1.0))
    if bad.any():
        i = _first_bad(bad)
        raise DataError(f"{source}: field 'rand_value' row {i}: value {r[i]!r} is outside [0, 1)")
    expect = r < ds.standard_threshold()
    bad = expect != ds.baseline_accepts
    if bad.any():
        i = _first_bad(bad)
        raise DataError(
            f"{source}: field 'baseline_accepts' row {i}: {bool(ds.baseline_accepts[i])} "
            f"disagrees with rand_value < min(1, target_prob/draft_prob) "
            f"({int(bad.sum())} inconsistent rows in all)")


# ----------------------------------------------------------------- npz form

def write_npz(path: str | os.PathLike, meta: dict, members: dict[str, np.ndarray]) -> None:
    """Write ``meta.json`` and arrays as an uncompressed zip with fixed timestamps
    (same content, same bytes), atomically."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo("meta.json", date_time=_ZIP_DATE),
                    json.dumps(meta, sort_keys=True))
        for member, array in members.items():
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(array), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(member, date_time=_ZIP_DATE), arr.getvalue())
    atomic_write_bytes(path, buf.getvalue())


def save_npz(ds: Dataset, path: str | os.PathLike) -> None:
    """Write a split atomically as a deterministic, uncompressed .npz."""
    write_npz(path, {"format_version": FORMAT_VERSION, "rows": len(ds), "name": ds.name},
              {f + ".npy": getattr(ds, f) for f in FIELDS})


def read_members(zf: zipfile.ZipFile, src: str, members: dict[str, str]) -> dict:
    """Arrays of an open split file: field -> array, for field -> zip member name.
    Never unpickles; a missing member is a DataError naming the field. Each
    member's declared shape is checked against ``MAX_SPLIT_BYTES`` before anything
    is allocated, and it is read with exactly that many bytes as its cap, so a
    member that inflates beyond what it declares is refused, not read whole. A file
    holding two members of one name is refused (``check_unique_members``)."""
    names = check_unique_members(zf, src)
    cols, total = {}, 0
    for field, member in members.items():
        if member not in names:
            raise DataError(f"{src}: field '{field}' is missing")
        cols[field], nbytes = _read_member_array(zf, member, src, field,
                                                 MAX_SPLIT_BYTES - total)
        total += nbytes
    return cols


def check_unique_members(zf: zipfile.ZipFile, src: str) -> set:
    """The member names of an open split file, each held once: a zip may hold two
    members of one name, of which readers silently take the last; DataError naming
    the file and the member."""
    seen: set = set()
    for name in zf.namelist():
        if name in seen:
            raise DataError(f"{src}: member {show(name)} appears more than once (a split "
                            "file holds each member once)")
        seen.add(name)
    return seen


# NumPy parses a .npy header with ast.literal_eval. On CPython 3.11 the AST
# constructor's recursion count is the interpreter's, not the thread's: two threads
# parsing at once (Dask workers in threads reading splits or shards, a garbage
# collection running Python code between them) can fail with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905, seen here in a test of
# mining on threaded workers). The headers this package reads are parsed one at a time.
_HEADER_LOCK = threading.Lock()


def read_npy_header(fh, max_header_size: int | None = None):
    """(shape, fortran order, dtype) of the .npy stream ``fh`` after its magic; DataError
    for a version other than 1.0 or 2.0 (the caller names the file), and whatever NumPy
    raises on a bad header."""
    fmt = np.lib.format
    version = fmt.read_magic(fh)
    if version not in ((1, 0), (2, 0)):
        raise DataError(f"unsupported .npy version {version}")
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    kw = {} if max_header_size is None else {"max_header_size": max_header_size}
    with _HEADER_LOCK:
        return read(fh, **kw)


def _read_member_array(zf: zipfile.ZipFile, member: str, src: str, field: str,
                       budget: int) -> tuple[np.ndarray, int]:
    with zf.open(member) as fh:
        try:
            shape, fortran, dtype = read_npy_header(fh)
        except DataError as e:
            raise DataError(f"{src}: field '{field}': {e}") from None
        if dtype.hasobject:
            raise DataError(f"{src}: field '{field}': object arrays are not allowed")
        count = 1
        for d in shape:
            count *= int(d)
        nbytes = count * dtype.itemsize
        if nbytes > budget:
            raise DataError(f"{src}: field '{field}' declares shape {shape} of {dtype} "
                            f"({nbytes} bytes), more than the {MAX_SPLIT_BYTES}-byte limit "
                            "of a split")
        data = bytearray(nbytes)
        got = fh.readinto(data) if nbytes else 0
        while got < nbytes:
            more = fh.readinto(memoryview(data)[got:])
            if not more:
                raise DataError(f"{src}: field '{field}' is truncated ({got} of {nbytes} "
                                "bytes)")
            got += more
        if fh.read(1):
            raise DataError(f"{src}: field '{field}' holds more data than its shape "
                            f"{shape} declares")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(shape, order="F" if fortran else "C"), nbytes


def read_meta(zf: zipfile.ZipFile, src: str):
    """The ``meta.json`` member, read with a byte cap by the one JSON reader."""
    check_unique_members(zf, src)
    with zf.open("meta.json") as fh:
        raw = fh.read(MAX_META_BYTES + 1)
    if len(raw) > MAX_META_BYTES:
        raise DataError(f"{src}: meta.json is larger than {MAX_META_BYTES} bytes")
    return jsonio.loads(raw, f"{src}: meta.json", "metadata", DataError)


def load_npz(path: str | os.PathLike, name: str = "") -> Dataset:
    path = Path(path)
    src = str(path)
    if not os.path.lexists(path):
        raise DataError(f"{src}: file not found")
    jsonio.check_regular(path, "split file", DataError)
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            cols = read_members(zf, src, {f: f + ".npy" for f in FIELDS})
            extra = sorted(n[:-4] for n in names if n.endswith(".npy") and n[:-4] not in FIELDS)
            if extra:
                raise DataError(f"{src}: field '{extra[0]}' is not part of the schema")
    except DataError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error,
            NotImplementedError) as e:
        raise DataError(f"{src}: not a readable split file ({first_line(e)})") from None
    return from_columns(cols, source=src, name=name or path.stem)


# ---------------------------------------------------------------- JSON form

def load_json(path: str | os.PathLike, name: str = "") -> Dataset:
    """Read the original benchmark's form: one JSON array of token objects."""
    path = Path(path)
    src = str(path)
    if not os.path.lexists(path):
        raise DataError(f"{src}: file not found")
    raw = jsonio.read_capped(path, "split file", MAX_JSON_SPLIT_BYTES, DataError)
    records = jsonio.loads(raw, src, "split file", DataError, finite=False)
    if not isinstance(records, list):
        raise DataError(f"{src}: expected a JSON array of token objects, got {type(records).__name__}")
    if not records:
        raise DataError(f"{src}: the split is empty (no rows)")
    cols: dict[str, list] = {f: [None] * len(records) for f in FIELDS}
    field_set = set(FIELDS)
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DataError(f"{src}: row {i}: expected an object, got {type(rec).__name__}")
        if rec.keys() != field_set:
            missing = [f for f in FIELDS if f not in rec]
            if missing:
                raise DataError(f"{src}: field '{missing[0]}' row {i}: missing")
            extra = sorted(k for k in rec if k not in field_set)
            raise DataError(f"{src}: field '{extra[0]}' row {i}: not part of the schema")
        for f, dtype in FIELDS.items():
            v = rec[f]
            if dtype == np.bool_:
                ok = type(v) is bool
                want = "true or false"
            elif dtype == np.int64:
                ok = type(v) is int
                want = "an integer"
            else:
                ok = type(v) in (int, float)
                want = "a number"
            if not ok:
                raise DataError(f"{src}: field '{f}' row {i}: expected {want}, got {json.dumps(v)}")
            cols[f][i] = v
    arrays = {}
    for f, dtype in FIELDS.items():
        try:
            arrays[f] = np.array(cols[f], dtype=dtype)
        except OverflowError:
            raise DataError(f"{src}: field '{f}': a value does not fit {dtype}") from None
    return from_columns(arrays, source=src, name=name or path.stem)


def dumps_json(ds: Dataset) -> str:
    """The original form: a JSON array with one object per line."""
    cols = {f: getattr(ds, f).tolist() for f in FIELDS}
    lines = []
    for i in range(len(ds)):
        obj = {f: cols[f][i] for f in FIELDS}
        lines.append(json.dumps(obj, allow_nan=False))
    return "[\n" + ",\n".join(lines) + "\n]\n"


def save_json(ds: Dataset, path: str | os.PathLike) -> None:
    atomic_write_bytes(path, dumps_json(ds).encode("utf-8"))


# --------------------------------------------------------- split directories

def split_path(directory: str | os.PathLike, split: str) -> Path:
    return Path(directory) / f"{split}.npz"


def load_split(directory: str | os.PathLike, split: str) -> Dataset:
    """Load ``split`` from a directory holding ``<split>.npz`` or ``<split>.json``."""
    directory = Path(directory)
    npz = directory / f"{split}.npz"
    js = directory / f"{split}.json"
    if npz.exists():
        return load_npz(npz, name=split)
    if js.exists():
        return load_json(js, name=split)
    if not directory.is_dir():
        raise DataError(f"{directory}: data directory not found (make the default splits "
                        "there with `evolve data generate`, or point to yours with --data)")
    raise DataError(f"{directory}: no '{split}' split ({split}.npz or {split}.json) found")


def load_splits(directory: str | os.PathLike, splits=SPLITS) -> dict[str, Dataset]:
    return {s: load_split(directory, s) for s in splits}


def describe(ds: Dataset) -> dict:
    """Summary statistics for `evolve data info`."""
    return {
        "tokens": len(ds),
        "standard_accept_rate": float(ds.baseline_accepts.mean()),
        "top_match_rate": float(ds.top_token_match.mean()),
        "draft_entropy": [float(ds.draft_entropy.min()), float(ds.draft_entropy.max())],
        "target_entropy": [float(ds.target_entropy.min()), float(ds.target_entropy.max())],
        "position_max": int(ds.position.max()),
        "mean_draft_prob": float(ds.draft_prob.mean()),
        "mean_target_prob": float(ds.target_prob.mean()),
    }

