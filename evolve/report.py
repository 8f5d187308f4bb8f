"""What `evolve benchmark`, `evolve inspect` and `evolve runs` compute and show."""

from __future__ import annotations

from pathlib import Path

from evolve import codegen, data, treeio
from evolve import primitives as P
from evolve.runs import RunDir, RunError, list_runs

SPARK = "▁▂▃▄▅▆▇█"


# ---------------------------------------------------------------- benchmark

def benchmark(data_dir: Path, heuristics: list[str] | None, repeats: int) -> dict:
    from evolve.scoring import PreparedSplit, score
    from heuristics import registry

    all_names = registry.names()
    names = heuristics or all_names
    unknown = [n for n in names if n not in all_names]
    if unknown:
        raise KeyError(f"--heuristic: unknown heuristic {unknown[0]!r} "
                       f"(known: {', '.join(all_names)})")
    splits = data.load_splits(data_dir)
    prepared = {k: PreparedSplit(v) for k, v in splits.items()}
    compiled = {n: registry.compiled(n) for n in names}
    out = {"splits": {}}
    for split, ps in prepared.items():
        out["splits"][split] = {
            "tokens": ps.n,
            "heuristics": {n: score(compiled[n], ps, repeats) for n in names},
        }
    out["evolved"] = registry.evolved_metadata()
    return out


def show_benchmark(result: dict, term) -> None:
    splits = result["splits"]
    order_split = "valid" if "valid" in splits else next(iter(splits))
    names = sorted(splits[order_split]["heuristics"],
                   key=lambda n: -splits[order_split]["heuristics"][n]["fitness"])
    cols = [("heuristic", "left"), ("accept %", "right"), ("accuracy %", "right"),
            ("quality", "right"), ("fitness", "right"), ("eval ms", "right")]
    for split, body in splits.items():
        rows, styles = [], []
        for n in names:
            m = body["heuristics"][n]
            label = f"{n} *" if n == "evolved" else n
            rows.append([label, f"{100 * m['accept_rate']:.1f}", f"{100 * m['accuracy']:.1f}",
                         f"{m['quality']:.4f}", f"{m['fitness']:.4f}", f"{m['eval_ms']:.3f}"])
            styles.append("bold" if n == "evolved" else None)
        term.table(f"{split} ({body['tokens']:,} tokens), sorted by {order_split} fitness",
                   cols, rows, styles)
        term.result("")
    meta = result.get("evolved") or {}
    if "evolved" in names:
        term.result(f"* evolved: heuristics/evolved.py (run {meta.get('run', '?')}, "
                    f"tree {meta.get('tree', '?')})")


# ------------------------------------------------------------------- runs

