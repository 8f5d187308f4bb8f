"""``evolve run``, ``inspect``, ``runs`` and ``benchmark``."""

from __future__ import annotations

import sys

import click

from evolve.cli.common import Stated, data_option, default_data, friendly_errors, \
    interrupted, json_option, number, option_message, runs_dir_option, term

# The objectives as --help lists them, spelled out so that `evolve --help` loads no
# kernel (tests/test_cli_defaults.py holds them to evolve.objectives.OBJECTIVES).
OBJECTIVE_HELP = ("expected: the seed metric with expected counts (noise-free; the default); "
                  "seed: the original benchmark's metric; speed: tokens per target call "
                  "within --budget-tv (traces); speed_kl: tokens per target call within "
                  "--budget-kl (mean KL per token; traces); pareto: NSGA-II over tokens per "
                  "call and TV (traces); task_speed: tokens per target call within "
                  "--budget-critical (accepted critical tokens per answer; task traces); "
                  "task_seed: the seed's metric on critical-token labels (task traces).")


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
@click.option("--generations", type=int, default=None, cls=Stated, stated="100",
              help="Generations.")
@click.option("--population", type=int, default=None, cls=Stated, stated="1000",
              help="Population size.")
@click.option("--seed", type=int, default=None, cls=Stated, stated="0",
              help="Random seed.")
@click.option("--objective", type=str, default=None,
              help=OBJECTIVE_HELP)
@click.option("--budget-tv", "tv_budget", type=float, default=None,
              cls=Stated, stated="0.02",
              help="Objectives speed, pareto: mean TV per token allowed.")
@click.option("--budget-kl", "kl_budget", type=float, default=None,
              cls=Stated, stated="0.01",
              help="Objective speed_kl: mean KL per token allowed.")
@click.option("--budget-critical", "critical_budget", type=float, default=None,
              cls=Stated, stated="0.01",
              help="Objective task_speed: accepted critical tokens per answer allowed (about "
                   "the accuracy drop).")
@click.option("--cap-tv-position", "tv_position_cap", type=float, default=None,
              cls=Stated, stated="1, no cap",
              help="Objectives speed, speed_kl: mean slot TV allowed at any block "
                   "position.")
@click.option("--cap-tv-p99", "tv_p99_cap", type=float, default=None,
              cls=Stated, stated="1, no cap",
              help="Objectives speed, speed_kl: 99th percentile of slot TV allowed "
                   "(reach-weighted).")
@click.option("--tournament", type=int, default=None, cls=Stated, stated="7",
              help="Tournament size.")
@click.option("--cx-prob", type=float, default=None, cls=Stated, stated="0.7",
              help="Crossover probability.")
@click.option("--mut-prob", type=float, default=None, cls=Stated, stated="0.25",
              help="Mutation probability.")
@click.option("--max-height", type=int, default=None, cls=Stated, stated="10",
              help="Tree height limit.")
@click.option("--max-size", type=int, default=None, cls=Stated, stated="60",
              help="Tree size limit (nodes).")
@click.option("--init-max-height", type=int, default=None,
              cls=Stated, stated="4",
              help="Height limit of the first population's trees.")
@click.option("--elitism", type=int, default=None, cls=Stated, stated="2",
              help="Elites kept each generation.")
@click.option("--seed-baselines", is_flag=True, default=None,
              help="Put the baselines (as trees) into the first population; with "
                   "--lookahead, the value gate on ahead too.")
@click.option("--threads", type=int, default=None, help="Kernel threads (0 = all cores).")
@click.option("--device", type=str, default=None,
              cls=Stated, stated="cpu",
              help="Evaluate populations on cpu (the Numba kernels) or cuda (torch, the "
                   "same results bit for bit; pip install '.[gpu]').")
@click.option("--starts", type=int, default=None,
              cls=Stated, stated="1",
              help="Independent starts (seeds seed..seed+N-1); the champion is the best on "
                   "valid.")
@click.option("--batch-blocks", type=int, default=None,
              help="Train fitness on N sampled draft blocks a generation (speed; 0 = all).")
@click.option("--trajectory", is_flag=True, default=None,
              help="Objective speed: score every rule on its own trajectory (importance-"
                   "weighted free-running estimate) on train, valid and test.")
@click.option("--ess-floor", "ess_floor", type=str, default=None, metavar="FLOAT",
              cls=Stated, stated="0.1",
              help="With --trajectory: least effective number of sequences, as a fraction "
                   "of the split's sequences, below which a rule is infeasible.")
@click.option("--lookahead", is_flag=True, default=None,
              help="Trace objectives: also offer next_tv and ahead, what verification knows "
                   "of the block's later drafted slots (such rules are scored by an "
                   "estimate; compare them free-running with evolve simulate --compare).")
@click.option("--inputs", type=str, default=None, metavar="NAME,...",
              help="Only these inputs (comma-separated) in the search, a subset of what the "
                   "data offer (all of them by default).")
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
def run_cmd(no_writeback, json_mode, ess_floor, **given):
    """Evolve an acceptance heuristic; the champion is written back to heuristics/."""
    from evolve.api import runs as api    # lazy: start-up (a command loads only what it runs)
    from evolve.cluster import ClusterInterrupted    # lazy: start-up (as above)
    from evolve.runs import runner    # lazy: start-up (a command loads only what it runs)
    # the options given, as the API's keywords: their defaults are Config's alone
    options = {k: v for k, v in given.items() if v is not None}
    if ess_floor is not None:
        options["ess_floor"] = number("--ess-floor", ess_floor)
    out = term(json_mode)
    opts = api.run_options(writeback=not no_writeback, **options)
    try:
        code, result = api.execute(opts, out)
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


