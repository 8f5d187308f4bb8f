"""The documentation's figures, drawn from the committed results: `make figures`.

Nothing here measures anything: every point is read from a JSON file under
benchmarks/ that a measuring command wrote (named on each figure and below), and the
styles are the project's own (``evolve.rules.styles``), so a family looks as it does in
``evolve tradeoff --png``.

- ``docs/img/tradeoff-ngram.png`` and ``docs/img/tradeoff-neural.png``: the trade-off on
  each pair (``benchmarks/experiments/trace_results.json``, ``make results``;
  ``benchmarks/experiments/neural_trace_results.json``, ``make results-neural``). Per TV budget, the
  top panel is the offline test split: every family tuned on valid to the budget and
  each champion, tokens per call against TV per token, with the budget dashed; the
  bottom panel is the final arbiter, paired free-running decoding on the test prompts:
  each rule's tokens per call minus the best tuned baseline's with its 95% interval,
  against the 99th percentile of its slot TV (the tail a rule spends in).
- ``docs/img/task_results.png``: the task world (``benchmarks/experiments/task_results.json``,
  ``make results-task``): per decoding and accuracy budget, every rule (a line each,
  named) with the tokens per call it gains over lossless speculative decoding of the
  same pair and the accuracy it loses, paired on the test problems with 95% intervals,
  the budget dashed.
- ``docs/img/real_task_results.png``: the same on SmolLM2-135M-Instruct and its draft
  (``benchmarks/experiments/real_task_results.json``, ``make results-real``).
- ``docs/img/speed.png``: node evaluations per second of the population kernel and
  its references on this machine's CPUs (``benchmarks/speed/speed_results.json``, ``make
  bench``; ``benchmarks/speed/gpu_eval_results_cpu.json``, ``python -m benchmarks.speed.gpu_eval
  --device cpu ...``, torch on the CPU), and below, on one H100 and its 16 CPU cores, the
  token kernel and a trace generation on the fused kernel, the torch path and Numba
  (``benchmarks/speed/gpu_results/h100-check-2afdd56.json``, one whole
  ``python -m benchmarks.speed.gpu_check`` run).

Usage: ``python -m benchmarks.figures [--out docs/img]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

from evolve.rules.styles import STYLES, OTHERS  # noqa: E402
from evolve.runs.pictures import pyplot, save_png  # noqa: E402

Z95 = 1.959963984540054
PAIRS = (("tradeoff-ngram.png", "experiments/trace_results.json", "the n-gram pair (make results)"),
         ("tradeoff-neural.png", "experiments/neural_trace_results.json",
          "the neural pair (make results-neural)"))


def style_of(label: str, champions: list):
    """(legend name, style) of a results label: its family's (``leniency (tuned)``,
    ``hf_ensemble(w=...) (tuned)``), per-position leniency's, or a champion's in turn."""
    if label.startswith("per-position leniency"):
        return "per-position leniency", STYLES["position_leniency"]
    family = label.split("(")[0].split(" ")[0]
    if family in STYLES:
        return family, STYLES[family]
    if label not in champions:
        champions.append(label)
    return label, OTHERS[champions.index(label) % len(OTHERS)]


def _offline_points(b: dict) -> list:
    """(label, TV per token, tokens per call) on test of every tuned family and champion."""
    pts = []
    for name, row in b["tuned_baselines"].items():
        if row.get("test"):
            label = "per-position leniency (tuned)" if name == "per-position leniency" \
                else name
            pts.append((label, row["test"]["tv_per_token"], row["test"]["tokens_per_call"]))
    for label, o in b["offline_test"].items():
        if label.startswith("evolved"):
            pts.append((label, o["tv_per_token"], o["tokens_per_call"]))
    return pts


def pair_figure(doc: dict, title: str, path: Path) -> None:
    plt = pyplot()
    budgets = doc["budgets"]
    fig, axes = plt.subplots(2, len(budgets), figsize=(5.6 * len(budgets), 8.2), dpi=110,
                             layout="constrained", squeeze=False)
    champions: list = []
    handles = {}
    for col, b in enumerate(budgets):
        top, bottom = axes[0][col], axes[1][col]
        pts = _offline_points(b)
        for label, x, y in pts:
            key, st = style_of(label, champions)
            h = top.plot([x], [y], ls="none", marker=st.marker, ms=9, color=st.colour,
                         mec="black", mew=0.5, label=key)[0]
            handles.setdefault(key, h)
        ys = [y for _, _, y in pts] + [b["oracle_tokens_per_call"]]
        pad = 0.08 * (max(ys) - min(ys))
        top.set_ylim(min(ys) - pad, max(ys) + pad)
        top.axhline(b["oracle_tokens_per_call"], ls=":", color="0.45", lw=1)
        top.annotate("knapsack oracle (a bound)", (0, b["oracle_tokens_per_call"]),
                     xycoords=("axes fraction", "data"), xytext=(4, -11),
                     textcoords="offset points", fontsize=8, color="0.3")
        top.annotate(f"standard rejection: {b['standard_tokens_per_call']:.4f} at TV 0 "
                     "(below)", (0, 0), xycoords="axes fraction", xytext=(4, 4),
                     textcoords="offset points", fontsize=8, color="0.3")
        top.axvline(b["budget"], ls="--", color="0.35", lw=1)
        xs = [x for _, x, _ in pts]
        top.set_xlim(min(xs + [b["budget"]]) - 0.1 * b["budget"], 1.08 * b["budget"])
        top.set_title(f"TV budget {b['budget']:g}: offline, test split", fontsize=10)
        top.set_xlabel("TV per token")
        top.set_ylabel("tokens per target call")
        top.grid(alpha=0.3)
        fr = b["free_running_test"]
        for label, r in fr["rules"].items():
            key, st = style_of(label, champions)
            if label == fr["reference"]:
                d, lo, hi = 0.0, 0.0, 0.0
            else:
                t = fr["versus_reference"][label]["tokens_per_call"]
                d, (lo, hi) = t["difference"], t["ci95"]
            h = bottom.errorbar([r["slot_tv_p99"]], [d], yerr=[[d - lo], [hi - d]], ls="none",
                                marker=st.marker, ms=9, color=st.colour, mec="black", mew=0.5,
                                capsize=3, label=key)
            handles.setdefault(key, h)
        bottom.axhline(0, color="0.35", lw=1)
        bottom.set_title(f"TV budget {b['budget']:g}: free-running, {fr['prompts']:,} test "
                         "prompts", fontsize=10)
        bottom.set_xlabel("slot TV, 99th percentile (the tail)")
        bottom.set_ylabel(f"tokens per call minus {style_of(fr['reference'], [])[0]}'s\n"
                          "(paired by prompt; 95% interval)")
        bottom.grid(alpha=0.3)
    fig.suptitle(f"{title}: rules tuned to each budget on valid, champions chosen on valid",
                 fontsize=11)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=3,
               fontsize=8, frameon=False)
    save_png(fig, path)


GPU_CHECK = "speed/gpu_results/h100-check-2afdd56.json"      # the whole gpu_check run shown


def _bars(ax, rows, title: str) -> None:
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r[1] for r in rows], color=[r[2] for r in rows])
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    for y, r in zip(ys, rows):
        ax.annotate(f"{r[1]:.2e}", (r[1], y), xytext=(3, -3), textcoords="offset points",
                    fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title, fontsize=10)


def speed_figure(speed: dict, gpu: dict, path: Path, check: dict | None = None) -> None:
    """Node evaluations per second on this machine's CPUs (top) and, from a whole
    ``benchmarks.speed.gpu_check`` run (``check``), on one GPU and that machine's CPU
    cores (bottom), one log scale for both."""
    plt = pyplot()
    pop = speed["population"]
    op = speed.get("operon") or {}
    rows = [("population kernel, 2 threads (Numba)", pop["kernel"]["node_evals_per_s"],
             "#1f77b4"),
            ("population kernel, 1 thread", pop["kernel"]["one_thread_node_evals_per_s"],
             "#6baed6"),
            ("DEAP's way: gp.compile + numpy, 1 process", pop["numpy"]["node_evals_per_s"],
             "#ff7f0e")]
    arith = ((op.get("mixes") or {}).get("arith") or {}).get("threads") or {}
    for n in ("1", "2"):
        if n in arith:
            rows.append((f"arithmetic trees, {n} thread{'s' if n == '2' else ''}: "
                         "this kernel", arith[n]["ours_node_evals_per_s"], "#1f77b4"))
            rows.append((f"the same on Operon (pyoperon {op['versions']['pyoperon']}, "
                         "float32 SIMD)", arith[n]["operon_node_evals_per_s"], "#2ca02c"))
    tok = gpu["token"]
    rows += [(f"token kernel, {tok['trees']} trees x {tok['rows']:,} rows: Numba, "
              f"{gpu['numba_threads']} threads", tok["numba_node_evals_per_s"], "#1f77b4"),
             (f"the same on torch, CPU, {gpu['torch_threads']} thread (the GPU path)",
              tok["torch_node_evals_per_s"], "#9467bd")]
    grows = []
    if check is not None:
        t, g = check["kernels"]["token"], check["kernels"]["trace"]
        n = check["numba_threads"]
        grows = [(f"token kernel, {t['trees']:,} trees x {t['rows']:,} rows: fused (Triton)",
                  t["fused_node_evals_per_s"], "#d62728"),
                 ("the same: torch, one operation per step", t["torch_node_evals_per_s"],
                  "#9467bd"),
                 (f"the same: Numba, {n} CPU threads", t["numba_node_evals_per_s"], "#1f77b4"),
                 (f"trace generation, {g['population']:,} trees x "
                  f"{g['drafted_tokens'] / 1e6:g}M drafted tokens: fused",
                  g["fused_node_evals_per_s"], "#d62728"),
                 ("the same: torch", g["torch_node_evals_per_s"], "#9467bd"),
                 (f"the same: Numba, {n} CPU threads", g["numba_node_evals_per_s"], "#1f77b4")]
    heights = [len(rows), len(grows)] if grows else [len(rows)]
    fig, axes = plt.subplots(len(heights), 1, sharex=True, squeeze=False, dpi=110,
                             figsize=(9, 0.5 * sum(heights) + 1.4 + 0.5 * len(heights)),
                             height_ratios=heights, layout="constrained")
    _bars(axes[0][0], rows, f"{speed['machine']['logical_cpus']} CPU cores "
                            f"({speed['machine']['cpu_model']}, shared)")
    if grows:
        device = check["title"].split(":")[0].replace("GPU check on ", "")
        _bars(axes[1][0], grows, f"one {device}, {check['cpu_count']} CPU cores (gpu_check)")
    ax = axes[-1][0]
    ax.set_xscale("log")
    ax.set_xlabel("node evaluations per second (log scale)")
    ax.set_xlim(right=max(r[1] for r in rows + grows) * 6)
    save_png(fig, path)


TASK_STYLES = {"lossless": "standard_rejection", "evolved": "champion"}


def task_rows(pb: dict) -> list:
    """The rows of one decoding and budget of the task results that have test figures
    paired against lossless, sorted by the target calls per correct answer they save."""
    rows = [r for r in pb["rows"] if r["versus_lossless"] is not None
            and r["versus_lossless"]["calls_per_correct"] is not None]
    return sorted(rows, key=lambda r: -r["versus_lossless"]["calls_per_correct"]["difference"])


def task_figure(doc: dict, path: Path) -> None:
    """Per decoding and accuracy budget (a row), two panels sharing the rules (one line
    each, sorted by their saving; no legend to look up: the names are the labels): the
    target calls per correct answer each rule saves against lossless speculative
    decoding (the oracle's saving is the bound any judge has), and the accuracy it
    loses, both paired by problem on the test problems with 95% intervals, the budget
    dashed."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator    # with matplotlib
    panels = [(mode, pb) for mode, m in doc["modes"].items()
              for pb in m["tradeoff"]["budgets"]]
    heights = [0.26 * len(task_rows(pb)) + 1.0 for _, pb in panels]
    # one row per decoding and budget: the page is narrow, so the rows stack
    fig, axes = plt.subplots(len(panels), 2, layout="constrained", squeeze=False,
                             figsize=(8.4, sum(heights)),
                             gridspec_kw={"width_ratios": [1.25, 1], "height_ratios": heights})
    champions: list = []
    for i, (mode, pb) in enumerate(panels):
        gain_ax, drop_ax = axes[i][0], axes[i][1]
        rows = task_rows(pb)
        for y, r in enumerate(rows):
            name = r["rule"]
            key = TASK_STYLES.get(name, name.replace(" ", "_"))
            st = STYLES[key] if key in STYLES else style_of(name, champions)[1]
            big = 9 if r["kind"] in ("run", "oracle") else 6
            c, a = r["versus_lossless"]["calls_per_correct"], r["versus_lossless"]["accuracy"]
            save, lo, hi = -c["difference"] + 0.0, -c["ci95"][1], -c["ci95"][0]
            gain_ax.errorbar([save], [y], xerr=[[max(0.0, save - lo)], [max(0.0, hi - save)]],
                             fmt=st.marker, color=st.colour, capsize=2, ms=big)
            drop = -a["difference"] + 0.0
            lo, hi = -a["ci95"][1], -a["ci95"][0]        # the drop's interval
            drop_ax.errorbar([drop], [y], xerr=[[max(0.0, drop - lo)],
                                                [max(0.0, hi - drop)]],
                             fmt=st.marker, color=st.colour, capsize=2, ms=big)
        for ax in (gain_ax, drop_ax):
            ax.set_yticks(range(len(rows)))
            ax.set_ylim(-0.6, len(rows) - 0.4)
            ax.grid(alpha=0.3, axis="x")
            ax.axvline(0, color="0.3", lw=0.8)
        gain_ax.set_yticklabels([r["rule"] for r in rows], fontsize=8)
        drop_ax.set_yticklabels([])
        drop_ax.axvline(pb["budget"], ls="--", color="0.5", lw=1)
        drop_ax.xaxis.set_major_locator(MaxNLocator(4))        # tick labels never touch
        gain_ax.set_title(f"{mode} decoding, budget {pb['budget']:g}: target calls per "
                          "correct answer saved", fontsize=9)
        drop_ax.set_title("accuracy drop (dashed: budget)", fontsize=9)
        gain_ax.set_xlabel("lossless minus the rule (paired, 95%)", fontsize=8)
        drop_ax.set_xlabel("against lossless (paired, 95%)", fontsize=8)
    save_png(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bench = ROOT / "benchmarks"
    for name, source, title in PAIRS:
        pair_figure(json.loads((bench / source).read_text()), title, args.out / name)
        print(f"{args.out / name}: from benchmarks/{source}")
    for name in ("task_results", "real_task_results"):     # the built-in pair, SmolLM2
        task_figure(json.loads((bench / "experiments" / f"{name}.json").read_text()),
                    args.out / f"{name}.png")
        print(f"{args.out / name}.png: from benchmarks/experiments/{name}.json")
    speed_figure(json.loads((bench / "speed" / "speed_results.json").read_text()),
                 json.loads((bench / "speed" / "gpu_eval_results_cpu.json").read_text()),
                 args.out / "speed.png", json.loads((bench / GPU_CHECK).read_text()))
    print(f"{args.out / 'speed.png'}: from benchmarks/speed/speed_results.json, "
          f"benchmarks/speed/gpu_eval_results_cpu.json and benchmarks/{GPU_CHECK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
