"""The arbiter on tasks: paired free-running task accuracy of acceptance rules.

Every rule decodes the same problems of a split with the same uniforms (each problem
owns a generator; the decoder draws its uniforms up front), from its own trajectory,
greedily or by sampling, each problem up to the end of its answer
(``evolve.data.decode.decode(end=...)``). Per rule: task accuracy (the checker against
the reference answers), tokens per target call (tokens up to the end of the answer
over the target calls it took) with standard errors by problem. Each rule is compared
with the first (the reference, usually the lossless rule) by paired differences per
problem: the accuracy drop and the tokens per call gained, each with a 95% interval.
"""

from __future__ import annotations

import contextlib

import numpy as np

from evolve.data.decode import clipped
from evolve.freerun.paired import interval, mean_se, ratio_difference, ratio_se
from evolve.rules.adapters import as_rule, vector_rule


def run_rule(pair, rule, split: str, prompts: int | None, greedy: bool, advance=None) -> dict:
    """Per problem: ``correct`` (bool), ``tokens`` (up to and including the end of the
    answer, at most the pair's ``max_tokens``) and ``calls`` (target calls it took),
    and the answers. ``pair`` is a task pair (``evolve.data.sources.task.pair``'s
    interface: the built-in pair or a Hugging Face one). ``advance(n)``, when given, is
    called as each batch of n problems is decoded."""
    rule = None if rule is None else as_rule(rule)
    H, rngs = pair.prompts(split, prompts)
    problems = pair.problems[split][:len(H)]
    C = H.shape[1]
    _, acc, hist, lens = pair.decode(H, rngs, pair.max_new(split), advance, rule=rule,
                                     record=False, history=True, greedy=greedy, end=pair.end,
                                     max_tokens=pair.max_tokens)
    calls = (acc >= 0).sum(axis=1).astype(np.float64)
    correct, tokens, answers = [], [], []
    for i, p in enumerate(problems):
        text = hist[i, C:lens[i]]
        if pair.max_tokens is not None:
            text = text[:pair.max_tokens]
        ends = np.flatnonzero(text == pair.end) if pair.end is not None else []
        tokens.append(len(text) if len(ends) == 0 else int(ends[0]) + 1)
        body = pair.body(text)          # the text before its end
        answer = pair.checker.extract(body)
        answers.append(answer)
        correct.append(answer is not None and pair.checker.check(body, p.answer))
    return {"correct": np.array(correct, dtype=bool), "tokens": np.array(tokens, np.float64),
            "calls": calls, "answers": answers}


def summary(r: dict) -> dict:
    """Accuracy, tokens per target call and target calls per problem (the latency to an
    answer: a rule that lengthens the text can raise tokens per call and still take more
    calls), each with its standard error by problem."""
    acc, acc_se = mean_se(r["correct"])
    tpc, tpc_se = ratio_se(r["tokens"], r["calls"])
    cpp, cpp_se = mean_se(r["calls"])
    return {"accuracy": acc, "accuracy_se": acc_se, "tokens_per_call": tpc,
            "tokens_se": tpc_se, "calls_per_problem": cpp, "calls_se": cpp_se,
            "problems": int(r["correct"].size)}


def paired(a: dict, b: dict) -> dict:
    """Rule a minus rule b, paired by problem (same problems, same uniforms)."""
    acc = mean_se(a["correct"].astype(np.float64) - b["correct"].astype(np.float64))
    return {"accuracy": interval(*acc),
            "tokens_per_call": interval(*ratio_difference(a["tokens"], a["calls"],
                                                          b["tokens"], b["calls"])),
            "calls_per_problem": interval(*mean_se(a["calls"] - b["calls"]))}


def compare(pair, rules: dict, split: str = "test", prompts: int | None = None,
            greedy: bool = True, progress=None, meter=None) -> dict:
    """Every rule of ``rules`` (label -> rule; None is the lossless rule) on the same
    problems and uniforms; summaries, and paired differences from the first.
    ``progress(text)`` gets a line per rule; ``meter(label, total, unit)``, when given
    (``evolve.cli.render``), counts each rule's problems as they are decoded."""
    say = progress or (lambda text: None)
    raw = {}
    n = min(prompts or len(pair.problems[split]), len(pair.problems[split]))
    for label, rule in rules.items():
        say(f"{label}: decoding {n} {split} problems ({'greedy' if greedy else 'sampled'})")
        with (meter(label, n, "problems") if meter else contextlib.nullcontext()) as m:
            raw[label] = run_rule(pair, rule, split, prompts, greedy,
                                  None if m is None else m.advance)
    labels = list(rules)
    ref = labels[0]
    return {"split": split, "decoding": "greedy" if greedy else "sample",
            "problems": int(raw[ref]["correct"].size), "reference": ref,
            "rules": {k: summary(v) for k, v in raw.items()},
            "versus_reference": {k: paired(raw[k], raw[ref]) for k in labels[1:]}}