def _fmt(x, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def is_trace_champion(champion: dict) -> bool:
    return "tokens_per_call" in next(iter(champion.get("metrics", {}).values()), {})


def show_run_result(result: dict, term, data_dir: Path) -> None:
    """What `evolve run` prints at the end: champion beside the baselines."""
    ch = result["champion"]
    term.result(f"run {result['run']} finished: {result['path']}")
    term.result(f"champion: {ch['expression']}  (size {ch['size']}, generation "
                f"{ch['generation']})")
    if is_trace_champion(ch):
        show_trace_champion(ch, term)
        png = Path(result["path"]) / "pareto.png"
        if png.exists():
            term.result(f"trade-off picture: {png}")
        term.result("trace champions stay in their run directory (they read trace "
                    "features); heuristics/evolved.py is unchanged")
        return
    bench = benchmark(data_dir, None, repeats=5)
    for split, body in bench["splits"].items():
        body["heuristics"]["champion"] = ch["metrics"][split]
    show_benchmark(bench, term)
    wb = result.get("writeback")
    if wb is None:
        term.result("write-back skipped (--no-writeback)")
    elif wb["written"]:
        term.result(f"written back to heuristics/evolved.py (valid fitness "
                    f"{wb['new_valid_fitness']:.4f} vs {_fmt(wb['current_valid_fitness'])})")
    else:
        term.result(f"heuristics/evolved.py kept: its valid fitness "
                    f"{_fmt(wb['current_valid_fitness'])} >= champion's "
                    f"{wb['new_valid_fitness']:.4f} (use --force to replace)")


def show_trace_champion(ch: dict, term) -> None:
    """Champion and baselines tuned on valid to the run's TV budget, on test."""
    budget = ch.get("tv_budget")
    cols = [("rule", "left"), ("param", "right"), ("test tokens/call", "right"),
            ("test TV/token", "right"), ("test KL/token", "right"),
            ("valid tokens/call", "right"), ("valid TV/token", "right")]
    rows = [["champion *", "", _fmt(ch["metrics"]["test"]["tokens_per_call"]),
             _fmt(ch["metrics"]["test"]["tv_per_token"], 5),
             _fmt(ch["metrics"]["test"]["kl_per_token"], 5),
             _fmt(ch["metrics"]["valid"]["tokens_per_call"]),
             _fmt(ch["metrics"]["valid"]["tv_per_token"], 5)]]
    for name, rep in (ch.get("baselines_tuned_on_valid") or {}).items():
        if rep is None:
            rows.append([name, "", "no parameter fits the budget", "", "", "", ""])
            continue
        rows.append([name, "" if rep["param"] is None else f"{rep['param']:.4g}",
                     _fmt(rep["test"]["tokens_per_call"]),
                     _fmt(rep["test"]["tv_per_token"], 5), _fmt(rep["test"]["kl_per_token"], 5),
                     _fmt(rep["valid"]["tokens_per_call"]),
                     _fmt(rep["valid"]["tv_per_token"], 5)])
    order = [rows[0]] + sorted(rows[1:], key=lambda r: -float(r[2]) if r[3] else 1e9)
    term.table(f"TV budget {budget}: baselines tuned on valid, all reported on test",
               cols, order, ["bold"] + [None] * (len(order) - 1))


def sparkline(values: list[float], width: int = 60) -> str:
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[min(len(values) - 1, int(i * step))] for i in range(width)]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        return SPARK[-1] * len(values)
    return "".join(SPARK[int((v - lo) / (hi - lo) * (len(SPARK) - 1))] for v in values)


SIMPLIFY_MAX_NODES = 40


def history_png(history: list[dict], path: Path, title: str) -> bool:
    """Best train/valid fitness and mean size per generation, as a PNG (matplotlib)."""
    from evolve.plots import pyplot, save_png
    try:
        plt = pyplot()
    except RuntimeError:
        return False
    gens = [h["generation"] for h in history]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 5), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    ax.plot(gens, [h["best_train"] for h in history], label="best train")
    ax.plot(gens, [h["median_train"] for h in history], label="median train", alpha=0.6)
    ax.plot(gens, [h["best_valid"] for h in history], label="best valid (champion pool)")
    ax.set_ylabel("fitness")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax2.plot(gens, [h["mean_size"] for h in history], color="gray")
    ax2.set_ylabel("mean size")
    ax2.set_xlabel("generation")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    return True


