"""Writing sharded trace splits (the format and its reading: ``evolve.data.shards``).

Writing never deletes what this module did not write. Shards are written into
a temporary directory (``.<split>.evolve-shards-tmp.XXXXXXXX``, holding a lock
file its writer keeps locked) renamed into place, so a split directory is
complete or absent. What is at the split's path is replaced only when it is
absent, an empty directory, or a shard set (a manifest and shard directories
of ``.npy`` columns, nothing else); a shard set replaced is kept in
``previous/<split>-<sha256 of its manifest>/`` beside it. Anything else is
refused (``check_out`` refuses it before anything is written). Temporary
directories left by a killed writer (their lock no longer held) are removed
by the next writer of the same split.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

import numpy as np

from evolve.data import traces as T
from evolve.data import labels as LB
from evolve.data.shards import (FORMAT, FORMAT_VERSION, MANIFEST, SHARD_NAME, ShardedSplit,
                                column_fields, digest, path_stat, shown, st_is_dir, st_is_file)
from evolve.data.tokens import DataError
from evolve.io import jsonio
from evolve.io.atomic import fsync_dir, naming, sync_filesystem

PREVIOUS = "previous"              # replaced shard sets are kept here (see module doc)
TMP_TAG = "evolve-shards-tmp"      # temporary split directories: .<split>.<TMP_TAG>.XXXXXXXX
LOCK = ".writer.lock"              # in a temporary directory, locked by its live writer
STALE_EMPTY_S = 60                 # an unlocked empty temporary directory older than this


def write_shard(directory: Path, columns: dict) -> dict:
    """Write one shard's columns as .npy files; its manifest entry. The files are not
    fsynced one by one: ``SplitWriter.commit`` syncs them all at once before the
    split is renamed into place."""
    directory.mkdir(parents=True)
    cols = {}
    for f in column_fields(columns):           # v2, or v3 with the slot features (and labels)
        a = np.ascontiguousarray(columns[f])
        path = directory / f"{f}.npy"
        try:
            with open(path, "wb") as fh:
                np.lib.format.write_array(fh, a, allow_pickle=False)
        except OSError as e:                   # a full disk: name the file
            raise naming(e, path) from None
        cols[f] = {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": digest(path)}
    return {"dir": directory.name, "rows": int(columns["draft_prob"].shape[0]), "columns": cols}


def is_shard_set(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` (not a symbolic link) is what a writer of this module
    leaves: a readable manifest of this format, shard directories holding only
    column files, and nothing else (so replacing it loses nothing of anyone else's)."""
    d = Path(directory)
    if not st_is_dir(path_stat(d)):
        return False
    try:
        names = os.listdir(d)
        if not st_is_file(path_stat(d / MANIFEST)):
            return False
        for name in names:
            if name in (MANIFEST, LOCK):
                continue
            if not (SHARD_NAME.fullmatch(name) and st_is_dir(path_stat(d / name))):
                return False
            fields = {f"{f}.npy" for f in T.V4_ALL_FIELDS + (LB.COLUMN,)}
            for inner in os.listdir(d / name):
                if inner not in fields or not st_is_file(path_stat(d / name / inner)):
                    return False
        m = jsonio.read_json(d / MANIFEST, "shard manifest", DataError)
    except (OSError, DataError):
        return False
    return isinstance(m, dict) and m.get("format") == FORMAT


def _state(path: Path) -> str:
    """What is at a split's path: absent, empty (directory), shards, or other."""
    st = path_stat(path)
    if st is None:
        return "absent"
    if st_is_dir(st):
        try:
            if not os.listdir(path):
                return "empty"
        except OSError:
            return "other"
        if is_shard_set(path):
            return "shards"
    return "other"


def _foreign(path: Path) -> DataError:
    st = path_stat(path)
    what = ("a symbolic link" if st is not None and stat.S_ISLNK(st.st_mode) else
            "a directory holding other files, or a damaged shard set" if st_is_dir(st) else
            "a file")
    return DataError(f"{shown(path)}: exists and is not a set of shards written by `evolve "
                     f"data shard` ({what}); refusing to replace it: move it away or choose "
                     "another --out")


