"""The arbiter on tasks: paired free-running task accuracy of acceptance rules.

Every rule decodes the same problems of a split with the same uniforms (each problem
owns a generator; the decoder draws its uniforms up front), from its own trajectory,
greedily or by sampling, each problem up to the end of its answer
(``evolve.data.decode.decode(end=...)``). Per rule, with standard errors by problem:
what a user pays, target calls per answer and per correct answer; task accuracy (the
checker against the reference answers) and agreement (answers unchanged from lossless
decoding); the answer's length; and tokens per target call (tokens up to the end of
the answer over the target calls it took), which a rule can raise while the answer
gets longer and takes more calls. Each rule is compared with the first (the
reference, usually the lossless rule) by paired differences per problem, each with a
95% interval. Rules are tuned (``tune``) to the fewest target calls per correct answer
within an accuracy budget.
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
        tokens.append(ended_length(pair, text))
        body = pair.body(text)          # the text before its end (and a stop string)
        answer = pair.checker.extract(body)
        answers.append(answer)
        correct.append(answer is not None and pair.checker.check(body, p.answer))
    return {"correct": np.array(correct, dtype=bool), "tokens": np.array(tokens, np.float64),
            "calls": calls, "answers": answers}


def ended_length(pair, text) -> int:
    """Tokens of a generated text up to and including the one that ended it: the end
    token, or the token that completed a stop string of the task (``done_of`` holds for
    every longer text once it holds, so it is found by bisection); all of it when it did
    not end."""
    ends = np.flatnonzero(text == pair.end) if pair.end is not None else []
    n = len(text) if len(ends) == 0 else int(ends[0]) + 1
    if not getattr(pair.config, "stop", ()) or not pair.done_of(list(text[:n])):
        return n
    lo, hi = 0, n                       # done_of(text[:hi]) holds, text[:lo] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pair.done_of(list(text[:mid])):
            hi = mid
        else:
            lo = mid
    return hi


def summary(r: dict, lossless: dict | None = None) -> dict:
    """What a user pays for an answer, with standard errors by problem: target calls per
    answer (``calls_per_problem``: the latency to an answer) and per correct answer
    (``calls_per_correct``: the cost of the answers that count; inf when none is
    right), accuracy, the answer's length in tokens, and tokens per target call (a rule
    that lengthens the text can raise tokens per call and still take more calls). With
    the lossless rule's run on the same problems (``lossless``), ``agreement``: the
    share of answers unchanged from lossless decoding (AutoJudge's criterion; it stays
    meaningful where the target itself is wrong)."""
    acc, acc_se = mean_se(r["correct"])
    tpc, tpc_se = ratio_se(r["tokens"], r["calls"])
    cpp, cpp_se = mean_se(r["calls"])
    right = r["correct"].astype(np.float64)
    cpc, cpc_se = ratio_se(r["calls"], right) if right.sum() > 0 else (np.inf, np.nan)
    length, length_se = mean_se(r["tokens"])
    out = {"accuracy": acc, "accuracy_se": acc_se, "tokens_per_call": tpc,
           "tokens_se": tpc_se, "calls_per_problem": cpp, "calls_se": cpp_se,
           "calls_per_correct": cpc, "calls_per_correct_se": cpc_se,
           "answer_tokens": length, "answer_tokens_se": length_se,
           "problems": int(r["correct"].size)}
    if lossless is not None:
        out["agreement"], out["agreement_se"] = mean_se(agrees(r, lossless))
    return out


def agrees(r: dict, lossless: dict) -> np.ndarray:
    """1.0 where a problem's answer is the lossless rule's (both none counts as the
    same), else 0.0."""
    return np.array([a == b for a, b in zip(r["answers"], lossless["answers"])],
                    dtype=np.float64)


def paired(a: dict, b: dict, lossless: dict | None = None) -> dict:
    """Rule a minus rule b, paired by problem (same problems, same uniforms): accuracy,
    tokens per call, target calls per answer and per correct answer, answer length, and
    (with the lossless run) agreement."""
    acc = mean_se(a["correct"].astype(np.float64) - b["correct"].astype(np.float64))
    out = {"accuracy": interval(*acc),
           "tokens_per_call": interval(*ratio_difference(a["tokens"], a["calls"],
                                                         b["tokens"], b["calls"])),
           "calls_per_problem": interval(*mean_se(a["calls"] - b["calls"])),
           "answer_tokens": interval(*mean_se(a["tokens"] - b["tokens"]))}
    ra, rb = a["correct"].astype(np.float64), b["correct"].astype(np.float64)
    out["calls_per_correct"] = (interval(*ratio_difference(a["calls"], ra, b["calls"], rb))
                                if ra.sum() > 0 and rb.sum() > 0 else None)
    if lossless is not None:
        out["agreement"] = interval(*mean_se(agrees(a, lossless) - agrees(b, lossless)))
    return out


def compare(pair, rules: dict, split: str = "test", prompts: int | None = None,
            greedy: bool = True, progress=None, meter=None) -> dict:
    """Every rule of ``rules`` (label -> rule; None is the lossless rule) on the same
    problems and uniforms; summaries, and paired differences from the first. The
    lossless rule is decoded too when none of ``rules`` is it (agreement is measured
    against it). ``progress(text)`` gets a line per rule; ``meter(label, total, unit)``,
    when given (``evolve.cli.render``), counts each rule's problems as they are decoded."""
    say = progress or (lambda text: None)
    raw = {}
    n = min(prompts or len(pair.problems[split]), len(pair.problems[split]))
    todo = dict(rules)
    if not any(r is None for r in rules.values()):
        todo[LOSSLESS] = None                  # the answers agreement is measured against
    for label, rule in todo.items():
        say(f"{label}: decoding {n} {split} problems ({'greedy' if greedy else 'sampled'})")
        with (meter(label, n, "problems") if meter else contextlib.nullcontext()) as m:
            raw[label] = run_rule(pair, rule, split, prompts, greedy,
                                  None if m is None else m.advance)
    lossless = raw[next(k for k, r in todo.items() if r is None)]
    labels = list(rules)
    ref = labels[0]
    return {"split": split, "decoding": "greedy" if greedy else "sample",
            "problems": int(raw[ref]["correct"].size), "reference": ref,
            "rules": {k: summary(raw[k], lossless) for k in labels},
            "versus_reference": {k: paired(raw[k], raw[ref], lossless) for k in labels[1:]}}


