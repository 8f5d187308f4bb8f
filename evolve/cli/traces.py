"""Commands on speculative-decoding traces: ``simulate`` and ``tradeoff`` (``data
trace`` is in ``evolve.cli.trace_data``).

One function per command, heavy modules imported inside commands, known errors
as one line on stderr and exit code 2, ``--json`` prints one JSON document on
stdout. The numerics live in ``evolve.data.sources.ngram``, ``evolve.simulate``
and ``evolve.rules.tuning``; the views in ``evolve.cli.views``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import click

from evolve.cli import trace_views, views
from evolve.cli.common import (default_traces, fail, friendly_errors, json_option, need, number,
                               runs_dir_option, term)
from evolve.errors import EvolveError, first_line, shorten, show

SPLIT_NAMES = ("train", "valid", "test")
DEFAULT_BUDGETS = (0.01, 0.03)

traces_option = click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                             help="Directory with train/valid/test trace splits "
                                  "(default: datasets/traces/).")


# ---------------------------------------------------------------- shared

def _load_split(data_dir: Path, split: str):
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    return traces.load(Path(data_dir) / f"{split}.npz", name=split)


def _pair_for(ts, out):
    """The draft/target pair that recorded a split, rebuilt by its source
    (``evolve.data.sources.registry``), and whether its corpus is the recorded one."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import source_of
    return source_of(ts).pair_of(ts, out.note)


def _config_of(ts):
    """The recorded trace configuration of a split, or DataError (one line): read
    before anything is built, to check the sizes asked for."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import source_of
    return source_of(ts).config_of(ts)


def _check_sizes(check, *args) -> None:
    """Run a size check of ``evolve.simulate``/``evolve.paired``; a SizeError is one
    line naming the options."""
    from evolve.simulate import SizeError    # lazy: start-up (a command loads only what it runs)
    try:
        check(*args)
    except SizeError as e:
        fail(e.cli_message())


def _run_rule(runs_parent: Path, run: str):
    """(rule, info) of a run's champion: its tree parsed (never evaluated)."""
    from evolve.lang import codegen, treeio    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.rules.adapters import tree_rule
    from evolve.runs import rundir as runs    # lazy: start-up (a command loads only what it runs)
    rd = runs.RunDir.open(runs_parent, run)
    champ = rd.champion(metrics_needed=False)     # the rule is its tree
    try:
        nodes = treeio.parse(champ["tree"])
    except treeio.TreeError as e:
        raise runs.RunError(f"{rd.file('champion.json')}: field 'tree': {e}") from None
    name = f"run {rd.name}"
    info = {"kind": "run", "name": rd.name, "label": name, "param": None,
            "tree": champ["tree"], "expression": codegen.infix(nodes),
            "objective": champ.get("objective"), "tv_budget": champ.get("tv_budget")}
    return tree_rule(nodes, name), info


