"""A champion's standing on valid: the three verdicts ``champion.json`` records
(the ``verdict`` of its ``standing``). Each data world's report sets one
(``evolve.tasks``), write-back keeps only a winner unforced
(``evolve.tasks.writeback``), ``evolve export`` refuses an infeasible one unless told
otherwise, and ``evolve.runs.schema`` checks a champion read back against the same
words; ``sentence`` is how every command says it, and ``next_steps`` what a verdict
means and which command to try next, as ``evolve run`` and ``evolve inspect`` print it
under the verdict.
"""

VERDICTS = WINS, LOSES, INFEASIBLE = ("wins", "loses", "infeasible")

# how each verdict reads after "the champion", and what it means in a few words
VERB = {WINS: "wins", LOSES: "loses", INFEASIBLE: "is infeasible"}
MEANING = {WINS: "the best rule on valid",
           LOSES: "another rule does better on valid",
           INFEASIBLE: "over the run's budget, or below the standard rule, on valid"}


def sentence(verdict: str, why: str) -> str:
    """What follows "the champion": ``loses (another rule does better on valid): why``."""
    return f"{VERB[verdict]} ({MEANING[verdict]}): {why}"

# What the search did not beat, by data world: the rules a champion is judged against.
RIVALS = {"tokens": "every baseline of evolve benchmark",
          "traces": "every rule family tuned to the same budget",
          "task": "the lossless rule and every rule family tuned to the same budget"}


def _longer(run: str, cfg: dict) -> str:
    g = cfg.get("generations")
    more = max(2 * g, 50) if isinstance(g, int) and g > 0 else 100
    return f"evolve run --resume {run} --generations {more}"


def next_steps(st: dict, world: str, run: str | None = None, cfg: dict | None = None,
               budget: float | None = None) -> list[str]:
    """Two lines under a verdict (``st``: a champion's ``standing``): what it means for
    the user, and the next commands to try: a longer search (``--resume RUN
    --generations N``), a search that starts from the baselines (``--seed-baselines``),
    another budget or objective, or deploying the rule that won (on traces ``evolve
    tradeoff`` prints its engine setting or how to export it). ``world``: the champion's
    data world (tokens, traces, task); ``run``: the run's name; ``cfg``: its
    configuration; ``budget``: its TV budget on traces."""
    cfg = cfg or {}
    run = run or "RUN"
    verdict = st.get("verdict")
    seeded = bool(cfg.get("seed_baselines"))
    seed = "" if seeded else "; or a new run that starts from the baselines (--seed-baselines)"
    rivals = RIVALS.get(world, "the baselines")
    tv = world == "traces" and cfg.get("objective") != "speed_kl" and budget is not None
    if world == "task" and "recorded_path" in st:       # chosen free-running on valid
        return _freerun_steps(verdict, run, cfg, seed)
    if verdict == WINS:
        check = {"traces": f"evolve simulate --compare standard_rejection --compare run:{run}",
                 "task": f"evolve simulate-task --compare lossless --compare run:{run}"
                 }.get(world)
        return [f"  what it means: the evolved rule does at least as well as {rivals} on "
                "valid; the test split, scored once, is the figure to quote",
                "  next: " + (f"check it free-running ({check}), then " if check else "")
                + f"export it (evolve export {run} --format numpy; or torch, hf, vllm where "
                "they compute its inputs)"]
    if verdict == LOSES:
        best = st.get("best_tuned") or st.get("best_baseline") or {}
        name = best.get("rule", "a baseline")
        what = ("a fixed baseline" if world == "tokens" else
                "a rule family with one knob, tuned to the same budget,")
        deploy = (f"deploy {name} instead: evolve tradeoff --budget {budget:g} --run {run} "
                  "prints its engine setting or how to export it" if tv else
                  f"use {name} instead (heuristics/baselines.py)" if world == "tokens" else
                  f"use {name} instead (evolve simulate-task --compare {name}:PARAM)")
        return [f"  what it means: {name}, {what} does better on valid; the evolved rule "
                "is not worth deploying (yet)",
                f"  next: {deploy}; or search longer ({_longer(run, cfg)}){seed}"]
    if verdict == INFEASIBLE:
        wider = (" or a larger budget (--budget-tv), or --objective pareto to see the whole "
                 "trade-off" if world == "traces" else
                 " or a larger budget (--budget-critical)" if world == "task" else "")
        return ["  what it means: the champion breaks the run's budget on valid, or decodes "
                "less than the standard rule: it is not a rule to deploy",
                f"  next: search longer ({_longer(run, cfg)}){seed};{wider}"
                .rstrip(";")]
    return []


def _freerun_steps(verdict: str, run: str, cfg: dict, seed: str) -> list[str]:
    """``next_steps`` of a task champion chosen free-running (``evolve.freerun.select``)."""
    data = f" --data {cfg['data']}" if cfg.get("data") else ""
    budget = cfg.get("critical_budget")
    b = f" --budget {budget:g}" if isinstance(budget, (int, float)) else ""
    if verdict == WINS:
        return ["  what it means: free-running on valid, it takes fewer target calls per "
                "correct answer than the lossless rule within the accuracy budget; the test "
                "split, scored once, is the figure to quote",
                f"  next: compare it with every rule family tuned free-running (evolve "
                f"tradeoff{data}{b} --run {run}), then export it (evolve export {run} "
                "--format numpy; or torch, hf where they compute its inputs)"]
    return ["  what it means: free-running, no evolved rule nor any step towards one saves "
            "target calls per correct answer within the budget: the champion is the "
            "lossless rule, not worth deploying",
            f"  next: search longer ({_longer(run, cfg)}){seed}; or a larger budget "
            "(--budget-critical)"]