LOSSLESS = "lossless"


# ------------------------------------------------------------ tuning by task accuracy

def drop_of(raw: dict, ref: dict) -> float:
    """The accuracy drop of a rule against the reference on the same problems."""
    return float(ref["correct"].mean() - raw["correct"].mean())


def tune(pair, make, params, budget: float, ref: dict, split: str = "valid",
         greedy: bool = True, lenient: bool = True, bisect_steps: int = 4,
         prompts: int | None = None, cache: dict | None = None,
         agreement_budget: float | None = None) -> dict:
    """A rule family tuned by free-running task decoding: ``make(param)`` decodes
    ``split`` for every param (in the family's grid order, strict to lenient when
    ``lenient``) and the one with the fewest target calls per correct answer whose
    accuracy drop against ``ref`` (the lossless rule's ``run_rule`` on the same
    problems) is within ``budget`` (and, with ``agreement_budget``, whose share of
    answers changed from lossless is within it) is kept (ties: the smaller drop, then
    the earlier); for a lenient family the step to the next, infeasible grid value is
    bisected ``bisect_steps`` times. ``cache`` (param -> (summary, drop)) keeps decodes
    for another budget. Returns {param, summary, drop, tried: [(param, tokens/call,
    drop, calls/answer, calls/correct answer, agreement)]} or {param: None, ...} when
    no param fits."""
    tried, best = [], None
    cache = {} if cache is None else cache

    def consider(p):
        nonlocal best
        if p not in cache:
            raw = run_rule(pair, make(p), split, prompts, greedy)
            cache[p] = (summary(raw, ref), drop_of(raw, ref))
        s, d = cache[p]
        tried.append((p, s["tokens_per_call"], d, s["calls_per_problem"],
                      s["calls_per_correct"], s["agreement"]))
        ok = d <= budget + 1e-12 and (agreement_budget is None
                                      or 1.0 - s["agreement"] <= agreement_budget + 1e-12)
        if ok and (best is None or (-s["calls_per_correct"], -d) >
                   (-best[1]["calls_per_correct"], -best[2])):
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
    if alpha <= 0.0:                    # the ends exactly (their trees: select.between_tree)
        return std
    h = clipped(h_rule.many(F))
    return h if alpha >= 1.0 else std + alpha * (h - std)


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
    if alpha <= 0.0:
        return std
    return clipped(h) if alpha >= 1.0 else std + alpha * (clipped(h) - std)


