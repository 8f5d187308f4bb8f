"""What the commands print: benchmark tables, run results, inspect, runs, simulation
and trade-off tables, and plain-text plots. Everything goes through the
``Terminal`` of ``evolve.cli.render`` (the one module that owns rich)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from evolve.cli.render import printable
from evolve.lang.features import ALL_INPUTS
from evolve.rules.styles import styles_of
from evolve.standing import sentence

WRAP = 120          # lines of data (a run's config) are wrapped to this width
SPARK = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def show_benchmark(result: dict, term) -> None:
    splits = result["splits"]
    order_split = "valid" if "valid" in splits else next(iter(splits))
    names = sorted(splits[order_split]["heuristics"],
                   key=lambda n: -splits[order_split]["heuristics"][n]["fitness"])
    cols = [("heuristic", "left"), ("accept %", "right"), ("accuracy %", "right"),
            ("quality", "right"), ("fitness", "right"), ("eval ms", "right")]
    timing = result.get("timing") or {}
    on_cpu = timing.get("fallback") or {}       # --device cuda: rows timed on the CPU
    for split, body in splits.items():
        rows, styles = [], []
        for n in names:
            m = body["heuristics"][n]
            label = f"{n} *" if n == "evolved" else n
            ms = f"{m['eval_ms']:.3f}" if "eval_ms" in m else "-"
            ms += " (cpu)" if n in on_cpu and "eval_ms" in m else ""
            rows.append([label, f"{100 * m['accept_rate']:.1f}", f"{100 * m['accuracy']:.1f}",
                         f"{m['quality']:.4f}", f"{m['fitness']:.4f}", ms])
            styles.append("bold" if n == "evolved" else None)
        term.table(f"{split} ({body['tokens']:,} tokens), sorted by {order_split} fitness",
                   cols, rows, styles)
        term.result("")
    if timing.get("device", "cpu") != "cpu":
        term.result(f"eval ms (--device {timing['device']}): timed on "
                    f"{timing.get('torch_device')} ({timing.get('name')}) by the "
                    f"{timing.get('by')}"
                    + ("; streamed from the host: " + ", ".join(timing["streamed"])
                       if timing.get("streamed") else "")
                    + ("; (cpu): timed on the CPU by the compiled function" if on_cpu else ""))
    meta = result.get("evolved") or {}
    if "evolved" in names:
        term.result(f"* evolved: heuristics/evolved.py (run {meta.get('run', '?')}, "
                    f"tree {meta.get('tree', '?')})")


def _fmt(x, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


class ChampionView:
    """How `evolve run` and `evolve inspect` show the champion of one data world
    (``evolve.tasks``). This one serves any world: its metrics per split and the
    write-back's decision as they are; ``VIEWS`` holds the worlds' own."""

    def result(self, result: dict, term, data_dir: Path) -> None:
        ch = result["champion"]
        self.metrics_table(ch, term)
        wb = result.get("writeback")
        term.result("write-back skipped (--no-writeback)" if wb is None else
                    "write-back: " + printable(", ".join(f"{k}={v}" for k, v in wb.items())))

    def inspect(self, info: dict, term) -> None:
        self.metrics_table(info["champion"], term)

    @staticmethod
    def metrics_table(ch: dict, term) -> None:
        metrics = ch.get("metrics") or {}
        keys = sorted({k for m in metrics.values() for k in m})
        term.table("champion metrics", [("split", "left")] + [(k, "right") for k in keys],
                   [[split] + [_fmt(m.get(k)) for k in keys] for split, m in metrics.items()])


def where_of_result(result: dict) -> dict:
    """The run a finished `evolve run` made, as the verdict's advice names it: its name
    and configuration (read back from its directory: a resume keeps the run's own)."""
    from evolve.runs.rundir import RunDir    # lazy: start-up (as above)
    try:
        meta = RunDir(result["path"]).meta()
        config = dict(meta["config"], data=(meta.get("data") or {}).get("dir"))
    except (OSError, ValueError, KeyError, TypeError):
        config = {}
    return {"run": result["run"], "config": config}


def where_of_info(info: dict) -> dict:
    """The run `evolve inspect` shows (``report.inspect_run``): its name and config."""
    return {"run": info["run"], "config": info.get("config") or {}}


class TokenView(ChampionView):
    def result(self, result, term, data_dir):
        from evolve.runs import report    # lazy: start-up (a command loads only what it runs)
        show_token_result(result, term, report.run_table(data_dir), where_of_result(result))

    def inspect(self, info, term):
        from evolve.runs import report    # lazy: start-up (a command loads only what it runs)
        from evolve.tasks import TASKS    # lazy: start-up (a command loads only what it runs)
        show_token_inspect(info["champion"], term, report.standard_metrics(
            Path((info.get("data") or {}).get("dir") or TASKS["tokens"].default_data())))
        show_standing(info["champion"], term, where_of_info(info))


class TraceView(ChampionView):
    def result(self, result, term, data_dir):
        show_trace_champion(result["champion"], term, where_of_result(result))
        png = Path(result["path"]) / "pareto.png"
        if png.exists():
            term.result(f"trade-off picture: {png}")
        show_trace_writeback(result.get("writeback"), term)

    def inspect(self, info, term):
        show_trace_inspect(info, term)


def show_task_champion(ch: dict, term, where: dict | None = None) -> None:
    """A task champion beside the rule families tuned on valid to its critical budget,
    all reported on test, and where it stands."""
    budget = ch.get("critical_budget")
    cols = [("rule", "left"), ("param", "right"), ("test tokens/call", "right"),
            ("test critical/answer", "right"), ("test false rejects/token", "right"),
            ("valid tokens/call", "right"), ("valid critical/answer", "right")]
    t, v = ch["metrics"]["test"], ch["metrics"]["valid"]
    rows = [["champion *", "", _fmt(t["tokens_per_call"]), _fmt(t["critical_per_answer"], 4),
             _fmt(t["false_rejects_per_token"], 5), _fmt(v["tokens_per_call"]),
             _fmt(v["critical_per_answer"], 4)]]
    for name, rep in (ch.get("baselines_tuned_on_valid") or {}).items():
        if rep is None:
            rows.append([name, "", "no parameter fits the budget", "", "", "", ""])
            continue
        rows.append([name, "" if rep["param"] is None else f"{rep['param']:.4g}",
                     _fmt(rep["test"]["tokens_per_call"]),
                     _fmt(rep["test"]["critical_per_answer"], 4),
                     _fmt(rep["test"]["false_rejects_per_token"], 5),
                     _fmt(rep["valid"]["tokens_per_call"]),
                     _fmt(rep["valid"]["critical_per_answer"], 4)])
    order = [rows[0]] + sorted(rows[1:], key=lambda r: -float(r[2]) if r[3] else 1e9)
    term.table(f"{ch.get('decoding', '')} decoding, critical budget {budget}: rule families "
               "tuned on valid, all reported on test", cols, order,
               ["bold"] + [None] * (len(order) - 1))
    by = t.get("critical_by_distance")
    if by:                       # (champions of earlier releases have none)
        term.result("by distance from the prompt on test (0: the answer's first token), "
                    "the champion's accepted critical tokens per answer and the critical "
                    "share of the drafts the standard rule could reject: "
                    + ", ".join(f"{k}: {v['critical_per_answer']:.4f} / "
                                + ("-" if v["critical_rate"] is None
                                   else f"{v['critical_rate']:.2f}")
                                for k, v in by.items()))
    show_standing(ch, term, where)


class TaskView(ChampionView):
    def result(self, result, term, data_dir):
        show_task_champion(result["champion"], term, where_of_result(result))
        term.result("not written back: export a task champion from its run "
                    "(evolve export RUN ...)")

    def inspect(self, info, term):
        show_task_champion(info["champion"], term, where_of_info(info))


VIEWS = {"tokens": TokenView(), "traces": TraceView(), "task": TaskView()}


def show_task_comparison(doc: dict, term) -> None:
    """The paired free-running decoding of ``evolve simulate-task``: what an answer costs
    first (target calls per answer and per correct answer), then accuracy, agreement
    with lossless decoding, the answer's length and tokens per call."""
    ref = doc["reference"]
    cols = [("rule", "left"), ("calls/answer", "right"), ("calls/correct", "right"),
            ("accuracy", "right"), ("agreement", "right"), ("answer tokens", "right"),
            ("tokens/call", "right")]
    rows = [[name, f"{r['calls_per_problem']:.2f} ± {_fmt(r['calls_se'])}",
             f"{r['calls_per_correct']:.2f}", f"{r['accuracy']:.4f}",
             f"{r['agreement']:.4f}", f"{r['answer_tokens']:.1f}",
             f"{r['tokens_per_call']:.4f}"]
            for name, r in doc["rules"].items()]
    term.table(f"{doc['decoding']} decoding of {doc['problems']} {doc['split']} problems, the "
               "same problems and uniforms for every rule", cols, rows)
    if doc["versus_reference"]:
        cols = [(f"rule minus {ref}", "left"), ("calls/answer [95%]", "right"),
                ("calls/correct [95%]", "right"), ("accuracy [95%]", "right"),
                ("agreement [95%]", "right"), ("tokens/call [95%]", "right")]
        rows = []
        for name, d in doc["versus_reference"].items():
            rows.append([name] + [_diff(d.get(k), digits) for k, digits in
                                  (("calls_per_problem", 2), ("calls_per_correct", 2),
                                   ("accuracy", 4), ("agreement", 4),
                                   ("tokens_per_call", 4))])
        term.table("paired differences (by problem)", cols, rows)
    for name, setting in doc.get("engine_settings", {}).items():
        term.result(f"{name} in the engine: {setting}")
    term.result(f"({doc['seconds']:.1f} s)")


def _diff(d: dict | None, digits: int) -> str:
    """A paired difference and its 95% interval, ``+0.12 [-0.03, +0.27]`` ('-' if none)."""
    if d is None:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['difference']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def view_of(champion: dict) -> ChampionView:
    """The view of a champion's data world (the generic one for a world without its own)."""
    from evolve.tasks import champion_task    # lazy: start-up (it loads the kernels)
    return VIEWS.get(champion_task(champion).name) or ChampionView()


def show_run_result(result: dict, term, data_dir: Path) -> None:
    """What `evolve run` prints at the end: the champion beside the baselines of its
    world (``data_dir``: the run's splits)."""
    ch = result["champion"]
    term.result(f"run {result['run']} finished: {result['path']}")
    term.result(f"champion: {ch['expression']}  (size {ch['size']}, generation "
                f"{ch['generation']})")
    view_of(ch).result(result, term, data_dir)


def show_token_result(result: dict, term, bench: dict, where: dict | None = None) -> None:
    """A token champion beside the benchmark table of the token splits (``bench``)."""
    ch = result["champion"]
    for split, body in bench["splits"].items():
        body["heuristics"]["champion"] = ch["metrics"][split]
    show_benchmark(bench, term)
    show_standing(ch, term, where)
    wb = result.get("writeback")
    if wb is None:
        term.result("write-back skipped (--no-writeback)")
    elif wb.get("refused"):
        show_refusal(wb, term)
    elif wb["written"]:
        term.result(f"written back to heuristics/evolved.py (valid fitness "
                    f"{wb['new_valid_fitness']:.4f} vs {_fmt(wb['current_valid_fitness'])})")
    else:
        term.result(f"heuristics/evolved.py kept: its valid fitness "
                    f"{_fmt(wb['current_valid_fitness'])} >= champion's "
                    f"{wb['new_valid_fitness']:.4f} (use --force to replace)")


def show_refusal(wb: dict, term) -> None:
    """A champion not written back for its standing (``tasks.writeback.refusal``)."""
    term.result(f"not written back to heuristics/{wb['module']}: the champion "
                f"{sentence(wb['refused'], wb['why'])} (use --force to write it back)")


def show_trace_writeback(wb: dict | None, term) -> None:
    """The write-back decision of a trace run (heuristics/evolved_trace.py)."""
    if wb is None:
        term.result("write-back skipped (--no-writeback)")
    elif wb.get("refused"):
        show_refusal(wb, term)
    elif wb["written"]:
        term.result(f"written back to heuristics/{wb['module']} (valid speed score at TV "
                    f"{wb['tv_budget']:g}: {wb['new_valid_score']:.4f} vs "
                    f"{_fmt(wb['current_valid_score'])})")
    else:
        term.result(f"heuristics/{wb['module']} kept: its valid speed score at TV "
                    f"{wb['tv_budget']:g} {_fmt(wb['current_valid_score'])} >= champion's "
                    f"{wb['new_valid_score']:.4f} (use --force to replace)")


def show_trace_champion(ch: dict, term, where: dict | None = None) -> None:
    """Champion and baselines tuned on valid to the run's TV budget, on test."""
    budget = ch.get("tv_budget")
    cols = [("rule", "left"), ("param", "right"), ("test tokens/call", "right"),
            ("test TV/token", "right"), ("test slot TV p99", "right"),
            ("test KL/token", "right"), ("valid tokens/call", "right"),
            ("valid TV/token", "right")]
    t, v = ch["metrics"]["test"], ch["metrics"]["valid"]
    rows = [["champion *", "", _fmt(t["tokens_per_call"]), _fmt(t["tv_per_token"], 5),
             _fmt(t.get("tv_p99"), 4), _fmt(t["kl_per_token"], 5),
             _fmt(v["tokens_per_call"]), _fmt(v["tv_per_token"], 5)]]
    for name, rep in (ch.get("baselines_tuned_on_valid") or {}).items():
        if rep is None:
            rows.append([name, "", "no parameter fits the budget", "", "", "", "", ""])
            continue
        rows.append([name, "" if rep["param"] is None else f"{rep['param']:.4g}",
                     _fmt(rep["test"]["tokens_per_call"]),
                     _fmt(rep["test"]["tv_per_token"], 5), _fmt(rep["test"].get("tv_p99"), 4),
                     _fmt(rep["test"]["kl_per_token"], 5),
                     _fmt(rep["valid"]["tokens_per_call"]),
                     _fmt(rep["valid"]["tv_per_token"], 5)])
    order = [rows[0]] + sorted(rows[1:], key=lambda r: -float(r[2]) if r[3] else 1e9)
    term.table(f"TV budget {budget}: baselines tuned on valid, all reported on test",
               cols, order, ["bold"] + [None] * (len(order) - 1))
    if ch.get("estimate"):
        term.note(f"* an estimate: {ch['estimate']}")
    if ch.get("tv_first_cap") is not None and t.get("tv_first"):
        k = int(ch.get("first_tokens", 1))
        first = "the first token" if k == 1 else f"the first {k} tokens"
        term.note(f"champion's mean slot TV over {first} after the prompt: test "
                  f"{t['tv_first'][k - 1]:.5f}, valid {v['tv_first'][k - 1]:.5f} (capped at "
                  f"{ch['tv_first_cap']:g} on train)")
    show_standing(ch, term, where)


def show_standing(ch: dict, term, where: dict | None = None) -> None:
    """Where a champion stands (``evolve.tasks.traces.standing``, ``tokens.standing``,
    the task world's), what that means and what to try next (``evolve.standing.
    next_steps``; ``where``: the run's name and config), and the scope it was scored
    with, which its exports keep."""
    st = ch.get("standing")
    if st:
        term.result(f"champion {sentence(st['verdict'], st['why'])}")
        if where is not None:
            from evolve.standing import next_steps    # lazy: as used
            from evolve.tasks import champion_task    # lazy: start-up (it loads the kernels)
            for line in next_steps(st, champion_task(ch).name, where.get("run"),
                                   where.get("config"), ch.get("tv_budget")):
                term.result(line)
    sc = ch.get("scope")
    if sc:
        term.result(f"scored with: {scope_text(sc)}")


def scope_text(sc: dict) -> str:
    """A champion's scope in one line (``evolve.data.traces.scope_of``)."""
    if sc.get("decoding") == "greedy":
        return (f"greedy decoding: target-argmax drafts kept, the rule decides every other; "
                f"{sc.get('block_size')} drafted tokens per call; vocabulary "
                f"{sc.get('vocab_size')}")
    who = ("every drafted token" if sc.get("top_k") is None
           else f"drafts among the draft's top {sc['top_k']} (standard rule outside)")
    t = sc.get("temperature")
    return (f"the rule decides {who}; {sc.get('block_size')} drafted tokens per call; "
            f"temperature {'not recorded' if t is None else f'{t:g}'}, no top-k/top-p "
            f"truncation; vocabulary {sc.get('vocab_size')}")


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


def show_inspect(info: dict, term) -> None:
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
        from evolve.lang import treeio    # lazy: start-up (as above)
        read = {n.name for n in treeio.parse(ch["tree"]) if n.kind == "input"}
        term.result(f"size {ch['size']}, depth {ch['depth']}, found in generation "
                    f"{ch.get('generation')}; inputs read: "
                    + (" ".join(f"{short}={name}" for name, short, _ in ALL_INPUTS
                                if name in read) or "none"))
        view_of(ch).inspect(info, term)
    if ch and isinstance(ch.get("starts"), list):
        show_starts(ch, term)
    png = Path(info["path"]) / "history.png"
    term.result(f"fitness over generations (PNG): {png}" if png.exists() else
                "fitness over generations (PNG): evolve inspect --png draws it")
    h = info["history"]
    if h["best_train"]:
        term.result(f"best train fitness  {sparkline(h['best_train'])}  "
                    f"{h['best_train'][0]:.4f} -> {h['best_train'][-1]:.4f}")
        term.result(f"best valid fitness  {sparkline(h['best_valid'])}  "
                    f"{h['best_valid'][0]:.4f} -> {h['best_valid'][-1]:.4f}")
        term.result(f"mean size           {sparkline(h['mean_size'])}  "
                    f"{h['mean_size'][0]:.1f} -> {h['mean_size'][-1]:.1f}")
    cfg = info.get("config") or {}
    # read from config.json: escaped whatever it holds, then wrapped at its commas
    term.result(textwrap.fill("config: " + printable(", ".join(f"{k}={v}"
                                                               for k, v in cfg.items())),
                              width=WRAP, subsequent_indent="  ", break_long_words=False,
                              break_on_hyphens=False))


def show_trace_inspect(info: dict, term) -> None:
    """A trace champion: baselines tuned to its budget, and the trade-off on valid."""
    ch = info["champion"]
    show_trace_champion(ch, term, where_of_info(info))
    series = (info.get("pareto") or {}).get("series")
    if isinstance(series, dict):
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
            term.result(render_text(pts, budgets=[budget]))
    png = Path(info["path"]) / "pareto.png"
    if png.exists():
        term.result(f"picture: {png}")


def show_token_inspect(ch: dict, term, standard: dict | None) -> None:
    """A token champion's metrics per split beside standard rejection's fitness."""
    cols = [("split", "left"), ("accept %", "right"), ("accuracy %", "right"),
            ("quality", "right"), ("fitness", "right"), ("std. rejection fitness", "right")]
    rows = []
    for split, m in ch.get("metrics", {}).items():
        std = standard.get(split) if standard else None
        rows.append([split, f"{100 * m['accept_rate']:.1f}", f"{100 * m['accuracy']:.1f}",
                     f"{m['quality']:.4f}", f"{m['fitness']:.4f}",
                     f"{std['fitness']:.4f}" if std else "-"])
    term.table("champion metrics", cols, rows)


def _clip(text: str, width: int = 60) -> str:
    """A damaged run's reason, cut to keep the table readable (--json has it whole)."""
    return text if len(text) <= width else text[:width - 1] + "…"


def show_runs(rows: list[dict], term) -> None:
    """The runs, one line each: a long status and champion are cut with an ellipsis
    (``evolve runs --json`` and ``evolve inspect`` have them whole)."""
    from evolve.tasks import TASKS    # lazy: start-up (the tasks load NumPy and the data layer)

    def score(r, split):
        task = TASKS.get(r.get("task"))
        return "" if task is None else task.runs_text(r, split)
    term.table("runs", [("run", "left"), ("status", "left", "cut"), ("gen", "right"),
                        ("valid", "right"), ("test", "right"), ("champion", "left", "cut")],
               [[r["run"], _clip(r["status"] or ""),
                 "" if r["generation"] is None else r["generation"],
                 score(r, "valid"), score(r, "test"), r["expression"] or ""] for r in rows])


def render_text(series: dict, width: int = 72, height: int = 20, xlabel="TV per token",
                ylabel="tokens per call", budgets=()) -> str:
    """A plain-text scatter: ``series`` maps a name to [(x, y), ...]; each series is
    marked by its letter of ``evolve.rules.styles`` (the pictures' legend, in letters),
    and each of ``budgets`` by a column of ':' (the pictures' dashed budget lines)."""
    pts = [(x, y) for v in series.values() for x, y in v if np.isfinite(x) and np.isfinite(y)]
    if not pts:
        return "(no points)"
    xs, ys = np.array(pts).T
    x0, x1 = 0.0 if xs.min() >= 0 else xs.min(), xs.max()
    y0, y1 = ys.min(), ys.max()
    x1 = x1 if x1 > x0 else x0 + 1.0
    y1 = y1 if y1 > y0 else y0 + 1.0
    grid = [[" "] * width for _ in range(height)]
    shown = [b for b in budgets if x0 <= b <= x1]
    for b in shown:
        c = int(round((b - x0) / (x1 - x0) * (width - 1)))
        for row in grid:
            row[c] = ":"
    legend = []
    for name, style in styles_of(series).items():
        v, m = series[name], style.letter
        legend.append(f"{m} {name}")
        for x, y in v:
            if not (np.isfinite(x) and np.isfinite(y)):
                continue
            c = int(round((x - x0) / (x1 - x0) * (width - 1)))
            r = height - 1 - int(round((y - y0) / (y1 - y0) * (height - 1)))
            grid[r][c] = m
    lab = f"{y1:.3f}"
    pad = len(lab)
    lines = [f"{ylabel}"]
    for r, row in enumerate(grid):
        tick = f"{y1:.3f}" if r == 0 else (f"{y0:.3f}" if r == height - 1 else "")
        lines.append((tick.rjust(pad) + " |" + "".join(row)).rstrip())
    lines.append(" " * pad + " +" + "-" * width)
    lo, hi = f"{x0:.4g}", f"{x1:.4g}"
    lines.append(" " * (pad + 2) + lo + " " * max(1, width - len(lo) - len(hi)) + hi)
    lines.append(" " * (pad + 2) + xlabel)
    if shown:
        legend.append(": budget " + ", ".join(f"{b:g}" for b in shown))
    lines.append("  ".join(legend))
    return "\n".join(lines)


def jsonable(obj):
    """Non-finite floats (an SE of one block, a never-reached position) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def show_starts(ch: dict, term) -> None:
    """The starts of a run of several (``--starts``): the chosen one and the spread."""
    from evolve.tasks import champion_task    # lazy: start-up (it loads the kernels)
    key = champion_task(ch).figure
    rows = []
    for st in ch["starts"]:
        rows.append([str(st.get("seed")), _fmt(st.get("valid_score")),
                     _fmt((st.get("valid") or {}).get(key)), _fmt((st.get("test") or {}).get(key)),
                     "chosen" if st.get("seed") == ch.get("chosen_seed") else "",
                     str(st.get("expression", ""))])     # whole: the table folds it
    term.table(f"starts: chosen on valid score; test {key} over starts", [
        ("seed", "right"), ("valid score", "right"), (f"valid {key}", "right"),
        (f"test {key}", "right"), ("", "left"), ("champion", "left")], rows)
    o = ch.get("over_starts") or {}
    if o:
        term.result(f"{o.get('figure')} over {o.get('n')} starts: median {_fmt(o.get('median'))}, "
                    f"min {_fmt(o.get('min'))}, max {_fmt(o.get('max'))}")
