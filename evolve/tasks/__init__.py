"""Data worlds by name: one module each, one line here.

A data world is what a run evolves on and what its champion is judged by: token
splits (``evolve.tasks.tokens``), speculative-decoding traces
(``evolve.tasks.traces``) or tasks with checked answers and critical-token labels
(``evolve.tasks.task``). Everything that differs between worlds is a method of
its ``Task``; the runner, multi-start runs, the run reports, the command line and
export ask the task and never test which world they are in. An objective names
its world by ``Objective.data``, the key of ``TASKS``.

Adding a world: a module with a ``Task`` subclass and one line in ``TASKS``
(``tests/test_tasks.py`` registers a toy one and runs it end to end).

Task modules import nothing heavy at import time (the command line lists the
objectives without loading Numba).
"""

from __future__ import annotations

from evolve.objectives import OBJECTIVES
from evolve.tasks.base import Finished, Task
from evolve.tasks.task import TaskTask
from evolve.tasks.tokens import TokenTask
from evolve.tasks.traces import TraceTask

TASKS: dict[str, Task] = {"tokens": TokenTask(), "traces": TraceTask(), "task": TaskTask()}


def task_of(objective) -> Task:
    """The task of an objective (an Objective or its name)."""
    obj = OBJECTIVES[objective] if isinstance(objective, str) else objective
    return TASKS[obj.data]


def champion_task(champion) -> Task:
    """The task of a champion.json record, by its objective (token splits when the
    objective is missing or unknown: what records written before objectives had)."""
    obj = OBJECTIVES.get(champion.get("objective")) if isinstance(champion, dict) else None
    return TASKS[obj.data] if obj is not None else TASKS["tokens"]


__all__ = ["TASKS", "Task", "Finished", "task_of", "champion_task"]