# ------------------------------------------------------------ the tuned comparison

ALPHAS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)   # a champion's step from lossless
JUDGE = "learned judge"


def lossless_step(ref: dict) -> dict:
    """A ``tune`` cache holding a champion's step alpha 0 (``between``): the lossless
    rule, whose decoding ``ref`` already is (the same problems and uniforms decode to
    the same text), so it is not decoded again."""
    return {0.0: (summary(ref, ref), 0.0)}


def _family(name: str, greedy: bool):
    """(params in tuning order, lenient, the decoder rule of a param) of a rule family."""
    from evolve.rules.adapters import named_rule    # lazy: the rules table on use
    from evolve.rules.table import RULES            # lazy: as above
    r = RULES[name]
    params = list(r.grid) if r.param is not None else [None]
    return params, bool(r.lenient), (lambda p: named_rule(name, p, greedy)[0])


def tradeoff(pair, train, budgets, champions: dict | None = None, greedy: bool = True,
             families=None, prompts: int | None = None,
             agreement_budget: float | None = None, progress=None,
             oracle: bool | int = False, judge: bool = True) -> dict:
    """Every rule tuned on valid free-running to each accuracy budget and reported once
    on test, paired, as a user would compare rules on their own task.

    ``pair``: the task pair (``pair.rebuild``); ``train``: the train split's
    ``TaskData`` (the learned judge is fit on its labels); ``families``: the rule
    families to tune (default: the task world's of this decoding); ``judge``: also
    the learned judge; ``champions``:
    label -> parsed tree of run champions, each taken a fraction alpha of the way from
    the lossless rule (``between``), alpha tuned like a family's parameter;
    ``prompts``: at most this many problems of valid and of test; ``agreement_budget``:
    also at most this share of answers changed from lossless; ``oracle``: the answer
    oracle (``evolve.rules.oracle``, a bound, not tuned) decodes test too, and every
    row gets ``oracle_share``, the share of the oracle's saving in target calls per
    correct answer against lossless that the rule achieves; a whole number instead of
    True decodes only that many test problems with the oracle (it continues every
    rejectable draft to the end of the answer, twice: many times a rule's cost) and
    measures every share on those same problems. A rule is tuned to the
    fewest target calls per correct answer within the budget (``tune``); on test every
    tuned rule and the lossless rule decode the same problems with the same uniforms.
    Returns {decoding, problems, lossless: {valid, test}, budgets: [{budget, rows,
    best}]}: a row per rule and budget (rule, kind, param, valid summary and drop,
    test summary, paired difference from lossless and, for a champion, from the best
    tuned baseline), ``best`` the baseline with the fewest test calls per correct
    answer among those that fit on valid."""
    from evolve.rules import judge as learned        # lazy: the learned judge on use
    from evolve.rules.adapters import TreeRule       # lazy: the rules table on use
    from evolve.rules.table import families as task_families    # lazy: as above
    say = progress or (lambda text: None)
    decoding = "greedy" if greedy else "sample"
    names = task_families("task", decoding) if families is None else list(families)
    say(f"the lossless rule decodes valid and test ({decoding})")
    ref = {s: run_rule(pair, None, s, prompts, greedy) for s in ("valid", "test")}
    candidates = {}                                   # label -> (kind, params, lenient, make)
    for name in names:
        params, lenient, make = _family(name, greedy)
        candidates[name] = ("family", params, lenient, make)
    if judge:
        model = learned.fit(train)
        candidates[JUDGE] = ("judge", list(learned.GRID), True,
                             lambda lam: learned.rule(model, lam, greedy))
    for label, nodes in (champions or {}).items():
        rule = TreeRule(nodes, label)
        candidates[label] = ("run", list(ALPHAS), True,
                             lambda al, rule=rule: between(rule, al, greedy))
    tuned = {}
    for label, (kind, params, lenient, make) in candidates.items():
        cache = lossless_step(ref["valid"]) if kind == "run" else {}
        for b in budgets:
            say(f"tuning {label} on valid to an accuracy drop of {b:g}")
            tuned[label, b] = tune(pair, make, params, b, ref["valid"], "valid", greedy,
                                   lenient=lenient, prompts=prompts, cache=cache,
                                   agreement_budget=agreement_budget)
    test_raw = {}                                      # (label, param) -> the test run
    for (label, b), t in tuned.items():
        key = (label, t["param"])
        if t["param"] is not None and key not in test_raw:
            say(f"{label} ({t['param']:g}) decodes test")
            test_raw[key] = run_rule(pair, candidates[label][3](t["param"]), "test", prompts,
                                     greedy)
    oracle_raw = None
    if oracle:
        from evolve.rules.oracle import AnswerOracle    # lazy: on use
        say("the oracle decodes test (a bound: it keeps exactly the drafts that keep the "
            "answer and do not lengthen it)")
        n = ref["test"]["correct"].size if oracle is True else min(int(oracle),
                                                                   ref["test"]["correct"].size)
        oracle_raw = run_rule(pair, AnswerOracle(), "test", n, greedy)
    out = []
    for b in budgets:
        rows = []
        for label, (kind, *_rest) in candidates.items():
            t = tuned[label, b]
            row = {"rule": label, "kind": kind, "param": t["param"],
                   "fits_valid": t["param"] is not None, "valid": t["summary"],
                   "valid_drop": t["drop"], "tried": t["tried"], "test": None,
                   "versus_lossless": None}
            if t["param"] is not None:
                r = test_raw[label, t["param"]]
                row["test"] = summary(r, ref["test"])
                row["versus_lossless"] = paired(r, ref["test"], ref["test"])
            rows.append(row)
        base = [r for r in rows if r["kind"] != "run" and r["test"] is not None]
        best = min(base, key=lambda r: r["test"]["calls_per_correct"], default=None)
        if best is not None:
            braw = test_raw[best["rule"], best["param"]]
            for r in rows:
                if r["kind"] == "run" and r["test"] is not None:
                    r["versus_best"] = paired(test_raw[r["rule"], r["param"]], braw,
                                              ref["test"])
        if oracle_raw is not None:
            _add_oracle(rows, oracle_raw, ref["test"], lambda r: test_raw[r["rule"], r["param"]])
        out.append({"budget": b, "rows": rows, "best": None if best is None else best["rule"]})
    return {"decoding": decoding, "problems": {s: int(ref[s]["correct"].size)
                                               for s in ("valid", "test")},
            "lossless": {s: summary(ref[s], ref[s]) for s in ("valid", "test")},
            "budgets": out, "judge": model.to_dict() if judge else None,
            "oracle_problems": None if oracle_raw is None else int(oracle_raw["correct"].size)}