def simplified(nodes) -> str | None:
    """A sympy-simplified formula, or None for large trees.

    Protected operators are shown as their plain counterparts (pdiv as /, plog
    as log|x|, ...), so the text reads as the rule does on ordinary inputs; it
    is a reading aid, never evaluated.
    """
    if len(nodes) > SIMPLIFY_MAX_NODES:
        return None
    import sympy as S
    syms = {name: S.Symbol(short, real=True) for name, short in P.INPUT_SHORT.items()}
    syms["position"] = S.Symbol("pos", nonnegative=True, integer=True)
    syms["top_token_match"] = S.Symbol("match")
    plain = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "pdiv": lambda a, b: a / b, "pmin": S.Min, "pmax": S.Max, "neg": lambda a: -a,
        "absf": S.Abs, "plog": lambda a: S.log(S.Abs(a)), "pexp": S.exp,
        "psqrt": lambda a: S.sqrt(S.Abs(a)), "square": lambda a: a ** 2,
        "lt": S.StrictLessThan, "and_": S.And, "or_": S.Or, "not_": S.Not,
        "ite": lambda c, a, b: S.Piecewise((a, c), (b, True)),
    }
    out = []
    for n in reversed(nodes):
        if n.kind == "input":
            out.append(syms[n.name])
        elif n.kind == "const":
            out.append(S.Integer(int(n.value)) if n.value == int(n.value) else S.Float(n.value))
        else:
            args = [out.pop() for _ in range(n.arity)]
            out.append(plain[n.name](*args))
    try:
        return str(S.simplify(out[0]))
    except (TypeError, ValueError, AttributeError, RecursionError):
        return None


def inspect_run(run: RunDir) -> dict:
    meta = run.meta()
    history = run.history()
    summary = run.summary()
    try:
        champ = run.champion()
    except RunError:
        champ = None
    out = {"run": run.name, "path": str(run.path), "config": meta.get("config"),
           "versions": meta.get("versions"), "data": meta.get("data"),
           "summary": summary, "generations": len(history), "champion": None,
           "history": {"best_train": [h["best_train"] for h in history],
                       "best_valid": [h["best_valid"] for h in history],
                       "mean_size": [h["mean_size"] for h in history]}}
    if run.file("pareto.json").exists():
        from evolve.runs import read_json
        out["pareto"] = read_json(run.file("pareto.json"), "trade-off data")
    if champ:
        nodes = treeio.parse(champ["tree"])   # validates; never evaluated
        out["champion"] = {**champ, "expression": codegen.infix(nodes),
                           "size": len(nodes), "depth": treeio.depth(nodes),
                           "simplified": simplified(nodes)}
    return out


