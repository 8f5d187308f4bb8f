"""The pictures a run leaves behind (PNG, matplotlib): fitness over generations and
the trade-off on valid. Headless backend, deterministic PNG bytes, atomic writes."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from evolve.io.atomic import atomic_write_bytes


def pyplot():
    """matplotlib.pyplot on the Agg backend; RuntimeError if matplotlib is missing."""
    try:
        import matplotlib    # lazy: start-up (matplotlib loads only where it is used)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt    # lazy: start-up (matplotlib loads only where it is used)
    except ImportError:
        raise RuntimeError("pictures need matplotlib (pip install matplotlib)") from None
    return plt


def save_png(fig, path) -> None:
    """Write a figure as PNG (no timestamp metadata, so same figure, same bytes) and close it."""
    plt = pyplot()
    buf = BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def history_png(history: list[dict], path: Path, title: str) -> bool:
    """``history_figure`` as a PNG; False without matplotlib."""
    try:
        fig = history_figure(history, title)
    except RuntimeError:
        return False
    save_png(fig, path)
    return True


def history_figure(history: list[dict], title: str):
    """Best train/valid fitness and mean size per generation (whole generations on the
    axis), as a matplotlib figure."""
    plt = pyplot()
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
    from matplotlib.ticker import MaxNLocator    # lazy: with matplotlib
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))     # generations are whole
    fig.tight_layout()
    return fig


# The panel "near the budgets" spans TV 0 .. ZOOM x the largest budget asked for.
ZOOM = 2.5
Z95 = 1.959963984540054


def _draw_series(ax, series: dict, styles: dict) -> None:
    """Each series in its style: a family's sweep as a line through its grid, a single
    rule as one large marker, the hall of fame as dots over the rest."""
    for name, pts in series.items():
        if not pts:
            continue
        st = styles[name]
        x, y = [p[0] for p in pts], [p[1] for p in pts]
        if name == "hall of fame":
            ax.plot(x, y, ls="none", marker="o", ms=3.5, color=st.colour, alpha=0.8,
                    zorder=4, label=name)
        elif len(pts) == 1:
            ax.plot(x, y, ls="none", marker=st.marker, ms=11, color=st.colour, mec="black",
                    mew=0.6, zorder=6, label=name)
        else:
            ax.plot(x, y, marker=st.marker, ms=4, lw=1.1, color=st.colour, zorder=3,
                    label=name)


def _zoom_limits(series: dict, tuned: list, budgets: list) -> tuple:
    """(x0, x1, y0, y1) of the panel near the budgets: TV from 0 to ZOOM x the largest
    budget (further where a single rule or a tuned point lies a little beyond), and the
    tokens per call of what is shown there, intervals included."""
    top = max(budgets)
    singles = [p[0] for v in series.values() if len(v) == 1 for p in v]
    singles += [t[1] for t in tuned]
    x1 = max([ZOOM * top] + [x * 1.08 for x in singles if x <= 2 * ZOOM * top])
    ys = [p[1] for v in series.values() for p in v if p[0] <= x1]
    ys += [t[2] + s * Z95 * (t[3] or 0.0) for t in tuned for s in (-1, 1)]
    if not ys:
        return 0.0, x1, 0.0, 1.0
    y0, y1 = min(ys), max(ys)
    pad = 0.08 * (y1 - y0) if y1 > y0 else 0.05
    return -0.02 * x1, x1, y0 - pad, y1 + pad


def _forest(ax, tuned: list, budgets: list, styles: dict) -> None:
    """The rules tuned to each budget, side by side: one column per rule (sorted by
    tokens per call within its budget, a gap between budgets), its test tokens per call
    with the 95% interval, the rule's name under it. Every tuned rule lands on its
    budget line, so in the curves' panel they would hide each other."""
    groups = []
    for b in budgets:
        rows = [t for t in tuned if (t[4] if len(t) > 4 else b) == b]
        groups.append((b, sorted(rows, key=lambda t: t[2])))
    x, names = 0, []
    for b, rows in groups:
        start = x
        for name, tv, y, se, *_ in rows:
            st = styles[name]
            ax.errorbar([x], [y], yerr=None if se is None else [[Z95 * se], [Z95 * se]],
                        ls="none", marker=st.marker, ms=8, color=st.colour, mec="black",
                        mew=0.6, ecolor=st.colour, elinewidth=1.0, capsize=2.5, zorder=7)
            names.append((x, name))
            x += 1
        if len(groups) > 1 and rows:
            ax.annotate(f"TV {b:g}", ((start + x - 1) / 2, 1), xycoords=("data", "axes fraction"),
                        xytext=(0, -4), textcoords="offset points", ha="center", va="top",
                        fontsize=8, color="0.25")
            if start:
                ax.axvline(start - 1, color="0.7", lw=0.8)
        x += 1                             # a gap between budgets
    ax.set_xticks([p for p, _ in names])
    ax.set_xticklabels([n for _, n in names], rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.7, max(x - 1.3, 0.7))
    ax.grid(alpha=0.3, axis="y")


