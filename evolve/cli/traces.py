"""Commands on speculative-decoding traces: ``simulate`` and ``tradeoff`` (``data
trace`` is in ``evolve.cli.trace_data``).

One function per command, heavy modules imported inside commands, known errors
as one line on stderr and exit code 2, ``--json`` prints one JSON document on
stdout. The numerics live in ``evolve.data.sources.ngram``, ``evolve.freerun.simulate``
and ``evolve.rules.tuning``; the views in ``evolve.cli.views``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from evolve.cli import trace_views, views
from evolve.cli.common import Stated, default_traces, fail, friendly_errors, json_option, need, number, \
    runs_dir_option, term

SPLIT_NAMES = ("train", "valid", "test")

traces_option = click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                             help="Directory with train/valid/test trace splits "
                                  "(default: datasets/traces/).")

any_scope_option = click.option(
    "--any-scope", is_flag=True,
    help="Evaluate a champion on traces of another scope (decoding, draft length, top-k, "
         "temperature) than it was scored in; refused without it, and each row of such a "
         "champion then says it is outside its scope.")


# ---------------------------------------------------------------- shared

def _load_split(data_dir: Path, split: str):
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    return traces.load(Path(data_dir) / f"{split}.npz", name=split)


# -------------------------------------------------------------- simulate

@click.command("simulate")
@click.option("--rule", "--heuristic", "heuristic", default=None, metavar="NAME",
              help="A rule of the rules table (an unknown name lists them), e.g. "
                   "standard_rejection or leniency (with --param); --heuristic is the same "
                   "option.")
@click.option("--param", type=float, default=None,
              help="The family's parameter (leniency l, ears beta, typical eps, bild alpha, "
                   "hf_ensemble w; default: the family's own).")
@click.option("--run", "run", default=None, metavar="RUN",
              help="Use the champion of this run directory instead.")
@click.option("--compare", "rules", multiple=True, metavar="RULE",
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
@any_scope_option
@json_option
@friendly_errors
def simulate_cmd(heuristic, param, run, rules, data_dir, split, prompts, blocks, contexts, reps,
                 seed, runs_dir, any_scope, json_mode):
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
    from evolve.freerun import simulate    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.rules.adapters import RuleError, named_rule
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    for name, value, most in (("prompts", prompts, simulate.MAX_PROMPTS),
                              ("blocks", blocks, simulate.MAX_BLOCKS),
                              ("contexts", contexts, simulate.MAX_CONTEXTS),
                              ("reps", reps, simulate.MAX_REPS)):
        if value is not None:
            simulate.check_bound(name, value, most)
    if rules:
        from evolve.api import comparisons as api    # lazy: start-up (a command loads only what it runs)
        if heuristic is not None or run is not None or param is not None:
            fail("--compare: give the rules there, not with --rule/--run/--param")
        out = term(json_mode)
        res = api.compare(rules, data_dir, split, prompts, blocks, seed, runs_dir,
                          progress=out.note, meter=out.meter, any_scope=any_scope)
        if json_mode:
            out.print_json(views.jsonable(res.report))
        else:
            trace_views.show_comparison(res.report, out)
        return
    if (heuristic is None) == (run is None):
        fail("give one of --rule NAME or --run RUN")
    if run is not None and param is not None:
        fail("--param: only with --rule (a run's champion has no parameter)")
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
            fail(f"{'--param' if e.field == 'param' else '--rule'}: {e}")
        if info.get("residual", "standard") != "standard":
            fail(f"--rule: {heuristic!r} resamples from p without the rejected draft; "
                 f"its single-rule check is not implemented: compare it free-running with "
                 f"--compare {heuristic}")
    ts = _load_split(data_dir, split)
    if run is not None:
        from evolve.api.named import in_scope, run_rule    # lazy: start-up (as above)
        from evolve.data.traces import scope_of    # lazy: start-up (as above)
        rule, info = in_scope(*run_rule(paths.runs_dir(runs_dir), run), scope_of(ts.meta),
                              any_scope, "run")
        if "outside_scope" in info:
            out.note(f"evaluated outside its scope: {info['outside_scope']}")
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import source_of
    if not source_of(ts).single_rule_check:
        # lazy: start-up (a command loads only what it runs)
        from evolve.data.tokens import DataError
        raise DataError(f"{data_dir / split}.npz: recorded by the {ts.backend} backend; "
                        "evolve simulate rebuilds the n-gram pair and supports n-gram "
                        "traces only")
    cfg = source_of(ts).config_of(ts)       # sizes checked before the pair is rebuilt
    simulate.check_simulation(cfg.prompts(split) if prompts is None else prompts,
                              cfg.blocks_per_prompt if blocks is None else blocks,
                              min(contexts, len(ts)), reps, cfg.block_size, cfg.prompt_len)
    t0 = time.perf_counter()
    out.note(f"{info['label']}: rebuilding the draft/target pair of {data_dir / split}.npz")
    pair, same_corpus = source_of(ts).pair_of(ts, out.note)
    res = simulate.check_rule(pair, ts, rule, split=split, prompts=prompts, blocks=blocks,
                              contexts=contexts, reps=reps, seed=seed, progress=out.note)
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
              cls=Stated, stated="0.01 and 0.03",
              help="TV per token allowed (repeatable); on task traces, the accuracy drop "
                   "from lossless decoding allowed.")
@click.option("--run", "runs", multiple=True, metavar="RUN",
              help="Add the champion of this run directory (repeatable).")
@runs_dir_option
@click.option("--png", type=str, default=None, metavar="FILE",
              help="Also draw the trade-off on test to this PNG file: the region of the "
                   "budgets, with a line at each, beside the whole curve (its directory "
                   "must exist).")
@click.option("--max-tv", type=float, default=None,
              cls=Stated, stated="4 x the largest budget",
              help="Right edge of the terminal picture.")
@click.option("--trajectory", is_flag=True,
              help="Also estimate each rule's free-running tokens per call on test from "
                   "its own trajectory (importance-weighted; noisy on small splits).")
@click.option("--engine", "engine", default=None, metavar="NAME",
              help="Sweep and tune only this engine's own knobs (transformers, sglang) and "
                   "standard rejection, each knob with the flags or keyword arguments to "
                   "paste.")
@click.option("--family", "families", multiple=True, metavar="NAME",
              help="Tune only this rule family (repeatable; standard rejection is always "
                   "swept on traces); on task traces learned_judge names the learned "
                   "judge, tuned only when named.")
@click.option("--device", default="cpu", show_default=True, metavar="DEVICE",
              help="Where the kernel sums run (sweeps, tuning, fixed rules, headroom): cpu "
                   "(Numba) or cuda (torch); the same report bit for bit.")
@click.option("--prompts", type=int, default=None, cls=Stated, stated="all",
              help="Task traces: at most this many valid and test problems decoded.")
@click.option("--agreement-budget", type=str, default=None, metavar="FLOAT",
              help="Task traces: also at most this share of answers changed from lossless "
                   "decoding.")
@click.option("--oracle", is_flag=True,
              help="Task traces: also decode test with the answer oracle (it keeps exactly "
                   "the drafts that keep the answer): the headroom any judge has, and each "
                   "rule's share of it.")
@click.option("--oracle-prompts", type=int, default=None, cls=Stated, stated="all of test",
              help="Task traces: the oracle decodes only this many test problems (it is "
                   "many times a rule's cost), and every share is measured on them; "
                   "implies --oracle.")
@click.option("--draft-cost", type=str, default=None, metavar="FLOAT|measure",
              help="Task traces: the draft's cost per token relative to a target call; adds "
                   "the time per correct answer (a call costs 1 + g x this) and the speed-up "
                   "over the target decoding alone. Default: measured here, one decoding "
                   "step of each model, where the pair has models (a Hugging Face pair).")
@any_scope_option
@json_option
@friendly_errors
def tradeoff_cmd(data_dir, budgets, runs, runs_dir, png, max_tv, trajectory, engine,
                 families, device, prompts, agreement_budget, oracle, oracle_prompts,
                 draft_cost, any_scope, json_mode):
    """Every rule tuned to budgets on valid, reported on test (traces: TV; tasks: accuracy).

    Every rule family of the rules table is swept on valid and test; for each
    budget each family is tuned on valid and its test numbers are shown, next
    to the champions of the --run directories and the installed trace rule
    (heuristics/evolved_trace.py, marked *). The families that are an engine's
    own knob (transformers' assistant_ensemble_weight, SGLang's accept thresholds)
    also show the tuned setting as that engine's flags or keyword arguments: no
    patch needed; --engine NAME sweeps only that engine's knobs (and standard
    rejection, the reference). --data may also be shards (`evolve data shard`), read
    whole into memory.

    On task traces (evolve data task) each rule family, the learned judge and the --run
    champions are tuned on valid by free-running decoding to the fewest target calls per
    correct answer within an accuracy drop of --budget, and decoded once on test with
    the same uniforms: target calls per answer and per correct answer, accuracy,
    agreement with lossless answers, answer length and tokens per call."""
    from evolve.api import tradeoffs as api    # lazy: start-up (a command loads only what it runs)
    need(max_tv is None or max_tv > 0, "--max-tv", max_tv, "a TV per token > 0")
    need(oracle_prompts is None or oracle_prompts >= 2, "--oracle-prompts", oracle_prompts,
         "a whole number >= 2")
    out = term(json_mode)
    res = api.tradeoff(data_dir, [number("--budget", b) for b in budgets] or None, runs,
                       runs_dir, png, trajectory, engine, device, progress=out.note,
                       meter=out.meter, any_scope=any_scope, prompts=prompts,
                       agreement_budget=number("--agreement-budget", agreement_budget),
                       oracle=oracle_prompts if oracle_prompts is not None else oracle,
                       families=list(families) or None,
                       draft_cost=("measure" if draft_cost in (None, "measure")
                                   else number("--draft-cost", draft_cost)))
    if json_mode:
        out.print_json(views.jsonable(res.report))
    elif isinstance(res, api.TaskTradeoff):
        trace_views.show_task_tradeoff(res.report, out)
    else:
        trace_views.show_tradeoff(res.report, res.series, out, max_tv)
