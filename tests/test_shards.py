"""Sharded trace splits (evolve.data.shards, `evolve data shard`): same rows as the
.npz splits, memory-mapped, and every kind of damage is one line and exit code 2.

Also guarantee 18 of docs/reliability.md, Shard columns and manifests are read like
every other file (test_a_split_of_more_shards_than_file_descriptors_runs_and_reports):
see tests/test_hostile_shards.py.
"""

import json
import os
import resource
import shutil

import numpy as np
import pytest

import evolve
from evolve.data import shard_writer
from evolve.data import shards as S
from evolve.data import traces as T
from evolve.data.sources import ngram as NG
from tests import tracekit
from tests.clikit import invoke, one_line_error

ROWS_PER_SHARD = 250          # rounded down to whole blocks (g = 4): 248 rows


npz_dir = tracekit.npz_dir_fixture()


@pytest.fixture(scope="module")
def sharded(npz_dir):
    r = invoke("data", "shard", npz_dir, "--rows-per-shard", ROWS_PER_SHARD)
    assert r.exit_code == 0, r.output
    return npz_dir / "shards"


def test_shards_hold_the_split_in_whole_blocks(npz_dir, sharded):
    for s in T.SPLITS:
        sp = S.open_split(sharded / s)
        ts = T.load(npz_dir / f"{s}.npz")
        g = ts.block_size
        assert len(sp) == len(ts) and sp.meta["block_size"] == g
        assert len(sp.shards) == -(-len(ts) // (ROWS_PER_SHARD // g * g))
        assert all(e["rows"] % g == 0 for e in sp.shards)
        first = sp.shard(0)
        assert isinstance(first.columns["cand_draft_prob"], np.memmap)
        whole = sp.concat()
        for f in T.ALL_FIELDS:
            assert np.array_equal(whole.columns[f], ts.columns[f]), f
    assert S.is_sharded(sharded) and not S.is_sharded(npz_dir)


def test_trace_build_writes_shards_directly(tmp_path, sharded):
    from tests.test_cli_trace import TINY_OPTIONS
    NG.build_splits_sharded(tracekit.TINY, tmp_path / "a", ROWS_PER_SHARD, chunk_prompts=5)
    r = invoke("data", "trace", "--out", tmp_path / "b", *TINY_OPTIONS,
               "--rows-per-shard", ROWS_PER_SHARD)
    assert r.exit_code == 0, r.output
    for d in ("a", "b"):
        for s in T.SPLITS:
            got = S.open_split(tmp_path / d / s).concat()
            want = S.open_split(sharded / s).concat()
            for f in T.ALL_FIELDS:
                assert np.array_equal(got.columns[f], want.columns[f]), (d, s, f)
    r = invoke("data", "trace", "--out", tmp_path / "b", *TINY_OPTIONS,
               "--rows-per-shard", ROWS_PER_SHARD)
    one_line_error(r, "--force")


def _copy(sharded, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(sharded, d)
    return d


def _manifest(d, split="train"):
    p = d / split / S.MANIFEST
    return p, json.loads(p.read_text())


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors")
def test_a_split_of_more_shards_than_file_descriptors_runs_and_reports(npz_dir, tmp_path):
    """Sixteen shards a split or more: far more column files than the descriptors this
    process may open. A run on them, its final report included, and reading a whole
    split back keep at most one shard's columns open (every column kept mapped used
    to end the run at the report with "Too many open files")."""
    shard_writer.shard_dir(npz_dir, tmp_path / "many", len(tracekit.split("test")) // 16)
    sp = S.open_split(tmp_path / "many" / "train", check=False)
    spare = 64
    assert len(sp.shards) * len(S.shard_fields(sp.meta)) > 4 * spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + spare,
                                                hard))
    try:
        res = evolve.run(objective="speed", data_dir=tmp_path / "many", generations=1,
                         population=10, seed=1, runs_dir=tmp_path / "runs", writeback=False)
        whole = S.open_split(tmp_path / "many" / "test").concat()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert res.status == "finished"
    ts = T.load(npz_dir / "test.npz")
    for f in ts.fields:
        assert np.array_equal(whole.columns[f], ts.columns[f]), f


def test_missing_column(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    (d / "train" / "shard-00001" / "p_max.npy").unlink()
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "shard-00001/p_max.npy", "'p_max' is missing")
    one_line_error(invoke("run", "--objective", "speed", "--generations", 1, "--population", 8,
                          "--data", d, "--runs-dir", tmp_path / "runs"),
                   "shard-00001/p_max.npy", "'p_max' is missing")
    assert not (tmp_path / "runs").exists()


def test_manifest_lies_about_rows(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    m["rows"] += 4
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "manifest.json", "'rows'")
    m["rows"] -= 4
    m["shards"][0]["rows"] += 4
    m["shards"][1]["rows"] -= 4
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "shard-00000", "rows")


def test_checksum_mismatch(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    path = d / "train" / "shard-00002" / "cand_target_prob.npy"
    a = np.load(path)
    a[3, 0] = np.nextafter(a[3, 0], 0)           # one bit: shape and dtype unchanged
    np.save(path, a)
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "shard-00002/cand_target_prob.npy", "checksum")


def test_mismatched_shard_schemas(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    sdir = d / "train" / "shard-00001"
    for f in ("cand_token", "cand_draft_prob", "cand_target_prob"):
        a = np.load(sdir / f"{f}.npy")[:, :-1]
        np.save(sdir / f"{f}.npy", a)
        m["shards"][1]["columns"][f] = {"dtype": a.dtype.str, "shape": list(a.shape),
                                        "sha256": S.digest(sdir / f"{f}.npy")}
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "shard-00001/cand_token.npy", "mismatched shard schemas")


def test_bad_row_names_the_shard_and_row(sharded, tmp_path):
    d = _copy(sharded, tmp_path)
    p, m = _manifest(d)
    sdir = d / "train" / "shard-00001"
    a = np.load(sdir / "q_max.npy")
    a[5] = 2.0
    np.save(sdir / "q_max.npy", a)
    m["shards"][1]["columns"]["q_max"]["sha256"] = S.digest(sdir / "q_max.npy")
    p.write_text(json.dumps(m))
    one_line_error(invoke("data", "shard", d, "--verify"),
                   "shard-00001", "'q_max' row 5")


def test_bad_options_and_inputs(npz_dir, sharded, tmp_path):
    one_line_error(invoke("data", "shard", npz_dir, "--rows-per-shard", 64), "--force")
    one_line_error(invoke("data", "shard", npz_dir, "--rows-per-shard", 0), "--rows-per-shard")
    one_line_error(invoke("data", "shard", tmp_path, "--rows-per-shard", 8), "train.npz")
    assert not (tmp_path / "shards").exists()
