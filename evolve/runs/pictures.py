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
    """Best train/valid fitness and mean size per generation, as a PNG (matplotlib)."""
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


def render_png(series: dict, path, title: str = "", xlabel="TV per token",
               ylabel="tokens per target call") -> None:
    """Scatter/line plot to a PNG; needs matplotlib (an optional dependency)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, v in series.items():
        if not v:
            continue
        x, y = zip(*v)          # in sweep (parameter) order
        ax.plot(x, y, marker="o", ms=6 if len(v) == 1 else 3, lw=1, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def tradeoff_png(series: dict, path, title: str) -> str | None:
    """``render_png`` of a trade-off; the path written, or None without matplotlib."""
    try:
        render_png(series, path, title=title)
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
            return tradeoff_png(series, ppng, f"run {run.name}: valid split, budget TV "
                                              f"{doc.get('budget', 0):g}") and ppng
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
