"""``evolve run``, ``inspect``, ``runs`` and ``benchmark``."""

from __future__ import annotations

import sys

import click

from evolve.cli.common import Stated, data_option, default_data, friendly_errors, \
    interrupted, json_option, number, option_message, runs_dir_option, term
from evolve.objectives import OBJECTIVES, SETTINGS
from evolve.search.config import Config

# The objectives as --help lists them, with their own help (evolve.objectives loads no
# kernel: the command line lists them without loading Numba).
OBJECTIVE_HELP = "; ".join(f"{o.name}: {o.help}" for o in OBJECTIVES.values()) + "."


def _stated(name: str) -> str | None:
    """The default ``--help`` states for Config field ``name`` (click's ``[default: X]``,
    ``common.Stated``): an objective's setting as it declares it, none for a flag or an
    empty default."""
    f = next(f for f in Config.__dataclass_fields__.values() if f.name == name)
    setting = f.metadata.get("setting")
    if setting is not None:
        return setting.stated_default()[1:-1]
    if isinstance(f.default, bool) or f.default in ("", None):
        return None
    return str(f.default)


def config_option(flag: str, name: str, **kwargs):
    """The ``evolve run`` option of Config field ``name``: its help and default as
    declared (``Config.help_of``), the default applied by Config (the option's is None)."""
    return click.option(flag, name, default=None, cls=Stated, stated=_stated(name),
                        help=Config.help_of(name, False), **kwargs)


def setting_options(command):
    """The options of every objective's settings (``evolve.objectives.SETTINGS``), as the
    objectives declare them: flag, help, default. A number is taken as text and read by
    ``run_cmd`` (``common.number``), so that a value that is not one is one line naming
    the option."""
    for s in reversed(SETTINGS):
        kind = {"bool": {"is_flag": True}, "int": {"type": int}}.get(
            s.kind, {"type": str, "metavar": "FLOAT"})
        command = config_option(s.flag, s.name, **kind)(command)
    return command


@click.command("benchmark")
@data_option
@click.option("--rule", "--heuristic", "heuristics", multiple=True, metavar="NAME",
              help="Limit rows to this rule of heuristics/ (repeatable; --heuristic is the "
                   "same option).")
@click.option("--repeats", type=click.IntRange(min=1), default=25, show_default=True,
              help="Timing repeats per heuristic and split (median reported).")
@click.option("--device", type=str, default="cpu", show_default=True,
              help="Time the compiled per-rule functions on cpu, or each rule's tree with "
                   "the device token kernel on cuda (the same metrics; pip install '.[gpu]').")
@json_option
@friendly_errors
def benchmark_cmd(data_dir, heuristics, repeats, device, json_mode):
    """Every baseline and the evolved champion on train/valid/test."""
    from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
    from evolve.runs import report    # lazy: start-up (a command loads only what it runs)
    result = report.benchmark(data_dir or default_data(), list(heuristics) or None, repeats,
                              device=device)
    out = term(json_mode)
    for name, why in result["skipped"].items():
        out.note(f"warning: {name} skipped: heuristics/{name}.py {why}")
    for name, why in result["timing"].get("fallback", {}).items():
        out.note(f"warning: {name} timed on the CPU by its compiled function: "
                 f"heuristics/{name}.py: {why}")
    if json_mode:
        out.print_json(result)
    else:
        views.show_benchmark(result, out)


# --------------------------------------------------------------------- run

@click.command("run")
@config_option("--generations", "generations", type=int)
@config_option("--population", "population", type=int)
@config_option("--seed", "seed", type=int)
@click.option("--objective", type=str, default=None, help=OBJECTIVE_HELP)
@setting_options
@config_option("--tournament", "tournament", type=int)
@config_option("--cx-prob", "cx_prob", type=float)
@config_option("--mut-prob", "mut_prob", type=float)
@config_option("--max-height", "max_height", type=int)
@config_option("--max-size", "max_size", type=int)
@config_option("--init-max-height", "init_max_height", type=int)
@config_option("--elitism", "elitism", type=int)
@config_option("--seed-baselines", "seed_baselines", is_flag=True)
@config_option("--threads", "threads", type=int)
@config_option("--device", "device", type=str)
@config_option("--starts", "starts", type=int)
@config_option("--batch-blocks", "batch_blocks", type=int)
@config_option("--trajectory", "trajectory", is_flag=True)
@config_option("--lookahead", "lookahead", is_flag=True)
@click.option("--inputs", type=str, default=None, metavar="NAME,...",
              help=Config.help_of("inputs"))