def tradeoff_figure(series: dict, budgets=(), title: str = "", tuned=(),
                    xlabel: str = "TV per token", ylabel: str = "tokens per target call"):
    """The trade-off as a matplotlib figure. ``series`` maps a name to its points
    [(TV, tokens per call), ...] in sweep order; ``budgets`` the TV budgets asked for;
    ``tuned`` the rules tuned to them, [(name, TV, tokens per call, standard error or
    None[, budget]), ...]. With budgets there are three panels: the tuned rules side by
    side with their 95% intervals, sorted by tokens per call (they all sit on their
    budget's line, where they would hide each other); the curves from TV 0 to ``ZOOM``
    times the largest budget, with a dashed line at each budget, on the same scale of
    tokens per call; and the whole curve with that region marked. Each series keeps its
    style (``evolve.rules.styles``), and one legend below names the curves."""
    from evolve.rules.styles import styles_of    # lazy: start-up (read with matplotlib)
    plt = pyplot()
    tuned = [tuple(t) for t in tuned]
    budgets = sorted({float(b) for b in budgets if b > 0})
    styles = styles_of(list(series) + [t[0] for t in tuned if t[0] not in series])
    forest = None
    if budgets:
        ratios = ([min(2.6, 0.6 + 0.16 * len(tuned))] if tuned else []) + [2.2, 1.2]
        fig, axes = plt.subplots(1, len(ratios), figsize=(12.5 if tuned else 11, 5.2),
                                 dpi=120, layout="constrained",
                                 gridspec_kw={"width_ratios": ratios})
        forest, ax, whole = axes if tuned else (None, *axes)
    else:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=120, layout="constrained")
        whole = None
    _draw_series(ax, series, styles)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if budgets:
        x0, x1, y0, y1 = _zoom_limits(series, tuned, budgets)
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        for b in budgets:
            ax.axvline(b, ls="--", lw=1, color="0.35", zorder=2)
            ax.annotate(f"budget {b:g}", (b, 1), xycoords=("data", "axes fraction"),
                        xytext=(-3, -4), textcoords="offset points", fontsize=8,
                        color="0.25", rotation=90, ha="right", va="top")   # never collide
        ax.set_title("near the budgets", fontsize=10)
        if forest is not None:
            _forest(forest, tuned, budgets, styles)
            forest.set_ylim(y0, y1)
            forest.set_ylabel(ylabel)
            ax.set_ylabel("")
            forest.set_title("tuned on valid, on test (95%)", fontsize=10)
        _draw_series(whole, series, styles)
        whole.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ls="--",
                                      lw=1, ec="0.35", zorder=8))
        whole.set_title("whole curve (box: " + ("middle" if forest is not None else "left")
                        + ")", fontsize=10)
        whole.set_xlabel(xlabel)
        whole.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(6, len(handles)),
                   fontsize=8, frameon=False)
    return fig


def render_png(series: dict, path, title: str = "", budgets=(), tuned=()) -> None:
    """``tradeoff_figure`` to a PNG; needs matplotlib (an optional dependency)."""
    save_png(tradeoff_figure(series, budgets, title, tuned), path)


def tradeoff_png(series: dict, path, title: str, budgets=(), tuned=()) -> str | None:
    """``render_png`` of a trade-off; the path written, or None without matplotlib."""
    try:
        render_png(series, path, title, budgets, tuned)
    except RuntimeError:
        return None
    return str(path)


def draw_pictures(run) -> list[str]:
    """Draw a run's pictures from its files, where missing or older than their data:
    history.png from history.jsonl and, for trace runs, pareto.png from the series in
    pareto.json. `evolve run` does not draw them (matplotlib costs about a second to
    import); `evolve inspect` does. Returns the paths written (none without
    matplotlib, or where the run directory cannot be written)."""
    jobs = []
    hist, png = run.file("history.jsonl"), run.file("history.png")
    if hist.exists() and (not png.exists() or png.stat().st_mtime < hist.stat().st_mtime):
        jobs.append(lambda: history_png(run.history(), png, f"run {run.name}") and png)
    par, ppng = run.file("pareto.json"), run.file("pareto.png")
    if par.exists() and (not ppng.exists() or ppng.stat().st_mtime < par.stat().st_mtime):
        def tradeoff():
            doc = run.pareto() or {}
            series = {str(k): [tuple(p) for p in v] for k, v in doc.get("series", {}).items()}
            budget = doc.get("budget")
            return tradeoff_png(series, ppng, f"run {run.name}: valid split, budget TV "
                                              f"{budget or 0:g}",
                                [budget] if isinstance(budget, (int, float)) else ()) and ppng
        jobs.append(tradeoff)
    written = []
    for job in jobs:
        try:
            p = job()
        except (OSError, ValueError, TypeError):
            p = None
        if p:
            written.append(str(p))
    return written
