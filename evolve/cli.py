"""The `evolve` command: one function per command, no numerics here.

Heavy modules (numpy, numba, deap) are imported inside commands so that
``evolve --help`` starts fast.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

EXIT_BAD_INPUT = 2


def _term(json_mode: bool = False):
    from evolve.terminal import Terminal
    return Terminal(json_mode=json_mode)


def friendly_errors(fn):
    """Known error types become one line on stderr and exit code 2, no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from evolve.data import DataError
        from evolve.engine import ConfigError
        from evolve.runs import RunError
        from evolve.treeio import TreeError
        try:
            return fn(*args, **kwargs)
        except (DataError, ConfigError, RunError, TreeError) as e:
            _term().error(str(e))
            sys.exit(EXIT_BAD_INPUT)
        except KeyError as e:
            _term().error(str(e.args[0]) if e.args else "unknown name")
            sys.exit(EXIT_BAD_INPUT)
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            _term().error(f"{where}{e.strerror or e}")
            sys.exit(EXIT_BAD_INPUT)
    return wrapper


def _default_data() -> Path:
    from evolve.data import DEFAULT_DIR
    return DEFAULT_DIR


def _default_traces() -> Path:
    return _default_data() / "traces"


TRACE_OBJECTIVES = ("speed", "pareto")   # = evolve.fitness.TRACE_OBJECTIVES (tested); kept here for a fast --help


data_option = click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                           help="Directory with train/valid/test splits (default: datasets/).")
json_option = click.option("--json", "json_mode", is_flag=True,
                           help="Print one JSON document on stdout.")
runs_dir_option = click.option("--runs-dir", type=click.Path(path_type=Path), default=None,
                               help="Where run directories live (default: runs/, or "
                                    "$EVOLVE_RUNS_DIR).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specevolve")
def main():
    """Discover acceptance rules for speculative decoding by genetic programming."""


# -------------------------------------------------------------------- data

@main.group("data")
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
    from evolve import data, synth
    out = out or _default_data()
    term = _term()
    seeds = {"train": seed, "valid": seed + 81, "test": seed + 414}
    small = max(1, round(sequences * 0.3))
    splits = synth.generate_splits(seeds, {"train": sequences, "valid": small, "test": small})
    for name, ds in splits.items():
        path = data.split_path(out, name)
        if path.exists() and not force:
            try:
                same = data.load_npz(path).columns()
                if all((same[f] == v).all() for f, v in ds.columns().items()):
                    term.note(f"{path}: unchanged ({len(ds):,} tokens)")
                    continue
            except (data.DataError, ValueError):
                pass
            raise data.DataError(f"{path}: exists and differs; pass --force to overwrite")
        data.save_npz(ds, path)
        term.note(f"{path}: {len(ds):,} tokens (seed {seeds[name]})")


@data_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--split", "split", required=True, help="Split name to store it as.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@friendly_errors
def data_import(file, split, out):
    """Import a split in the original JSON array form."""
    from evolve import data
    if not split.isidentifier():
        raise data.DataError(f"--split: {split!r} is not a valid split name")
    ds = data.load_json(file, name=split)
    path = data.split_path(out, split)
    data.save_npz(ds, path)
    _term().note(f"{path}: {len(ds):,} tokens imported from {file}")


