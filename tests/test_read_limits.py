"""Reading a run or data directory is bounded: no read can hang or exhaust memory.

Guarantee 14 of docs/reliability.md, Reading is bounded:

Files read from a run or data directory must be regular files: a FIFO, a device
(also behind a symlink, e.g. to `/dev/zero`) or a directory is refused before it is
opened (JSON files are also opened non-blocking and checked again once open), so a
read can neither hang nor run without end. Each `.npy` member of a split file is
checked against the shape its header declares before anything is allocated (at most
4 GiB of arrays per split; object arrays refused), then read with exactly that many
bytes as its cap: a small compressed member that inflates beyond its declared shape
is refused after reading at most its declared size. Tests:
`test_npz_member_declaring_a_huge_shape_is_refused_before_allocating`,
`test_npz_member_that_inflates_beyond_its_shape_is_refused` (64 MiB of zeros in a
small file, refused in well under a second),
`test_npz_compressed_bomb_with_a_big_declared_shape_is_refused`,
`test_object_arrays_are_refused`, and a member of a .npy version other than 1.0 and
2.0 is refused naming the file and the field
(`test_a_member_of_another_npy_version_is_refused_naming_file_and_field`). A split file (trace or token) that holds two zip
members of one name, of which a reader would silently take the last, is refused
naming the file and the member
(`test_a_member_held_twice_is_refused_naming_file_and_member`,
`test_a_token_split_member_held_twice_is_refused`). Also:
`test_non_regular_files_are_refused_without_reading[fifo|device|directory]`
(checkpoint, history, a data split and a JSON import), `test_json_read_is_capped`.

Budgets are tiny and every run is made in a temporary directory (tests/runkit.py).
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from evolve.data import tokens as data
from evolve.data import traces
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)
from tests.runkit import copy_run, resume, write_zip

pytestmark = pytest.mark.usefixtures("isolated")


# ------------------------------------------------------------------------------------
# 14. Resource limits while reading
# ------------------------------------------------------------------------------------

def _npy(shape, dtype="<f8", payload: bytes = b"") -> bytes:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload


def test_npz_member_declaring_a_huge_shape_is_refused_before_allocating(tmp_path):
    f = write_zip(tmp_path / "train.npz", {"draft_prob.npy": _npy((10 ** 15,), payload=b"\0" * 8)})
    with pytest.raises(data.DataError, match="declares shape"):
        data.load_npz(f)


def test_npz_member_that_inflates_beyond_its_shape_is_refused(tmp_path):
    f = tmp_path / "train.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("draft_prob.npy", _npy((4,), payload=b"\0" * (64 * 1024 * 1024)))
    assert f.stat().st_size < 1024 * 1024                  # a small file ...
    t0 = time.perf_counter()
    with pytest.raises(data.DataError, match="more data than its shape"):
        data.load_npz(f)                                   # ... not inflated whole
    assert time.perf_counter() - t0 < 5


def test_npz_compressed_bomb_with_a_big_declared_shape_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_SPLIT_BYTES", 1024 * 1024)
    f = tmp_path / "train.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("draft_prob.npy", _npy((1024 * 1024,), payload=b"\0" * (8 * 1024 * 1024)))
    with pytest.raises(data.DataError, match="limit"):
        data.load_npz(f)


def test_object_arrays_are_refused(tmp_path):
    f = write_zip(tmp_path / "train.npz", {"draft_prob.npy": _npy((1,), dtype="|O")})
    with pytest.raises(data.DataError, match="object arrays|not a readable"):
        data.load_npz(f)


def test_a_member_of_another_npy_version_is_refused_naming_file_and_field(tmp_path):
    """A .npy member whose magic says version 3.0 is one DataError naming the split and
    the field (read_npy_header refuses versions other than 1.0 and 2.0)."""
    member = bytearray(_npy((1,), payload=b"\0" * 8))
    member[6] = 3                                       # the magic's major version
    f = write_zip(tmp_path / "train.npz", {"draft_prob.npy": bytes(member)})
    with pytest.raises(data.DataError) as e:
        data.load_npz(f)
    assert "train.npz" in str(e.value) and "'draft_prob'" in str(e.value)
    assert "unsupported .npy version (3, 0)" in str(e.value)


def _with_a_second_copy(src: Path, dst: Path, member: str, change) -> Path:
    """``src`` copied to ``dst`` with one more member named ``member``: ``change`` of
    its bytes (readers that take the last copy would read that one)."""
    import warnings
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(dst) as zf:
        payload = zf.read(member)
    with warnings.catch_warnings(), zipfile.ZipFile(dst, "a") as zf:
        warnings.simplefilter("ignore")                     # "Duplicate name"
        zf.writestr(member, change(payload))
    return dst


@pytest.mark.parametrize("member", ["v3/slot_tv", "draft_prob.npy", "meta.json"])
def test_a_member_held_twice_is_refused_naming_file_and_member(tmp_path, member):
    """A trace file with two zip members of one name was read by run, shard and
    tradeoff, the last copy used silently: one line naming the file and the member."""
    from tests import tracekit
    src = tmp_path / "good"
    for s in traces.SPLITS:
        traces.save(tracekit.split(s), src / f"{s}.npz")
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    flip = (lambda b: b.replace(b'"block_size": 4', b'"block_size": 2')) \
        if member == "meta.json" else (lambda b: b[:-8] + np.float64(0.5).tobytes())
    f = _with_a_second_copy(src / "valid.npz", bad / "valid.npz", member, flip)
    for args in (("run", "--objective", "speed", "--generations", 1, "--population", 10,
                  "--no-writeback", "--runs-dir", tmp_path / "runs", "--data", bad),
                 ("data", "shard", bad, "--rows-per-shard", 64, "--out", tmp_path / "sh"),
                 ("tradeoff", "--data", bad, "--json")):
        one_line_error(invoke(*args), str(f), repr(member), "more than once")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sh").exists()


def test_a_token_split_member_held_twice_is_refused(tmp_path, data_copy):
    f = _with_a_second_copy(data_copy / "valid.npz", tmp_path / "d" / "valid.npz",
                            "draft_prob.npy", lambda b: b[:-8] + np.float64(0.5).tobytes())
    for s in ("train", "test"):
        shutil.copyfile(data_copy / f"{s}.npz", tmp_path / "d" / f"{s}.npz")
    one_line_error(invoke("data", "info", "--data", tmp_path / "d"), str(f),
                   "'draft_prob.npy'", "more than once")
    with pytest.raises(data.DataError, match="more than once"):
        data.load_npz(f)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_non_regular_files_are_refused_without_reading(tmp_path, finished, data_copy, kind):
    def plant(path: Path):
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)                                # opening it would wait forever
        elif kind == "device":
            path.symlink_to("/dev/zero")                   # reading it never ends
        else:
            path.mkdir()
    run = copy_run(finished, tmp_path / "runs")
    for name in ("checkpoint.json", "history.jsonl"):
        plant(run / name)
    line = one_line_error(resume(run))
    assert "not a regular file" in line
    line = one_line_error(invoke("inspect", "r", "--runs-dir", run.parent))
    assert "not a regular file" in line
    ddir = tmp_path / "data"
    shutil.copytree(data_copy, ddir)
    plant(ddir / "valid.npz")
    line = one_line_error(invoke("data", "info", "--data", ddir))
    assert "valid.npz" in line and "not a regular file" in line
    js = tmp_path / "x.json"
    js.write_text("[]")
    plant(js)
    line = one_line_error(invoke("data", "import", js, "--split", "t", "--out", tmp_path / "o"))
    assert "not a regular file" in line


def test_json_read_is_capped(tmp_path):
    from evolve.io import jsonio
    f = tmp_path / "big.json"
    f.write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(jsonio.JsonError, match="larger than 100"):
        jsonio.read_json(f, "file", limit=100)
