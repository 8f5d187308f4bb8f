"""Hostile sharded trace sets (evolve.data.shards, `evolve data shard`): the writer
never deletes what it did not write, and every damaged column or manifest is one
line naming the file (and field), exit code 2, no traceback.

Splits are the tiny traces of tests/tracekit.py; every test works on its own copy
in a temporary directory.

Guarantee 17 of docs/reliability.md, Shard sets never delete what they did not write:

`evolve data shard` and `evolve data trace --rows-per-shard` check `--out` before
anything is written. A split path (`train/`, `valid/`, `test/`) may be absent, an
empty directory, or a shard set written by this tool: a manifest and `shard-NNNNN/`
directories of `.npy` columns and nothing else. Anything else there (a file, a link,
a directory holding other files, a damaged shard set) is refused in one line, with
or without `--force`, and nothing is created. Without `--force` an existing shard
set is refused too. With it, the old set is moved (not copied or deleted) to
`previous/<split>-<sha256 of its manifest>/` beside it, as `data generate --force`
keeps `previous/`, and the command prints where. The writer checks again at commit,
so a directory that appears after the check is not replaced either. Shards are built
in `.<split>.evolve-shards-tmp.XXXXXXXX`, locked by its writer with `flock`. The
next writer of that split removes such directories whose lock is free (a writer
killed with `kill -9`), and nothing else. Tests (in `tests/test_hostile_shards.py`):
`test_user_directory_at_a_split_is_never_deleted[False|True]`,
`test_force_replaces_shard_sets_only[valid|test]`,
`test_file_or_link_at_a_split_is_refused[file|symlink]`,
`test_force_keeps_the_previous_shards`,
`test_trace_into_shards_never_deletes_a_user_directory`,
`test_writer_itself_refuses_to_replace_a_foreign_directory`,
`test_leftovers_of_a_killed_writer_are_removed_on_the_next_write` (a real writer
killed with SIGKILL), `test_live_writer_temp_directory_is_left_alone` and
`test_stale_locked_name_is_removed_only_when_unlocked`.

Guarantee 18 of docs/reliability.md, Shard columns and manifests are read like every other file:

`manifest.json` is read by the one JSON reader (12): a 64 MiB cap, a depth limit and
finite numbers only. Every field is type-checked: `format_version` and
`schema_version` (`true` is not 1), `rows`, `meta.block_size`/`top_k`/
`context_len`/`vocab_size`, and each shard's `dir` (`shard-NNNNN`, listed once),
`rows` (a whole number of blocks, not 0) and `columns` (the schema's fields, each
with a dtype string, a shape and a 64-hex-digit sha256). A column must be a regular
file, and the manifest, the shard directories and the columns must not be symbolic
links. Its `.npy` header is parsed and checked before the column is mapped: a plain
bool, integer or float dtype, C order, one or two non-negative dimensions, and
declared bytes that exactly fill the file. So a column of garbage, text, a link to
`/etc/passwd`, an object array, a header that declares more rows than the file holds
or an absurd shape, and an empty file each give one line naming the file and the
field, with exit code 2, from `data shard --verify`, from `evolve run --data` and on
cluster workers (`map_shard`). A shard with 0 rows is named as such (the writer
never writes one). Names that are not printable, such as a newline in a directory or
shard name, are escaped so the error stays on one line. Tests:
`test_damaged_column_is_one_line[...]` (13 kinds, through `--verify` and `run`),
`test_damaged_column_on_map_is_one_line`,
`test_symlinked_shard_directory_is_refused`,
`test_manifest_fields_are_type_checked[...]` (20 lies),
`test_manifest_nested_too_deeply`, `test_manifest_nan_is_refused`,
`test_manifest_size_is_capped`, `test_manifest_must_be_a_regular_file[...]`,
`test_newline_in_a_shard_name_stays_on_one_line`,
`test_newline_in_the_directory_name_stays_on_one_line` and
`test_zero_row_shard_is_named`. A split of more shards than the process may open
files runs and reports: at most one shard's columns are mapped at a time
(`test_a_split_of_more_shards_than_file_descriptors_runs_and_reports`), and a full
disk while sharding names the file and leaves neither the split nor a temporary
directory (`test_a_full_disk_while_sharding_names_the_file_and_leaves_nothing`).

Also guarantee 22 of docs/reliability.md, A trace recording owns its output directory
(test_trace_into_shards_owns_its_output_directory): see tests/test_cli_trace.py.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from evolve.data import shard_writer as W
from evolve.data import shards as S
from evolve.data import traces as T
from evolve.data.tokens import DataError
from tests import tracekit
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated")

REPO = Path(__file__).resolve().parent.parent
ROWS = 100                     # rows per shard (rounded down to whole blocks)


npz_dir = tracekit.npz_dir_fixture()


@pytest.fixture(scope="module")
def sharded(npz_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "shards"
    r = invoke("data", "shard", npz_dir, "--rows-per-shard", ROWS, "--out", out)
    assert r.exit_code == 0, r.output
    return out


def tree(root: Path) -> dict:
    """Every file under ``root`` (hidden ones included) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def hidden(root: Path) -> list:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def shard(npz_dir, out, *extra):
    return invoke("data", "shard", npz_dir, "--rows-per-shard", ROWS, "--out", out, *extra)


