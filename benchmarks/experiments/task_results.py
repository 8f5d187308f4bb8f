"""Acceptance rules judged per answer: the task world's results.

On the built-in arithmetic task and its pair (``evolve data task``), for greedy and
for sampled decoding, at accuracy budgets of 1% and 3% (the accuracy drop against
lossless speculative decoding of the same pair):

1. the search (``evolve run --objective task_speed``, multi-start) evolves a rule on
   the train labels with the critical budget per answer set to the accuracy budget;
   the run itself chooses its champion free-running on valid (``--select-problems``);
2. ``evolve tradeoff --data DIR --budget 0.01 --budget 0.03 --run RUN... --prompts 200
   --oracle-prompts 100``
   (``evolve.tradeoff``) does the rest: every rule family of the task world and the
   learned judge tuned on valid free-running to the fewest target calls per correct
   answer within the budget, each champion stepped a fraction alpha of the way from
   the lossless rule with alpha tuned the same way, everything decoded once on the
   test problems with the same uniforms (the first 200 of valid and of test), paired
   with 95% intervals, and the answer oracle's row on the first 100 test problems (it
   continues every rejectable draft to the end of the answer, twice) with every
   rule's share of its saving measured on those problems: the saving any judge could
   have.

This script only records (or reuses) the traces, runs the searches and calls the
trade-off; the figures are the trade-off's report. They go to
``benchmarks/experiments/task_results.json``; ``--page`` rewrites the section of
docs/results/task-world.md and the picture ``docs/img/task_results.png``. On your own
task, the same study is two commands: ``evolve run --objective task_speed --data DIR``
and ``evolve tradeoff --data DIR --budget 0.01 --run RUN --oracle``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from benchmarks.common import ROOT, minutes, write_section  # noqa: E402

import numpy as np  # noqa: E402

import evolve  # noqa: E402
from evolve.data import traces  # noqa: E402
from evolve.data.sources.task import pair as TP  # noqa: E402
from evolve.data.sources.task import record  # noqa: E402
from evolve.io import paths  # noqa: E402
from evolve.runs.rundir import RunDir  # noqa: E402
from evolve.api.tradeoffs import JUDGE_FAMILY  # noqa: E402
from evolve.rules.table import families  # noqa: E402
from benchmarks.experiments.trace_results import (  # noqa: E402  (one copy of each)
    _commit, _shown, quick_and_render_args, rendered)

OUT = ROOT / "benchmarks" / "experiments" / "task_results.json"
PICTURE = ROOT / "docs" / "img" / "task_results.png"
SECTION = "task-results"
BUDGETS = (0.01, 0.03)
MODES = ("greedy", "sample")
SIZES = {"greedy": (1000, 500, 1000), "sample": (600, 400, 800)}   # train, valid, test
LOSSLESS = "lossless"


def recorded(data: Path, mode: str, sizes, seed: int) -> dict:
    """The task traces of ``data`` (the built-in task recorded there first when
    missing; traces of your own task and pair, ``evolve data task --task-file``, are
    used as they are)."""
    missing = [s for s in ("train", "valid", "test") if not (data / f"{s}.npz").exists()]
    if missing:
        cfg = TP.TaskPairConfig(seed=seed, train_prompts=sizes[0], valid_prompts=sizes[1],
                                test_prompts=sizes[2])
        pair = TP.build_pair(cfg)
        data.mkdir(parents=True, exist_ok=True)
        for split in missing:                  # (a split recorded before is kept)
            t = time.perf_counter()
            record.save(record.record_split(pair, split, mode, seed), data)
            print(f"{mode}: recorded {split} ({time.perf_counter() - t:.0f} s)",
                  file=sys.stderr)
    meta = traces.read_file_meta(data / "test.npz")
    if meta.get("decoding") != mode:
        raise SystemExit(f"{data}: the traces are {meta.get('decoding')}, not {mode}")
    return {s: record.load(data, s) for s in ("train", "valid", "test")}


def evolve_champion(data: Path, runs_dir: Path, budget: float, a, mode: str) -> dict:
    name = f"evolved-{mode}-b{budget:g}"
    opts = dict(objective="task_speed", critical_budget=budget, starts=a.starts, seed=a.seed,
                population=a.population, generations=a.generations, seed_baselines=True,
                tournament=3)
    folder = runs_dir / name
    done = folder / "summary.json"
    if a.reuse_runs and (folder / "config.json").exists():
        kept = RunDir(folder).meta()["config"]      # checked: a bad one is one line
        other = sorted(k for k, v in opts.items() if kept.get(k) != v)
        if other:
            raise SystemExit(f"{folder}: a search with other settings ({other[0]} "
                             f"{kept.get(other[0])!r}, not {opts[other[0]]!r}); remove it "
                             "or give another --runs-dir")
    if a.reuse_runs and done.exists() and json.loads(done.read_text()).get("status") == "finished":
        res = evolve.load_run(folder)               # the same command, run before
    elif a.reuse_runs and (folder / "config.json").exists():
        # the same command, cut off: its finished starts are kept and the rest continue
        res = evolve.run(data_dir=data, runs_dir=runs_dir, resume=name, writeback=False)
    else:
        res = evolve.run(data_dir=data, runs_dir=runs_dir, name=name, writeback=False,
                         force=True, **opts)
    ch = res.champion
    cmd = (f"evolve run --objective task_speed --budget-critical {budget:g} --starts "
           f"{a.starts} --seed {a.seed} --population {a.population} --generations "
           f"{a.generations} --seed-baselines --tournament 3 --data {_shown(data)} "
           f"--name {name}")
    return {"budget": budget, "command": cmd, "name": name, "path": res.path,
            "run": _shown(res.path), "expression": ch["expression"],
            "chosen_seed": ch.get("chosen_seed"),
            "verdict": (ch.get("standing") or {}).get("verdict")}


def run_mode(mode: str, a, sizes: dict) -> tuple:
    """One decoding's results: record (or reuse) its traces, evolve a champion per
    budget, and the trade-off of every rule with the oracle. Returns (mode, its part)."""
    t0 = time.perf_counter()

    def say(text):
        print(f"[{time.perf_counter() - t0:6.0f} s] {mode}: {text}", file=sys.stderr,
              flush=True)

    data = a.data / mode
    splits = recorded(data, mode, sizes[mode], a.seed)
    champions = []
    for b in a.budgets:
        say(f"budget {b:g}: evolving ({a.starts} starts)")
        champions.append(evolve_champion(data, a.runs_dir, b, a, mode))
    say("the trade-off: every rule tuned on valid, decoded on test, and the oracle")
    fams = None if a.families is None else [   # those of this decoding (an engine's knob
        f for f in a.families                  # exists in one)
        if f == JUDGE_FAMILY or f in families("task", mode)]
    t = evolve.tradeoff(data, budgets=list(a.budgets), runs=[c.pop("path") for c in champions],
                        runs_dir=a.runs_dir, oracle=a.oracle_prompts or False,
                        prompts=a.prompts, progress=say, families=fams)
    cmd = (f"evolve tradeoff --data {_shown(data)} "
           + " ".join(f"--budget {b:g}" for b in a.budgets) + " "
           + " ".join(f"--run {c['name']}" for c in champions)
           + ("" if a.prompts is None else f" --prompts {a.prompts}")
           + (f" --oracle-prompts {a.oracle_prompts}" if a.oracle_prompts else "")
           + "".join(f" --family {f}" for f in fams or ()))
    report = {k: v for k, v in t.report.items() if k not in ("runs",)}
    report["data"] = _shown(Path(report["data"]))
    for e in report["budgets"]:
        for r in e["rows"]:
            r.pop("tried", None)
    return mode, {
        "data": _shown(data), "champions": champions, "tradeoff": report,
        "tradeoff_command": cmd,
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
    ap.add_argument("--prompts", type=int, default=200,
                    help="valid problems each rule is tuned on and test problems it is "
                         "reported on (the first of each split) [200]")
    ap.add_argument("--oracle-prompts", type=int, default=100,
                    help="test problems the answer oracle decodes (every share is measured "
                         "on them; 0: no oracle, as on a Hugging Face pair) [100]")
    ap.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS),
                    help="accuracy budgets [0.01 0.03]")
    ap.add_argument("--section", default=SECTION,
                    help="the results page's section written with --page [task-results]")
    ap.add_argument("--picture", type=Path, default=PICTURE,
                    help="the picture written with --page [docs/img/task_results.png]")
    ap.add_argument("--families", nargs="+", default=None,
                    help="tune only these rule families (learned_judge: the learned judge) "
                         "[every one of the decoding, and the learned judge]")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="keep a finished search of the same name under --runs-dir, and continue "
                         "one that was cut off (its settings must be the same)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the results of the decodings not run here from --out (each "
                         "one names the command and commit it came from)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="decodings run at once, each in its own process [2]")
    quick_and_render_args(ap)
    a = ap.parse_args(argv)
    if rendered(a, markdown, lambda doc: write_page(doc, section=a.section,
                                                    picture=a.picture)):
        return 0
    sizes = dict(SIZES)
    if a.quick:
        a.starts, a.population, a.generations, a.oracle_prompts, a.prompts = 2, 30, 2, 10, None
        sizes = {m: (60, 30, 30) for m in MODES}
    t0 = time.perf_counter()
    doc = {"commit": _commit(),
           "command": " ".join(["python -m benchmarks.experiments.task_results",
                                *(_shown(Path(x)) if Path(x).is_absolute() else x
                                  for x in (argv if argv is not None else sys.argv[1:]))]),
           "settings": {k: (_shown(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "modes": {}}
    a.runs_dir.mkdir(parents=True, exist_ok=True)
    if a.jobs > 1 and len(a.modes) > 1:        # each decoding in its own process
        with ProcessPoolExecutor(max_workers=a.jobs, mp_context=get_context("spawn")) as ex:
            parts = list(ex.map(run_mode, a.modes, [a] * len(a.modes),
                                [sizes] * len(a.modes)))
    else:
        parts = [run_mode(mode, a, sizes) for mode in a.modes]
    doc["modes"] = dict(parts)
    if a.merge and a.out.exists():
        doc["modes"] = merged(json.loads(a.out.read_text()), doc["modes"])
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1, default=_json) + "\n")
    print(f"{a.out}: written", file=sys.stderr)
    if a.page:
        write_page(doc, section=a.section, picture=a.picture)
    print(markdown(doc))
    return 0


def merged(old: dict, new: dict) -> dict:
    """The decodings of ``new``, with those only ``old`` has kept, each kept one naming
    the command and commit it came from; in the order of MODES."""
    out = {}
    for mode in MODES:
        if mode in new:
            out[mode] = new[mode]
        elif mode in old.get("modes", {}):
            kept = dict(old["modes"][mode])
            kept.setdefault("kept_from", {"command": old.get("command"),
                                          "commit": old.get("commit"),
                                          "seconds": old.get("seconds")})
            out[mode] = kept
    return out


def _json(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return _shown(o)
    raise TypeError(type(o))


def _ci(d: dict | None, digits: int = 3) -> str:
    if d is None:
        return "n/a"
    lo, hi = d["ci95"]
    return f"{d['difference']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _pm(s: dict, key: str, se: str, digits: int = 3) -> str:
    x = s.get(key)
    if x is None or not np.isfinite(x):
        return "n/a"
    e = s.get(se)
    return f"{x:.{digits}f}" + ("" if e is None or not np.isfinite(e) else f" ± {e:.{digits}f}")


def _param(row: dict) -> str:
    if row["kind"] == "oracle":
        return "(a bound)"
    if row["param"] is None:
        return "none fits"
    return f"alpha {row['param']:.4g}" if row["kind"] == "run" else f"{row['param']:.4g}"


def markdown(doc: dict) -> str:
    st = doc.get("settings", {})
    out = st.get("out", "benchmarks/experiments/task_results.json")
    img = "../img/" + Path(st.get("picture") or PICTURE).name
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']} "
             f"({minutes(doc.get('seconds', 0))} on 2 shared cores); figures in "
             f"`{out}`.", "",
             "[![Target calls per correct answer saved against lossless, and accuracy "
             f"lost, every rule tuned on valid]({img})]({img})", "",
             "*Every rule on the test problems, the same uniforms for all, one line each: "
             "the target calls per correct answer it saves against lossless speculative "
             "decoding of the same pair (left"
             + ("; the oracle, decoded on the first test problems, is what a judge of a "
                "draft could save" if any(m["tradeoff"].get("oracle_problems")
                                          for m in doc["modes"].values()) else "")
             + ") and the accuracy it loses "
             "(right), one row of panels per decoding and "
             "budget, both paired by problem with 95% intervals; the dashed line is the "
             "budget each rule was tuned to on valid. Drawn "
             + ("by `make figures` " if out == _shown(OUT) else "") + f"from `{out}`.*", ""]
    for mode, m in doc["modes"].items():
        rep = m["tradeoff"]
        sz = rep["sizes"]
        ll = rep["lossless"]["test"]
        on = rep.get("oracle_problems")
        lines += [f"**{mode.capitalize()} decoding** ({sz['train']:,} train / {sz['valid']:,} "
                  f"valid / {sz['test']:,} test problems; rules tuned on the first "
                  f"{rep['problems']['valid']:,} of valid and decoded on the first "
                  f"{rep['problems']['test']:,} of test"
                  + (f", the oracle on the first {on:,} of those, its row and every rule's "
                     "share of its saving measured on them" if on else "")
                  + "; lossless on test: accuracy "
                  f"{ll['accuracy']:.3f}, {ll['calls_per_correct']:.2f} target calls per "
                  f"correct answer, {ll['calls_per_problem']:.2f} per answer, "
                  f"{ll['tokens_per_call']:.3f} tokens per call). The trade-off: "
                  f"`{m['tradeoff_command']}`."
                  + (f" Kept from an earlier run: `{m['kept_from']['command']}` at commit "
                     f"{m['kept_from']['commit']}." if m.get("kept_from") else ""), ""]
        champs = {label: c for c in m["champions"] for label in (c["name"], f"run {c['name']}")}
        for entry in rep["budgets"]:
            b = entry["budget"]
            lines += [f"Accuracy budget {b:g} (each rule tuned on valid to the fewest target "
                      f"calls per correct answer within an accuracy drop of {b:g}; test, "
                      f"{rep['problems']['test']:,} problems, the same uniforms for every "
                      "rule):", "",
                      "| rule | parameter (valid) | target calls per correct answer | "
                      "per answer | accuracy | agreement with lossless | answer tokens | "
                      "tokens/call | of oracle |",
                      "|---|---|---|---|---|---|---|---|---|",
                      f"| {LOSSLESS} |  | {_pm(ll, 'calls_per_correct', 'calls_per_correct_se', 2)}"
                      f" | {_pm(ll, 'calls_per_problem', 'calls_se', 2)} | "
                      f"{_pm(ll, 'accuracy', 'accuracy_se')} | 1.000 | "
                      f"{_pm(ll, 'answer_tokens', 'answer_tokens_se', 1)} | "
                      f"{_pm(ll, 'tokens_per_call', 'tokens_se')} | 0 |"]
            paired = ["", "Each rule minus lossless, paired by problem (95% intervals; "
                      "negative calls are a saving):", "",
                      "| rule | target calls per correct answer | per answer | accuracy | "
                      "agreement | tokens/call |", "|---|---|---|---|---|---|"]
            rows = sorted(entry["rows"], key=lambda r: (r["test"] is None, (r["test"] or {})
                                                        .get("calls_per_correct", 0)))
            for r in rows:
                s = r["test"]
                bold = "**" if r["rule"] == entry["best"] or r["kind"] == "run" else ""
                name = f"{bold}{r['rule']}{bold}"
                if s is None:
                    lines.append(f"| {name} | {_param(r)} | | | | | | | |")
                    continue
                share = r.get("oracle_share")
                lines.append(
                    f"| {name} | {_param(r)} | {_pm(s, 'calls_per_correct', 'calls_per_correct_se', 2)}"
                    f" | {_pm(s, 'calls_per_problem', 'calls_se', 2)} | "
                    f"{_pm(s, 'accuracy', 'accuracy_se')} | {_pm(s, 'agreement', 'agreement_se')} | "
                    f"{_pm(s, 'answer_tokens', 'answer_tokens_se', 1)} | "
                    f"{_pm(s, 'tokens_per_call', 'tokens_se')} | "
                    f"{'' if share is None else format(share, '.2f')} |")
                vs = r["versus_lossless"]
                paired.append(f"| {name} | {_ci(vs['calls_per_correct'], 2)} | "
                              f"{_ci(vs['calls_per_problem'], 2)} | {_ci(vs['accuracy'])} | "
                              f"{_ci(vs.get('agreement'))} | {_ci(vs['tokens_per_call'])} |")
            lines += paired + [""]
            for r in rows:
                if r["kind"] != "run":
                    continue
                c = champs.get(r["rule"], {})
                vb = r.get("versus_best")
                head = (f"- `{r['rule']}` (searched at budget {c.get('budget', float('nan')):g}): "
                        f"`{c.get('expression', '?')}`, its run's verdict on valid "
                        f"free-running: {c.get('verdict') or '?'}; `{c.get('command', '')}`.")
                lines.append(head)
                if vb is not None and r["test"] is not None:
                    lines.append(f"  Minus the best tuned baseline ({entry['best']}), paired on "
                                 f"test: target calls per correct answer "
                                 f"{_ci(vb['calls_per_correct'], 2)}, accuracy "
                                 f"{_ci(vb['accuracy'])}.")
                elif r["test"] is None:
                    lines.append("  No step from lossless towards it fits the budget on valid.")
            no_fit = [r["rule"] for r in rows if r["kind"] in ("family", "judge")
                      and not r["fits_valid"]]
            if no_fit:
                lines += ["", f"No parameter fits the budget on valid: {', '.join(no_fit)}."]
            lines.append("")
        lab = m["labels"]["train"]
        mined = lab.get("mined") or {}
        lines += [f"Labels ({mode}): {lab['labelled']:,} of {lab['rows']:,} train drafts the "
                  f"standard rule could reject, {lab['critical']:,} critical; mining took "
                  f"{mined.get('target_forward_rows', 0):,} target rows in "
                  f"{mined.get('seconds', 0):.0f} s.", ""]
    return "\n".join(lines)


def write_page(doc: dict, path: Path | None = None, section: str = SECTION,
               picture: Path = PICTURE) -> None:
    write_section(markdown(doc), section, path)
    from benchmarks.figures import task_figure    # the picture is make figures' too
    task_figure(doc, picture)


if __name__ == "__main__":
    raise SystemExit(main())
