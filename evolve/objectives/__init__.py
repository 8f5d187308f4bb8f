"""Objectives by name: one module each, one line here.

See ``evolve.objectives.base`` for what an objective provides.
"""

from evolve.objectives.base import TOKENS, TRACES, Evaluator, Objective
from evolve.objectives.trace_objectives import PARETO, SPEED, SPEED_KL
from evolve.objectives.task_objectives import TASK_SEED, TASK_SPEED
from evolve.objectives.tokens import EXPECTED, SEED
from evolve.objectives.trajectory_objective import SPEED_TRAJECTORY

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (EXPECTED, SEED, SPEED, SPEED_KL, PARETO,
                                                        TASK_SPEED, TASK_SEED)}


def bind(config) -> Objective:
    """The objective a run optimises, chosen once from its configuration (a
    ``Config``): the one its ``objective`` names, or with ``trajectory`` set the
    speed objective scored on the rule's own trajectory (``Config.validate`` allows
    that with speed only)."""
    if getattr(config, "trajectory", False):
        return SPEED_TRAJECTORY
    return OBJECTIVES[config.objective]


__all__ = ["OBJECTIVES", "Objective", "Evaluator", "TOKENS", "TRACES", "bind"]