# ------------------------------------------------------------ tuning by task accuracy

def drop_of(raw: dict, ref: dict) -> float:
    """The accuracy drop of a rule against the reference on the same problems."""
    return float(ref["correct"].mean() - raw["correct"].mean())


def tune(pair, make, params, budget: float, ref: dict, split: str = "valid",
         greedy: bool = True, lenient: bool = True, bisect_steps: int = 4,
         prompts: int | None = None, cache: dict | None = None) -> dict:
    """A rule family tuned by free-running task accuracy: ``make(param)`` decodes
    ``split`` for every param (in the family's grid order, strict to lenient when
    ``lenient``) and the one with the most tokens per call whose accuracy drop against
    ``ref`` (the lossless rule's ``run_rule`` on the same problems) is within
    ``budget`` is kept (ties: the smaller drop, then the earlier); for a lenient
    family the step to the next, infeasible grid value is bisected ``bisect_steps``
    times. ``cache`` (param -> (summary, drop)) keeps decodes for another budget.
    Returns {param, summary, drop, tried: [(param, tokens/call, drop, calls/problem)]} or
    {param: None, ...} when no param fits."""
    tried, best = [], None
    cache = {} if cache is None else cache

    def consider(p):
        nonlocal best
        if p not in cache:
            raw = run_rule(pair, make(p), split, prompts, greedy)
            cache[p] = (summary(raw), drop_of(raw, ref))
        s, d = cache[p]
        tried.append((p, s["tokens_per_call"], d, s["calls_per_problem"]))
        ok = d <= budget + 1e-12
        if ok and (best is None or (s["tokens_per_call"], -d) > (best[1]["tokens_per_call"],
                                                                   -best[2])):
            best = (p, s, d)
        return ok

    fits = [consider(p) for p in params]
    if best is not None and lenient and len(params) > 1:
        i = list(params).index(best[0])
        if i + 1 < len(params) and not fits[i + 1]:
            lo, hi = params[i], params[i + 1]
            for _ in range(bisect_steps):
                mid = 0.5 * (lo + hi)
                if consider(mid):
                    lo = mid
                else:
                    hi = mid
    if best is None:
        return {"param": None, "summary": None, "drop": None, "tried": tried}
    return {"param": best[0], "summary": best[1], "drop": best[2], "tried": tried}


def _between(F: dict, h_rule, alpha: float, greedy: bool) -> np.ndarray:
    std = (np.zeros_like(np.asarray(F["draft_prob"], dtype=np.float64)) if greedy else
           np.minimum(1.0, np.asarray(F["target_prob"]) / np.asarray(F["draft_prob"])))
    return std + alpha * (clipped(h_rule.many(F)) - std)


def between(rule, alpha: float, greedy: bool):
    """The rule a fraction ``alpha`` of the way from the standard rule to ``rule``: its
    acceptance is s + alpha (a - s), with s the standard rule's (greedy: 0 for a draft
    that is not the target's argmax) and a ``rule``'s clipped threshold. alpha 0 is
    lossless, 1 is ``rule``; between, it is lenient in alpha. A decoder rule."""
    return vector_rule(_between, f"{getattr(rule, 'name', 'rule')} x {alpha:g}",
                       h_rule=as_rule(rule), alpha=alpha, greedy=greedy)


def between_thresholds(h, X: np.ndarray, alpha: float, greedy: bool) -> np.ndarray:
    """``between``'s thresholds offline, from a rule's thresholds ``h`` of the drafted
    rows of an input matrix ``X`` (``task_data.drafted_matrix``)."""
    std = np.zeros(X.shape[1]) if greedy else np.minimum(1.0, X[1] / X[0])
    return std + alpha * (clipped(h) - std)
