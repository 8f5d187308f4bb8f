"""The built-in arithmetic task (evolve/data/sources/task/story.py, grammar.py,
arithmetic.py): deterministic for a seed, disjoint splits, varied wording, right
arithmetic (checked against hand-written problems and an independent evaluation),
prompts that read back into their stories, and solutions whose state carries a
written result forward."""

import operator
import re

import numpy as np
import pytest

from evolve.data.sources.task import arithmetic as A
from evolve.data.sources.task import files as F
from evolve.data.sources.task import grammar as G
from evolve.data.sources.task import story as S
from evolve.data.sources.task.checker import DelimiterChecker

COUNTS = {"train": 200, "valid": 50, "test": 50}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
EQUATION = re.compile(r"(-?\d+) ([-+*]) (\d+) = (-?\d+)")


@pytest.fixture(scope="module")
def problems():
    return A.generate(7, COUNTS)


def _stories(problems):
    return [S.parse_prompt(p.prompt) for s in problems for p in problems[s]]


def test_same_seed_same_problems_another_seed_others(problems):
    assert A.generate(7, COUNTS) == problems
    other = A.generate(8, COUNTS)
    assert [p.prompt for p in other["test"]] != [p.prompt for p in problems["test"]]
    assert [len(problems[s]) for s in problems] == [200, 50, 50]
    assert all(p.split == s for s in problems for p in problems[s])


def test_splits_share_no_prompt(problems):
    prompts = [p.prompt for s in problems for p in problems[s]]
    assert len(set(prompts)) == len(prompts)


@pytest.mark.parametrize("prompt, answer", [
    ("Question: Tom has 23 apples. Then he buys 19 more. Later, he sells 7 apples. "
     "How many apples does Tom have now?\nAnswer:\n", 35),
    ("Question: There are 12 cards in Mia's box. Then the number of cards grows 3 times. "
     "Then she loses 5 of them. How many cards are left at the end?\nAnswer:\n", 31),
    ("Question: Raj owns 9 coins. A friend gives Raj another 41 coins. "
     "What is the number of coins Raj has in the end?\nAnswer:\n", 50),
    ("Question: Ines has 60 shells. Ines gives away 59 shells. Ines ends up with 4 times "
     "as many shells. How many shells does Ines have now?\nAnswer:\n", 4),
])
def test_hand_written_prompts_read_back_with_their_answers(prompt, answer):
    assert S.parse_prompt(prompt).answer == answer


@pytest.mark.parametrize("prompt", [
    "Question: Tom has 23 apples. Then she buys 19 more. How many apples does Tom have now?\n"
    "Answer:\n",                                                        # pronoun of another
    "Question: Tom has 23 apples. Then he buys 19 more. How many coins does Tom have now?\n"
    "Answer:\n",                                                        # other things
    "Question: Tom has 23 apples. How many apples does Tom have now?\nAnswer:\n",  # no step
    "Question: Tom has 23 apples. Then he buys 1 more. Then he buys 1 more. Then he buys 1 "
    "more. How many apples does Tom have now?\nAnswer:\n",             # three steps
    "Question: Tom has 23 apples. Then he steals 19 more. How many apples does Tom have "
    "now?\nAnswer:\n",                                                  # another wording
    "Question: Tom has 23 apples. Then he buys 19 more. How many apples does Tom have now?\n",
    "Tom has 23 apples. Then he buys 19 more. How many apples does Tom have now?\nAnswer:\n",
])
def test_prompts_the_task_did_not_write_do_not_read_back(prompt):
    assert S.parse_prompt(prompt) is None


def test_every_prompt_reads_back_into_a_story_with_its_answer(problems):
    for s in problems:
        for p in problems[s]:
            story = S.parse_prompt(p.prompt)
            value = story.start
            for op, n in zip(story.ops, story.operands):
                value = OPS[op](value, n)
                assert value >= 1
            assert str(value) == p.answer


def test_the_prompts_use_every_template_and_both_sizes(problems):
    text = " ".join(p.prompt for p in problems["train"])
    for group in (S.START, S.QUESTIONS, *S.OPERATIONS.values()):
        for t in group:
            pattern = re.escape(t).replace(r"\{n\}", r"\d+")
            pattern = re.sub(r"\\\{\w+\\\}", lambda _: r"[\w']+", pattern)
            assert re.search(pattern, text), t
    sizes = {len(st.ops) for st in _stories(problems)}
    assert sizes == {1, 2}


def test_solutions_are_varied_right_and_checked(problems):
    rng = np.random.default_rng(0)
    checker = DelimiterChecker()
    texts, first_lines = set(), set()
    for p in problems["train"]:
        story = S.parse_prompt(p.prompt)
        text = G.sample_solution(story, rng)
        texts.add(text)
        first_lines.add(text.split("\n", 1)[0].split(str(story.start))[0])
        assert checker.check(text, p.answer), (p.prompt, text)
        assert text.endswith("#### " + p.answer + "\n")
        equations = EQUATION.findall(text)
        assert len(equations) == len(story.ops)
        for (a, op, b, r), want_op, want_b in zip(equations, story.ops, story.operands):
            assert (op, int(b)) == (want_op, want_b)
            assert OPS[op](int(a), int(b)) == int(r)
        assert len(text) + 1 <= G.longest_solution(story)
    assert len(texts) == len(problems["train"])
    assert len(first_lines) >= 12            # intros, prefixes and step wordings


def test_a_written_result_carries_forward():
    story = S.Story("Tom", "he", "apples", 23, ("+", "-"), (19, 7))
    state = G.state_of(story, ["Tom starts with 23 apples.", "23 + 19 = 52."])
    assert (state.steps, state.value) == (1, 52)
    assert all("52 - 7 = 45" in line for line, _ in G.lines_of(story, state))
    state = G.advance(story, state, "Then 52 - 7 = 45 apples.")
    lines = G.lines_of(story, state)
    assert ("#### 45", 1 - G.CONCLUSION_SHARE) in lines
    assert abs(sum(w for _, w in lines) - 1) < 1e-12
    state = G.advance(story, state, "So Tom has 44 apples.")         # no '=': the answer stays
    assert G.lines_of(story, state) == [("#### 45", 1.0)]
    assert G.lines_of(story, G.advance(story, state, "#### 45")) is None


def test_a_step_without_a_result_takes_the_right_one():
    story = S.Story("Ana", "she", "coins", 10, ("*", "+"), (3, 5))
    state = G.state_of(story, ["10 * 3 = lots"])
    assert (state.steps, state.value) == (1, 30)
    assert G.written_result("so 10 * 3 = -12.") == -12


def test_the_first_line_may_be_an_intro_only_there():
    story = S.Story("Ana", "she", "coins", 10, ("+",), (5,))
    first = G.lines_of(story, G.start(story))
    intros = [line for line, _ in first if "=" not in line]
    assert len(intros) == len(G.INTROS)
    assert abs(sum(w for line, w in first if "=" not in line) - G.INTRO_SHARE) < 1e-12
    after = G.lines_of(story, G.advance(story, G.start(story), intros[0]))
    assert all("10 + 5 = 15" in line for line, _ in after)


def test_the_synthetic_task_as_a_task_file(problems, tmp_path):
    rows = [p for s in problems for p in problems[s]]
    F.write_tasks(tmp_path / "arithmetic.jsonl", rows)
    assert F.by_split(F.read_tasks(tmp_path / "arithmetic.jsonl")) == problems
