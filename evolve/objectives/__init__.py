"""Objectives by name: one module each, one line here.

See ``evolve.objectives.base`` for what an objective provides.
"""

from evolve.objectives.base import TOKENS, TRACES, Evaluator, Objective
from evolve.objectives.speculative import PARETO, SPEED, SPEED_KL
from evolve.objectives.tokens import EXPECTED, SEED

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (EXPECTED, SEED, SPEED, SPEED_KL, PARETO)}



def is_trace_champion(champion: dict) -> bool:
    """Whether a champion.json record comes from an objective on traces."""
    obj = OBJECTIVES.get(champion.get("objective")) if isinstance(champion, dict) else None
    return obj is not None and obj.traces


__all__ = ["OBJECTIVES", "Objective", "Evaluator", "TOKENS", "TRACES", "is_trace_champion"]