# ------------------------------------------------------ never delete user data

@pytest.mark.parametrize("force", [False, True])
def test_user_directory_at_a_split_is_never_deleted(npz_dir, tmp_path, force):
    u = tmp_path / "U"
    (u / "train").mkdir(parents=True)
    (u / "train" / "IMPORTANT.txt").write_text("mine\n")
    before = tree(u)
    r = shard(npz_dir, u, *(["--force"] if force else []))
    one_line_error(r, str(u / "train"), "not a set of shards")
    assert tree(u) == before
    assert sorted(p.name for p in u.iterdir()) == ["train"]      # nothing written


@pytest.mark.parametrize("split", ["valid", "test"])
def test_force_replaces_shard_sets_only(npz_dir, tmp_path, split):
    u = tmp_path / "U"
    assert shard(npz_dir, u).exit_code == 0
    (u / split / "notes.txt").write_text("mine\n")     # a shard set no longer
    before = tree(u)
    one_line_error(shard(npz_dir, u, "--force"), str(u / split), "not a set of shards")
    assert tree(u) == before and hidden(u) == []


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_file_or_link_at_a_split_is_refused(npz_dir, tmp_path, what):
    u = tmp_path / "U"
    u.mkdir()
    (u / "mine.txt").write_text("mine\n")
    if what == "file":
        (u / "test").write_text("mine\n")
    else:
        (u / "test").symlink_to("mine.txt")
    one_line_error(shard(npz_dir, u, "--force"), str(u / "test"))
    assert (u / "mine.txt").read_text() == "mine\n"
    assert sorted(p.name for p in u.iterdir()) == ["mine.txt", "test"]


def test_force_keeps_the_previous_shards(npz_dir, tmp_path):
    u = tmp_path / "U"
    (u / "valid").mkdir(parents=True)                    # an empty directory is fine
    assert shard(npz_dir, u).exit_code == 0
    old = {s: S.open_split(u / s).content_digest() for s in T.SPLITS}
    old_rows = {s: len(S.open_split(u / s)) for s in T.SPLITS}
    one_line_error(shard(npz_dir, u), "--force")
    r = invoke("data", "shard", npz_dir, "--rows-per-shard", 2 * ROWS, "--out", u, "--force")
    assert r.exit_code == 0, r.output
    assert "previous" in r.output
    kept = sorted((u / "previous").iterdir())
    assert [p.name.split("-")[0] for p in kept] == sorted(T.SPLITS)
    for p in kept:                                       # the old shards, whole and valid
        s = p.name.split("-")[0]
        sp = S.open_split(p)
        assert sp.content_digest() == old[s] and len(sp) == old_rows[s]
        assert len(S.open_split(u / s)) == old_rows[s]
        assert S.open_split(u / s).content_digest() != old[s]     # other shard sizes
    assert hidden(u) == []
    assert S.is_sharded(u) and not S.is_sharded(u / "previous")


def test_trace_into_shards_never_deletes_a_user_directory(tmp_path):
    from tests.test_cli_trace import TINY_OPTIONS
    u = tmp_path / "U"
    (u / "valid").mkdir(parents=True)
    (u / "valid" / "IMPORTANT.txt").write_text("mine\n")
    r = invoke("data", "trace", "--out", u, *TINY_OPTIONS, "--rows-per-shard", ROWS,
               "--force")
    one_line_error(r, str(u / "valid"), "not a set of shards")
    assert tree(u) == {"valid/IMPORTANT.txt": b"mine\n"} and hidden(u) == []