def show_inspect(info: dict, term, standard: dict | None) -> None:
    term.result(f"run {info['run']}  ({info['path']})")
    s = info.get("summary") or {}
    if s:
        term.result(f"status: {s.get('status')} at generation {s.get('generation')}"
                    + (f"; resume with: {s['resume']}" if s.get("resume") else ""))
    ch = info.get("champion")
    if not ch:
        term.result("no champion yet (the run has not finished)")
    else:
        term.result(f"formula:  {ch['expression']}")
        if ch.get("simplified") and ch["simplified"] != ch["expression"]:
            term.result(f"simplified (protected operators read as plain): {ch['simplified']}")
        term.result(f"tree:     {ch['tree']}")
        term.result(f"size {ch['size']}, depth {ch['depth']}, found in generation "
                    f"{ch.get('generation')}; inputs: d=draft_prob t=target_prob pos=position "
                    "de/te=draft/target entropy match=top_token_match"
                    + ("; bpos=block_position pmax/qmax=target/draft top probability"
                       if is_trace_champion(ch) else ""))
    if ch and is_trace_champion(ch):
        show_trace_champion(ch, term)
        series = (info.get("pareto") or {}).get("series")
        if isinstance(series, dict):
            from evolve.pareto import render_text
            try:
                pts = {str(k): [(float(x), float(y)) for x, y in v] for k, v in series.items()}
            except (TypeError, ValueError):
                pts = {}
            budget = (info.get("pareto") or {}).get("budget")
            if pts and isinstance(budget, (int, float)) and budget > 0:
                # zoom on the budget: the far end of bild/typical would squeeze it
                edge = max([4 * budget] + [x for x, _ in pts.get("champion", [])])
                shown = {k: [(x, y) for x, y in v if x <= edge] for k, v in pts.items()}
                hidden = sum(map(len, pts.values())) - sum(map(len, shown.values()))
                pts = shown
                if hidden:
                    term.result(f"({hidden} points with TV per token > {edge:g} not shown)")
            if pts:
                term.result("trade-off on valid (baselines swept, hall of fame, champion):")
                term.result(render_text(pts))
        png = Path(info["path"]) / "pareto.png"
        if png.exists():
            term.result(f"picture: {png}")
    elif ch:
        cols = [("split", "left"), ("accept %", "right"), ("accuracy %", "right"),
                ("quality", "right"), ("fitness", "right"), ("std. rejection fitness", "right")]
        rows = []
        for split, m in ch.get("metrics", {}).items():
            std = standard.get(split) if standard else None
            rows.append([split, f"{100 * m['accept_rate']:.1f}", f"{100 * m['accuracy']:.1f}",
                         f"{m['quality']:.4f}", f"{m['fitness']:.4f}",
                         f"{std['fitness']:.4f}" if std else "-"])
        term.table("champion metrics", cols, rows)
    png = Path(info["path"]) / "history.png"
    if png.exists():
        term.result(f"fitness over generations (PNG): {png}")
    h = info["history"]
    if h["best_train"]:
        term.result(f"best train fitness  {sparkline(h['best_train'])}  "
                    f"{h['best_train'][0]:.4f} -> {h['best_train'][-1]:.4f}")
        term.result(f"best valid fitness  {sparkline(h['best_valid'])}  "
                    f"{h['best_valid'][0]:.4f} -> {h['best_valid'][-1]:.4f}")
        term.result(f"mean size           {sparkline(h['mean_size'])}  "
                    f"{h['mean_size'][0]:.1f} -> {h['mean_size'][-1]:.1f}")
    cfg = info.get("config") or {}
    term.result("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))


def standard_metrics(data_dir: Path) -> dict | None:
    """Standard rejection's metrics per split (numpy path; no compilation)."""
    from evolve.fitness import counts_from_thresholds
    try:
        splits = data.load_splits(data_dir)
    except data.DataError:
        return None
    return {k: counts_from_thresholds(ds.standard_threshold(), ds.rand_value,
                                      ds.baseline_accepts, ds.standard_threshold()).metrics()
            for k, ds in splits.items()}


def runs_table(parent: Path) -> list[dict]:
    rows = []
    for run in list_runs(parent):
        row = {"run": run.name, "status": None, "generation": None, "expression": None,
               "valid_fitness": None, "test_fitness": None}
        try:
            s = run.summary()
            row["status"] = s.get("status", "running or killed")
            row["generation"] = s.get("generation")
            champ = run.champion() if run.file("champion.json").exists() else None
            if champ:
                row["expression"] = codegen.infix(treeio.parse(champ["tree"]))
                if is_trace_champion(champ):
                    for split in ("valid", "test"):
                        m = champ["metrics"][split]
                        row[f"{split}_tokens_per_call"] = m["tokens_per_call"]
                        row[f"{split}_tv_per_token"] = m["tv_per_token"]
                else:
                    row["valid_fitness"] = champ["metrics"]["valid"]["fitness"]
                    row["test_fitness"] = champ["metrics"]["test"]["fitness"]
        except (RunError, treeio.TreeError, KeyError, TypeError) as e:
            row["status"] = f"damaged: {e}"
        rows.append(row)
    return rows


def show_runs(rows: list[dict], term) -> None:
    def score(r, split):
        if r.get(f"{split}_fitness") is not None:
            return f"{r[f'{split}_fitness']:.4f}"
        if r.get(f"{split}_tokens_per_call") is not None:
            return (f"{r[f'{split}_tokens_per_call']:.3f} tok/call, "
                    f"TV {r[f'{split}_tv_per_token']:.4f}")
        return ""
    term.table("runs", [("run", "left"), ("status", "left"), ("gen", "right"),
                        ("valid", "right"), ("test", "right"), ("champion", "left")],
               [[r["run"], r["status"] or "", "" if r["generation"] is None else r["generation"],
                 score(r, "valid"), score(r, "test"), r["expression"] or ""] for r in rows])
