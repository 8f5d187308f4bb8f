from evolve.cli import views
from evolve.runs import report
from evolve.lang import treeio
from evolve.rules.table import RULES

SEED_TREES = {n: r.tree() for n, r in RULES.items() if r.data == "tokens"}


def test_simplified_formula():
    assert report.simplified(treeio.parse("sub(add(draft_prob, target_prob), draft_prob)")) == "t"
    assert report.simplified(treeio.parse(SEED_TREES["standard_rejection"])) == "Min(1, t/d)"
    big = "draft_prob"
    for _ in range(30):
        big = f"add({big}, 1.0)"
    assert report.simplified(treeio.parse(big)) is None


def test_sparkline():
    assert views.sparkline([]) == ""
    assert views.sparkline([1, 1, 1]) == "███"
    line = views.sparkline([0, 0.5, 1])
    assert line[0] == "▁" and line[-1] == "█" and len(line) == 3
    assert len(views.sparkline(list(range(500)), width=60)) == 60
