"""Does the drafted token's class help a rule? Searches with and without ``token_class``.

For each trace directory, budget and seed, this runs the search twice with the same
seed and settings: on every input the data offer, and on the same inputs less
``token_class`` (``evolve run --inputs``). It reports, on test and exactly on the
recorded path, each champion's tokens per call and TV per token, whether it reads
``token_class``, and with minus without, paired by seed (mean and the range over
seeds). Traces recorded before the recorders wrote the vocabulary's classes are
copied to a temporary folder with the table their pair's tokenizer gives (the
target's folder named in their meta; ``evolve.data.vocab_class``), the same table a
recording writes now; the files given are not changed.

    python -m benchmarks.experiments.token_class [--data DIR ...] [--budgets 0.01 0.03]
        [--seeds 1 2 3 4 5] [--page]

The figures go to ``benchmarks/experiments/token_class.json``; ``--page`` writes the
section of docs/results/real-pair.md.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, minutes  # noqa: E402

import evolve  # noqa: E402
from evolve.data import traces as T  # noqa: E402
from evolve.data import vocab_class as VC  # noqa: E402
from benchmarks.experiments import paired_seeds as PS  # noqa: E402
from benchmarks.experiments.trace_results import _shown  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "token_class.json"
SECTION = "token-class"


def with_classes(data: Path, tmp: Path) -> Path:
    """``data`` itself where its splits carry the table, else a copy that does."""
    splits = {s: T.load(data / f"{s}.npz") for s in T.SPLITS}
    if all(VC.META_KEY in ts.meta for ts in splits.values()):
        return data
    from transformers import AutoTokenizer      # lazy: only for such traces
    target = Path(splits["train"].meta["models"]["target"]["name_or_path"])
    if not target.is_dir():          # recorded elsewhere: the pair's folder beside them
        target = data.parent.parent / "target"
    tok = AutoTokenizer.from_pretrained(target)
    text = VC.to_text(VC.tokenizer_table(tok, T.vocab_size(splits["train"].meta)))
    out = tmp / ("classes-" + data.name)
    out.mkdir()
    for s, ts in splits.items():
        meta = {k: v for k, v in ts.meta.items() if k != "source"}
        T.save(T.TraceSplit(ts.columns, dict(meta, **{VC.META_KEY: text}), s),
               out / f"{s}.npz")
    for extra in data.iterdir():
        if extra.suffix != ".npz" and extra.is_file():
            shutil.copy(extra, out / extra.name)
    return out


def offered(data: Path) -> list:
    """The inputs a speed search on ``data`` is offered."""
    from evolve.search.config import Config
    from evolve.search.engine import Evolution
    tr, va = (T.load(data / f"{s}.npz") for s in ("train", "valid"))
    return list(Evolution(Config(objective="speed", generations=1, population=4), tr, va)
                .inputs)


def champion(data: Path, runs: Path, budget: float, seed: int, inputs: list, a,
             label: str) -> dict:
    res = evolve.run(data_dir=data, runs_dir=runs, name=f"{label}-b{budget:g}-s{seed}",
                     writeback=False, force=True, objective="speed", tv_budget=budget,
                     seed=seed, population=a.population, generations=a.generations,
                     seed_baselines=True, tournament=3, inputs=",".join(inputs))
    t = res.champion["metrics"]["test"]
    tree = res.champion["tree"]
    return {"seed": seed, "expression": res.champion["expression"], "tree": tree,
            "reads_class": "token_class" in tree,
            "tokens_per_call": t["tokens_per_call"], "tv_per_token": t["tv_per_token"]}


def main(argv=None) -> int:
    ap = PS.arguments(__doc__.splitlines()[0], OUT)
    a = ap.parse_args(argv)
    data, doc = PS.start(a, "benchmarks.experiments.token_class", argv)
    with tempfile.TemporaryDirectory() as tmp:
        for i, d in enumerate(data):
            src = with_classes(d, Path(tmp))
            runs = Path(tmp) / f"runs-{i}"
            every = offered(src)
            less = [n for n in every if n != "token_class"]
            rows = []
            for b in a.budgets:
                without = [champion(src, runs, b, s, less, a, "without") for s in a.seeds]
                with_ = [champion(src, runs, b, s, every, a, "with") for s in a.seeds]
                rows.append({"budget": b, "without": without, "with": with_,
                             "with_minus_without": PS.paired(
                                 without, with_, ("tokens_per_call", "tv_per_token"))})
                print(f"{_shown(d)} budget {b:g}: done", file=sys.stderr, flush=True)
            doc["data"][_shown(d)] = {"classes_added": src != d, "inputs": every,
                                      "rows": rows}
    return PS.finish(doc, a, markdown, SECTION)


def markdown(doc: dict) -> str:
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']} "
             f"({minutes(doc['seconds'])} on 2 shared cores; population "
             f"{doc['population']}, {doc['generations']} generations, one start per seed); "
             f"figures in `{doc.get('out', _shown(OUT))}`. Test split, exact on the "
             "recorded path; both searches of a seed have the same settings and seed, "
             "one without `token_class` among its inputs.", ""]
    for d, entry in doc["data"].items():
        note = (" (traces recorded before the classes were written: the table of their "
                "tokenizer added to a copy)" if entry["classes_added"] else "")
        lines += [f"**`{d}`**{note}", "",
                  "| budget | search | tokens/call | TV/token | champions reading the class |",
                  "|---|---|---|---|---|"]
        for r in entry["rows"]:
            for kind in ("without", "with"):
                cs = r[kind]

                def rng(m):
                    return PS.span([c[m] for c in cs])
                reads = sum(c["reads_class"] for c in cs)
                label = "without `token_class`" if kind == "without" else "with `token_class`"
                lines.append(f"| {r['budget']:g} | {label} | {rng('tokens_per_call')} | "
                             f"{rng('tv_per_token')} | {reads} of {len(cs)} |")
            dd = r["with_minus_without"]

            def delta(m):
                return PS.signed(dd[m])
            lines.append(f"| {r['budget']:g} | with minus without, paired by seed | "
                         f"{delta('tokens_per_call')} | {delta('tv_per_token')} | |")
        lines.append("")
    first = next(iter(doc["data"].values()))["rows"][0]
    lines.append(f"*Mean over {len(first['with'])} seeds, with the smallest and largest in "
                 "brackets.*")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