@click.option("--engine", type=str, default=None, metavar="vllm|transformers",
              help="Only the inputs that engine's export computes (vllm: draft_prob, "
                   "target_prob, block_position), so the champion exports there.")
@click.option("--name", type=str, default=None, help="Run directory name.")
@click.option("--resume", type=str, default=None, help="Continue an interrupted run.")
@click.option("--no-writeback", is_flag=True,
              help="Do not touch heuristics/evolved.py (evolved_trace.py for trace runs).")
@click.option("--cluster", type=str, default=None, metavar="local:N",
              help="Score sharded traces on a local Dask cluster of N worker processes.")
@click.option("--scheduler", type=str, default=None, metavar="ADDRESS",
              help="Score sharded traces on the Dask cluster at ADDRESS.")
@click.option("--force", is_flag=True, default=None,
              help="Write back even if not better on valid.")
@data_option
@runs_dir_option
@json_option
@friendly_errors
def run_cmd(no_writeback, json_mode, **given):
    """Evolve an acceptance heuristic; the champion is written back to heuristics/."""
    from evolve.api import runs as api    # lazy: start-up (a command loads only what it runs)
    from evolve.cluster import ClusterInterrupted    # lazy: start-up (as above)
    from evolve.runs import runner    # lazy: start-up (a command loads only what it runs)
    # the options given, as the API's keywords: their defaults are Config's alone
    options = {k: v for k, v in given.items() if v is not None}
    for s in SETTINGS:
        if s.kind == "float" and s.name in options:
            options[s.name] = number(s.flag, options[s.name])
    out = term(json_mode)
    try:
        code, result, opts = api.execute(out, writeback=not no_writeback, **options)
    except ClusterInterrupted as e:        # stopped while reaching the cluster
        interrupted(option_message(e))
    if json_mode:
        out.print_json(result)
    elif code != runner.EXIT_INTERRUPTED:
        from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
        views.show_run_result(result, out, opts.data_dir)
    if code == runner.EXIT_INTERRUPTED:    # the run caught the signal, saved, and stopped
        g = result.get("generation")
        interrupted(("before its first generation" if g is None else f"at generation {g}")
                    + f"; checkpoint saved in {result['path']}; resume with: "
                    f"{result['resume']}")
    sys.exit(code)


# ----------------------------------------------------------------- inspect

@click.command("inspect")
@click.argument("run", required=False)
@click.option("--png", is_flag=True,
              help="Also draw the run's pictures: history.png (fitness over generations) "
                   "and, for a trace run, pareto.png (the trade-off on valid), in the run's "
                   "directory; drawn again only when the run has changed.")
@click.option("--simplify", is_flag=True,
              help="Also show the formula simplified by sympy (protected operators read "
                   "as plain ones; trees of at most 40 nodes).")
@runs_dir_option
@json_option
@friendly_errors
def inspect_cmd(run, png, simplify, runs_dir, json_mode):
    """The champion of a run (default: the latest): formula, metrics, history."""
    from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
    from evolve.runs import report, rundir    # lazy: start-up (a command loads only what it runs)
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    parent = paths.runs_dir(runs_dir)
    rd = rundir.RunDir.open(parent, run) if run else rundir.latest_run(parent)
    info = report.inspect_run(rd, simplify=simplify)
    out = term(json_mode)
    if png:       # matplotlib costs seconds to import and draw: only when asked
        # lazy: start-up (a command loads only what it runs)
        from evolve.runs.pictures import draw_pictures
        draw_pictures(rd)
    if json_mode:
        out.print_json(info)
        return
    views.show_inspect(info, out)


@click.command("runs")
@runs_dir_option
@json_option
@friendly_errors
def runs_cmd(runs_dir, json_mode):
    """List runs with their champions."""
    from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
    from evolve.runs import report    # lazy: start-up (a command loads only what it runs)
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    rows = report.runs_table(paths.runs_dir(runs_dir))
    out = term(json_mode)
    if json_mode:
        out.print_json(rows)
        return
    if not rows:
        out.result("no runs yet")
        return
    views.show_runs(rows, out)


