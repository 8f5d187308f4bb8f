"""``evolve data trace``: record speculative-decoding traces (the n-gram pair built
here, or a Hugging Face draft/target pair with ``--backend hf``)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import click

from evolve.cli.common import default_traces, fail, friendly_errors, need, term
from evolve.io import atomic
from evolve.io.lock import Busy, DirLock

# evolve.data.sources.ngram.TraceConfig's defaults, spelled out so that `--help` need not
# import numpy (tests/test_cli_trace.py checks that they are the same).
TRACE_DEFAULTS = {"seed": 0, "block_size": 4, "top_k": 16, "temperature": 1.0,
                  "blocks_per_prompt": 16, "train_prompts": 512, "valid_prompts": 256,
                  "test_prompts": 256, "max_files": None, "max_bytes_per_file": None}
SPLIT_NAMES = ("train", "valid", "test")


# configuration fields whose option has another name
OPTION_OF = {"prompts_file": "--prompts", "corpus_dir": "--corpus"}


def _option_of(field: str) -> str:
    return OPTION_OF.get(field) or "--" + field.replace("_", "-")


# -------------------------------------------------------------- data trace

@click.command("trace")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory (default: datasets/traces/).")
@click.option("--seed", type=int, default=TRACE_DEFAULTS["seed"], show_default=True,
              help="Seed of the file split, the draft's files and every prompt.")
@click.option("--block-size", type=int, default=TRACE_DEFAULTS["block_size"], show_default=True,
              help="Drafted bytes per block (g).")
@click.option("--top-k", type=int, default=TRACE_DEFAULTS["top_k"], show_default=True,
              help="Draft candidates stored per drafted position.")
@click.option("--temperature", type=float, default=TRACE_DEFAULTS["temperature"],
              show_default=True, help="Sampling temperature of both models.")
@click.option("--blocks-per-prompt", type=int, default=TRACE_DEFAULTS["blocks_per_prompt"],
              show_default=True, help="Blocks decoded from each prompt.")
@click.option("--train-prompts", type=int, default=TRACE_DEFAULTS["train_prompts"],
              show_default=True, help="Prompts of the train split.")
@click.option("--valid-prompts", type=int, default=TRACE_DEFAULTS["valid_prompts"],
              show_default=True, help="Prompts of the valid split.")
@click.option("--test-prompts", type=int, default=TRACE_DEFAULTS["test_prompts"],
              show_default=True, help="Prompts of the test split.")
@click.option("--max-files", type=int, default=None,
              help="Use only the first N corpus files (quick builds; default: all).")
@click.option("--max-bytes-per-file", type=int, default=None,
              help="Use only the first N bytes of each corpus file (quick builds).")
@click.option("--force", is_flag=True, help="Overwrite existing splits that differ (each "
                                            "replaced file is kept in OUT/previous/).")
@click.option("--rows-per-shard", type=int, default=None,
              help="Write memory-mapped shards of N rows instead of .npz (large traces).")
@click.option("--backend", type=click.Choice(["ngram", "hf"]), default="ngram",
              show_default=True, help="ngram: the byte-level n-gram pair built here; hf: "
                                      "a Hugging Face draft/target pair (--target, --draft).")
@click.option("--target", default=None, metavar="PATH_OR_ID",
              help="hf: the target model, a directory or hub id (AutoModelForCausalLM).")
@click.option("--draft", default=None, metavar="PATH_OR_ID", help="hf: the draft model.")
@click.option("--device", default="cpu", show_default=True, help="hf: cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True,
              help="hf: float32, float16, bfloat16 or auto (bfloat16 on cuda).")
@click.option("--batch-size", type=int, default=16, show_default=True,
              help="hf: prompts decoded together.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help="hf: JSON lines with a 'text' field (and an optional 'split').")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path), default=None,
              help="hf: draw prompts from the files under DIR (default: the n-gram corpus).")
@click.option("--prompt-len", type=int, default=64, show_default=True,
              help="hf: tokens per prompt drawn from a corpus.")
@click.option("--context-len", type=int, default=0, show_default=True,
              help="hf: tokens of context stored per drafted position (0: none).")
@friendly_errors
def data_trace(out, seed, block_size, top_k, temperature, blocks_per_prompt, train_prompts,
               valid_prompts, test_prompts, max_files, max_bytes_per_file, force,
               rows_per_shard, backend, target, draft, device, dtype, batch_size, prompts_file,
               corpus_dir, prompt_len, context_len):
    """Build train/valid/test speculative-decoding traces (see datasets/TRACES.md)."""
    from evolve.data.sources import ngram    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import SOURCES
    out = Path(out) if out else default_traces()
    tm = term()
    need(max_files is None or max_files >= 4, "--max-files", max_files,
          "at least 4 (the models and three prompt pools need files)")
    need(max_bytes_per_file is None or max_bytes_per_file >= 1, "--max-bytes-per-file",
          max_bytes_per_file, "at least 1")
    source = SOURCES[backend]
    options = {"seed": seed, "block_size": block_size, "top_k": top_k,
               "temperature": temperature, "blocks_per_prompt": blocks_per_prompt,
               "train_prompts": train_prompts, "valid_prompts": valid_prompts,
               "test_prompts": test_prompts, "max_files": max_files,
               "max_bytes_per_file": max_bytes_per_file, "target": target, "draft": draft,
               "prompt_len": prompt_len, "context_len": context_len, "device": device,
               "dtype": dtype, "batch_size": batch_size,
               "prompts_file": None if prompts_file is None else str(prompts_file),
               "corpus_dir": None if corpus_dir is None else str(corpus_dir)}
    try:
        cfg = source.config(options)
    except ngram.TraceConfigError as e:
        fail(f"{_option_of(e.field)}: {e.detail}")
    if rows_per_shard is not None and not source.shardable:
        fail(f"--rows-per-shard: only with --backend "
             + " or ".join(s.name for s in SOURCES.values() if s.shardable)
             + f" (shard {backend} traces with `evolve data shard`)")
    if os.path.lexists(out) and not out.is_dir():
        fail(f"--out {out}: exists and is not a directory")
    # The recording owns --out (an OS lock, dropped however the process ends): a second
    # recording into the same directory is refused instead of interleaving its writes.
    created = [p for p in (out, *out.parents) if not os.path.lexists(p)]
    out.mkdir(parents=True, exist_ok=True)
    try:
        with DirLock(out):
            if rows_per_shard is not None:      # straight into shards
                # lazy: start-up (a command loads only what it runs)
                from evolve.cli.shards import trace_to_shards
                trace_to_shards(cfg, out, rows_per_shard, force)
            else:
                _record(cfg, source, out, force, tm, seed, block_size, top_k, temperature)
    except BaseException as e:
        if isinstance(e, Busy):       # --out is another recording's now, even if this
            fail(f"--out {out}: another process is recording traces into this directory; "
                 "wait for it to finish")       # process made it: it is left alone
        for p in created:             # a refused build leaves no directory it made
            with contextlib.suppress(OSError):
                p.rmdir()             # (only while empty)
        raise


def _record(cfg, source, out, force, tm, seed, block_size, top_k, temperature):
    """Build and write the splits, with ``out`` locked: a file of another configuration is
    refused before the build (the build would differ), every built file is checked
    before any is written, and with --force each replaced file is kept in previous/."""
    import numpy as np    # lazy: start-up (a command loads only what it runs)

    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources import hf, ngram    # lazy: start-up (a command loads only what it runs)
    from evolve.data.tokens import DataError    # lazy: start-up (a command loads only what it runs)
    if not force:
        for name in SPLIT_NAMES:
            path = out / f"{name}.npz"
            if os.path.lexists(path) and _recorded_config(path) != cfg.to_dict():
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
    t0 = time.perf_counter()
    if not source.loads_models:     # one that loads models says so once they are loaded
        tm.note(f"building traces (seed {seed}, g = {block_size}, k = {top_k}, "
                f"temperature {temperature:g}) ...")
    try:
        built = source.build(cfg, progress=tm.note, meter=tm.meter)
    except ngram.TraceConfigError as e:
        fail(f"{_option_of(e.field)}: {e.detail}")
    except hf.HFTraceError as e:     # a pair that cannot be used: the line says why
        fail(str(e))
    except DataError:
        raise
    except ValueError as e:      # the pair or corpus cannot support this configuration
        fail(f"trace build: {e}")
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
                tm.note(f"{path}: unchanged ({len(ts):,} rows)")
                continue
            if not force:
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
        todo.append((path, ts))
    for path, ts in todo:
        if os.path.lexists(path):
            kept = atomic.keep_previous(path, "trace file", DataError)
            tm.note(f"{path}: the previous file is kept as {kept}")
        traces.save(ts, path)
        tm.note(f"{path}: {len(ts):,} rows, {path.stat().st_size / 1e6:.1f} MB")
    tm.note(f"done in {time.perf_counter() - t0:.1f} s")


def _recorded_config(path: Path):
    """The generation config in a trace file's meta.json (None if unreadable)."""
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    from evolve.data.tokens import DataError    # lazy: start-up (a command loads only what it runs)
    try:
        meta = traces.read_file_meta(path)
    except DataError:
        return None
    return meta.get("config") if isinstance(meta, dict) else None