def check_out(out: str | os.PathLike, force: bool, splits=T.SPLITS) -> list:
    """Before anything is written to ``out``: the splits whose shard sets will be
    replaced (kept in ``out/previous/``). A split path holding anything else (a
    file, a link, a directory that is not a shard set) is refused, ``force`` or
    not; shard sets are refused without ``force``."""
    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        raise DataError(f"{shown(out)}: --out is not a directory")
    replace = []
    for s in splits:
        state = _state(out / s)
        if state == "other":
            raise _foreign(out / s)
        if state == "shards":
            replace.append(s)
    if replace and not force:
        raise DataError(f"{shown(out / replace[0])}: holds sharded splits; pass --force to "
                        f"replace them (the previous ones are kept in "
                        f"{shown(out / PREVIOUS)})")
    prev = path_stat(out / PREVIOUS)
    if replace and prev is not None and not st_is_dir(prev):
        raise DataError(f"{shown(out / PREVIOUS)}: exists and is not a directory (replaced "
                        "shards are kept there)")
    return replace


def _tmp_pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(f".{name}.{TMP_TAG}.") + r"[a-z0-9_]{8}")


def clean_leftovers(out: str | os.PathLike) -> list:
    """Remove the temporary directories that killed writers of split ``out`` left
    beside it: only names of this module's own pattern, and only when their lock
    is free (its writer is gone) or, with no lock file, when empty and stale.
    Returns the paths removed."""
    out = Path(out)
    pattern = _tmp_pattern(out.name)
    removed = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        try:
            fd = os.open(path / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:          # a writer that was killed before its lock
            try:
                if (not os.listdir(path)
                        and time.time() - os.lstat(path).st_mtime > STALE_EMPTY_S):
                    os.rmdir(path)
                    removed.append(path)
            except OSError:
                pass
            continue
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:                # its writer is alive
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def keep_previous(out: Path) -> Path:
    """Move the shard set at ``out`` to ``<parent>/previous/<name>-<sha256 of its
    manifest, 16 digits>`` (a rename: nothing is copied or deleted)."""
    raw = jsonio.read_capped(out / MANIFEST, "shard manifest", jsonio.MAX_JSON_BYTES,
                             DataError, where=shown(out / MANIFEST))
    prev = out.parent / PREVIOUS
    prev.mkdir(exist_ok=True)
    base = f"{out.name}-{hashlib.sha256(raw).hexdigest()[:16]}"
    kept, i = prev / base, 1
    while os.path.lexists(kept):
        kept, i = prev / f"{base}-{i}", i + 1
    os.rename(out, kept)
    return kept


class SplitWriter:
    """Writes a sharded split piece by piece (whole blocks), then commits it atomically.

    The shards go to a temporary directory beside ``out`` (see the module doc);
    ``commit`` moves it into place, keeping a shard set that was there in
    ``previous/`` and refusing anything else that was there."""

    def __init__(self, out: str | os.PathLike, meta: dict, rows_per_shard: int):
        self.out = Path(out)
        self.meta = {k: v for k, v in meta.items() if k != "source"}
        g = int(self.meta["block_size"])
        self.rows_per_shard = max(g, rows_per_shard // g * g)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(self.out)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.{TMP_TAG}.",
                                         dir=self.out.parent))
        self._lock = os.open(self.tmp / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.entries: list[dict] = []
        self.pending: list[dict] = []
        self.pending_rows = 0
        self.kept: Path | None = None

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def add(self, columns: dict) -> None:
        """Append rows (a dict of schema-v2 columns, whole blocks)."""
        self.pending.append(columns)
        self.pending_rows += int(columns["draft_prob"].shape[0])
        while self.pending_rows >= self.rows_per_shard:
            self._flush(self.rows_per_shard)

    def _flush(self, rows: int) -> None:
        """Write the first ``rows`` pending rows as the next shard. Only those rows are
        copied: the rest stay as views of what ``add`` was given (copying every
        pending row at each shard made small shards of large pieces quadratic)."""
        parts, need = [], rows
        while need:
            p = self.pending[0]
            n = int(p["draft_prob"].shape[0])
            if n <= need:
                parts.append(self.pending.pop(0))
                need -= n
            else:
                parts.append({f: a[:need] for f, a in p.items()})
                self.pending[0] = {f: a[need:] for f, a in p.items()}
                need = 0
        fields = column_fields(parts[0])
        head = parts[0] if len(parts) == 1 else \
            {f: np.concatenate([p[f] for p in parts]) for f in fields}
        self.entries.append(write_shard(self.tmp / f"shard-{len(self.entries):05d}", head))
        self.pending_rows -= rows

    def commit(self) -> Path:
        if self.pending_rows:
            self._flush(self.pending_rows)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "schema_version": (T.version_of(self.entries[0]["columns"])
                                       if self.entries else T.FORMAT_VERSION),
                    "meta": self.meta,
                    "rows": sum(e["rows"] for e in self.entries), "shards": self.entries}
        with open(self.tmp / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n")
        # every column and the manifest on disk before the rename, in one call (an
        # fsync per column cost about 2 ms each: most of the time of small shards)
        sync_filesystem(self.tmp)
        state = _state(self.out)
        if state == "other":               # never replace what this module did not write
            raise _foreign(self.out)
        if state == "shards":              # kept aside: the split is the old or the new one
            self.kept = keep_previous(self.out)
        elif state == "empty":
            os.rmdir(self.out)             # fails, deleting nothing, should it fill meanwhile
        os.rename(self.tmp, self.out)      # fails should anything appear at out meanwhile
        self.tmp = self.out
        try:
            os.unlink(self.out / LOCK)
        except OSError:
            pass
        self._release()
        fsync_dir(self.out.parent)
        return self.out

    def abort(self) -> None:
        if self.tmp != self.out:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self._release()


def write_split(ts: T.TraceSplit, out: str | os.PathLike, rows_per_shard: int) -> Path:
    """Write a loaded split as shards of ``rows_per_shard`` rows (rounded down to
    whole blocks, at least one block)."""
    return _write_all(SplitWriter(out, ts.meta, rows_per_shard), ts)


def _write_all(w: SplitWriter, ts: T.TraceSplit) -> Path:
    try:
        n, step = len(ts), w.rows_per_shard
        for a in range(0, n, step):
            w.add({f: ts.columns[f][a:a + step] for f in column_fields(ts.columns)})
        return w.commit()
    except BaseException:
        w.abort()
        raise


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


def shard_dir(src: str | os.PathLike, out: str | os.PathLike, rows_per_shard: int,
              splits=T.SPLITS, force: bool = False, on_split=None) -> dict:
    """Shard the .npz trace splits of ``src`` into ``out``; split -> number of shards.
    Task traces shard with their critical-token labels (``<split>.labels.npz``, checked
    against the traces first). Shard sets already at ``out`` are replaced only with
    ``force`` (and kept in ``out/previous/``); anything else there is refused
    (``check_out``). ``on_split(split, shards)`` is called as each split is in place
    (each is complete or absent: an interrupted one is removed)."""
    src, out = Path(src), Path(out)
    if rows_per_shard < 1:
        raise DataError(f"--rows-per-shard: {rows_per_shard!r} is invalid; expected >= 1")
    for s in splits:                       # every split readable before anything is written
        path = src / f"{s}.npz"
        if not T.is_trace_file(path):
            T.load(path, name=s)           # raises the precise DataError
        elif T.read_file_meta(path).get("backend") == "task":
            _with_labels(src, T.load(path, name=s))   # and task traces' labels, all checked
    check_out(out, force, splits)
    done = {}
    for s in splits:                       # one split in memory at a time
        ts = _with_labels(src, T.load(src / f"{s}.npz", name=s))
        w = SplitWriter(out / s, ts.meta, rows_per_shard)
        _write_all(w, ts)
        done[s] = len(w.entries)
        if on_split is not None:
            on_split(s, done[s])
    return done


def _with_labels(src: Path, ts: T.TraceSplit) -> T.TraceSplit:
    """Task traces with their labels as one more column (and their meta, without the
    checksum of the .npz file they were written beside, as ``meta.labels``); other
    traces as they are."""
    if ts.meta.get("backend") != "task":
        return ts
    path = src / f"{ts.name}.npz"
    meta, crit = LB.load_labels(LB.labels_path(src, ts.name), path, ts)
    labels = {k: v for k, v in meta.items() if k != "traces_sha256"}
    return T.TraceSplit({**ts.columns, LB.COLUMN: crit}, dict(ts.meta, labels=labels),
                        ts.name)
