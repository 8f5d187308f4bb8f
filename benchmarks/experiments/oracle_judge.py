"""Can a judge of the rule inputs find the task world's headroom? A judge taught the
answer oracle's own decisions, decoded free-running.

On the built-in task in greedy decoding the answer oracle (``evolve.rules.oracle``)
saves about 14% of the target calls per correct answer, and no tuned rule or evolved
champion gets a fifth of that. Is the saving out of the inputs' reach, or only out of
the labels' (a critical-token label says nothing of the oracle's second condition: the
text must not get longer)? For each seed of the task (its problems and draft), this
records train with the standard rule, labels every draft the rule could reject with
both of the oracle's conditions (``evolve.data.labels.mine_with_lengths``: is the
answer the same, and how many more tokens the text takes), and fits four logistic
judges (``evolve.rules.judge.fit_xy``), each accepting a draft when its predicted
probability of a bad acceptance is below λ:

- taught the critical-token labels (bad: the answer changes; the learned judge's), or
  the oracle's (bad: the answer changes or the text gets longer);
- on the learned judge's twelve slot inputs, or on every input the task world offers
  that varies on train (the token's class one-hot).

λ is tuned on valid free-running to the fewest target calls per correct answer within
the accuracy budget (``evolve.freerun.task_compare.tune``), and test is decoded once,
paired with lossless decoding and the oracle on the same problems and uniforms.

    python -m benchmarks.experiments.oracle_judge [--seeds 0 1 2] [--train 300]
        [--valid 200] [--test 100] [--budget 0.01] [--page]
    python -m benchmarks.experiments.oracle_judge --data datasets/pairs/smollm2/results/task/greedy \
        --out benchmarks/experiments/real_oracle_judge.json --section real-oracle-judge --page

``--data``: the same study on a greedy task recording of any pair (the real pair's:
its train labels are mined again with lengths, and must be the recorded ones).

The figures go to ``benchmarks/experiments/oracle_judge.json``; ``--page`` writes the
section ``oracle-judge`` of docs/results/task-world.md (``--render JSON --page``: from
the figures of an earlier run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, minutes, publish, write_section  # noqa: E402

from benchmarks.experiments.trace_results import _commit, _shown  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "oracle_judge.json"
SECTION = "oracle-judge"
LABELS = ("critical", "oracle")          # what a judge is taught is a bad acceptance
INPUT_SETS = ("slot", "all")
GRID = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def input_names(X: np.ndarray, rows: np.ndarray) -> list:
    """Every input of the task world's matrix ``X`` (registry order) that is finite and
    varies on the labelled ``rows``."""
    from evolve.lang.primitives import INPUT_INDEX
    out = []
    for name, i in sorted(INPUT_INDEX.items(), key=lambda kv: kv[1]):
        v = X[i, rows]
        if np.all(np.isfinite(v)) and v.std() > 0:
            out.append(name)
    return out


def one_seed(seed: int, a) -> dict:
    """The study on the built-in task of this seed (its problems and draft)."""
    from evolve.data.sources.task import pair as TP, record
    t0 = time.perf_counter()
    pair = TP.build_pair(TP.TaskPairConfig(seed=seed, train_prompts=a.train,
                                           valid_prompts=a.valid, test_prompts=a.test))
    ts = record.record_traces(pair, "train", "greedy", a.train)
    return study(pair, ts, seed, seed, a.valid, a.test, a, t0)


def one_recording(data: Path, a) -> dict:
    """The study on a greedy task recording (``evolve data task``): its pair rebuilt from
    the recording, its train traces labelled again with lengths (the labels must be the
    recorded ones), its first valid and test problems decoded."""
    from evolve.data.sources.task import pair as TP, record
    t0 = time.perf_counter()
    split = record.load(data, "train")
    if split.meta.get("decoding") != "greedy":
        raise SystemExit(f"{data}: a {split.meta.get('decoding')} recording; the study "
                         "decodes greedy recordings only")
    pair = TP.rebuild(split.meta)
    sizes = {s: int(record.load(data, s).meta["task"]["problems"]) for s in ("valid", "test")}
    seed = int(split.meta["config"]["seed"])
    return study(pair, split.traces, seed, _shown(data), min(a.valid, sizes["valid"]),
                 min(a.test, sizes["test"]), a, t0, recorded=split.critical)


def study(pair, ts, label_seed: int, tag, valid: int, test: int, a, t0,
          recorded=None) -> dict:
    """Train's drafts labelled with both of the oracle's conditions, the four judges fit
    on them, λ tuned on ``valid`` problems free-running, ``test`` problems decoded once
    beside lossless decoding and the oracle. ``recorded``: the recording's labels, which
    the new ones must equal."""
    from evolve.data import inputs
    from evolve.data import labels as LB
    from evolve.freerun import task_compare as TC
    from evolve.lang.features import SLOT_SIGNATURE
    from evolve.lang.primitives import INPUT_INDEX
    from evolve.objectives.task_data import GROUPS
    from evolve.rules import judge as J
    from evolve.rules.oracle import AnswerOracle
    labels, extra, cost = LB.mine_with_lengths(
        pair, ts.columns, pair.answer_of, pair.done_of, True, pair.max_new("train"),
        label_seed, pad=pair.pad, max_tokens=pair.max_tokens)
    if recorded is not None and not np.array_equal(labels, recorded):
        raise SystemExit(f"{tag}: the train labels mined again differ from the recorded ones")
    rows = np.flatnonzero(labels >= 0)
    X = inputs.input_matrix(inputs.readable(ts.columns, ts.meta), "drafted", GROUPS)
    crit, ext = labels[rows], extra[rows]
    keeps = (crit == 0) & (ext <= 0)          # the oracle's decision: answer kept, no longer
    bad = {"critical": (crit == 1).astype(np.float64), "oracle": (~keeps).astype(np.float64)}
    names = {"slot": list(SLOT_SIGNATURE), "all": input_names(X, rows)}
    cls = np.unique(X[INPUT_INDEX["token_class"], rows]) if "token_class" in names["all"] \
        else ()
    _say(f"{tag}: {rows.size:,} labelled train drafts, {int(crit.sum()):,} critical, "
         f"{int(keeps.sum()):,} the oracle keeps; "
         f"{time.perf_counter() - t0:.0f} s")
    judges = {}
    for label in LABELS:
        for inp in INPUT_SETS:
            d = J.Design(names[inp], cls if inp == "all" else ())
            model = J.fit_xy(d.matrix(lambda n: X[INPUT_INDEX[n], rows]),
                             bad[label])
            judges[f"{label} labels, {inp} inputs"] = (model, d, label)
    ref = TC.run_rule(pair, None, "valid", valid, True)
    tuned = {}
    for name, (model, d, label) in judges.items():
        t = TC.tune(pair, lambda lam, m=model, d=d, lb=label:
                    J.rule(m, lam, True, d, f"judge[{lb}]"),
                    a.grid, a.budget, ref, "valid", greedy=True, prompts=valid)
        tuned[name] = {"lambda": t["param"], "tried": [list(map(_num, x)) for x in t["tried"]]}
        _say(f"{tag}: {name}: lambda {t['param']} on valid")
    rules = {"lossless": None, "oracle": AnswerOracle()}
    for name, (model, d, label) in judges.items():
        rules[name] = J.rule(model, tuned[name]["lambda"], True, d, f"judge[{label}]")
    res = TC.compare(pair, rules, "test", test, True, progress=_say)
    return {"seed": tag, "train_labelled": int(rows.size), "train_critical": int(crit.sum()),
            "train_oracle_keeps": int(keeps.sum()),
            "train_longer": int(((crit == 0) & (ext > 0)).sum()),
            "train_problems": int(ts.meta["task"]["problems"]), "valid_problems": valid,
            "test_problems": test, "inputs": names, "mining": cost, "tuned": tuned, "test": res,
            "seconds": round(time.perf_counter() - t0, 1)}


def _num(x):
    return None if x is None else (round(float(x), 6) if np.isfinite(x) else None)


def run(a) -> dict:
    t0 = time.perf_counter()
    if a.data:
        seeds = [one_recording(d, a) for d in a.data]
        args = ["--data", *map(_shown, a.data), "--valid", str(a.valid), "--test",
                str(a.test)]
    else:
        seeds = [one_seed(s, a) for s in a.seeds]
        args = ["--seeds", *map(str, a.seeds), "--train", str(a.train), "--valid",
                str(a.valid), "--test", str(a.test)]
    args += ["--budget", str(a.budget)] + (["--grid", *map(str, a.grid)]
                                           if tuple(a.grid) != GRID else [])
    if a.out != OUT:
        args += ["--out", _shown(a.out)]
    if a.section != SECTION:
        args += ["--section", a.section]
    return {"seeds": seeds, "budget": a.budget, "train": a.train, "valid": a.valid,
            "test": a.test, "grid": list(a.grid), "commit": _commit(),
            "data": [_shown(d) for d in a.data] if a.data else None,
            "out": _shown(a.out), "minutes": round((time.perf_counter() - t0) / 60, 1),
            "command": "python -m benchmarks.experiments.oracle_judge " + " ".join(args)}


def markdown(doc: dict) -> str:
    seeds = doc["seeds"]
    names = [k for k in seeds[0]["test"]["rules"] if k != "lossless"]
    out = doc.get("out", "benchmarks/experiments/oracle_judge.json")
    if doc.get("data"):
        s0 = seeds[0]
        what = (f"The greedy recording {', '.join(f'`{d}`' for d in doc['data'])} (its pair "
                f"and task): its {s0['train_problems']} train problems labelled again with "
                f"lengths (the same labels as recorded), λ tuned on {s0['valid_problems']} "
                f"valid problems")
        test = s0["test_problems"]
    else:
        what = (f"Built-in task, greedy decoding, {len(seeds)} seeds of the task (its "
                f"problems and draft); each seed: {doc['train']} train problems labelled, "
                f"λ tuned on {doc['valid']} valid problems")
        test = doc["test"]
    lines = [f"Generated by `{doc['command']} --page` at commit {doc['commit']} "
             f"({minutes(doc['minutes'] * 60)} on 2 shared cores); figures in `{out}`. "
             f"{what} free-running to the fewest target calls per correct answer within "
             f"an accuracy drop of {doc['budget']:g}, {test} test problems decoded "
             "once, paired with lossless decoding on the same problems and uniforms.", "",
             f"| {'recording' if doc.get('data') else 'seed'} | labelled train drafts | "
             "critical | the oracle keeps | harmless but longer |",
             "|---|---|---|---|---|"]
    for s in seeds:
        lines.append(f"| {s['seed']} | {s['train_labelled']:,} | {s['train_critical']:,} | "
                     f"{s['train_oracle_keeps']:,} | {s['train_longer']:,} |")
    if doc.get("data"):
        lines += _recording_tables(seeds, names)
    else:
        lines += _seed_tables(seeds, names)
    return "\n".join(lines) + "\n"


def _recording_tables(seeds: list, names: list) -> list:
    """Each recording's test figures, rule by rule, minus lossless."""
    lines = []
    for s in seeds:
        res = s["test"]
        oracle = res["versus_reference"]["oracle"]["calls_per_problem"]["difference"]
        lines += ["", f"`{s['seed']}`, test, minus lossless (95% paired interval; negative "
                  "is a saving), and the share of the oracle's saving in calls per answer:",
                  "", "| rule | λ (valid) | target calls per correct answer | per answer | "
                  "accuracy | agreement | answer tokens | of the oracle's saving |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in names:
            v = res["versus_reference"][name]
            c, p = v["calls_per_correct"], v["calls_per_problem"]
            cpc = ("" if c is None else
                   f"{c['difference']:+.2f} [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]")
            share = (f"{p['difference'] / oracle + 0.0:.2f}" if name != "oracle" and oracle < 0
                     else "")
            lam = "" if name == "oracle" else f"{s['tuned'][name]['lambda']:g}"
            lines.append(f"| {name} | {lam} | {cpc} | {p['difference']:+.2f} "
                         f"[{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}] | "
                         f"{v['accuracy']['difference']:+.3f} | "
                         f"{res['rules'][name]['agreement']:.3f} | "
                         f"{v['answer_tokens']['difference']:+.1f} | {share} |")
    return lines + ["", *_valid_table(seeds, names)]


def _seed_tables(seeds: list, names: list) -> list:
    """Each rule's test figures per seed, and the judges over λ on valid."""
    lines = []
    lines += ["", "Target calls per correct answer minus lossless on test (95% paired "
              "interval; negative is a saving), the change in accuracy, and λ tuned on valid:", "",
              "| rule | " + " | ".join(f"seed {s['seed']}" for s in seeds) + " | mean |",
              "|---|" + "---|" * (len(seeds) + 1)]
    for name in names:
        cells, means = [], []
        for s in seeds:
            v = s["test"]["versus_reference"][name]
            c = v["calls_per_correct"]
            acc = -v["accuracy"]["difference"]
            lam = "" if name == "oracle" else f", λ {s['tuned'][name]['lambda']:g}"
            if c is None:
                cells.append(f"no correct answer, accuracy {-acc:+.3f}{lam}")
                continue
            lo, hi = c["ci95"]
            means.append(c["difference"])
            cells.append(f"{c['difference']:+.2f} [{lo:+.2f}, {hi:+.2f}], accuracy "
                         f"{-acc:+.3f}{lam}")
        mean = f"{np.mean(means):+.2f}" if len(means) == len(seeds) else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} |")
    return lines + ["", *_valid_table(seeds, names)]