@data_group.command("export")
@data_option
@click.option("--split", "splits", multiple=True, help="Split(s) to export (default: all).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@friendly_errors
def data_export(data_dir, splits, out):
    """Export splits to the original JSON array form (<out>/<split>.json)."""
    from evolve import data
    data_dir = data_dir or _default_data()
    for split in splits or data.SPLITS:
        ds = data.load_split(data_dir, split)
        path = Path(out) / f"{split}.json"
        data.save_json(ds, path)
        _term().note(f"{path}: {len(ds):,} tokens")


@data_group.command("info")
@data_option
@json_option
@friendly_errors
def data_info(data_dir, json_mode):
    """Tokens, standard acceptance, top-match rate and entropy ranges per split."""
    from evolve import data
    data_dir = data_dir or _default_data()
    info = {s: data.describe(data.load_split(data_dir, s)) for s in data.SPLITS}
    term = _term(json_mode)
    if json_mode:
        term.print_json(info)
        return
    rows = [[s, f"{d['tokens']:,}", f"{100 * d['standard_accept_rate']:.2f}",
             f"{100 * d['top_match_rate']:.2f}",
             f"{d['draft_entropy'][0]:.2f}..{d['draft_entropy'][1]:.2f}",
             f"{d['target_entropy'][0]:.2f}..{d['target_entropy'][1]:.2f}",
             str(d["position_max"])] for s, d in info.items()]
    term.table(f"{data_dir}", [("split", "left"), ("tokens", "right"),
                               ("standard accept %", "right"), ("top match %", "right"),
                               ("draft entropy", "right"), ("target entropy", "right"),
                               ("max position", "right")], rows)


# --------------------------------------------------------------- benchmark

@main.command("benchmark")
@data_option
@click.option("--heuristic", "heuristics", multiple=True,
              help="Limit rows to this heuristic (repeatable).")
@click.option("--repeats", type=click.IntRange(min=1), default=25, show_default=True,
              help="Timing repeats per heuristic and split (median reported).")
@json_option
@friendly_errors
def benchmark_cmd(data_dir, heuristics, repeats, json_mode):
    """Every baseline and the evolved champion on train/valid/test."""
    from evolve import report
    result = report.benchmark(data_dir or _default_data(), list(heuristics) or None, repeats)
    term = _term(json_mode)
    if json_mode:
        term.print_json(result)
    else:
        report.show_benchmark(result, term)


# --------------------------------------------------------------------- run

@main.command("run")
@click.option("--generations", type=int, default=None, help="Generations [default: 100].")
@click.option("--population", type=int, default=None, help="Population size [default: 1000].")
@click.option("--seed", type=int, default=None, help="Random seed [default: 0].")
@click.option("--objective", type=str, default=None,
              help="expected (noise-free, default) or seed (the original metric) on token "
                   "splits; on traces speed (tokens per target call within --budget-tv) or "
                   "pareto (NSGA-II over tokens per call and TV).")
@click.option("--budget-tv", "tv_budget", type=float, default=None,
              help="Objective speed: mean TV per token allowed [0.02].")
@click.option("--tournament", type=int, default=None, help="Tournament size [default: 7].")
@click.option("--cx-prob", type=float, default=None, help="Crossover probability [0.7].")
@click.option("--mut-prob", type=float, default=None, help="Mutation probability [0.25].")
@click.option("--max-height", type=int, default=None, help="Tree height limit [10].")
@click.option("--max-size", type=int, default=None, help="Tree size limit (nodes) [60].")
@click.option("--init-max-height", type=int, default=None,
              help="Height limit of the first population's trees [4].")
@click.option("--elitism", type=int, default=None, help="Elites kept each generation [2].")
@click.option("--seed-baselines", is_flag=True, default=None,
              help="Put the baselines (as trees) into the first population.")
@click.option("--threads", type=int, default=None, help="Kernel threads (0 = all cores).")
@click.option("--name", type=str, default=None, help="Run directory name.")
@click.option("--resume", type=str, default=None, help="Continue an interrupted run.")
@click.option("--no-writeback", is_flag=True, help="Do not touch heuristics/evolved.py.")
@click.option("--force", is_flag=True, help="Write back even if not better on valid.")
@data_option
@runs_dir_option
@json_option
@friendly_errors
def run_cmd(generations, population, seed, objective, tv_budget, tournament, cx_prob, mut_prob,
            max_height, max_size, init_max_height, elitism, seed_baselines, threads, name, resume,
            no_writeback, force, data_dir, runs_dir, json_mode):
    """Evolve an acceptance heuristic; the champion is written back to heuristics/."""
    from evolve import runner, runs
    from evolve.engine import Config
    given = {"generations": generations, "population": population, "seed": seed,
             "objective": objective, "tournament": tournament, "cx_prob": cx_prob,
             "mut_prob": mut_prob, "max_height": max_height, "max_size": max_size,
             "init_max_height": init_max_height,
             "elitism": elitism, "seed_baselines": seed_baselines, "threads": threads,
             "tv_budget": tv_budget}
    term = _term(json_mode)
    if resume:
        extra = [k for k, v in given.items() if v is not None and k != "generations"]
        if extra or name:
            opt = "--name" if name else "--" + extra[0].replace("_", "-")
            raise runs.RunError(f"{opt}: cannot be changed on --resume (only --generations)")
    cfg = Config(**{k: v for k, v in given.items() if v is not None})
    if resume and generations is None:
        cfg.generations = None   # keep the run's own
    if data_dir is None:
        data_dir = _default_traces() if cfg.objective in TRACE_OBJECTIVES else _default_data()
    opts = runner.RunOptions(config=cfg, data_dir=data_dir,
                             runs_parent=runs.runs_dir(runs_dir), name=name, resume=resume,
                             writeback=not no_writeback, force=force)
    code, result = runner.execute(opts, term)
    if json_mode:
        term.print_json(result)
    elif code == runner.EXIT_INTERRUPTED:
        term.note(f"interrupted at generation {result['generation']}; checkpoint saved in "
                  f"{result['path']}")
        term.note(f"resume with: {result['resume']}")
    else:
        from evolve import report
        report.show_run_result(result, term, opts.data_dir)
    sys.exit(code)


# ----------------------------------------------------------------- inspect

@main.command("inspect")
@click.argument("run", required=False)
@runs_dir_option
@json_option
@friendly_errors
def inspect_cmd(run, runs_dir, json_mode):
    """The champion of a run (default: the latest): formula, metrics, history."""
    from evolve import report, runs
    parent = runs.runs_dir(runs_dir)
    rd = runs.RunDir.open(parent, run) if run else runs.latest_run(parent)
    info = report.inspect_run(rd)
    term = _term(json_mode)
    if json_mode:
        term.print_json(info)
        return
    data_dir = Path((info.get("data") or {}).get("dir") or _default_data())
    report.show_inspect(info, term, report.standard_metrics(data_dir))


@main.command("runs")
@runs_dir_option
@json_option
@friendly_errors
def runs_cmd(runs_dir, json_mode):
    """List runs with their champions."""
    from evolve import report, runs
    rows = report.runs_table(runs.runs_dir(runs_dir))
    term = _term(json_mode)
    if json_mode:
        term.print_json(rows)
        return
    if not rows:
        term.result("no runs yet")
        return
    report.show_runs(rows, term)


# ------------------------------------------------------------------- bench

@main.command("bench")
@click.option("--smoke", is_flag=True,
              help="Tiny sizes (well under a minute): proves the machinery, checks no target.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="JSON file to write (default: benchmarks/results.json, or "
                   "benchmarks/results-smoke.json with --smoke).")
@click.option("--json", "json_mode", is_flag=True,
              help="Print the JSON document on stdout instead of the table and the file.")
@friendly_errors
def bench_cmd(smoke, out, json_mode):
    """Speed benchmark: kernel vs DEAP+numpy, whole run, champion, start-up (~5 min)."""
    from evolve import bench
    term = _term(json_mode)
    try:
        result = bench.run(smoke=smoke, note=term.note)
    except bench.BenchError as e:
        term.error(str(e))
        sys.exit(1)
    if json_mode:
        term.print_json(result)
        return
    path = out or bench.default_path(smoke)
    bench.save(result, path)
    bench.show(result, term)
    term.result(f"results written to {path}")


# Trace commands (evolve data trace, evolve simulate, evolve tradeoff) register themselves.
import evolve.cli_trace  # noqa: E402,F401

if __name__ == "__main__":
    main()
