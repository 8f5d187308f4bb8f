"""Objectives by name: one module each, one line here.

See ``evolve.objectives.base`` for what an objective provides. ``SETTINGS`` is every
setting the objectives declare (``evolve.objectives.settings``), each once: the fields
``evolve.search.config.Config`` adds after ``objective``, the options of ``evolve run``,
the keywords of ``evolve.run`` and what champions record. Importing this package loads
numpy and nothing heavier (the command line lists objectives and builds its options
from it without loading Numba).
"""

from evolve.objectives.base import TOKENS, TRACES, Evaluator, Objective
from evolve.objectives.settings import Setting, metadata_keys, union
from evolve.objectives.trace_objectives import PARETO, SPEED, SPEED_KL
from evolve.objectives.task_objectives import TASK_SEED, TASK_SPEED
from evolve.objectives.tokens import EXPECTED, SEED
from evolve.objectives.trajectory_objective import SPEED_TRAJECTORY

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (EXPECTED, SEED, SPEED, SPEED_KL, PARETO,
                                                        TASK_SPEED, TASK_SEED)}
# what ``bind`` may choose: the registered objectives and the variants bound by a flag
ALL_OBJECTIVES: tuple = (*OBJECTIVES.values(), SPEED_TRAJECTORY)
SETTINGS: tuple[Setting, ...] = union(ALL_OBJECTIVES)
# the keys under which champion.json and a champion module's METADATA record settings
SETTING_KEYS: tuple[str, ...] = metadata_keys(ALL_OBJECTIVES)


def bind(config) -> Objective:
    """The objective a run optimises, chosen once from its configuration (a
    ``Config``): the one its ``objective`` names, or with ``trajectory`` set the
    speed objective scored on the rule's own trajectory (``Config.validate`` allows
    that with speed only)."""
    if getattr(config, "trajectory", False):
        return SPEED_TRAJECTORY
    return OBJECTIVES[config.objective]


def recorded_settings(doc: dict) -> dict:
    """The settings a champion record or a module's METADATA holds, by key."""
    return {k: doc[k] for k in SETTING_KEYS if k in doc}


__all__ = ["OBJECTIVES", "ALL_OBJECTIVES", "SETTINGS", "SETTING_KEYS", "Objective", "Evaluator",
           "Setting", "TOKENS", "TRACES", "bind", "recorded_settings"]
