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


def test_every_verdict_says_what_it_means_and_what_to_try_next():
    """``evolve.standing.next_steps``: under each verdict, a line of what it means and a
    line of commands, each a real command with the run's own name and settings: a loser
    on traces points at its rival's setting through `evolve tradeoff` at the run's budget,
    a longer search resumes the run, and --seed-baselines is offered only to a run that
    did not start from the baselines."""
    from evolve.standing import next_steps
    cfg = {"generations": 10, "seed_baselines": True, "objective": "speed"}
    loses = {"verdict": "loses", "best_tuned": {"rule": "leniency", "param": 0.84}}
    what, nxt = next_steps(loses, "traces", "speed-tour", cfg, 0.02)
    assert what.startswith("  what it means: leniency, a rule family with one knob")
    assert "evolve tradeoff --budget 0.02 --run speed-tour" in nxt
    assert "evolve run --resume speed-tour --generations 50" in nxt
    assert "--seed-baselines" not in nxt
    _, nxt = next_steps(loses, "traces", "r", {**cfg, "seed_baselines": False,
                                               "generations": 200}, 0.02)
    assert "--generations 400" in nxt and "--seed-baselines" in nxt
    _, nxt = next_steps({"verdict": "loses", "best_baseline": {"rule": "ratio_floor_0.3"}},
                        "tokens", "t", {"generations": 20})
    assert "use ratio_floor_0.3 instead" in nxt and "tradeoff" not in nxt
    what, nxt = next_steps({"verdict": "infeasible"}, "traces", "x", cfg, 0.02)
    assert "not a rule to deploy" in what and "--budget-tv" in nxt and "pareto" in nxt
    what, nxt = next_steps({"verdict": "wins"}, "traces", "w", cfg, 0.02)
    assert "evolve simulate --compare standard_rejection --compare run:w" in nxt
    assert "evolve export w --format" in nxt
    _, nxt = next_steps({"verdict": "wins"}, "task", "k", cfg)
    assert "evolve simulate-task --compare lossless --compare run:k" in nxt
    assert next_steps({}, "traces") == []
