"""``evolve export``: a champion as a standalone numpy, torch, transformers or vLLM module,
or as a patch against vLLM's rejection sampler."""

from __future__ import annotations

import click

from evolve.cli.common import fail, friendly_errors, runs_dir_option, term

# evolve.export.modules.FORMATS + PATCHES (tested equal)
FORMATS = ("numpy", "torch", "hf", "vllm", "vllm-patch")


@click.command("export")
@click.argument("run", required=False)
@click.option("--installed", "installed", is_flag=False, flag_value="trace", default=None,
              metavar="[trace|tokens]",
              help="Export the installed rule instead of a run's champion: "
                   "heuristics/evolved_trace.py (trace, the default) or heuristics/evolved.py "
                   "(tokens).")
@click.option("--format", "fmt", required=True, metavar="|".join(FORMATS),
              help="numpy or torch: threshold/accept over arrays or tensors; hf: a drop-in "
                   "for transformers' assisted generation; vllm: the rule over the tensors of "
                   "vLLM's rejection sampler (a module); vllm-patch: a unified diff against "
                   "vLLM 0.33.0's vllm/v1/sample/rejection_sampler.py that puts the rule in "
                   "its Triton kernel (patch -p1; rules over draft_prob, target_prob and "
                   "block_position only).")
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
def export_cmd(run, installed, fmt, out, force, allow_infeasible, runs_dir):
    """Write a champion (RUN, or --installed) as a module that needs no part of this project,
    or (vllm-patch) as a patch for vLLM."""
    from evolve.export import champions    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.export.modules import ExportError, check_format, export_source
    # lazy: start-up (a command loads only what it runs)
    from evolve.export.outfile import OutputError, check_target, write_new
    # lazy: start-up (a command loads only what it runs)
    from evolve.export.vllm_patch import patch_source
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    if fmt not in FORMATS:
        fail(f"--format: {fmt!r} is invalid; expected one of {', '.join(FORMATS)}")
    if (run is None) == (installed is None):
        fail("give one of RUN or --installed")
    if installed is not None and installed not in champions.INSTALLED:
        fail(f"--installed: {installed!r} is invalid; expected trace or tokens")
    if force and out is None:
        fail("--force: only with --out")
    if out is not None:      # before anything is read: the file is written last
        try:
            out = check_target("--out", out, force=force,
                               refuse_under=(paths.heuristics_dir(),
                                             paths.PACKAGE_ROOT / "heuristics"))
        except OutputError as e:
            fail(str(e))
    if installed is not None:
        nodes, meta, title = champions.from_installed(installed)
    else:
        nodes, meta, title = champions.from_run(paths.runs_dir(runs_dir), run)
    st = meta.get("standing") or {}
    if st.get("verdict") == "infeasible" and not allow_infeasible:
        fail(f"{title}: the champion is infeasible: {st.get('why')} (--allow-infeasible "
             "exports it anyway)")
    if st.get("verdict") == "loses":
        term().note(f"note: the champion loses: {st.get('why')}")
    try:
        check_format(fmt, nodes)
        if fmt == "vllm-patch":
            source = patch_source(nodes, meta, title)
        else:
            source = export_source(nodes, fmt, meta, title)
    except ExportError as e:
        fail(str(e))
    except (TypeError, ValueError) as e:        # metadata that is not plain JSON
        fail(f"{title}: cannot export its metadata ({e})")
    if out is None:
        click.echo(source, nl=False)
        return
    try:
        kept = write_new("--out", out, source.encode("utf-8"), force)
    except OutputError as e:
        fail(str(e))
    kind = "patch" if fmt == "vllm-patch" else "module"
    term().note(f"{out}: {fmt} {kind} of {meta.get('run', '?')} "
                f"({len(source.splitlines())} lines)"
                + (f"; the replaced file is kept as {kept}" if kept else ""))
