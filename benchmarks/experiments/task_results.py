"""Acceptance rules judged by the answers they change: the task world's results.

On the built-in arithmetic task and its pair (``evolve data task``), for greedy and
for sampled decoding, at accuracy budgets of 1% and 3% (the accuracy drop against
lossless speculative decoding of the same pair):

1. every rule family of the task world (``evolve.rules.table.families("task")``) and
   the learned judge (a logistic regression on the train labels,
   ``evolve.rules.judge``) is tuned on valid by free-running task accuracy
   (``evolve.freerun.task_compare.tune``: every grid value decoded on the valid problems with
   the same uniforms as the lossless rule, the most tokens per call within the budget
   kept; lenient families bisected towards their first infeasible value);
2. the search (``evolve run --objective task_speed``, multi-start) evolves a rule on
   the train labels with the critical budget per answer set to the accuracy budget,
   chosen on valid by the same objective; the champion then goes a fraction alpha of
   the way from the standard rule to itself (``evolve.freerun.task_compare.between``), alpha
   tuned on valid free-running like a family's parameter, since critical tokens per
   answer on the recorded path and the accuracy drop free-running are not the same
   number (the results say how far apart they are);
3. every tuned rule, the champion and the lossless rule decode the test problems with
   the same uniforms (``evolve.freerun.task_compare.compare``): accuracy, tokens per call,
   and paired differences from the lossless rule and from the best tuned baseline,
   with 95% intervals.

Figures go to ``benchmarks/experiments/task_results.json``; ``--page`` rewrites the section of
docs/results/task-world.md and the picture ``docs/img/task_results.png``. On your own task:
record it into ``DIR/greedy`` (and/or ``DIR/sample``) with ``evolve data task
--task-file ... --decoding greedy``, then ``python -m benchmarks.experiments.task_results --data
DIR --modes greedy --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from benchmarks.common import ROOT, write_section  # noqa: E402

import numpy as np  # noqa: E402

import evolve  # noqa: E402
from evolve.freerun import task_compare as TC  # noqa: E402
from evolve.data import traces  # noqa: E402
from evolve.data.sources.task import pair as TP  # noqa: E402
from evolve.data.sources.task import record  # noqa: E402
from evolve.io import paths  # noqa: E402
from evolve.kernels.tokens import matrix_thresholds  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives.task_data import TaskData, metrics_of  # noqa: E402
from evolve.rules import judge  # noqa: E402
from benchmarks.experiments.trace_results import (  # noqa: E402  (one copy of each)
    _commit, _shown, quick_and_render_args, rendered)
from evolve.rules.adapters import TreeRule, named_rule  # noqa: E402
from evolve.rules.table import RULES, families  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "task_results.json"
PICTURE = ROOT / "docs" / "img" / "task_results.png"
SECTION = "task-results"
BUDGETS = (0.01, 0.03)
MODES = ("greedy", "sample")
SIZES = {"greedy": (1000, 500, 1000), "sample": (600, 400, 800)}   # train, valid, test
ALPHAS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
JUDGE = "learned judge"
LOSSLESS = "lossless"


def recorded(data: Path, mode: str, sizes, seed: int) -> tuple:
    """The task traces of ``data`` (the built-in task recorded there first when
    missing; traces of your own task and pair, ``evolve data task --task-file``, are
    used as they are) and the pair that recorded them."""
    if not all((data / f"{s}.npz").exists() for s in ("train", "valid", "test")):
        cfg = TP.TaskPairConfig(seed=seed, train_prompts=sizes[0], valid_prompts=sizes[1],
                                test_prompts=sizes[2])
        pair = TP.build_pair(cfg)
        data.mkdir(parents=True, exist_ok=True)
        for split in ("train", "valid", "test"):
            t = time.perf_counter()
            record.save(record.record_split(pair, split, mode, seed), data)
            print(f"{mode}: recorded {split} ({time.perf_counter() - t:.0f} s)",
                  file=sys.stderr)
    meta = traces.read_file_meta(data / "test.npz")
    if meta.get("decoding") != mode:
        raise SystemExit(f"{data}: the traces are {meta.get('decoding')}, not {mode}")
    pair = TP.rebuild(meta)        # the built-in pair, or your own (evolve data task --task-file)
    splits = {s: record.load(data, s) for s in ("train", "valid", "test")}
    return splits, pair


def _family(name: str, greedy: bool):
    """(params in tuning order, lenient, the decoder rule of a param)."""
    r = RULES[name]
    params = list(r.grid) if r.param is not None else [None]
    return params, bool(r.lenient), (lambda p: named_rule(name, p, greedy)[0])


def tune_all(pair, tds: dict, ref_valid: dict, greedy: bool, budgets, progress) -> dict:
    """Every family and the learned judge tuned on valid by free-running accuracy, per
    budget: label -> budget -> {param, valid summary, drop, tried}."""
    out = {}
    for name in families("task", "greedy" if greedy else "sample"):
        params, lenient, make = _family(name, greedy)
        cache: dict = {}
        out[name] = {}
        for b in budgets:
            progress(f"tuning {name} on valid to an accuracy drop of {b:g}")
            out[name][b] = TC.tune(pair, make, params, b, ref_valid, "valid", greedy,
                                   lenient=lenient, cache=cache)
    model = judge.fit(tds["train"])
    cache = {}
    out[JUDGE] = {}
    for b in budgets:
        progress(f"tuning {JUDGE} on valid to an accuracy drop of {b:g}")
        out[JUDGE][b] = TC.tune(pair, lambda lam: judge.rule(model, lam, greedy),
                                list(judge.GRID), b, ref_valid, "valid", greedy,
                                lenient=True, cache=cache)
    out[JUDGE]["weights"] = model.to_dict()
    return out, model


def evolve_champion(data: Path, runs_dir: Path, budget: float, a, mode: str) -> dict:
    name = f"{mode}-b{budget:g}-{int(time.time())}"
    opts = dict(objective="task_speed", critical_budget=budget, starts=a.starts, seed=a.seed,
                population=a.population, generations=a.generations, seed_baselines=True,
                tournament=3)
    res = evolve.run(data_dir=data, runs_dir=runs_dir, name=name, writeback=False, **opts)
    ch = res.champion
    cmd = (f"evolve run --objective task_speed --budget-critical {budget:g} --starts "
           f"{a.starts} --seed {a.seed} --population {a.population} --generations "
           f"{a.generations} --seed-baselines --tournament 3 --data {_shown(data)}")
    return {"command": cmd, "run": _shown(res.path), "tree": ch["tree"],
            "expression": ch["expression"], "chosen_seed": ch["chosen_seed"],
            "standing": ch.get("standing"), "over_starts": ch.get("over_starts"),
            "starts": [{"seed": s["seed"], "tree": s["tree"], "valid_score": s["valid_score"],
                        "test": s["test"]} for s in ch["starts"]],
            "metrics": ch["metrics"]}


def run_mode(mode: str, a, sizes: dict) -> tuple:
    """One decoding's results: record (or reuse) its traces, tune every rule on valid,
    evolve, and decode everything on test. Returns (mode, its part of the document)."""
    t0 = time.perf_counter()

    def say(text):
        print(f"[{time.perf_counter() - t0:6.0f} s] {mode}: {text}", file=sys.stderr,
              flush=True)

    greedy = mode == "greedy"
    data = a.data / mode
    splits, pair = recorded(data, mode, sizes[mode], a.seed)
    tds = {k: TaskData(v) for k, v in splits.items()}
    say("the lossless rule on valid")
    ref_valid = TC.run_rule(pair, None, "valid", None, greedy)
    tuned, model = tune_all(pair, tds, ref_valid, greedy, BUDGETS, say)
    per_budget = []
    for b in BUDGETS:
        say(f"budget {b:g}: evolving ({a.starts} starts)")
        champ = evolve_champion(data, a.runs_dir, b, a, mode)
        nodes = treeio.parse(champ["tree"])
        tree_rule = TreeRule(nodes, "champion")
        cache: dict = {}
        say(f"budget {b:g}: the champion's alpha on valid")
        alpha = TC.tune(pair, lambda al: TC.between(tree_rule, al, greedy), list(ALPHAS),
                        b, ref_valid, "valid", greedy, lenient=True, cache=cache)
        champ["alpha"] = alpha
        # offline on test: critical tokens per answer on the recorded path
        offline = {}
        rules = {LOSSLESS: None}
        for name, per in tuned.items():
            if name == "weights" or not isinstance(per, dict):
                continue
            t = per.get(b)
            if t is None or t["param"] is None:
                continue
            label = f"{name} (tuned)"
            rules[label] = (judge.rule(model, t["param"], greedy) if name == JUDGE
                            else named_rule(name, t["param"], greedy)[0])
        best = max(((k, per[b]) for k, per in tuned.items()
                    if isinstance(per, dict) and per.get(b) and per[b]["param"] is not None),
                   key=lambda kv: kv[1]["summary"]["tokens_per_call"], default=None)
        if alpha["param"] is not None:
            rules["evolved"] = TC.between(tree_rule, alpha["param"], greedy)
        say(f"budget {b:g}: {len(rules)} rules decode the test problems")
        raw = {label: TC.run_rule(pair, rule, "test", None, greedy)
               for label, rule in rules.items()}          # every rule decoded once
        free = {"split": "test", "decoding": mode, "problems": int(raw[LOSSLESS]["correct"].size),
                "reference": LOSSLESS, "rules": {k: TC.summary(v) for k, v in raw.items()},
                "versus_reference": {k: TC.paired(v, raw[LOSSLESS]) for k, v in raw.items()
                                     if k != LOSSLESS}}
        if best is not None and "evolved" in rules:
            ref_label = f"{best[0]} (tuned)"
            free["evolved_minus_best"] = {"best": ref_label,
                                          **TC.paired(raw["evolved"], raw[ref_label])}
        say(f"budget {b:g}: each start's champion (alpha 1) decodes the test problems")
        for st in champ["starts"]:
            r = TC.run_rule(pair, TreeRule(treeio.parse(st["tree"]), "start"), "test", None,
                            greedy)
            st["free_running_test"] = {**TC.summary(r), "versus_lossless":
                                       TC.paired(r, raw[LOSSLESS])}
        for label, rule in rules.items():
            if label == LOSSLESS:
                continue
            if label == "evolved":
                h = matrix_thresholds(treeio.linearise([nodes]), tds["test"].X)[0]
                h = TC.between_thresholds(h, tds["test"].X, alpha["param"], greedy)
            elif label == f"{JUDGE} (tuned)":
                h = judge.thresholds(model, tds["test"], tuned[JUDGE][b]["param"])
            else:
                name = label[:-len(" (tuned)")]
                h = matrix_thresholds(treeio.linearise([treeio.parse(
                    RULES[name].task_tree(tuned[name][b]["param"], greedy))]),
                    tds["test"].X)[0]
            offline[label] = metrics_of(tds["test"].thresholds_sums(h))
        per_budget.append({"budget": b, "champion": champ, "best_tuned": None if best is None
                           else best[0], "free_running_test": free,
                           "offline_test": offline})
    return mode, {
        "data": _shown(data), "valid_lossless_accuracy": float(ref_valid["correct"].mean()),
        "tuned": {k: ({str(b): v[b] for b in BUDGETS} if k != JUDGE else
                      {**{str(b): v[b] for b in BUDGETS}, "weights": v["weights"]})
                  for k, v in tuned.items()},
        "budgets": per_budget,
        "labels": {s: {"rows": int(len(splits[s])),
                       "labelled": int((splits[s].critical >= 0).sum()),
                       "critical": int((splits[s].critical == 1).sum()),
                       "mined": splits[s].labels_meta.get("mined")}
                   for s in ("train", "valid", "test")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--population", type=int, default=300)
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--data", type=Path, default=paths.DATA_DIR / "task-results",
                    help="where each mode's traces are recorded (<data>/<mode>)")
    ap.add_argument("--runs-dir", type=Path, default=paths.RUNS_DIR / "task-results")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", action="store_true",
                    help="rewrite the section of docs/results/task-world.md and its picture")
    ap.add_argument("--jobs", type=int, default=2,
                    help="decodings run at once, each in its own process [2]")
    quick_and_render_args(ap)
    a = ap.parse_args(argv)
    if rendered(a, markdown, write_page):
        return 0
    sizes = dict(SIZES)
    if a.quick:
        a.starts, a.population, a.generations = 2, 30, 2
        sizes = {m: (60, 30, 30) for m in MODES}
    t0 = time.perf_counter()
    doc = {"commit": _commit(),
           "command": " ".join(["python -m benchmarks.experiments.task_results",
                                *(argv if argv is not None else sys.argv[1:])]),
           "settings": {k: (_shown(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "sizes": sizes, "modes": {}}

    def say(text):
        print(f"[{time.perf_counter() - t0:6.0f} s] {text}", file=sys.stderr)

    a.runs_dir.mkdir(parents=True, exist_ok=True)
    if a.jobs > 1 and len(a.modes) > 1:        # each decoding in its own process
        with ProcessPoolExecutor(max_workers=a.jobs, mp_context=get_context("spawn")) as ex:
            parts = list(ex.map(run_mode, a.modes, [a] * len(a.modes),
                                [sizes] * len(a.modes)))
    else:
        parts = [run_mode(mode, a, sizes) for mode in a.modes]
    doc["modes"] = dict(parts)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1, default=_json) + "\n")
    say(f"{a.out}: written")
    if a.page:
        write_page(doc)
    print(markdown(doc))
    return 0


def _json(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


def _pm(x, se) -> str:
    return f"{x:.3f} ± {se:.3f}"


def _ci(d: dict, scale: float = 1.0, digits: int = 3) -> str:
    lo, hi = d["ci95"]
    return f"{d['difference'] * scale:+.{digits}f} [{lo * scale:+.{digits}f}, {hi * scale:+.{digits}f}]"


def markdown(doc: dict) -> str:
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']} "
             f"({doc.get('seconds', 0) / 60:.0f} minutes on 2 shared cores); figures in "
             "`benchmarks/experiments/task_results.json`.", "",
             "[![Tokens per call gained and accuracy lost against lossless, every rule "
             "tuned on valid](../img/task_results.png)](../img/task_results.png)", "",
             "*Every rule on the test problems, the same uniforms for all, one line each: "
             "the tokens per target call it gains over lossless speculative decoding of the "
             "same pair (left) and the accuracy it loses (right), one row of panels per "
             "decoding and budget, "
             "both paired by problem with 95% intervals; the dashed line is the budget each "
             "rule was tuned to on valid. Drawn by `make figures` from "
             "`benchmarks/experiments/task_results.json`.*", ""]
    for mode, m in doc["modes"].items():
        sz = doc["sizes"][mode]
        lines += [f"**{mode.capitalize()} decoding** ({sz[0]:,} train / {sz[1]:,} valid / "
                  f"{sz[2]:,} test problems; lossless accuracy on valid "
                  f"{m['valid_lossless_accuracy']:.3f}).", ""]
        for pb in m["budgets"]:
            b, free = pb["budget"], pb["free_running_test"]
            ch = pb["champion"]
            lines += [f"Accuracy budget {b:g} (each rule tuned on valid to an accuracy drop "
                      f"of at most {b:g}; test, {free['problems']:,} problems, the same "
                      "uniforms for every rule). Each rule free-running, and on the path the "
                      "standard rule recorded:", "",
                      "| rule | parameter (valid) | accuracy | tokens/call | target calls "
                      "per problem | recorded path: tokens/call | recorded path: critical "
                      "per answer |",
                      "|---|---|---|---|---|---|---|"]
            paired = ["", "Each rule minus lossless, paired by problem (95% intervals):", "",
                      "| rule | accuracy | tokens/call | target calls per problem |",
                      "|---|---|---|---|"]
            for label, s in free["rules"].items():
                if label == LOSSLESS:
                    param, vs, off = "", None, None
                else:
                    name = label[:-len(" (tuned)")] if label.endswith(" (tuned)") else None
                    if label == "evolved":
                        param = f"alpha {ch['alpha']['param']:.4g}"
                    else:
                        param = f"{m['tuned'][name][str(b)]['param']:.4g}"
                    vs = free["versus_reference"][label]
                    off = pb["offline_test"].get(label)
                bold = "**" if label in ("evolved", f"{pb['best_tuned']} (tuned)") else ""
                lines.append(
                    f"| {bold}{label}{bold} | {param} | {_pm(s['accuracy'], s['accuracy_se'])} "
                    f"| {_pm(s['tokens_per_call'], s['tokens_se'])} | "
                    f"{s['calls_per_problem']:.2f} ± {s['calls_se']:.2f} | "
                    f"{'' if off is None else format(off['tokens_per_call'], '.3f')} | "
                    f"{'' if off is None else format(off['critical_per_answer'], '.4f')} |")
                if vs is not None:
                    paired.append(
                        f"| {bold}{label}{bold} | {_ci(vs['accuracy'])} | "
                        f"{_ci(vs['tokens_per_call'])} | "
                        f"{_ci(vs['calls_per_problem'], digits=2)} |")
            lines += paired
            fastest = _fastest(m, b, pb)
            if fastest:
                lines += ["", fastest]
            no_fit = [k for k, v in m["tuned"].items() if v[str(b)]["param"] is None]
            if no_fit:
                lines += ["", f"No parameter fits the budget on valid: {', '.join(no_fit)}."]
            e = free.get("evolved_minus_best")
            lines += [""]
            if e is not None:
                lines.append(
                    f"- evolved minus the best tuned baseline on valid ({e['best']}), paired on "
                    f"test: tokens per call {_ci(e['tokens_per_call'])}, accuracy "
                    f"{_ci(e['accuracy'])}, target calls per problem "
                    f"{_ci(e['calls_per_problem'], digits=2)}.")
            tpcs = [s["test"]["tokens_per_call"] for s in ch["starts"]]
            lines.append(
                f"- evolved: `{ch['expression']}` (seed {ch['chosen_seed']} of "
                f"{len(ch['starts'])}; offline test tokens per call over starts: median "
                f"{np.median(tpcs):.3f}, min {min(tpcs):.3f}, max {max(tpcs):.3f}; its "
                f"standing on valid: {(ch.get('standing') or {}).get('verdict', '?')}), "
                f"alpha {ch['alpha']['param'] if ch['alpha']['param'] is not None else 'none fits'}"
                f" on valid; `{ch['command']}`.")
            fr = [s["free_running_test"] for s in ch["starts"] if "free_running_test" in s]
            if fr:
                gain = [f["versus_lossless"]["tokens_per_call"]["difference"] for f in fr]
                drop = [-f["versus_lossless"]["accuracy"]["difference"] + 0.0 for f in fr]
                lines.append(
                    f"- each start's champion as evolved (alpha 1), free-running on test, over "
                    f"the {len(fr)} starts: tokens per call minus lossless median "
                    f"{np.median(gain):+.3f} (min {min(gain):+.3f}, max {max(gain):+.3f}), "
                    f"accuracy drop median {np.median(drop):.3f} (min {min(drop):.3f}, max "
                    f"{max(drop):.3f}).")
            lines.append("")
        lab = m["labels"]["train"]
        mined = lab.get("mined") or {}
        lines += [f"Labels ({mode}): {lab['labelled']:,} of {lab['rows']:,} train drafts the "
                  f"standard rule could reject, {lab['critical']:,} critical; mining took "
                  f"{mined.get('target_forward_rows', 0):,} target rows in "
                  f"{mined.get('seconds', 0):.0f} s.", ""]
    return "\n".join(lines)


def _fastest(m: dict, b: float, pb: dict) -> str:
    """A line on the time to an answer: of every value decoded on valid within the
    budget (each family's and the champion's alpha), the fewest target calls per
    problem, against the lossless rule's."""
    best = None
    sources = [(k, v[str(b)]["tried"]) for k, v in m["tuned"].items()]
    sources.append(("evolved (alpha)", pb["champion"]["alpha"]["tried"]))
    lossless = None
    for name, tried in sources:
        for t in tried:
            if len(t) < 4:
                return ""
            p, _, drop, calls = t
            if p in (0.0,) and name == "evolved (alpha)":
                lossless = calls
            if drop <= b + 1e-12 and (best is None or calls < best[2]):
                best = (name, p, calls)
    if best is None or lossless is None:
        return ""
    return (f"Time to an answer: of every value decoded on valid within the budget, the "
            f"fewest target calls per problem is {best[0]} at {best[1]:.4g}: {best[2]:.2f}, "
            f"against {lossless:.2f} for the lossless rule (alpha 0).")


def write_page(doc: dict, path: Path | None = None) -> None:
    write_section(markdown(doc), SECTION, path)
    from benchmarks.figures import task_figure    # the picture is make figures' too
    task_figure(doc, PICTURE)


if __name__ == "__main__":
    raise SystemExit(main())