def test_trace_into_shards_owns_its_output_directory(tmp_path):
    """A recording straight into shards holds --out as an .npz recording does: a second
    one meanwhile is refused in one line and writes nothing."""
    from evolve.io.lock import DirLock
    from tests.test_cli_trace import TINY_OPTIONS
    u = tmp_path / "U"
    u.mkdir()
    with DirLock(u):                            # another recording holds the directory
        r = invoke("data", "trace", "--out", u, *TINY_OPTIONS, "--rows-per-shard", ROWS)
        one_line_error(r, "--out", str(u), "another process")
    assert list(u.iterdir()) == []
    r = invoke("data", "trace", "--out", u, *TINY_OPTIONS, "--rows-per-shard", ROWS)
    assert r.exit_code == 0 and S.is_sharded(u), r.output


def test_writer_itself_refuses_to_replace_a_foreign_directory(tmp_path):
    """The check at commit holds even when a directory appears after the command's
    check (or the writer is used directly)."""
    ts = tracekit.split("test")
    out = tmp_path / "train"
    w = W.SplitWriter(out, ts.meta, ROWS)
    w.add({f: ts.columns[f][:ROWS // 4 * 4] for f in T.ALL_FIELDS})
    out.mkdir()
    (out / "IMPORTANT.txt").write_text("mine\n")
    with pytest.raises(DataError, match="not a set of shards"):
        w.commit()
    w.abort()
    assert (out / "IMPORTANT.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]


@pytest.mark.parametrize("where", ["column", "sync"])
def test_a_full_disk_while_sharding_names_the_file_and_leaves_nothing(npz_dir, tmp_path,
                                                                     monkeypatch, where):
    """A column write that fails (ENOSPC, which names no file by itself), or the sync
    of the whole split before it is renamed into place: one line naming the file, and
    neither a split nor a temporary directory is left."""
    if where == "column":
        real, calls = np.lib.format.write_array, itertools.count()

        def write_array(fh, a, *args, **kwargs):
            if next(calls) >= 40:                   # a shard or so written, then full
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fh, a, *args, **kwargs)
        monkeypatch.setattr(np.lib.format, "write_array", write_array)
    else:
        def sync_filesystem(path):
            raise OSError(errno.EIO, "Input/output error", str(path))
        monkeypatch.setattr(W, "sync_filesystem", sync_filesystem)
    u = tmp_path / "U"
    line = one_line_error(invoke("data", "shard", npz_dir, "--rows-per-shard", ROWS,
                                 "--out", u), str(u))
    assert ("No space left on device" in line and ".npy" in line if where == "column"
            else "Input/output error" in line), line
    assert not u.exists() or list(u.iterdir()) == []


# ----------------------------------------------------- leftovers of a kill -9

KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from evolve.data import shard_writer as W
    from tests import tracekit
    ts = tracekit.split("test")
    w = W.SplitWriter(sys.argv[1], ts.meta, 64)
    w.add({f: a[:128] for f, a in ts.columns.items()})      # two shards on disk
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow
def test_leftovers_of_a_killed_writer_are_removed_on_the_next_write(npz_dir, tmp_path):
    u = tmp_path / "U"
    u.mkdir()
    r = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(u / "train")], cwd=REPO,
                       capture_output=True, timeout=120)
    assert r.returncode == -9, r.stderr
    assert len(hidden(u)) == 1                     # the killed writer's temporary directory
    (u / ".train.mine").mkdir()                    # not this tool's naming: kept
    assert shard(npz_dir, u).exit_code == 0
    assert hidden(u) == [".train.mine"]


def test_live_writer_temp_directory_is_left_alone(tmp_path):
    ts = tracekit.split("test")
    a = W.SplitWriter(tmp_path / "train", ts.meta, 64)
    a.add({f: x[:128] for f, x in ts.columns.items()})
    b = W.SplitWriter(tmp_path / "train", ts.meta, 64)          # cleans leftovers
    assert a.tmp.is_dir()
    b.add({f: x[:64] for f, x in ts.columns.items()})
    b.commit()
    a.commit()                                                  # keeps b's aside
    assert len(S.open_split(tmp_path / "train")) == 128
    assert len(S.open_split(next((tmp_path / "previous").iterdir()))) == 64
    assert hidden(tmp_path) == []


def test_stale_locked_name_is_removed_only_when_unlocked(tmp_path):
    ts = tracekit.split("test")
    a = W.SplitWriter(tmp_path / "train", ts.meta, 64)
    a._release()                                   # as if its process had died
    held = W.SplitWriter(tmp_path / "train", ts.meta, 64)
    fd = os.open(held.tmp / W.LOCK, os.O_RDWR)
    held._release()
    fcntl.flock(fd, fcntl.LOCK_EX)                 # another live process holds it
    try:
        W.SplitWriter(tmp_path / "train", ts.meta, 64).abort()
        assert not a.tmp.exists() and held.tmp.is_dir()
    finally:
        os.close(fd)


# ------------------------------------------------------------ damaged columns

def _copy(sharded, tmp_path, name="set"):
    d = tmp_path / name
    shutil.copytree(sharded, d, symlinks=True)
    return d


def _header(path: Path, descr: str, shape: tuple, payload: bytes = b"") -> None:
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": descr, "fortran_order": False, "shape": shape})
        fh.write(payload)


def _damage(kind: str, path: Path) -> None:
    a = np.load(path)
    if kind == "garbage":
        path.write_bytes(os.urandom(64))
    elif kind == "text":
        path.write_text("p_max\n0.5\n0.25\n")
    elif kind == "etc_passwd":
        path.unlink()
        path.symlink_to("/etc/passwd")
    elif kind == "symlink":                         # a link to a valid column
        other = path.parent / "valid-copy.npy"
        shutil.copyfile(path, other)
        path.unlink()
        path.symlink_to(other.name)
    elif kind == "object":
        np.save(path, np.array([1.0] * len(a), dtype=object), allow_pickle=True)
    elif kind == "more_rows":
        _header(path, a.dtype.str, (len(a) + 4,), a.tobytes())
    elif kind == "huge":
        _header(path, a.dtype.str, (10 ** 30,), a.tobytes())
    elif kind == "huge_2d":
        _header(path, a.dtype.str, (2 ** 62, 2 ** 62), a.tobytes())
    elif kind == "negative":
        _header(path, a.dtype.str, (-len(a),), a.tobytes())
    elif kind == "fortran":
        np.save(path, np.asfortranarray(np.stack([a, a], axis=1)))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    else:
        raise AssertionError(kind)


COLUMN_DAMAGE = ["garbage", "text", "etc_passwd", "symlink", "object", "more_rows", "huge",
                 "huge_2d", "negative", "fortran", "empty", "fifo", "directory"]


@pytest.mark.parametrize("kind", COLUMN_DAMAGE)
def test_damaged_column_is_one_line(sharded, tmp_path, kind):
    d = _copy(sharded, tmp_path)
    path = d / "train" / "shard-00001" / "p_max.npy"
    _damage(kind, path)
    line = one_line_error(invoke("data", "shard", d, "--verify"),
                          "shard-00001/p_max.npy", "'p_max'")
    assert "Aborted" not in line
    one_line_error(invoke("run", "--objective", "speed", "--generations", 1,
                          "--population", 8, "--data", d, "--runs-dir", tmp_path / "runs"),
                   "shard-00001/p_max.npy", "'p_max'")
    assert not (tmp_path / "runs").exists()


def test_damaged_column_on_map_is_one_line(sharded, tmp_path):
    """``map_shard`` (what cluster workers call) reads the same guarded way."""
    d = _copy(sharded, tmp_path)
    sp = S.open_split(d / "train")
    _damage("huge", d / "train" / "shard-00000" / "q_max.npy")
    with pytest.raises(DataError, match="shard-00000/q_max.npy: field 'q_max'"):
        sp.shard(0)


def test_symlinked_shard_directory_is_refused(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    real = tmp_path / "elsewhere"
    shutil.move(d / "train" / "shard-00001", real)
    (d / "train" / "shard-00001").symlink_to(real)
    one_line_error(invoke("data", "shard", d, "--verify"), "shard-00001", "symbolic link")


# ----------------------------------------------------------- hostile manifests

def _manifest(d, split="train"):
    p = d / split / S.MANIFEST
    return p, json.loads(p.read_text())


def _set(m: dict, where: str, value):
    *keys, last = where.split(".")
    node = m
    for k in keys:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


MANIFEST_LIES = [
    ("format_version", True, "'format_version'"),
    ("schema_version", 2.0, "'schema_version'"),
    ("rows", True, "'rows'"),
    ("rows", "996", "'rows'"),
    ("meta", [], "'meta'"),
    ("meta.block_size", "4", "block_size"),
    ("meta.block_size", 0, "block_size"),
    ("meta.top_k", -1, "top_k"),
    ("meta.vocab_size", "big", "vocab_size"),
    ("shards.0", "shard-00000", "shard 0"),
    ("shards.0.dir", "../train/shard-00000", "'dir'"),
    ("shards.0.dir", "shard-00000/", "'dir'"),
    ("shards.1.dir", "shard-00000", "twice"),
    ("shards.0.rows", 4.0, "'rows'"),
    ("shards.0.rows", -4, "'rows'"),
    ("shards.0.columns.p_max.sha256", 7, "sha256"),
    ("shards.0.columns.p_max.shape", [True], "shape"),
    ("shards.0.columns.p_max.shape", "oops", "shape"),
    ("shards.0.columns.p_max.dtype", ["<f8"], "dtype"),
    ("shards.0.columns.extra", {"dtype": "<f8", "shape": [4], "sha256": "0" * 64},
     "'extra'"),
]


@pytest.mark.parametrize("where,value,needle", MANIFEST_LIES,
                         ids=[f"{w}={v!r}"[:40] for w, v, _ in MANIFEST_LIES])
def test_manifest_fields_are_type_checked(sharded, tmp_path, where, value, needle):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    _set(m, where, value)
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"), "train/manifest.json", needle)


def test_manifest_nested_too_deeply(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    text = json.dumps(m)
    p.write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line_error(invoke("data", "shard", d, "--verify"), "manifest.json", "nested too deeply")


def test_manifest_nan_is_refused(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    m["meta"]["temperature"] = float("nan")
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"), "manifest.json", "NaN")


def test_manifest_size_is_capped(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, _ = _manifest(d)
    with open(p, "r+b") as fh:                       # sparse: nothing is really written
        fh.truncate(300 << 20)
    one_line_error(invoke("data", "shard", d, "--verify"), "manifest.json", "larger than")


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_manifest_must_be_a_regular_file(sharded, tmp_path, kind):
    d = _copy(sharded, tmp_path)
    p, _ = _manifest(d)
    if kind == "symlink":
        shutil.move(p, tmp_path / "m.json")
        p.symlink_to(tmp_path / "m.json")
        needle = "symbolic link"
    else:
        p.unlink()
        os.mkfifo(p)
        needle = "not a regular file"
    one_line_error(invoke("data", "shard", d, "--verify"), "manifest.json", needle)


# -------------------------------------------------------------------- messages

def test_newline_in_a_shard_name_stays_on_one_line(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    m["shards"][1]["dir"] = "shard-00001\nINJECTED"
    p.write_text(json.dumps(m))
    line = one_line_error(invoke("data", "shard", d, "--verify"), "manifest.json")
    assert "INJECTED" in line


def test_newline_in_the_directory_name_stays_on_one_line(sharded, tmp_path):
    d = _copy(sharded, tmp_path, "set\nINJECTED")
    _damage("garbage", d / "train" / "shard-00001" / "p_max.npy")
    line = one_line_error(invoke("data", "shard", d, "--verify"), "'p_max'")
    assert "INJECTED" in line and "shard-00001" in line


def test_zero_row_shard_is_named(sharded, tmp_path):
    """The writer never writes an empty shard: one in a manifest is named as such."""
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    sdir = d / "train" / "shard-00001"
    e = m["shards"][1]
    for f in T.ALL_FIELDS:
        a = np.load(sdir / f"{f}.npy")[:0]
        np.save(sdir / f"{f}.npy", a)
        e["columns"][f] = {"dtype": a.dtype.str, "shape": list(a.shape),
                           "sha256": S.digest(sdir / f"{f}.npy")}
    m["rows"] -= e["rows"]
    e["rows"] = 0
    p.write_text(json.dumps(m))
    line = one_line_error(invoke("data", "shard", d, "--verify"), "shard-00001", "0 rows")
    assert "split is empty" not in line