def _valid_table(seeds: list, names: list) -> list:
    """The judges over every λ tried on valid."""
    caps = (0.01, 0.05, 0.2, 0.5)
    many = len(seeds) > 1
    lines = ["Each judge on valid, over every λ tried: the most target calls per answer "
             "(right or wrong) it saves against lossless within each accuracy drop, and "
             "the most calls per correct answer"
             + (" (the best λ of each seed, mean over seeds)" if many else "")
             + "; the oracle saves calls at no drop:", "",
              "| judge | " + " | ".join(f"per answer, drop ≤ {c:g}" for c in caps)
              + " | per correct answer, any drop |", "|---|" + "---|" * (len(caps) + 1)]
    for name in names:
        if name == "oracle":
            continue
        row = []
        for col, cap in [(3, c) for c in caps] + [(4, 1.0)]:
            best = []
            for s in seeds:
                tried = s["tuned"][name]["tried"]
                zero = next(t for t in tried if t[0] == 0.0)
                best.append(max(zero[col] - t[col] for t in tried
                                if t[2] <= cap + 1e-12 and t[col] is not None))
            row.append(f"{np.mean(best):.2f}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--train", type=int, default=300)
    ap.add_argument("--valid", type=int, default=200)
    ap.add_argument("--test", type=int, default=100)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--grid", type=float, nargs="+", default=list(GRID),
                    help="the values of λ tried on valid, strict to lenient")
    ap.add_argument("--data", type=Path, nargs="+", default=None,
                    help="greedy task recordings (evolve data task) to run the study on, "
                         "instead of the built-in task's seeds")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--section", default=SECTION,
                    help="the results page's section --page writes [oracle-judge]")
    ap.add_argument("--page", action="store_true")
    ap.add_argument("--render", type=Path, default=None,
                    help="render an earlier run's figures (its JSON; with --page, onto the "
                         "page) instead of running")
    a = ap.parse_args(argv)
    if a.render is not None:
        text = markdown(json.loads(a.render.read_text()))
        if a.page:
            write_section(text, a.section)
        print(text)
        return 0
    return publish(run(a), a.out, markdown, a.section, a.page)


if __name__ == "__main__":
    raise SystemExit(main())
