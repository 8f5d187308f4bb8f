"""The trace results of docs/results/traces.md, reproduced from scratch: `make results`.

For each TV budget (0.01 and 0.03 per token) on the default n-gram traces (or
any traces with --data; `make results-neural` runs it on the neural pair's):

1. evolve with several starts (`evolve run --objective speed --starts N`, the
   champion chosen on valid only) three times: plain; with the mean slot TV of
   every block position capped at tuned leniency's largest (on valid,
   `--cap-tv-position`); and with the 99th percentile of slot TV capped at the
   best tuned baseline's (step 2; on valid, `--cap-tv-p99`), so the champion
   cannot buy its tokens by spending its distortion at one position or on a few
   slots, and its tail is no heavier than the reference's;
2. tune every rule family of the rules table (``evolve.rules.table``: the
   literature's, the slot-spending baselines Cactus and fuzzy SD, the engines'
   own knobs hf_ensemble, sglang_acc, sglang_single) and leniency with one
   parameter per block position on valid; a family whose objectives are not
   exact on these traces (the SGLang ones unless top-k = vocabulary, the slot
   baselines on traces without slot features) is listed with the reason. The
   best tuned baseline is the one with the most tokens per call on valid;
3. report everything on test offline (exact objectives: tokens per call, TV,
   99th percentile of slot TV, KL; the knapsack oracle's share), and
4. compare the champions with the best tuned baseline (the reference) and both
   tuned leniencies in paired free-running decoding on the test prompt pool (the
   same prompts and uniforms for every rule, standard errors by sequence, 95%
   intervals).

Writes benchmarks/experiments/trace_results.json (commands, seeds, trees, commit, every
figure) and, with --page, the tables between the results markers of
the section's page (docs/results/traces.md for trace-results). Usage:

    python -m benchmarks.experiments.trace_results [--starts 5] [--population 500]
        [--generations 40] [--prompts 8192] [--page]
    python -m benchmarks.experiments.trace_results --quick     # tiny sizes, a smoke test

Free-running decoding uses the pair that recorded the traces: the n-gram pair
rebuilt from its configuration, or the Hugging Face models named in an hf
split's meta.json (``evolve.data.sources.hf.free``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, write_section  # noqa: E402

import evolve  # noqa: E402
from evolve.freerun import paired  # noqa: E402
from evolve.data import traces  # noqa: E402
from evolve.data.sources import ngram  # noqa: E402
from evolve.data.sources.registry import source_of_pair  # noqa: E402
from evolve.lang import primitives as P  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules import headroom, tuning  # noqa: E402
from evolve.rules.adapters import TreeRule, named_rule  # noqa: E402
from evolve.rules.table import engine_families  # noqa: E402
from evolve.io import paths  # noqa: E402

BUDGETS = (0.01, 0.03)
OUT = ROOT / "benchmarks" / "experiments" / "trace_results.json"
VARIANTS = ("plain", "cap", "p99", "lookahead")
DEFAULT_VARIANTS = ("plain", "cap", "p99")
SECTION = "trace-results"       # markers <!-- SECTION:begin/end --> on docs/results/traces.md
OPTION = {"tv_budget": "budget-tv", "kl_budget": "budget-kl", "tv_position_cap": "cap-tv-position",
          "tv_p99_cap": "cap-tv-p99",
          "population": "population", "generations": "generations", "seed": "seed",
          "starts": "starts", "objective": "objective", "tournament": "tournament"}
FLAGS = {"seed_baselines": "--seed-baselines", "lookahead": "--lookahead"}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _shown(path: Path) -> str:
    """A path as a command shows it: relative to the checkout when inside it (a
    symlinked data folder stays inside it, as the user would type it)."""
    for p in (Path(os.path.abspath(path)), Path(path).resolve()):
        try:
            return str(p.relative_to(ROOT))
        except ValueError:
            pass
    return str(path)


def quick_and_render_args(ap: argparse.ArgumentParser) -> None:
    """The two options every results script takes: --quick and --render."""
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="only print (and with --page write) the tables of a results file")


def rendered(a: argparse.Namespace, markdown, write) -> bool:
    """With --render: print the tables of that results file (``markdown(doc)``) and, with
    --page, ``write(doc)`` them into the page; False (nothing done) without it."""
    if a.render is None:
        return False
    doc = json.loads(a.render.read_text())
    if a.page:
        write(doc)
    print(markdown(doc))
    return True


def _traces(data_dir: Path, quick: bool, top_k: int | None = None) -> dict:
    if not (data_dir / "train.npz").exists() and data_dir.name.startswith("neural-traces"):
        raise SystemExit(f"{data_dir}: no traces; record them with `make neural-pair "
                         "neural-traces` (or `make results-engines-neural`)")
    if not (data_dir / "train.npz").exists():
        cfg = ngram.TraceConfig(**(QUICK_TRACES if quick else {}),
                                **({} if top_k is None else {"top_k": top_k}))
        print(f"building traces in {data_dir} ...", file=sys.stderr)
        ngram.build_splits(cfg, data_dir)
    return traces.load_splits(data_dir)


QUICK_LOOKAHEAD_SLOTS = 16     # --quick: the TV of a lookahead rule at this many slots
QUICK_TRACES = dict(seed=3, max_files=60, max_bytes_per_file=40_000, train_prompts=24,
                    valid_prompts=64, test_prompts=32, blocks_per_prompt=8)


def _pair(ts, data_dir: Path):
    """The pair that recorded the traces, for free-running: n-gram or Hugging Face."""
    if ts.backend == "hf":
        from evolve.data.sources.hf import free as hf_free
        return hf_free.load(ts, str(data_dir / "test.npz"))
    return ngram.build_pair(ngram.config_of(ts))


OFFLINE_KEYS = ("tokens_per_call", "tokens_se", "tv_per_token", "tv_p99", "kl_per_token",
                "tv_by_position")
POSITION = "per-position leniency"


def _offline(nodes, sa) -> dict:
    o = spec.objectives(sa, tuning.tree_thresholds(nodes, sa)).to_dict()
    return {k: o[k] for k in OFFLINE_KEYS}


def tuned_baselines(sas: dict, budget: float, position=None) -> dict:
    """Every rule family but standard rejection tuned on valid to ``budget`` and
    reported on test (exact objectives, with the family's own residual and tail):
    name -> row. A family not exact on these splits carries ``not_exact`` (why)
    and no numbers; one no parameter of which fits on valid, ``fits_valid`` False.
    ``position``: ``(ls, valid objectives)`` of the tuned per-position leniency,
    added as the row ``POSITION``."""
    rows = {}
    for name in tuning.families():
        if name == "standard_rejection":
            continue
        r = tuning.RULES[name]
        why = tuning.scorable(name, sas["valid"]) or tuning.scorable(name, sas["test"])
        rep = None if why else tuning.tuned_report(name, sas["valid"], sas["test"], budget)
        row = {"rule": name, "engine": r.engine, "param": None, "fits_valid": rep is not None}
        if why:
            row["not_exact"] = why
        if rep is not None:
            row.update(label=r.label(rep["param"]), param=rep["param"],
                       setting=r.engine_setting(rep["param"]),
                       valid={k: rep["valid"][k] for k in ("tokens_per_call", "tv_per_token",
                                                   "tv_p99")},
                       test={k: rep["test"][k] for k in OFFLINE_KEYS})
        rows[name] = row
    if position is not None and position[0] is not None:
        ls, o = position
        nodes = treeio.parse(headroom.position_leniency_tree(ls))
        rows[POSITION] = {"rule": POSITION, "engine": None, "param": list(ls),
                          "fits_valid": True, "label": "per-position leniency (tuned)",
                          "setting": None,
                          "valid": {"tokens_per_call": o.tokens_per_call,
                                    "tv_per_token": o.tv_per_token,
                                    "tv_p99": _offline(nodes, sas["valid"])["tv_p99"]},
                          "test": _offline(nodes, sas["test"])}
    return rows


def best_baseline(rows: dict) -> str | None:
    """The fitted row with the most tokens per call on valid (ties: the first)."""
    best = None
    for name, row in rows.items():
        if row["fits_valid"] and (best is None or row["valid"]["tokens_per_call"]
                                  > rows[best]["valid"]["tokens_per_call"]):
            best = name
    return best


def _baseline_rule(name: str, row: dict):
    """(label, decoder rule) of a tuned-baseline row, with its residual and scope."""
    if name == POSITION:
        return "per-position leniency (tuned)", TreeRule(
            treeio.parse(headroom.position_leniency_tree(row["param"])), POSITION)
    if name == "leniency":
        return "leniency (tuned)", named_rule(name, row["param"])[0]
    return f"{row['label']} (best tuned baseline)", named_rule(name, row["param"])[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--population", type=int, default=500)
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=8192)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--data", type=Path, default=paths.TRACES_DIR)
    ap.add_argument("--runs-dir", type=Path, default=paths.RUNS_DIR / "trace-results")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", "--readme", dest="page", action="store_true",
                    help="rewrite the results tables of the section's page under "
                         "docs/results/ (--readme: the name the recorded commands use)")
    ap.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(DEFAULT_VARIANTS),
                    help="which evolved champions: plain, cap (mean slot TV per position "
                         "capped), p99 (99th percentile of slot TV capped), lookahead (p99 "
                         "capped, the search also offered next_tv and ahead); none: only "
                         "the tuned baselines [plain cap p99]")
    ap.add_argument("--engines", action="store_true",
                    help="also decode every tuned engine family (the engines' own knobs) "
                         "free-running against the reference")
    ap.add_argument("--top-k", type=int, default=None,
                    help="the candidates per drafted position of n-gram traces this script "
                         "records (default: the trace default; the vocabulary, 256, makes "
                         "the SGLang knobs exact)")
    ap.add_argument("--section", default=SECTION,
                    help="the page markers to write between (<!-- SECTION:begin -->)")
    ap.add_argument("--lookahead-slots", type=int, default=None,
                    help="reached slots at which the free-running TV of a rule that reads "
                         "a lookahead input is estimated (default: the pair's, 2,000 on the "
                         "n-gram pair, 300 on a Hugging Face pair; --quick: %d)" % QUICK_LOOKAHEAD_SLOTS)
    quick_and_render_args(ap)
    a = ap.parse_args(argv)
    if rendered(a, markdown, lambda doc: write_page(doc, a.section)):
        return 0
    if a.quick:
        a.starts, a.population, a.generations, a.prompts, a.blocks = 2, 40, 3, 32, 4
        a.lookahead_slots = QUICK_LOOKAHEAD_SLOTS
    t0 = time.perf_counter()
    splits = _traces(a.data, a.quick, a.top_k)
    sas = {k: spec.TraceArrays.from_split(v) for k, v in splits.items()}
    pair = _pair(splits["test"], a.data)
    slots, futures = source_of_pair(pair).lookahead     # recorded as used, not as None
    a.lookahead_slots = a.lookahead_slots or slots
    doc = {"commit": _commit(), "data": _shown(a.data),
           "command": " ".join(["python -m benchmarks.experiments.trace_results", *(
               argv if argv is not None else sys.argv[1:])]),
           "settings": vars(a) | {
        "data": _shown(a.data), "runs_dir": _shown(a.runs_dir), "out": _shown(a.out),
        "render": None, "lookahead_futures": futures}, "budgets": []}
    a.runs_dir.mkdir(parents=True, exist_ok=True)
    for budget in BUDGETS:
        print(f"budget {budget}: tuning baselines on valid", file=sys.stderr)
        lenient = tuning.tune("leniency", sas["valid"], budget)
        len_nodes = treeio.parse(tuning.RULES["leniency"].tree(lenient.param))
        ls, pos_valid = headroom.tune_position_leniency(sas["valid"], budget)
        pos_nodes = treeio.parse(headroom.position_leniency_tree(ls))
        len_valid = spec.objectives(sas["valid"], tuning.tree_thresholds(len_nodes, sas["valid"]))
        cap = max(len_valid.tv_by_position)
        table = tuned_baselines(sas, budget, (ls, pos_valid))
        best = best_baseline(table)
        p99 = table[best]["valid"]["tv_p99"]    # the tail the champion may not exceed
        ref_label, ref_rule = _baseline_rule(best, table[best])
        rules = {"leniency (tuned)": (len_nodes, {"l": lenient.param}),
                 "per-position leniency (tuned)": (pos_nodes, {"l": list(ls)})}
        runs = {}
        variants = (("evolved", "plain", {}),
                    ("evolved, slot TV capped", "cap", {"tv_position_cap": round(cap, 6)}),
                    ("evolved, slot TV p99 capped", "p99", {"tv_p99_cap": round(p99, 6)}),
                    ("evolved with lookahead, slot TV p99 capped", "lookahead",
                     {"tv_p99_cap": round(p99, 6), "lookahead": True}))
        for variant, tag, extra in (v for v in variants if v[1] in a.variants):
            name = f"b{budget:g}-{tag}-{int(time.time())}"
            opts = dict(objective="speed", tv_budget=budget, starts=a.starts, seed=a.seed,
                        population=a.population, generations=a.generations,
                        seed_baselines=True, tournament=3, **extra)
            print(f"budget {budget}: {variant}: {a.starts} starts", file=sys.stderr)
            res = evolve.run(data_dir=a.data, runs_dir=a.runs_dir, name=name, writeback=False,
                             **opts)
            ch = res.champion
            cmd = "evolve run " + " ".join(
                FLAGS[k] if k in FLAGS else f"--{OPTION.get(k, k)} {v}"
                for k, v in opts.items()) + f" --data {_shown(a.data)}"
            runs[variant] = {"command": cmd, "run": str(res.path), "tree": ch["tree"],
                             "expression": ch["expression"], "chosen_seed": ch["chosen_seed"],
                             "over_starts": ch["over_starts"],
                             "starts": [{k: s[k] for k in ("seed", "tree", "valid_score")}
                                        | {"test_tokens_per_call": s["test"]["tokens_per_call"]}
                                        for s in ch["starts"]]}
            rules[variant] = (treeio.parse(ch["tree"]), {})
        std = tuning.evaluate("standard_rejection", sas["test"]).tokens
        oracle = headroom.knapsack_oracle(sas["test"], budget).tokens_per_call
        offline = {}
        if ref_label not in rules:      # its own residual and tail: the tuned row's numbers
            offline[ref_label] = dict(table[best]["test"], params={
                table[best]["rule"]: table[best]["param"]})
        engine_rules = {}
        if a.engines:        # their own residual and tail: the tuned rows' numbers
            for name in engine_families():
                row = table.get(name)
                if row and row["fits_valid"] and name != best:
                    label = f"{row['label']} (tuned)"
                    engine_rules[label] = _baseline_rule(name, row)[1]
                    offline[label] = dict(row["test"], params={name: row["param"]})
        for label, (nodes, params) in rules.items():
            o = _offline(nodes, sas["test"])
            o["params"] = params
            offline[label] = o
        for o in offline.values():
            o["oracle_share"] = (o["tokens_per_call"] - std) / (oracle - std)
        for row in table.values():
            if row["fits_valid"]:
                row["test"]["oracle_share"] = (row["test"]["tokens_per_call"] - std) / (oracle - std)
        print(f"budget {budget}: paired free-running decoding, {a.prompts} prompts",
              file=sys.stderr)
        decoders = {ref_label: ref_rule}          # the reference first
        decoders.update({k: TreeRule(v[0], k) for k, v in rules.items() if k != ref_label})
        decoders.update(engine_rules)
        free = paired.compare(pair, decoders, split="test", prompts=a.prompts,
                              blocks=a.blocks, seed=a.seed,
                              lookahead_slots=a.lookahead_slots)
        doc["budgets"].append({"budget": budget, "standard_tokens_per_call": std,
                               "oracle_tokens_per_call": oracle, "runs": runs,
                               "tuned_baselines": table,
                               "best_tuned_baseline": {"rule": best, "label": ref_label},
                               "offline_test": offline, "free_running_test": free})
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{a.out}: written ({doc['seconds']} s)", file=sys.stderr)
    if a.page:
        write_page(doc, a.section)
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    s = doc["settings"]
    cmd = doc.get("command", "python -m benchmarks.experiments.trace_results")
    make = (" (`make results`)" if cmd in ("python -m benchmarks.experiments.trace_results --page",
                                         "python -m benchmarks.experiments.trace_results --readme") else "")
    lines = [f"Generated by `{cmd}`{make} at commit "
             f"{doc['commit']}: "
             + (f"{s['starts']} starts of population {s['population']} x "
                f"{s['generations']} generations per champion"
                if s.get("variants", VARIANTS) else "tuned baselines only, no evolved champions")
             + f", free-running on {s['prompts']} test "
             f"prompts x {s['blocks']} blocks; figures in `{s.get('out', 'benchmarks/experiments/trace_results.json')}`.",
             ""]
    for b in doc["budgets"]:
        lines += [f"**TV budget {b['budget']:g}** (test; standard rejection "
                  f"{b['standard_tokens_per_call']:.4f} tokens/call, knapsack oracle "
                  f"{b['oracle_tokens_per_call']:.4f}):", "",
                  "| rule | offline tokens/call | TV/token | slot TV p99 | KL/token | of oracle "
                  "| free-running tokens/call | free-running TV/token | minus the reference "
                  f"({free_ref(b)}; 95% interval) | draft log-lik. minus the reference's |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        free = b["free_running_test"]
        for label, o in b["offline_test"].items():
            fr = free["rules"][label]
            vs = free["versus_reference"].get(label)
            diff = "(reference)" if vs is None else (
                f"{vs['tokens_per_call']['difference']:+.4f} "
                f"[{vs['tokens_per_call']['ci95'][0]:+.4f}, {vs['tokens_per_call']['ci95'][1]:+.4f}]")
            steer = "" if vs is None else (
                f"{vs['draft_loglik_per_token']['difference']:+.4f} ± "
                f"{vs['draft_loglik_per_token']['se']:.4f}")
            kind = (fr.get("distortion") or {}).get("kind", "exact")
            free_tv = f"{fr['tv_per_token']:.4f}" + (f" ± {fr['tv_se']:.4f} (estimate)"
                                                     if kind == "estimate" else "")
            lines.append(f"| {label} | {o['tokens_per_call']:.4f} | {o['tv_per_token']:.4f} | "
                         f"{o['tv_p99']:.4f} | {o['kl_per_token']:.4f} | "
                         f"{100 * o['oracle_share']:.0f}% | {fr['tokens_per_call']:.4f} ± "
                         f"{fr['tokens_se']:.4f} | {free_tv} | {diff} | {steer} |")
        lines.append("")
        lines += baselines_markdown(b)
        for variant, r in b["runs"].items():
            o = r["over_starts"]
            lines.append(f"- {variant}: `{r['expression']}` (seed {r['chosen_seed']} of "
                         f"{len(r['starts'])}; test tokens/call over starts: median "
                         f"{o['median']:.4f}, min {o['min']:.4f}, max {o['max']:.4f}); "
                         f"`{r['command']}`")
            if "--lookahead" in r["command"]:
                fr = free["rules"].get(variant) or {}
                d = fr.get("distortion") or {}
                if d.get("kind") == "estimate":
                    tv = ("its TV is estimated"
                          f" at {d['slots']:,} of {d['reached']:,} reached slots, "
                          f"{d['futures']} sampled later drafts per candidate (mean "
                          f"slot TV {d['slot_tv_mean']:.5f}; "
                          f"{d['slot_tv_mean_half_futures']:.5f} at half the futures"
                          + (f"; later drafts sampled after the draft's {d['candidates']} most "
                             f"likely candidates: {d['slot_tv_mean_quarter_candidates']:.5f} "
                             f"with {d['quarter']}, a worst case of "
                             f"{d['candidate_bound_mean']:.3f} on average"
                             if "candidates" in d else "")
                          + ") (`evolve.data.lookahead_emission`)")
                else:
                    tv = "its TV is measured"
                lines.append("  It reads a lookahead input: its offline numbers are an "
                             "estimate (next_tv and ahead held at the recorded draft's values "
                             "for every candidate); free-running, its tokens per call are "
                             f"measured and {tv}."
                             if P.uses_lookahead_inputs(treeio.parse(r["tree"])) else
                             "  It reads neither lookahead input, so its offline and "
                             "free-running numbers are exact.")
        lines.append("")
    return "\n".join(lines)


def free_ref(b: dict) -> str:
    return b["free_running_test"].get("reference", "leniency (tuned)")


def baselines_markdown(b: dict) -> list:
    """The tuned-baseline table of one budget (results files written before it: none)."""
    table = b.get("tuned_baselines")
    if not table:
        return []
    best = (b.get("best_tuned_baseline") or {}).get("rule")
    lines = [f"Tuned baselines (each tuned on valid to TV {b['budget']:g}, reported on test; "
             "the best on valid is the free-running reference):", "",
             "| family | engine | tuned parameter | valid tokens/call | test tokens/call "
             "| TV/token | slot TV p99 | KL/token | of oracle |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        mark = " **(best)**" if name == best else ""
        eng = row.get("engine") or ""
        if not row["fits_valid"]:
            why = row.get("not_exact")
            text = (f"not exact on these traces ({why.split(';')[0]})" if why
                    else "no parameter fits the budget on valid")
            lines.append(f"| {name} | {eng} | {text} | | | | | | |")
            continue
        o, v = row["test"], row["valid"]
        param = row.get("setting") or row.get("label") or name
        share = o.get("oracle_share")
        lines.append(f"| {name}{mark} | {eng} | {param} | {v['tokens_per_call']:.4f} | "
                     f"{o['tokens_per_call']:.4f} | {o['tv_per_token']:.4f} | "
                     f"{o['tv_p99']:.4f} | {o['kl_per_token']:.4f} | "
                     + ("" if share is None else f"{100 * share:.0f}%") + " |")
    return lines + [""]


def write_page(doc: dict, section: str = SECTION, render=None, path: Path | None = None) -> None:
    """Replace the results page's text between the section's markers by ``render(doc)``
    (default: this script's tables)."""
    write_section((render or markdown)(doc), section, path)


if __name__ == "__main__":
    raise SystemExit(main())
