"""``evolve data trace``: record speculative-decoding traces (the n-gram pair built
here, or a Hugging Face draft/target pair with ``--backend hf``)."""

from __future__ import annotations

from pathlib import Path

import click

from evolve.cli.common import friendly_errors, term

# evolve.data.sources.ngram.TraceConfig's defaults, spelled out so that `--help` need not
# import numpy (tests/test_cli_trace.py checks that they are the same).
TRACE_DEFAULTS = {"seed": 0, "block_size": 4, "top_k": 16, "temperature": 1.0,
                  "blocks_per_prompt": 16, "train_prompts": 512, "valid_prompts": 256,
                  "test_prompts": 256, "max_files": None, "max_bytes_per_file": None}


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
    """Build train/valid/test speculative-decoding traces.

    A draft/target pair decodes prompts in blocks of --block-size drafted tokens; every
    drafted position is recorded with the draft's --top-k candidates and both models'
    probabilities, from which the trace objectives (evolve run --objective speed,
    evolve tradeoff) are exact. The default pair is a byte-level n-gram pair trained
    here on the Python standard library's source (about 3 s); --backend hf records
    your own Hugging Face pair. Then: evolve run --objective speed --data OUT."""
    from evolve.api import record    # lazy: start-up (a command loads only what it runs)
    tm = term()
    options = {"seed": seed, "block_size": block_size, "top_k": top_k,
               "temperature": temperature, "blocks_per_prompt": blocks_per_prompt,
               "train_prompts": train_prompts, "valid_prompts": valid_prompts,
               "test_prompts": test_prompts, "max_files": max_files,
               "max_bytes_per_file": max_bytes_per_file, "target": target, "draft": draft,
               "prompt_len": prompt_len, "context_len": context_len, "device": device,
               "dtype": dtype, "batch_size": batch_size, "prompts_file": prompts_file,
               "corpus_dir": corpus_dir}
    record.trace(out, backend, force, rows_per_shard, progress=tm.note, meter=tm.meter,
                 **options)
