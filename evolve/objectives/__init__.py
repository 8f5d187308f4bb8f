"""Objectives by name: one module each, one line here.

See ``evolve.objectives.base`` for what an objective provides.
"""

from evolve.objectives.base import TOKENS, TRACES, Evaluator, Objective
from evolve.objectives.speculative import PARETO, SPEED, SPEED_KL
from evolve.objectives.tokens import EXPECTED, SEED

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (EXPECTED, SEED, SPEED, SPEED_KL, PARETO)}

__all__ = ["OBJECTIVES", "Objective", "Evaluator", "TOKENS", "TRACES"]
