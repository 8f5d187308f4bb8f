"""``evolve.trace``: record speculative-decoding traces (what ``evolve data trace``
does): the n-gram pair built here, or any Hugging Face draft/target pair.

    import evolve
    t = evolve.trace("datasets/traces")                        # the n-gram pair, ~3 s
    t = evolve.trace("datasets/my-traces", backend="hf", target="gpt2-medium",
                     draft="distilgpt2", prompts_file="prompts.jsonl")
    t.rows                       # rows (drafted positions) per split

Every option of ``evolve data trace`` is a keyword, named as the recording
configuration names it (``block_size``, ``top_k``, ``temperature``, ...,
``prompts_file``, ``corpus_dir``); options not given take the source's
configuration defaults (``evolve.data.sources.ngram.TraceConfig``,
``evolve.data.sources.hf.HFTraceConfig``). The recording owns ``out`` while it runs
(a second one into the same directory is refused); a split file of another
configuration is refused unless ``force`` (then kept in ``out/previous/``); every
split is checked before any is written. Errors are one line naming the parameter.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from evolve.data import shard_writer, shards, traces
from evolve.data.sources import hf, ngram
from evolve.data.sources.registry import SOURCES
from evolve.data.tokens import DataError
from evolve.errors import EvolveError, show
from evolve.io import atomic, paths
from evolve.io.lock import Busy, DirLock

SPLIT_NAMES = ("train", "valid", "test")
# Every option a recording takes, by its configuration field's name.
OPTIONS = tuple(dict.fromkeys([f.name for f in fields(ngram.TraceConfig)]
                              + [f.name for f in fields(hf.HFTraceConfig)]))


class RecordError(EvolveError):
    """A recording asked with an argument it cannot use (one line, naming it)."""


@dataclass(frozen=True)
class TraceResult:
    """A recording: ``out`` (the directory), ``rows`` per split (drafted positions),
    ``files`` written (unchanged ones are not rewritten), ``config`` (the recording
    configuration every split's meta.json holds) and ``seconds``."""
    out: Path
    rows: dict
    files: list
    config: dict
    seconds: float


def _configure(backend: str, options: dict):
    if backend not in SOURCES:
        raise RecordError.of("backend", f"{show(backend)} is invalid; expected one of "
                                        f"{', '.join(SOURCES)}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise RecordError.of(unknown[0], f"not an option of a recording (options: "
                                         f"{', '.join(OPTIONS)})")
    options = {k: (str(v) if k in ("prompts_file", "corpus_dir") and v is not None else v)
               for k, v in options.items()}
    for param, least, why in (("max_files", 4, " (the models and three prompt pools need "
                                               "files)"), ("max_bytes_per_file", 1, "")):
        value = options.get(param)
        if value is not None and not (isinstance(value, int) and value >= least):
            raise RecordError.of(param, f"{show(value)} is invalid; expected at least "
                                        f"{least}{why}")
    try:
        return SOURCES[backend].config(options)
    except ngram.TraceConfigError as e:
        raise RecordError.of(e.field, e.detail) from None


def trace(out=None, backend: str = "ngram", force: bool = False,
          rows_per_shard: int | None = None, progress=None, meter=None,
          **options) -> TraceResult:
    """Record train/valid/test traces into ``out`` (default ``datasets/traces``).
    ``backend``: ngram (the pair built here) or hf (``target`` and ``draft``: directories
    or hub ids); ``rows_per_shard``: write memory-mapped shards of that many rows
    instead of .npz files (ngram). ``progress``: a callable given a line per step
    (``print``); ``meter``: the command line's bar for a Hugging Face pair's decoding."""
    cfg = _configure(backend, options)
    source = SOURCES[backend]
    if rows_per_shard is not None:
        if not source.shardable:
            raise RecordError.of("rows_per_shard", "only with backend " + " or ".join(
                s.name for s in SOURCES.values() if s.shardable)
                + f" (shard {backend} traces with `evolve data shard`)")
        if not (isinstance(rows_per_shard, int) and rows_per_shard >= 1):
            raise RecordError.of("rows_per_shard", f"{show(rows_per_shard)} is invalid; "
                                                   "expected a whole number >= 1")
    out = Path(out) if out is not None else paths.TRACES_DIR
    if os.path.lexists(out) and not out.is_dir():
        raise RecordError.of("out", f"{out}: exists and is not a directory")
    say = progress or (lambda text: None)
    # The recording owns out (an OS lock, dropped however the process ends): a second
    # recording into the same directory is refused instead of interleaving its writes.
    created = [p for p in (out, *out.parents) if not os.path.lexists(p)]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with DirLock(out):
            if rows_per_shard is not None:      # straight into shards
                rows, files = _shards(cfg, out, rows_per_shard, force, say)
            else:
                rows, files = _record(cfg, source, out, force, say, meter)
    except BaseException as e:
        if isinstance(e, Busy):       # out is another recording's now, even if this
            raise RecordError.of("out", f"{out}: another process is recording traces into "
                                        "this directory; wait for it to finish") from None
        for p in created:             # a refused build leaves no directory it made
            with contextlib.suppress(OSError):
                p.rmdir()             # (only while empty)
        raise
    seconds = time.perf_counter() - t0
    say(f"done in {seconds:.1f} s")
    return TraceResult(out, rows, files, cfg.to_dict(), round(seconds, 3))


def _shards(cfg, out: Path, rows_per_shard: int, force: bool, say) -> tuple:
    replaced = shard_writer.check_out(out, force)      # refused before anything is written
    t0 = time.perf_counter()
    done = ngram.build_splits_sharded(cfg, out, rows_per_shard, progress=say)
    say(f"{shards.shown(out)}: {sum(done.values()):,} rows in shards of "
        f"{rows_per_shard:,}; done in {time.perf_counter() - t0:.1f} s")
    if replaced:
        say(f"{', '.join(replaced)}: the previous shards are kept in "
            f"{shards.shown(Path(out) / shard_writer.PREVIOUS)}")
    return dict(done), [str(out / name) for name in done]


def _record(cfg, source, out: Path, force: bool, say, meter) -> tuple:
    """Build and write the splits, with ``out`` locked: a file of another configuration is
    refused before the build (the build would differ), every built file is checked
    before any is written, and with ``force`` each replaced file is kept in previous/."""
    if not force:
        for name in SPLIT_NAMES:
            path = out / f"{name}.npz"
            if os.path.lexists(path) and _recorded_config(path) != cfg.to_dict():
                raise DataError(f"{path}: exists and differs; pass force (--force) to "
                                "overwrite")
    if not source.loads_models:     # one that loads models says so once they are loaded
        say(f"building traces (seed {cfg.seed}, g = {cfg.block_size}, k = {cfg.top_k}, "
            f"temperature {cfg.temperature:g}) ...")
    try:
        built = source.build(cfg, progress=say, meter=meter)
    except ngram.TraceConfigError as e:
        raise RecordError.of(e.field, e.detail) from None
    except (hf.HFTraceError, DataError):     # a pair that cannot be used: the line says why
        raise
    except ValueError as e:      # the pair or corpus cannot support this configuration
        raise RecordError(f"trace build: {e}") from None
    # Check every file before writing any, so a refusal leaves the directory as it was.
    todo = []
    for name, ts in built.items():
        path = out / f"{name}.npz"
        if os.path.lexists(path):
            try:
                old = traces.load(path, name=name)
                same = (old.meta.get("config") == cfg.to_dict()
                        and all(np.array_equal(old.columns[f], ts.columns[f])
                                for f in traces.ALL_FIELDS))
            except DataError:
                same = False
            if same:
                say(f"{path}: unchanged ({len(ts):,} rows)")
                continue
            if not force:
                raise DataError(f"{path}: exists and differs; pass force (--force) to "
                                "overwrite")
        todo.append((path, ts))
    for path, ts in todo:
        if os.path.lexists(path):
            kept = atomic.keep_previous(path, "trace file", DataError)
            say(f"{path}: the previous file is kept as {kept}")
        traces.save(ts, path)
        say(f"{path}: {len(ts):,} rows, {path.stat().st_size / 1e6:.1f} MB")
    return {name: len(ts) for name, ts in built.items()}, [str(p) for p, _ in todo]


def _recorded_config(path: Path):
    """The generation config in a trace file's meta.json (None if unreadable)."""
    try:
        meta = traces.read_file_meta(path)
    except DataError:
        return None
    return meta.get("config") if isinstance(meta, dict) else None
