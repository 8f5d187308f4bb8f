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

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_section  # noqa: E402

import numpy as np  # noqa: E402

import evolve  # noqa: E402
from evolve.data import traces as T  # noqa: E402
from evolve.data import vocab_class as VC  # noqa: E402
from evolve.io import paths  # noqa: E402
from benchmarks.experiments.trace_results import _commit, _shown  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "token_class.json"
SECTION = "token-class"
DATA = (paths.DATA_DIR / "pairs" / "smollm2" / "results" / "traces", paths.DATA_DIR / "traces")


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


def _spread(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=None,
                    help="trace directories [the real pair's, the default traces: those "
                         "there]")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--population", type=int, default=300)
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", action="store_true",
                    help="write the section of docs/results/real-pair.md")
    a = ap.parse_args(argv)
    data = a.data or [d for d in DATA if (d / "test.npz").exists()]
    if not data:
        raise SystemExit("no trace directory: record one (evolve data trace) or pass --data")
    t0 = time.perf_counter()
    doc = {"commit": _commit(),
           "command": " ".join(["python -m benchmarks.experiments.token_class",
                                *(_shown(Path(x)) if Path(x).is_absolute() else x
                                  for x in (argv if argv is not None else sys.argv[1:]))]),
           "out": _shown(a.out), "population": a.population, "generations": a.generations,
           "data": {}}
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
                diff = {m: _spread([w[m] - o[m] for o, w in zip(without, with_)])
                        for m in ("tokens_per_call", "tv_per_token")}
                rows.append({"budget": b, "without": without, "with": with_,
                             "with_minus_without": diff})
                print(f"{_shown(d)} budget {b:g}: done", file=sys.stderr, flush=True)
            doc["data"][_shown(d)] = {"classes_added": src != d, "inputs": every,
                                      "rows": rows}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    if a.page:
        write_section(text, SECTION)
    print(text)
    return 0


def markdown(doc: dict) -> str:
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']} "
             f"({doc['seconds'] / 60:.0f} minutes on 2 shared cores; population "
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
                    s = _spread([c[m] for c in cs])
                    return f"{s['mean']:.4f} ({s['min']:.4f} to {s['max']:.4f})"
                reads = sum(c["reads_class"] for c in cs)
                label = "without `token_class`" if kind == "without" else "with `token_class`"
                lines.append(f"| {r['budget']:g} | {label} | {rng('tokens_per_call')} | "
                             f"{rng('tv_per_token')} | {reads} of {len(cs)} |")
            dd = r["with_minus_without"]

            def delta(m, digits=4):
                s = dd[m]
                return (f"{s['mean']:+.{digits}f} ({s['min']:+.{digits}f} to "
                        f"{s['max']:+.{digits}f})")
            lines.append(f"| {r['budget']:g} | with minus without, paired by seed | "
                         f"{delta('tokens_per_call')} | {delta('tv_per_token')} | |")
        lines.append("")
    first = next(iter(doc["data"].values()))["rows"][0]
    lines.append(f"*Mean over {len(first['with'])} seeds, with the smallest and largest in "
                 "brackets.*")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
