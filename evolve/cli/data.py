"""``evolve data``: generate, import, export and describe token splits (``data
trace``, which records speculative-decoding traces, is in ``evolve.cli.trace_data``)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from evolve.cli.common import (OneLineGroup, data_option, default_data, friendly_errors,
                               json_option, need, term)

MAX_SEQUENCES = 10_000_000


@click.group("data", cls=OneLineGroup)
def data_group():
    """Generate, import, export and describe dataset splits."""


@data_group.command("generate")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory (default: datasets/).")
@click.option("--seed", type=int, default=42, show_default=True,
              help="Train seed; valid and test use seed+81 and seed+414 (42 -> 42/123/456).")
@click.option("--sequences", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Train sequences; valid and test get 30% of it each.")
@click.option("--force", is_flag=True, help="Overwrite existing splits that differ.")
@friendly_errors
def data_generate(out, seed, sequences, force):
    """Write train/valid/test with the seed-compatible generator."""
    import numpy as np    # lazy: start-up (a command loads only what it runs)

    from evolve.data import tokens as data    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources import synthetic as synth
    from evolve.io import atomic    # lazy: start-up (a command loads only what it runs)
    need(seed >= 0, "--seed", seed, "an integer >= 0")
    need(sequences <= MAX_SEQUENCES, "--sequences", sequences, f"at most {MAX_SEQUENCES:,}")
    out = out or default_data()
    tm = term()
    seeds = {"train": seed, "valid": seed + 81, "test": seed + 414}
    small = max(1, round(sequences * 0.3))
    splits = synth.generate_splits(seeds, {"train": sequences, "valid": small, "test": small})
    for name, ds in splits.items():
        path = data.split_path(out, name)
        if os.path.lexists(path):
            try:
                same = data.load_npz(path).columns()
                if all(np.array_equal(same[f], v) for f, v in ds.columns().items()):
                    tm.note(f"{path}: unchanged ({len(ds):,} tokens)")
                    continue
            except (data.DataError, ValueError):
                pass
            if not force:
                raise data.DataError(f"{path}: exists and differs; pass --force to overwrite")
            tm.note(f"{path}: the previous file is kept as "
                    f"{atomic.keep_previous(path, 'split file', data.DataError)}")
        data.save_npz(ds, path)
        tm.note(f"{path}: {len(ds):,} tokens (seed {seeds[name]})")


@data_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--split", "split", required=True, help="Split name to store it as.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@friendly_errors
def data_import(file, split, out):
    """Import a split in the original JSON array form."""
    from evolve.data import tokens as data    # lazy: start-up (a command loads only what it runs)
    if not split.isidentifier():
        raise data.DataError(f"--split: {split!r} is not a valid split name")
    ds = data.load_json(file, name=split)
    path = data.split_path(out, split)
    data.save_npz(ds, path)
    term().note(f"{path}: {len(ds):,} tokens imported from {file}")


@data_group.command("export")
@data_option
@click.option("--split", "splits", multiple=True, help="Split(s) to export (default: all).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@friendly_errors
def data_export(data_dir, splits, out):
    """Export splits to the original JSON array form (<out>/<split>.json)."""
    from evolve.data import tokens as data    # lazy: start-up (a command loads only what it runs)
    data_dir = data_dir or default_data()
    for split in splits or data.SPLITS:
        ds = data.load_split(data_dir, split)
        path = Path(out) / f"{split}.json"
        data.save_json(ds, path)
        term().note(f"{path}: {len(ds):,} tokens")


@data_group.command("info")
@data_option
@json_option
@friendly_errors
def data_info(data_dir, json_mode):
    """Tokens, standard acceptance, top-match rate and entropy ranges per split."""
    from evolve.data import tokens as data    # lazy: start-up (a command loads only what it runs)
    data_dir = data_dir or default_data()
    info = {s: data.describe(data.load_split(data_dir, s)) for s in data.SPLITS}
    out = term(json_mode)
    if json_mode:
        out.print_json(info)
        return
    rows = [[s, f"{d['tokens']:,}", f"{100 * d['standard_accept_rate']:.2f}",
             f"{100 * d['top_match_rate']:.2f}",
             f"{d['draft_entropy'][0]:.2f}..{d['draft_entropy'][1]:.2f}",
             f"{d['target_entropy'][0]:.2f}..{d['target_entropy'][1]:.2f}",
             str(d["position_max"])] for s, d in info.items()]
    out.table(f"{data_dir}", [("split", "left"), ("tokens", "right"),
                               ("standard accept %", "right"), ("top match %", "right"),
                               ("draft entropy", "right"), ("target entropy", "right"),
                               ("max position", "right")], rows)


# --------------------------------------------------------------- benchmark
