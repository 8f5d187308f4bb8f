"""Literature rules on the (tokens per target call, distortion) axes.

Each rule is a numpy function of the candidate features (``spec.FEATURES``, as
(n, k) arrays) and one parameter; ``sweep`` evaluates it over a parameter grid
with the exact objectives of ``evolve.spec``; ``tune`` picks, on one split, the
parameter with the most tokens per call whose mean TV per token is within a
budget (then report it on another split); ``pareto_front`` keeps the
non-dominated points; ``render_text`` draws them for a terminal and
``render_png`` (matplotlib, optional) to a file.

Rules (d = draft_prob, t = target_prob, te = target_entropy):
    standard   min(1, t/d)                                  (no parameter)
    leniency   min(1, t / (l d)),  l in (0, 1]              l = 1: standard
    ears       min(1, t/d + beta (1 - p_max)), beta >= 0    beta = 0: standard
    typical    1 if t > min(eps, sqrt(eps) exp(-te)) else 0 (Medusa: eps 0.09, delta 0.3)
    bild       1 if -log t <= alpha else 0                  (BiLD rollback, alpha 2..5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve import spec


def standard(F):
    return np.minimum(1.0, F["target_prob"] / F["draft_prob"])


def leniency(F, l=0.5):
    return np.minimum(1.0, F["target_prob"] / (l * F["draft_prob"]))


def ears(F, beta=0.3):
    return np.minimum(1.0, F["target_prob"] / F["draft_prob"] + beta * (1.0 - F["p_max"]))


def typical(F, eps=0.09, delta=None):
    delta = np.sqrt(eps) if delta is None else delta
    t = F["target_prob"]
    return np.where(t > np.minimum(eps, delta * np.exp(-F["target_entropy"])), 1.0, 0.0)


def bild(F, alpha=5.0):
    return np.where(-np.log(F["target_prob"]) <= alpha, 1.0, 0.0)


@dataclass(frozen=True)
class RuleSpec:
    fn: object
    param: str | None
    grid: tuple
    default: float | None
    lenient: bool          # a(x) >= min(1, p/q) everywhere (TV = extra mass)


RULES: dict[str, RuleSpec] = {
    "standard": RuleSpec(standard, None, (), None, True),
    "leniency": RuleSpec(leniency, "l", (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
                         0.5, True),
    "ears": RuleSpec(ears, "beta", (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0), 0.3, True),
    "typical": RuleSpec(typical, "eps", (0.005, 0.01, 0.02, 0.05, 0.09, 0.15, 0.2, 0.3), 0.09,
                        False),
    "bild": RuleSpec(bild, "alpha", (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0), 5.0, False),
}


@dataclass(frozen=True)
class Point:
    rule: str
    param: float | None
    objectives: spec.Objectives

    @property
    def tokens(self) -> float:
        return self.objectives.tokens_per_call

    @property
    def tv(self) -> float:
        return self.objectives.tv_per_token

    @property
    def kl(self) -> float:
        return self.objectives.kl_per_token

    def label(self) -> str:
        if self.param is None:
            return self.rule
        name = RULES[self.rule].param if self.rule in RULES else "param"
        return f"{self.rule}({name}={self.param:g})"

    def to_dict(self) -> dict:
        return {"rule": self.rule, "param": self.param, **self.objectives.to_dict()}


def evaluate(name: str, sa: spec.SpecArrays, param=None) -> Point:
    r = RULES[name]
    kw = {} if r.param is None else {r.param: r.default if param is None else param}
    h = spec.rule_thresholds(r.fn, sa, **kw)
    return Point(name, None if r.param is None else float(kw[r.param]), spec.objectives(sa, h))


def sweep(name: str, sa: spec.SpecArrays, grid=None) -> list[Point]:
    r = RULES[name]
    if r.param is None:
        return [evaluate(name, sa)]
    return [evaluate(name, sa, v) for v in (r.grid if grid is None else grid)]


def sweep_all(sa: spec.SpecArrays, names=None) -> list[Point]:
    return [p for n in (names or RULES) for p in sweep(n, sa)]


BISECT_STEPS = 20


def tune(name: str, sa_tune: spec.SpecArrays, budget: float, grid=None) -> Point | None:
    """The parameter with the most tokens per call whose TV per token is <= budget
    on ``sa_tune`` (ties: smaller TV, then the earlier grid value); None if none fits.

    The grid is searched first; for lenient rules (TV and tokens grow together
    with leniency along the grid) the best feasible grid value is then refined
    by bisection towards its infeasible neighbour, so the tuned rule spends the
    budget instead of stopping at a coarse grid step."""
    r = RULES[name]
    pts = sweep(name, sa_tune, grid)
    feasible = [p for p in pts if p.tv <= budget]
    if not feasible:
        return None
    best = max(feasible, key=lambda p: (p.tokens, -p.tv))
    if r.param is None or not r.lenient:
        return best
    i = pts.index(best)
    if i + 1 >= len(pts) or pts[i + 1].tv <= budget:
        return best
    lo, hi = best.param, pts[i + 1].param   # feasible .. infeasible
    for _ in range(BISECT_STEPS):
        mid = evaluate(name, sa_tune, 0.5 * (lo + hi))
        if mid.tv <= budget:
            lo = mid.param
            if (mid.tokens, -mid.tv) > (best.tokens, -best.tv):
                best = mid
        else:
            hi = mid.param
    return best


def tuned_report(name: str, sa_valid: spec.SpecArrays, sa_test: spec.SpecArrays,
                 budget: float, grid=None) -> dict | None:
    """Tune on valid to a TV budget, then evaluate that parameter on test."""
    best = tune(name, sa_valid, budget, grid)
    if best is None:
        return None
    test = evaluate(name, sa_test, best.param)
    return {"rule": name, "param": best.param, "budget": budget,
            "valid": best.objectives.to_dict(), "test": test.objectives.to_dict()}


def pareto_front(points, x=lambda p: p.tv, y=lambda p: p.tokens) -> list:
    """Points not dominated (lower-or-equal x and higher-or-equal y, one strictly), by x."""
    pts = sorted(points, key=lambda p: (x(p), -y(p)))
    front, best = [], -np.inf
    for p in pts:
        if y(p) > best:
            front.append(p)
            best = y(p)
    return front


# ----------------------------------------------------------------- pictures

_MARKS = "so^vdx+*#%@"


def render_text(series: dict, width: int = 72, height: int = 20, xlabel="TV per token",
                ylabel="tokens per call") -> str:
    """A plain-text scatter: ``series`` maps a name to [(x, y), ...]."""
    pts = [(x, y) for v in series.values() for x, y in v if np.isfinite(x) and np.isfinite(y)]
    if not pts:
        return "(no points)"
    xs, ys = np.array(pts).T
    x0, x1 = 0.0 if xs.min() >= 0 else xs.min(), xs.max()
    y0, y1 = ys.min(), ys.max()
    x1 = x1 if x1 > x0 else x0 + 1.0
    y1 = y1 if y1 > y0 else y0 + 1.0
    grid = [[" "] * width for _ in range(height)]
    legend = []
    for i, (name, v) in enumerate(series.items()):
        m = _MARKS[i % len(_MARKS)]
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
        lines.append(tick.rjust(pad) + " |" + "".join(row))
    lines.append(" " * pad + " +" + "-" * width)
    lo, hi = f"{x0:.4g}", f"{x1:.4g}"
    lines.append(" " * (pad + 2) + lo + " " * max(1, width - len(lo) - len(hi)) + hi)
    lines.append(" " * (pad + 2) + xlabel)
    lines.append("  ".join(legend))
    return "\n".join(lines)


def render_png(series: dict, path, title: str = "", xlabel="TV per token",
               ylabel="tokens per target call") -> None:
    """Scatter/line plot to a PNG; needs matplotlib (an optional dependency)."""
    from evolve.plots import pyplot, save_png
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


def series_of(points) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(p.rule, []).append((p.tv, p.tokens))
    return out


# ---------------------------------------------------------------- trade-off

def tradeoff(sa_valid: spec.SpecArrays, sa_test: spec.SpecArrays, budgets,
             extra: dict | None = None) -> dict:
    """The trade-off report behind ``evolve tradeoff``.

    Every family of ``RULES`` is swept on valid and on test; for each TV budget
    every family is tuned on valid (``tuned_report``) and reported on test.
    ``extra`` maps a name to a fixed rule ``fn(F) -> thresholds`` (a run's
    champion, say), evaluated as it is on both splits. Per budget the rows are
    sorted by tokens per call on test (families no parameter of which fits the
    budget on valid last). ``series`` holds the test points for the pictures:
    each family's grid in sweep order, then each extra rule."""
    budgets = [float(b) for b in budgets]
    sweeps = {"valid": sweep_all(sa_valid), "test": sweep_all(sa_test)}
    fixed = {}
    for name, fn in (extra or {}).items():
        fixed[name] = {s: spec.objectives(sa, spec.rule_thresholds(fn, sa)).to_dict()
                       for s, sa in (("valid", sa_valid), ("test", sa_test))}
    per_budget = []
    for b in budgets:
        rows = []
        for name in RULES:
            rep = tuned_report(name, sa_valid, sa_test, b)
            if rep is None:
                rows.append({"rule": name, "kind": "family", "param": None, "budget": b,
                             "fits_valid": False, "over_budget_test": None,
                             "valid": None, "test": None})
            else:
                rows.append({**rep, "kind": "family", "fits_valid": True,
                             "over_budget_test": rep["test"]["tv_per_token"] > b})
        for name, o in fixed.items():
            rows.append({"rule": name, "kind": "extra", "param": None, "budget": b,
                         "fits_valid": o["valid"]["tv_per_token"] <= b,
                         "over_budget_test": o["test"]["tv_per_token"] > b, **o})
        rows.sort(key=lambda r: (r["test"] is None,
                                 -(r["test"]["tokens_per_call"] if r["test"] else 0.0)))
        per_budget.append({"budget": b, "rows": rows})
    series = series_of(sweeps["test"])
    for name, o in fixed.items():
        series[name] = [(o["test"]["tv_per_token"], o["test"]["tokens_per_call"])]
    return {"block_size": sa_test.g, "top_k": sa_test.k,
            "blocks": {"valid": sa_valid.n_blocks, "test": sa_test.n_blocks},
            "budgets": per_budget,
            "extra": fixed,
            "sweeps": {s: [p.to_dict() for p in pts] for s, pts in sweeps.items()},
            "series": {k: [list(xy) for xy in v] for k, v in series.items()}}
