"""``evolve data shard``: trace splits as memory-mapped shards (``evolve.data.shards``)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from evolve.cli.common import doing, friendly_errors, need, term


@click.command("shard")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--rows-per-shard", type=int, default=None,
              help="Rows per shard (rounded down to whole blocks); required unless --verify.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where the sharded splits go (default: DIRECTORY/shards).")
@click.option("--force", is_flag=True,
              help="Replace sharded splits already at --out (the previous ones are kept in "
                   "--out/previous/; anything else there is never replaced).")
@click.option("--verify", is_flag=True,
              help="Only validate an existing sharded set at DIRECTORY (manifests, "
                   "checksums, every row).")
@friendly_errors
def data_shard(directory, rows_per_shard, out, force, verify):
    """Split the trace splits (.npz) of DIRECTORY into shards of .npy columns.

    Task traces (`evolve data task`) shard with their critical-token labels.
    `evolve run --data OUT` then reads them memory-mapped, in-process or on a
    cluster (--cluster / --scheduler)."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.data import shard_writer, shards
    from evolve.data.traces import SPLITS    # lazy: start-up (as above)
    tm = term()
    if verify:
        for name, sp in shards.load_splits(directory).items():
            tm.note(f"{name}: {len(sp):,} rows in {len(sp.shards)} shards: valid")
        return
    need(rows_per_shard is not None and rows_per_shard >= 1, "--rows-per-shard", rows_per_shard,
         "a whole number >= 1")
    out = Path(out) if out else Path(directory) / "shards"
    replaced = shard_writer.check_out(out, force)      # refused before anything is written
    t0 = time.perf_counter()
    written = []
    doing(f"nothing was written to {shards.shown(out)}")

    def split_done(name: str, n: int) -> None:
        """A split is in place: what an interrupt from now on leaves."""
        written.append(name)
        rest = [s for s in SPLITS if s not in written]
        old = [s for s in rest if s in replaced]
        doing(f"{', '.join(written)} written to {shards.shown(out)}"
              + (f"; {', '.join(rest)} not written" if rest else "")
              + (f" ({', '.join(old)} still the previous shards)" if old else "")
              + (f"; the shards replaced are kept in "
                 f"{shards.shown(out / shard_writer.PREVIOUS)}"
                 if any(s in replaced for s in written) else ""))
        tm.note(f"{shards.shown(out / name)}: {n} shards")

    shard_writer.shard_dir(directory, out, rows_per_shard, force=force, on_split=split_done)
    kept_note(out, replaced)
    tm.note(f"done in {time.perf_counter() - t0:.1f} s")


def kept_note(out: Path, replaced: list) -> None:
    """Where --force kept the shard sets it replaced."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.data import shard_writer, shards
    if replaced:
        term().note(f"{', '.join(replaced)}: the previous shards are kept in "
                    f"{shards.shown(Path(out) / shard_writer.PREVIOUS)}")
