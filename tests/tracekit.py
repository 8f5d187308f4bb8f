"""Tiny trace builds shared by the trace/spec/simulation tests (cached per process)."""

from __future__ import annotations

import functools

from evolve.data.sources import ngram as T
from evolve.data import traces
from evolve.data.traces import TraceSplit

# A corpus slice and few prompts: builds in well under a second.
TINY = T.TraceConfig(seed=3, max_files=60, max_bytes_per_file=40_000, train_prompts=24,
                     valid_prompts=64, test_prompts=16, blocks_per_prompt=8)


@functools.lru_cache(maxsize=None)
def pair(config: T.TraceConfig = TINY) -> T.LMPair:
    return T.build_pair(config)


@functools.lru_cache(maxsize=None)
def split(name: str, config: T.TraceConfig = TINY) -> TraceSplit:
    return T.build_split(pair(config), name)


def npz_dir_fixture():
    """A module-scoped ``npz_dir`` fixture: the tiny train/valid/test traces as .npz."""
    import pytest
    from evolve.data import traces

    def npz_dir(tmp_path_factory):
        d = tmp_path_factory.mktemp("traces")
        for s in traces.SPLITS:
            traces.save(split(s), d / f"{s}.npz")
        return d
    return pytest.fixture(scope="module", name="npz_dir")(npz_dir)


def tiny_dir_fixture():
    """A module-scoped ``tiny_dir`` fixture: the tiny traces built into a directory."""
    import pytest

    def tiny_dir(tmp_path_factory):
        d = tmp_path_factory.mktemp("tiny_traces")
        T.build_splits(TINY, d)
        return d
    return pytest.fixture(scope="module", name="tiny_dir")(tiny_dir)


def saved_with(tmp_path, field, fn):
    """The test split with ``field`` replaced by ``fn(field)``, written with
    ``traces.save`` (which checks only what it must to write) to tmp_path/bad.npz."""
    ts = split("test")
    cols = {f: v.copy() for f, v in ts.columns.items()}
    cols[field] = fn(cols[field])
    path = tmp_path / "bad.npz"
    traces.save(TraceSplit(cols, dict(ts.meta), "bad"), path)
    return path
