"""A task run's champion chosen free-running, by what a user pays per answer.

On the recorded path a lenient rule looks better than it decodes: once it keeps a
draft the standard rule would not, the text is another one, and the labels belong to
the old text. So a task run's last step decodes valid free-running
(``evolve.freerun.task_compare``): the run's champion on valid and the next rules of
the hall of fame (``SELECT_TOP`` in all),
each taken a fraction alpha of the way from the lossless rule (``between``; alpha in
``task_compare.ALPHAS``, the step to the first infeasible one bisected twice), and keeps the
one with the fewest target calls per correct answer whose accuracy drop against the
lossless rule, on the same problems and uniforms, is within the run's budget (and,
with ``--budget-agreement``, whose share of answers changed from lossless is too). alpha 0
is the lossless rule itself, so some choice always fits: where no step towards any of
them saves target calls per correct answer, the choice is lossless and the run says
so. The chosen rule is written as a tree (``between_tree``), so the champion a run
exports is the rule that was judged.
"""

from __future__ import annotations

import math

from evolve.freerun import task_compare as TC

SELECT_TOP = 3          # rules judged free-running: the champion on valid, then the hall of fame
BISECT_STEPS = 2        # halvings of the step to the first infeasible alpha


def clip_tree(tree: str) -> str:
    """The tree of clip(h, 0, 1) with NaN to 0, as ``evolve.data.decode.clipped``
    (pmax(h, 0) is 0 where h is NaN)."""
    return f"pmin(pmax({tree}, 0.0), 1.0)"


def between_tree(tree: str, alpha: float, greedy: bool) -> str:
    """The tree of ``task_compare.between(rule, alpha, greedy)``: s + alpha (clip(h) - s),
    with s the standard rule's acceptance (greedy: 0, the decoder keeps the target's
    argmax drafts itself). alpha 1 is ``tree`` itself; alpha 0 the lossless rule."""
    from evolve.rules.table import STANDARD_TREE    # lazy: the rules table on use
    alpha = float(alpha)
    if alpha >= 1.0:
        return tree
    if greedy:
        return "0.0" if alpha <= 0.0 else f"mul({alpha!r}, {clip_tree(tree)})"
    if alpha <= 0.0:
        return STANDARD_TREE
    return (f"add({STANDARD_TREE}, mul({alpha!r}, sub({clip_tree(tree)}, "
            f"{STANDARD_TREE})))")


def _finite(x):
    """A figure as JSON holds it (inf, a share with no right answer, as None)."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _plain(summary: dict) -> dict:
    return {k: _finite(float(v)) if isinstance(v, float) else v for k, v in summary.items()}


def select(pair, hof_trees, budget: float, greedy: bool, problems: int, say=None,
           agreement_budget: float | None = None) -> dict:
    """The free-running choice among the first ``SELECT_TOP`` distinct trees of
    ``hof_trees`` (text, best first: the run's champion, then its hall of fame) and
    their steps from lossless, on ``problems``
    problems of valid: {tree (the chosen rule's tree), source (its hall-of-fame rank,
    0 first; None for the lossless rule), alpha, valid (its summary), drop, lossless
    (the lossless rule's summary), problems, budget, decoding, tried: per rank the
    (alpha, tokens/call, drop, calls/answer, calls/correct answer, agreement) decoded;
    source_tree: the tree it steps towards; agreement_budget: with one, the share of
    answers a choice may change from lossless as well (None: no bound)}."""
    from evolve.lang import treeio                  # lazy: the primitive table on use
    from evolve.rules.adapters import TreeRule      # lazy: as above
    say = say or (lambda text: None)
    ref = TC.run_rule(pair, None, "valid", problems, greedy)
    lossless = TC.summary(ref, ref)
    best, tried = None, []
    for rank, tree in enumerate(list(dict.fromkeys(hof_trees))[:SELECT_TOP]):
        say(f"hall-of-fame rule {rank + 1}: its steps from lossless decode valid free-running")
        rule = TreeRule(treeio.parse(tree), f"hall of fame {rank + 1}")
        t = TC.tune(pair, lambda a, rule=rule: TC.between(rule, a, greedy), list(TC.ALPHAS),
                    budget, ref, "valid", greedy, lenient=True, prompts=problems,
                    bisect_steps=BISECT_STEPS, cache=TC.lossless_step(ref),
                    agreement_budget=agreement_budget)
        tried.append([list(map(_finite, row)) for row in t["tried"]])
        if t["param"] is None:
            continue
        key = (t["summary"]["calls_per_correct"], t["drop"], t["param"] <= 0.0)
        if best is None or key < best[0]:
            best = (key, rank, tree, t)
    if best is None or best[3]["param"] <= 0.0 or not (
            best[0][0] < lossless["calls_per_correct"]):      # the lossless rule is the choice
        alpha, source, src, s, drop = 0.0, None, None, lossless, 0.0
        tree = between_tree("0.0", 0.0, greedy)
    else:
        _, source, src, t = best
        alpha, s, drop = float(t["param"]), t["summary"], float(t["drop"])
        tree = between_tree(src, alpha, greedy)
    return {"tree": tree, "source": source, "source_tree": src, "alpha": alpha,
            "valid": _plain(s),
            "drop": drop, "lossless": _plain(lossless), "problems": int(ref["correct"].size),
            "budget": float(budget), "decoding": "greedy" if greedy else "sample",
            "agreement_budget": None if agreement_budget is None else float(agreement_budget),
            "tried": tried}
