"""The built-in synthetic task: arithmetic word problems with worked steps.

Each problem is a ``story.Story`` of two or three numbers (one or two
operations), its prompt in one of the story templates, and its reference answer;
a worked solution (``grammar.sample_solution``) ends in ``#### <answer>``, so
``checker.DelimiterChecker()`` checks it. Numbers: the start 2..60; ``+`` adds
2..60; ``-`` takes 1..(value - 1), so values stay >= 1; ``*`` multiplies by 2..4
while the value is at most 250. Operations are drawn ``+`` 0.45, ``-`` 0.35,
``*`` 0.2 among those allowed; two operations with probability 0.6.

Deterministic for a seed: each split draws from its own child of
``SeedSequence(seed)``; a problem whose prompt an earlier one of any split
already has is drawn again, so splits never share a prompt.
"""

from __future__ import annotations

import numpy as np

from evolve.data.sources.task.files import Problem
from evolve.data.sources.task.story import (OPERATIONS, PEOPLE, ITEMS, QUESTIONS, START,
                                            Story, apply, prompt_text)
from evolve.data.tokens import SPLITS, DataError

OP_WEIGHTS = {"+": 0.45, "-": 0.35, "*": 0.2}
TWO_OPS = 0.6
MAX_DRAWS = 100           # draws per problem before the split is refused (too many asked)


def _operation(rng, value: int) -> tuple[str, int]:
    allowed = [op for op in OP_WEIGHTS
               if (op != "-" or value >= 2) and (op != "*" or value <= 250)]
    w = np.array([OP_WEIGHTS[op] for op in allowed])
    op = allowed[int(rng.choice(len(allowed), p=w / w.sum()))]
    n = {"+": lambda: rng.integers(2, 61), "-": lambda: rng.integers(1, value),
         "*": lambda: rng.integers(2, 5)}[op]()
    return op, int(n)


def random_problem(rng, split: str | None = None) -> tuple[Story, Problem]:
    """One story and its problem, drawn with ``rng`` (a numpy Generator)."""
    name, pron = PEOPLE[int(rng.integers(len(PEOPLE)))]
    items = ITEMS[int(rng.integers(len(ITEMS)))]
    value = current = int(rng.integers(2, 61))
    ops, operands = [], []
    for _ in range(2 if rng.random() < TWO_OPS else 1):
        op, n = _operation(rng, current)
        current = apply(op, current, n)
        ops.append(op)
        operands.append(n)
    story = Story(name, pron, items, value, tuple(ops), tuple(operands))
    prompt = prompt_text(story, int(rng.integers(len(START))),
                         tuple(int(rng.integers(len(OPERATIONS[op]))) for op in ops),
                         int(rng.integers(len(QUESTIONS))))
    return story, Problem(prompt, str(story.answer), split)


def generate(seed: int, counts: dict) -> dict[str, list[Problem]]:
    """``counts[split]`` problems of each split (train, valid, test), disjoint."""
    children = dict(zip(SPLITS, np.random.SeedSequence(seed).spawn(len(SPLITS))))
    seen: set[str] = set()
    out = {}
    for split in SPLITS:
        rng = np.random.default_rng(children[split])
        problems = []
        for _ in range(int(counts.get(split, 0))):
            for _ in range(MAX_DRAWS):
                _, p = random_problem(rng, split)
                if p.prompt not in seen:
                    break
            else:
                raise DataError(f"{split}: no new problem in {MAX_DRAWS} draws; "
                                "ask for fewer problems")
            seen.add(p.prompt)
            problems.append(p)
        out[split] = problems
    return out