def _rule_of(text: str, runs_parent: Path):
    """A --compare rule: NAME, NAME:PARAM or run:RUN."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.rules.adapters import RuleError, named_rule
    shown = show(text)                 # echoed shortened: the line stays a line
    if text.startswith("run:"):
        if not text[4:].strip():
            fail(f"--compare: {shown}: the run name after 'run:' is empty")
        try:
            return _run_rule(runs_parent, text[4:])
        except EvolveError as e:
            fail(f"--compare: {shown}: {shorten(str(e), 300)}")
        except OSError as e:          # a name the system refuses (too long, ...)
            fail(f"--compare: {shown}: {e.strerror or shorten(str(e), 300)}")
    name, colon, value = text.partition(":")
    if colon and not value.strip():
        fail(f"--compare: {shown}: the parameter after ':' is empty; give NAME or "
             "NAME:PARAM")
    try:
        param = float(value) if colon else None
    except ValueError:
        fail(f"--compare: {shown}: the parameter {show(value)} is not a number")
    try:
        return named_rule(name, param)
    except RuleError as e:
        fail(f"--compare: {shown}: {shorten(str(e), 300)}")


def _installed_rule():
    """The installed trace rule (heuristics/evolved_trace.py) as an info dict with its
    parsed nodes, or None when there is none."""
    from evolve.lang import codegen    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.tasks.writeback import TRACE_MODULE, installed_trace
    found = installed_trace()
    if found is None:
        return None
    nodes, meta = found
    return {"kind": "installed", "name": TRACE_MODULE, "nodes": nodes,
            "label": f"installed * (run {meta.get('run', '?')})", "param": None,
            "tree": meta.get("tree"), "expression": codegen.infix(nodes),
            "objective": meta.get("objective"), "tv_budget": meta.get("tv_budget")}


# -------------------------------------------------------------- simulate

@click.command("simulate")
@click.option("--heuristic", "heuristic", default=None, metavar="NAME",
              help="A rule of the rules table (evolve/rules/table.py), e.g. standard_rejection "
                   "or leniency (with --param).")
@click.option("--param", type=float, default=None,
              help="The family's parameter (leniency l, ears beta, typical eps, bild alpha, "
                   "hf_ensemble w; default: the family's own).")
@click.option("--run", "run", default=None, metavar="RUN",
              help="Use the champion of this run directory instead.")
@click.option("--compare", "compare", multiple=True, metavar="RULE",
              help="Paired free-running comparison of rules (repeatable; the first is the "
                   "reference): NAME, NAME:PARAM (e.g. leniency:0.75, an engine's knob "
                   "such as hf_ensemble:0.85 or sglang_acc:0.6) or run:RUN.")
@traces_option
@click.option("--split", default="test", show_default=True,
              help="Trace split: the prompt pool and the offline estimate.")
@click.option("--prompts", type=int, default=None,
              help="Prompts to decode (default: as many as the split has).")
@click.option("--blocks", type=int, default=None,
              help="Blocks per prompt (default: as in the split).")
@click.option("--contexts", type=int, default=200, show_default=True,
              help="Contexts of the split at which the emitted byte is sampled.")
@click.option("--reps", type=int, default=2000, show_default=True,
              help="Samples of the emitted byte per context.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the simulated prompts and draws.")
@runs_dir_option
@json_option
@friendly_errors
def simulate_cmd(heuristic, param, run, compare, data_dir, split, prompts, blocks, contexts, reps,
                 seed, runs_dir, json_mode):
    """Real speculative decoding with a rule, next to its offline exact estimate.

    Rebuilds the draft/target pair from the split's recorded configuration,
    decodes from the split's prompt pool with the rule (tokens per target call)
    and samples the emitted byte at contexts of the split (TV from the target),
    and shows the offline numbers of `evolve.objectives.spec` for the same rule on that split:
    they should agree within sampling error.

    With --compare, every rule decodes the same prompts with the same uniforms
    from its own trajectory; the table shows tokens per call, TV and KL per
    token along each trajectory, slot TV by block position and its 99th
    percentile, the text's log-likelihood under target and draft, and each
    rule's paired difference from the first, with 95% intervals (standard
    errors by sequence). --compare also works on traces recorded with
    --backend hf: it loads the models and prompt source named in the split."""
    from evolve import paired, simulate    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.rules.adapters import RuleError, named_rule
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    for name, value, most in (("prompts", prompts, simulate.MAX_PROMPTS),
                              ("blocks", blocks, simulate.MAX_BLOCKS),
                              ("contexts", contexts, simulate.MAX_CONTEXTS),
                              ("reps", reps, simulate.MAX_REPS)):
        if value is not None:
            _check_sizes(simulate.check_bound, name, value, most)
    if compare:
        # lazy: start-up (a command loads only what it runs)
        from evolve.cli.compare import compare_cmd
        if heuristic is not None or run is not None or param is not None:
            fail("--compare: give the rules there, not with --heuristic/--run/--param")
        need(len(compare) >= 2, "--compare", list(compare), "at least two rules")
        need(split in SPLIT_NAMES, "--split", split, "one of " + ", ".join(SPLIT_NAMES))
        need(prompts is None or prompts >= 2, "--prompts", prompts, "at least 2")
        need(blocks is None or blocks >= 1, "--blocks", blocks, "at least 1")
        need(seed >= 0, "--seed", seed, "an integer >= 0")
        data_dir = Path(data_dir) if data_dir else default_traces()
        ts = _load_split(data_dir, split)
        cfg = _config_of(ts)         # sizes checked before the rules' runs or the models
        _check_sizes(paired.check_comparison,
                     cfg.prompts(split) if prompts is None else prompts,
                     cfg.blocks_per_prompt if blocks is None else blocks, len(compare),
                     cfg.block_size, cfg.top_k, cfg.context_len, cfg.prompt_len)
        out = term(json_mode)
        rules = {}
        for spec_ in compare:
            rule, info = _rule_of(spec_, paths.runs_dir(runs_dir))
            rules[info["label"]] = rule
        pair, same_corpus = _pair_for(ts, out)
        compare_cmd(pair, rules, data_dir, split, prompts, blocks, seed, same_corpus, out,
                    json_mode)
        return
    if (heuristic is None) == (run is None):
        fail("give one of --heuristic NAME or --run RUN")
    if run is not None and param is not None:
        fail("--param: only with --heuristic (a run's champion has no parameter)")
    need(split in SPLIT_NAMES, "--split", split, "one of " + ", ".join(SPLIT_NAMES))
    need(prompts is None or prompts >= 2, "--prompts", prompts, "at least 2")
    need(blocks is None or blocks >= 1, "--blocks", blocks, "at least 1")
    need(contexts >= 1, "--contexts", contexts, "at least 1")
    need(reps >= 2, "--reps", reps, "at least 2")
    need(seed >= 0, "--seed", seed, "an integer >= 0")
    data_dir = Path(data_dir) if data_dir else default_traces()
    out = term(json_mode)
    if heuristic is not None:
        try:
            rule, info = named_rule(heuristic, param)
        except RuleError as e:
            fail(f"{'--param' if e.field == 'param' else '--heuristic'}: {e}")
        if info.get("residual", "standard") != "standard":
            fail(f"--heuristic: {heuristic!r} resamples from p without the rejected draft; "
                 f"its single-rule check is not implemented: compare it free-running with "
                 f"--compare {heuristic}")
    else:
        rule, info = _run_rule(paths.runs_dir(runs_dir), run)
    ts = _load_split(data_dir, split)
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import source_of
    if not source_of(ts).single_rule_check:
        # lazy: start-up (a command loads only what it runs)
        from evolve.data.tokens import DataError
        raise DataError(f"{data_dir / split}.npz: recorded by the {ts.backend} backend; "
                        "evolve simulate rebuilds the n-gram pair and supports n-gram "
                        "traces only")
    cfg = _config_of(ts)             # sizes checked before the pair is rebuilt
    _check_sizes(simulate.check_simulation, cfg.prompts(split) if prompts is None else prompts,
                 cfg.blocks_per_prompt if blocks is None else blocks, min(contexts, len(ts)),
                 reps, cfg.block_size, cfg.prompt_len)
    t0 = time.perf_counter()
    out.note(f"{info['label']}: rebuilding the draft/target pair of {data_dir / split}.npz")
    pair, same_corpus = _pair_for(ts, out)
    try:
        res = simulate.check_rule(pair, ts, rule, split=split, prompts=prompts, blocks=blocks,
                                  contexts=contexts, reps=reps, seed=seed, progress=out.note)
    except simulate.SizeError as e:
        fail(e.cli_message())
    doc = {"rule": info, "data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(views.jsonable(doc))
        return
    trace_views.show_simulation(doc, out)


# -------------------------------------------------------------- tradeoff

@click.command("tradeoff")
@traces_option
@click.option("--budget", "budgets", type=str, multiple=True, metavar="FLOAT",
              help="TV per token allowed (repeatable) [default: 0.01 and 0.03].")
@click.option("--run", "run_names", multiple=True, metavar="RUN",
              help="Add the champion of this run directory (repeatable).")
@runs_dir_option
@click.option("--png", type=str, default=None, metavar="FILE",
              help="Also draw the trade-off on test to this PNG file (every point; its "
                   "directory must exist).")
@click.option("--max-tv", type=float, default=None,
              help="Right edge of the terminal picture [default: 4 x the largest budget].")
@click.option("--trajectory", is_flag=True,
              help="Also estimate each rule's free-running tokens per call on test from "
                   "its own trajectory (importance-weighted; noisy on small splits).")
@click.option("--engine", "engine", default=None, metavar="NAME",
              help="Show only the rows of this engine's own knobs (transformers, sglang), "
                   "each with the flags or keyword arguments to paste.")
@click.option("--device", default="cpu", show_default=True, metavar="DEVICE",
              help="Where the kernel sums run (sweeps, tuning, fixed rules, headroom): cpu "
                   "(Numba) or cuda (torch); the same report bit for bit.")
@json_option
@friendly_errors
def tradeoff_cmd(data_dir, budgets, run_names, runs_dir, png, max_tv, trajectory, engine,
                 device, json_mode):
    """Literature rules tuned to TV budgets on valid, reported on test.

    Every rule family of the rules table is swept on valid and test; for each
    budget each family is tuned on valid and its test numbers are shown, next
    to the champions of the --run directories and the installed trace rule
    (heuristics/evolved_trace.py, marked *). The families that are an engine's
    own knob (transformers' assistant_ensemble_weight, SGLang's accept thresholds)
    also show the tuned setting as that engine's flags or keyword arguments: no
    patch needed; --engine NAME shows only that engine's rows."""
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    from evolve.objectives import spec    # lazy: start-up (a command loads only what it runs)
    from evolve.rules import tuning    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.rules.table import ENGINES, families
    from evolve.runs import pictures    # lazy: start-up (a command loads only what it runs)
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    budgets = list(dict.fromkeys(number("--budget", b) for b in budgets)) or \
        list(DEFAULT_BUDGETS)
    need(engine is None or engine in ENGINES, "--engine", engine,
         f"one of {', '.join(ENGINES)}")
    for b in budgets:
        need(math.isfinite(b) and b >= 0, "--budget", b, "a TV per token >= 0")
    need(max_tv is None or max_tv > 0, "--max-tv", max_tv, "a TV per token > 0")
    from evolve.kernels import gpu    # lazy: start-up (a command loads only what it runs)
    gpu.check(device)                 # before any work: one line naming --device
    if png is not None:
        # lazy: start-up (a command loads only what it runs)
        from evolve.export.outfile import OutputError, check_target
        try:
            png = check_target("--png", png)
        except OutputError as e:
            fail(str(e))
    data_dir = Path(data_dir) if data_dir else default_traces()
    out = term(json_mode)
    extra, infos = {}, []
    parent = paths.runs_dir(runs_dir)
    for r in dict.fromkeys(run_names):
        rule, info = _run_rule(parent, r)
        extra[info["label"]] = rule.nodes
        infos.append(info)
    installed = _installed_rule()
    if installed is not None:
        extra[installed["label"]] = installed.pop("nodes")
        infos.append(installed)
    t0 = time.perf_counter()
    splits = traces.load_splits(data_dir, ("valid", "test"))
    sas = {s: spec.SpecArrays.from_split(ts) for s, ts in splits.items()}
    out.note(f"sweeping {len(families())} rule families on valid and test, tuning to "
              f"{len(budgets)} budget(s) ...")
    # lazy: start-up (a command loads only what it runs)
    from evolve.objectives.trajectory import TraceBlocks
    res = tuning.tradeoff(sas["valid"], sas["test"], budgets, extra,
                          TraceBlocks.from_split(splits["test"]) if trajectory else None,
                          device, traces.scope_of(splits["valid"].meta))
    # standard last among the families: drawn over leniency l=1 and ears beta=0 (same point)
    names = [k for k in res["series"] if k in families() and k != "standard_rejection"]
    names += [k for k in res["series"] if k not in names]
    series = {k: [tuple(xy) for xy in res["series"][k]] for k in names}
    png_path = None
    if png is not None:
        try:
            tuned = [(r["rule"], r["test"]["tv_per_token"], r["test"]["tokens_per_call"],
                      r["test"].get("tokens_se")) for e in res["budgets"] for r in e["rows"]
                     if r["test"] is not None and r["kind"] != "extra"]
            pictures.render_png(series, png, f"{data_dir}: test split (g = "
                                f"{res['block_size']}, k = {res['top_k']})", budgets, tuned)
        except RuntimeError as e:       # matplotlib missing
            fail(f"--png: {e}")
        except OSError as e:            # the directory went away, a full disk, ...
            fail(f"--png: {png}: {e.strerror or e}")
        png_path = str(png)
        out.note(f"{png}: written")
    if engine is not None:     # one engine's rows (the sweeps and the picture keep all)
        for entry in res["budgets"]:
            entry["rows"] = [r for r in entry["rows"] if r.get("engine") == engine]
    doc = {"data": str(data_dir), **res, "runs": infos, "png": png_path, "trajectory": trajectory,
           "engine": engine, "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(views.jsonable(doc))
        return
    trace_views.show_tradeoff(doc, series, out, max_tv)