ORACLE = "oracle"


def with_time(doc: dict, draft_cost: float, block_size: int,
              measured: dict | None = None) -> dict:
    """A ``tradeoff`` report with what an answer takes in time under a cost model, in
    units of one target call: a call verifying a block costs 1 and each of its
    ``block_size`` drafted tokens ``draft_cost`` (the draft's cost per token relative to
    a target call), so a call costs 1 + g c; the target decoding alone takes one call a
    token of the lossless text (the same text in greedy decoding, the same
    distribution sampled). Each summary gains ``time_per_correct`` (calls per correct
    answer x (1 + g c)) and ``speedup`` (the target alone's time per correct answer,
    from the lossless run of the same problems, over it: below 1 the pair is slower than
    its target alone); each paired difference in calls per correct answer gains
    ``time_per_correct``, scaled alike (every rule drafts g a call). With a constant
    g the model rescales calls per correct answer, and no ranking changes. ``measured``:
    how ``draft_cost`` was timed, where it was (``evolve.data.sources.hf.clock``), kept
    in ``time_model["measured"]``."""
    per = 1.0 + block_size * draft_cost

    def timed(summary: dict | None, lossless: dict) -> None:
        if summary is None:
            return
        alone = (lossless["answer_tokens"] / lossless["accuracy"]
                 if lossless["accuracy"] > 0 else float("inf"))
        summary["time_per_correct"] = summary["calls_per_correct"] * per
        summary["speedup"] = (alone / summary["time_per_correct"]
                              if np.isfinite(summary["time_per_correct"]) else 0.0)

    def scaled(d: dict | None) -> None:
        c = (d or {}).get("calls_per_correct")
        if c is not None:
            d["time_per_correct"] = {"difference": c["difference"] * per, "se": c["se"] * per,
                                     "ci95": [x * per for x in c["ci95"]]}

    for split in ("valid", "test"):
        timed(doc["lossless"][split], dict(doc["lossless"][split]))
    for entry in doc["budgets"]:
        for r in entry["rows"]:
            for split in ("valid", "test"):
                timed(r.get(split), r.get(f"lossless_{split}") or doc["lossless"][split])
            for key in ("versus_lossless", "versus_best"):
                scaled(r.get(key))
    doc["time_model"] = {"draft_cost": draft_cost, "block_size": block_size,
                         "call_cost": per}
    if measured is not None:
        doc["time_model"]["measured"] = dict(measured)
    return doc


