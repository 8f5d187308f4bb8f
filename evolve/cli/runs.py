"""``evolve run``, ``inspect``, ``runs`` and ``benchmark``."""

from __future__ import annotations

import sys

import click

from evolve.cli.common import data_option, default_data, friendly_errors, json_option, number, \
    runs_dir_option, term
from evolve.objectives import OBJECTIVES, SETTINGS
from evolve.search.config import Config

# The objectives as --help lists them, with their own help (evolve.objectives loads no
# kernel: the command line lists them without loading Numba).
OBJECTIVE_HELP = "; ".join(f"{o.name}: {o.help}" for o in OBJECTIVES.values()) + "."


def setting_options(command):
    """The options of every objective's settings (``evolve.objectives.SETTINGS``), as the
    objectives declare them: flag, help, default. A number is taken as text and read by
    ``run_cmd`` (``common.number``), so that a value that is not one is one line naming
    the option."""
    for s in reversed(SETTINGS):
        kind = {"bool": {"is_flag": True}, "int": {"type": int}}.get(
            s.kind, {"type": str, "metavar": "FLOAT"})
        command = click.option(s.flag, s.name, default=None, help=Config.help_of(s.name),
                               **kind)(command)
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
@click.option("--generations", type=int, default=None, help=Config.help_of("generations"))
@click.option("--population", type=int, default=None, help=Config.help_of("population"))
@click.option("--seed", type=int, default=None, help=Config.help_of("seed"))
@click.option("--objective", type=str, default=None, help=OBJECTIVE_HELP)
@setting_options
@click.option("--tournament", type=int, default=None, help=Config.help_of("tournament"))
@click.option("--cx-prob", type=float, default=None, help=Config.help_of("cx_prob"))
@click.option("--mut-prob", type=float, default=None, help=Config.help_of("mut_prob"))
@click.option("--max-height", type=int, default=None, help=Config.help_of("max_height"))
@click.option("--max-size", type=int, default=None, help=Config.help_of("max_size"))
@click.option("--init-max-height", type=int, default=None,
              help=Config.help_of("init_max_height"))
@click.option("--elitism", type=int, default=None, help=Config.help_of("elitism"))
@click.option("--seed-baselines", is_flag=True, default=None,
              help=Config.help_of("seed_baselines"))
@click.option("--threads", type=int, default=None, help=Config.help_of("threads"))
@click.option("--device", type=str, default=None, help=Config.help_of("device"))
@click.option("--starts", type=int, default=None, help=Config.help_of("starts"))
@click.option("--batch-blocks", type=int, default=None, help=Config.help_of("batch_blocks"))
@click.option("--trajectory", is_flag=True, default=None, help=Config.help_of("trajectory"))
@click.option("--lookahead", is_flag=True, default=None, help=Config.help_of("lookahead"))
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
        out.error(str(e))
        sys.exit(runner.EXIT_INTERRUPTED)
    if json_mode:
        out.print_json(result)
    elif code == runner.EXIT_INTERRUPTED:
        out.note(f"interrupted at generation {result['generation']}; checkpoint saved in "
                  f"{result['path']}")
        out.note(f"resume with: {result['resume']}")
    else:
        from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
        views.show_run_result(result, out, opts.data_dir)
    sys.exit(code)


# ----------------------------------------------------------------- inspect

@click.command("inspect")
@click.argument("run", required=False)
@runs_dir_option
@json_option
@friendly_errors
def inspect_cmd(run, runs_dir, json_mode):
    """The champion of a run (default: the latest): formula, metrics, history."""
    from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
    from evolve.runs import report, rundir    # lazy: start-up (a command loads only what it runs)
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    parent = paths.runs_dir(runs_dir)
    rd = rundir.RunDir.open(parent, run) if run else rundir.latest_run(parent)
    info = report.inspect_run(rd)
    out = term(json_mode)
    if json_mode:
        out.print_json(info)
        return
    # lazy: start-up (a command loads only what it runs)
    from evolve.runs.pictures import draw_pictures
    draw_pictures(rd)
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


