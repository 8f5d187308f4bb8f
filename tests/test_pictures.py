"""Pictures people would rather look at than read (``evolve.runs.pictures``) and one look
per rule everywhere (``evolve.rules.styles``): a trade-off zooms to the budgets asked
for, draws a line at each and the whole curve beside it; every family has one colour,
marker and terminal letter, in every picture and in the terminal's plots."""

import pytest

from evolve.cli.views import render_text
from evolve.rules.styles import OTHERS, STYLES, styles_of
from evolve.rules import tuning
from evolve.rules.table import RULES, families

pytest.importorskip("matplotlib")

SERIES = {
    "leniency": [(0.0, 2.3), (0.004, 2.34), (0.01, 2.37), (0.03, 2.46), (0.3, 4.6)],
    "typical_acceptance": [(0.07, 2.2), (0.075, 2.43)],
    "hall of fame": [(0.009, 2.36), (0.0095, 2.365)],
    "standard_rejection": [(0.0, 2.3)],
    "run r1": [(0.011, 2.38)],
}


def test_every_family_and_run_series_has_one_style_of_its_own():
    names = set(families()) | {"position_leniency", "knapsack_oracle", "hall of fame",
                               "champion", "evolved front (NSGA-II)", *tuning.GATES}
    assert names <= set(STYLES), sorted(names - set(STYLES))
    every = list(STYLES.values()) + list(OTHERS)
    assert len({s.colour.lower() for s in every}) == len(every)        # no colour twice
    assert len({s.letter for s in every}) == len(every)                # no letter twice
    assert all(len(s.letter) == 1 for s in every)


def _apart(a: str, b: str) -> float:
    """The "redmean" distance of two colours (0 .. about 765): a cheap perceptual one."""
    (r1, g1, b1), (r2, g2, b2) = (tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in (a, b))
    rm = (r1 + r2) / 2
    return ((2 + rm / 256) * (r1 - r2) ** 2 + 4 * (g1 - g2) ** 2
            + (2 + (255 - rm) / 256) * (b1 - b2) ** 2) ** 0.5


def test_the_rules_of_one_picture_are_told_apart_by_colour():
    """Every family a results picture draws side by side, the learned judge and the
    evolved champion: no two colours alike (BiLD once drew in the champion's red, and
    the learned judge in fuzzy SD's brown)."""
    names = sorted(set(families()) | {"kl_judge", "trtllm_relaxed", "learned_judge",
                                       "champion", "standard_rejection", "position_leniency",
                                       *tuning.GATES})
    close = [(a, b, round(_apart(STYLES[a].colour, STYLES[b].colour)))
             for i, a in enumerate(names) for b in names[i + 1:]
             if _apart(STYLES[a].colour, STYLES[b].colour) < 90]
    assert not close, close


def test_a_familys_style_does_not_depend_on_what_else_is_drawn():
    """The same letter and colour for standard rejection whatever precedes it (the
    terminal plots once marked it 's' in one command and typical acceptance 's' in
    another)."""
    a = styles_of(["standard_rejection", "typical_acceptance"])
    b = styles_of(["run x", "typical_acceptance", "standard_rejection"])
    assert a["standard_rejection"] == b["standard_rejection"] == STYLES["standard_rejection"]
    assert a["typical_acceptance"] == b["typical_acceptance"]
    assert b["run x"] == OTHERS[0]
    assert set(RULES) >= {"standard_rejection", "typical_acceptance"}


def test_the_terminal_plot_marks_each_series_with_its_letter_and_the_budgets():
    text = render_text(SERIES, width=50, height=12, budgets=[0.01, 0.03])
    legend = text.splitlines()[-1]
    for name in SERIES:
        assert f"{styles_of(SERIES)[name].letter} {name}" in legend
    assert ": budget 0.01, 0.03" in legend
    rows = text.splitlines()[1:13]
    cols = {i for r in rows for i, ch in enumerate(r) if ch == ":"}
    assert len(cols) == 2                     # one column per budget