def _head(r: dict, n: int) -> dict:
    """A decoding's record of its first ``n`` problems."""
    return {k: (v[:n] if isinstance(v, (np.ndarray, list)) else v) for k, v in r.items()}


def _add_oracle(rows: list, raw: dict, lossless: dict, raw_of) -> None:
    """The oracle's row (``tradeoff(oracle=...)``), and each row's share of its saving in
    target calls per correct answer against lossless (None where the oracle saves
    nothing or a row has no test figures), both on the problems the oracle decoded
    (``raw``: the first of the test problems; ``raw_of(row)``: a row's test decoding)."""
    n = int(raw["correct"].size)
    ll = _head(lossless, n)
    o = summary(raw, ll)
    ls = summary(ll, ll)["calls_per_correct"]
    room = ls - o["calls_per_correct"]
    for r in rows:
        t = None if r["test"] is None else summary(_head(raw_of(r), n), ll)
        r["oracle_share"] = (None if t is None or room <= 0 or not np.isfinite(room)
                             or not np.isfinite(t["calls_per_correct"])
                             else float((ls - t["calls_per_correct"]) / room))
    rows.append({"rule": ORACLE, "kind": "oracle", "param": None, "fits_valid": False,
                 "valid": None, "valid_drop": None, "tried": [], "test": o,
                 "versus_lossless": paired(raw, ll, ll), "oracle_share": None,
                 "lossless_test": summary(ll, ll)})       # on the problems it decoded