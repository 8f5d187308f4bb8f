"""``evolve export``: a champion as a standalone numpy, torch, transformers or vLLM module,
or as a patch against vLLM's rejection sampler."""

from __future__ import annotations

import click

from evolve.cli.common import friendly_errors, runs_dir_option, term
from evolve.export import formats


@click.command("export")
@click.argument("run", required=False)
@click.option("--installed", "installed", is_flag=False, flag_value="trace", default=None,
              metavar="[trace|tokens]",
              help="Export the installed rule instead of a run's champion: "
                   "heuristics/evolved_trace.py (trace, the default) or heuristics/evolved.py "
                   "(tokens).")
@click.option("--format", "format", required=True, metavar="|".join(formats.NAMES),
              help=formats.help_text())
@click.option("--out", type=str, default=None, metavar="FILE",
              help="Write the module (or patch) to this new file (default: print it). Its "
                   "directory must exist; not inside the heuristics directory.")
@click.option("--force", is_flag=True,
              help="Replace an existing --out file, keeping it as <name>.previous "
                   "(<name>.previous.1, ... when that exists).")
@click.option("--allow-infeasible", is_flag=True,
              help="Export a champion marked infeasible (over its budget, or below standard "
                   "rejection, on valid).")
@runs_dir_option
@friendly_errors
def export_cmd(run, installed, format, out, force, allow_infeasible, runs_dir):
    """Write a champion (RUN, or --installed) as a module that needs no part of this project,
    or (vllm-patch) as a patch for vLLM."""
    from evolve.export import front    # lazy: start-up (a command loads only what it runs)
    res = front.export(run, installed=installed, format=format, out=out, force=force,
                         allow_infeasible=allow_infeasible, runs_dir=runs_dir)
    for line in res.notes:
        term().note(line)
    if out is None:
        click.echo(res.source, nl=False)
        return
    kind = formats.FORMATS[format].kind
    term().note(f"{res.path}: {format} {kind} of {res.metadata.get('run', '?')} "
                f"({len(res.source.splitlines())} lines)"
                + (f"; the replaced file is kept as {res.kept}" if res.kept else ""))
