"""The arithmetic task's solutions: the one definition of their wording.

A solution is lines, each ending in ``\\n``: an optional intro line, one step line
per operation of the story (``23 + 19 = 42.`` in one of a few wordings, with an
optional ``First, `` / ``Then `` / ``Next, ``), an optional conclusion line, and the
answer line ``#### 42``; then the end byte ``PAD``. What may come next is a
function of the story and the lines written so far (``State``, ``advance``):

- a line with ``=`` is a step; the running value becomes the number written after
  its last ``=`` (as written: a wrong result carries into the later steps and the
  answer, as it would in a model's own text), or the right result of that step
  when no number follows the ``=``;
- a line starting with ``####`` is the answer: the solution ends;
- any other line is the intro (before any step) or the conclusion (after the last
  step); written anywhere else it changes nothing.

``lines_of`` gives the lines that may come next with their weights (summing to 1):
the step lines of the next step (left operand the running value, right result),
with the intro lines first taking ``INTRO_SHARE``; after the last step the
conclusion lines (``CONCLUSION_SHARE``, once) and the answer line. Both the
sampler of reference solutions (``sample_solution``) and the grammar-exact target
(``target``) read it, so they cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from evolve.data.sources.task.story import MAX_DIGITS, Story, apply

PAD = 0                      # "no text": left of a prompt, and the end of a solution
ANSWER = "#### {R}"
DELIMITER = "####"
STEPS = {
    "+": ("{L} + {n} = {R}.", "{Name} gets {n} more, so {pron} has {L} + {n} = {R}.",
          "Adding {n}: {L} + {n} = {R}.", "That makes {L} + {n} = {R} {items}."),
    "-": ("{L} - {n} = {R}.", "{Name} loses {n}, so {pron} has {L} - {n} = {R}.",
          "Taking away {n}: {L} - {n} = {R}.", "That leaves {L} - {n} = {R} {items}."),
    "*": ("{L} * {n} = {R}.", "{n} times as many is {L} * {n} = {R}.",
          "Multiplying by {n}: {L} * {n} = {R}.", "That makes {L} * {n} = {R} {items}."),
}
FIRST_PREFIXES = ("", "First, ")
LATER_PREFIXES = ("", "Then ", "Next, ")
INTROS = ("{Name} starts with {L} {items}.", "At first there are {L} {items}.")
CONCLUSIONS = ("So {Name} has {R} {items}.", "The answer is {R}.",
               "{Name} has {R} {items} in the end.")
INTRO_SHARE = 0.3
CONCLUSION_SHARE = 0.5
_RESULT = re.compile(rf"\s*(-?\d{{1,{MAX_DIGITS}}})")


@dataclass(frozen=True)
class State:
    """Where a solution stands: steps written, the running value, whether no line
    is written yet, whether a conclusion is, whether the answer is."""
    steps: int
    value: int
    fresh: bool = True
    concluded: bool = False
    answered: bool = False


def start(story: Story) -> State:
    return State(0, story.start)


def written_result(line: str) -> int | None:
    """The number written after the last ``=`` of a line, or None."""
    m = _RESULT.match(line.rsplit("=", 1)[1]) if "=" in line else None
    return int(m.group(1)) if m else None


def advance(story: Story, state: State, line: str) -> State:
    """The state after one more line (without its ``\\n``)."""
    if state.answered:
        return state
    if line.startswith(DELIMITER):
        return replace(state, fresh=False, answered=True)
    if "=" in line:
        value = written_result(line)
        if value is None:
            value = (apply(story.ops[state.steps], state.value, story.operands[state.steps])
                     if state.steps < len(story.ops) else state.value)
        return replace(state, steps=state.steps + 1, value=value, fresh=False)
    return replace(state, fresh=False,
                   concluded=state.concluded or state.steps >= len(story.ops))


def state_of(story: Story, lines) -> State:
    """The state after the given complete lines."""
    state = start(story)
    for line in lines:
        state = advance(story, state, line)
    return state


def _lower_first(template: str, prefixed: bool) -> str:
    return template[0].lower() + template[1:] if prefixed and template[0].isalpha() else template


def _share(lines: list[str], total: float) -> list[tuple[str, float]]:
    return [(t, total / len(lines)) for t in lines]


def lines_of(story: Story, state: State) -> list[tuple[str, float]] | None:
    """The lines that may come next with their weights (sum 1), or None after the
    answer (only ``PAD`` follows). Equal lines keep separate entries."""
    if state.answered:
        return None
    f = story.fields
    if state.steps < len(story.ops):
        op, n = story.ops[state.steps], story.operands[state.steps]
        fields = f(L=state.value, n=n, R=apply(op, state.value, n))
        prefixes = FIRST_PREFIXES if state.steps == 0 else LATER_PREFIXES
        steps = [(p + _lower_first(t, bool(p))).format(**fields)
                 for t in STEPS[op] for p in prefixes]
        if not state.fresh:
            return _share(steps, 1.0)
        intros = [t.format(**fields) for t in INTROS]
        return _share(intros, INTRO_SHARE) + _share(steps, 1.0 - INTRO_SHARE)
    answer = [ANSWER.format(R=state.value)]
    if state.concluded:
        return _share(answer, 1.0)
    conclusions = [t.format(**f(R=state.value)) for t in CONCLUSIONS]
    return _share(conclusions, CONCLUSION_SHARE) + _share(answer, 1.0 - CONCLUSION_SHARE)


def sample_solution(story: Story, rng) -> str:
    """A solution drawn line by line from ``lines_of`` (``rng``: a numpy Generator);
    its text without the end byte."""
    state, out = start(story), []
    while (lines := lines_of(story, state)) is not None:
        weights = [w for _, w in lines]
        line = lines[int(rng.choice(len(lines), p=weights))][0]
        out.append(line)
        state = advance(story, state, line)
    return "".join(line + "\n" for line in out)


def longest_solution(story: Story) -> int:
    """Bytes of the longest solution the grammar allows for a story, its end byte
    included (what a model's context must hold beyond the prompt)."""
    memo: dict[State, int] = {}

    def longest(state: State) -> int:
        if state not in memo:
            lines = lines_of(story, state)
            memo[state] = 1 if lines is None else max(
                len(line) + 1 + longest(advance(story, state, line)) for line, _ in lines)
        return memo[state]

    return longest(start(story))
