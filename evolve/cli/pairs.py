"""``evolve data pair NAME``: build a named draft/target pair (``evolve.data.sources.pairs``)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from evolve.cli.common import fail, friendly_errors, json_option, term
from evolve.data.sources.pairs import PAIRS


@click.command("pair")
@click.argument("name", type=click.Choice(list(PAIRS)))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder of the pair (default: datasets/pairs/NAME, or "
                   "$EVOLVE_PAIRS_DIR/NAME).")
@click.option("--size", default=None,
              help="Build size of the pair's draft (smollm2: full, or tiny for a quick "
                   "check; default: the first).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draft's build.")
@click.option("--force", is_flag=True, help="Build again what is already there.")
@json_option
@friendly_errors
def data_pair(name, out, size, seed, force, json_mode):
    """Build a named draft/target pair into a folder: target/ and draft/ (for --target and
    --draft of `evolve data trace --backend hf` and `evolve data task`), and what else
    the pair brings. What is already built is kept."""
    pair = PAIRS[name]
    size = size or pair.sizes[0]
    if size not in pair.sizes:
        fail(f"--size: {size!r} is invalid for {name}; expected one of {', '.join(pair.sizes)}")
    if seed < 0:
        fail(f"--seed: {seed} is invalid; expected an integer >= 0")
    out = Path(out) if out else pair.default_dir()
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a directory")
    tm = term(json_mode)
    t0 = time.perf_counter()
    record = pair.build(out, size, seed, progress=tm.note, force=force)
    if json_mode:
        tm.print_json(record)
        return
    tm.note(f"{out}: {name} built ({time.perf_counter() - t0:.1f} s)")
    for what, line in _commands(record):
        tm.note(f"{what}: {line}")


def _commands(record: dict):
    cmds = record.get("commands") or {}
    if "traces" in cmds:
        yield "traces", cmds["traces"]
    for kind, line in (cmds.get("tasks") or {}).items():
        yield f"task {kind}", line