def _lines(ax):
    return {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_the_tradeoff_picture_zooms_to_the_budgets_and_keeps_the_whole_curve():
    from evolve.runs import pictures
    tuned = [("leniency", 0.0099, 2.37, 0.02, 0.01), ("position_leniency", 0.0094, 2.375,
                                                      0.019, 0.01),
             ("leniency", 0.029, 2.45, 0.02, 0.03), ("ears", 0.03, 2.44, 0.02, 0.03)]
    fig = pictures.tradeoff_figure(SERIES, [0.01, 0.03], "t", tuned)
    forest, zoom, whole = fig.axes[:3]
    x0, x1 = zoom.get_xlim()
    assert x0 <= 0 and 0.03 < x1 <= pictures.ZOOM * 0.03 * 1.1   # the budgets, not TV 0.3
    assert whole.get_xlim()[1] >= 0.3                               # the whole curve beside
    budget_lines = [ln.get_xdata()[0] for ln in zoom.get_lines()
                    if ln.get_linestyle() == "--"]
    assert sorted(budget_lines) == [0.01, 0.03]
    # the budgets' labels run along their lines: two budgets close together never collide
    labels = [t for t in zoom.texts if t.get_text().startswith("budget ")]
    assert len(labels) == 2 and all(t.get_rotation() == 90 for t in labels)
    drawn = _lines(zoom)
    for name in SERIES:
        st = STYLES.get(name) or OTHERS[0]
        assert drawn[name].get_color() == st.colour, name
        assert drawn[name].get_marker() == st.marker or name == "hall of fame", name
    # the hall of fame is inside the zoomed region, on top of the family lines
    hof = drawn["hall of fame"]
    assert hof.get_zorder() > drawn["leniency"].get_zorder()
    assert all(x0 <= x <= x1 for x in hof.get_xdata())
    y0, y1 = zoom.get_ylim()
    assert y0 < 2.3 and 2.46 < y1 < 3                               # not up to 4.6
    # the tuned rules, which all sit on their budget's line, stand side by side in their
    # own panel, on the same scale, each with its 95% interval, sorted within its budget
    assert not [c for c in zoom.containers if c.has_yerr]
    bars = [c for c in forest.containers if c.has_yerr]
    assert len(bars) == len(tuned) and forest.get_ylim() == zoom.get_ylim()
    names = [t.get_text() for t in forest.get_xticklabels()]
    assert names == ["leniency", "position_leniency", "ears", "leniency"]
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels.count("leniency") == 1 and "position_leniency" not in labels
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_the_history_picture_counts_whole_generations():
    from evolve.runs import pictures
    history = [{"generation": g, "best_train": 0.5 + g / 100, "median_train": 0.4,
                "best_valid": 0.5, "mean_size": 7.0} for g in range(21)]
    fig = pictures.history_figure(history, "run r")
    ticks = [t for t in fig.axes[1].get_xticks() if 0 <= t <= 20]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_a_picture_without_budgets_is_one_panel(tmp_path):
    from evolve.runs import pictures
    path = tmp_path / "p.png"
    pictures.render_png(SERIES, path, "no budget")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = tmp_path / "q.png"
    pictures.render_png(SERIES, again, "no budget")
    assert path.read_bytes() == again.read_bytes()                  # same figure, same bytes


def test_every_figure_of_the_docs_is_drawn_by_the_committed_script(tmp_path):
    """docs/img/ holds exactly what `make figures` (benchmarks/figures.py) draws from the
    committed results, and every picture a page shows is one of them."""
    import re
    from pathlib import Path
    from benchmarks import figures
    root = Path(__file__).resolve().parents[1]
    assert figures.main(["--out", str(tmp_path)]) == 0
    drawn = {p.name for p in tmp_path.glob("*.png")}
    assert drawn == {p.name for p in (root / "docs" / "img").glob("*.png")}
    shown = {m for page in (root / "docs").rglob("*.md")
             for m in re.findall(r"\]\((?:\.\./)?img/([\w.-]+\.png)\)", page.read_text())}
    assert shown and shown <= drawn, shown - drawn


def test_the_task_figure_gives_each_rule_a_line_of_its_own(monkeypatch, tmp_path):
    """docs/img/task_results.png: per decoding and budget, every rule on a line of its own
    (named on the axis: no legend), the oracle's bound among them, sorted by the target
    calls per correct answer it saves against lossless."""
    import json
    from pathlib import Path
    from benchmarks import figures
    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "experiments"
                      / "task_results.json").read_text())
    shown = []
    monkeypatch.setattr(figures, "save_png", lambda fig, path: shown.append(fig))
    figures.task_figure(doc, tmp_path / "t.png")
    (fig,) = shown
    assert not fig.legends
    panels = [pb for m in doc["modes"].values() for pb in m["tradeoff"]["budgets"]]
    gains = fig.axes[::2]
    assert len(gains) == len(panels)
    for ax, pb in zip(gains, panels):
        rows = [r for r in pb["rows"] if r["versus_lossless"] is not None]
        assert any(r["kind"] == "oracle" for r in rows)
        want = [r["rule"] for r in sorted(
            rows, key=lambda r: -r["versus_lossless"]["calls_per_correct"]["difference"])]
        assert [t.get_text() for t in ax.get_yticklabels()] == want
    import matplotlib.pyplot as plt
    plt.close(fig)
