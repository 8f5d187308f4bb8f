"""The arithmetic task's problems: a story of two or three numbers, and its prompt.

A ``Story`` is a person, the things they count, a start value and one or two
operations (``+``, ``-``, ``*``) with their operands. Its prompt is one sentence
for the start, one per operation and a question, each from a few templates
(``START``, ``OPERATIONS``, ``QUESTIONS``), between ``QUESTION`` and
``PROMPT_END``:

    Question: Tom has 23 apples. Then he buys 19 more. Later, he sells 7 apples.
    How many apples does Tom have now?
    Answer:

(one line up to ``Answer:``). ``parse_prompt`` reads a prompt back into its story
by the same templates, exactly: the grammar-exact target (``target``) knows the
problem only from the text it is given.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

QUESTION = "Question: "
PROMPT_END = "\nAnswer:\n"
PEOPLE = (("Tom", "he"), ("Ana", "she"), ("Raj", "he"), ("Mia", "she"), ("Sam", "he"),
          ("Lena", "she"), ("Omar", "he"), ("Ines", "she"))
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards")
OPS = ("+", "-", "*")

START = ("{Name} has {n} {items}.", "{Name} owns {n} {items}.",
         "There are {n} {items} in {Name}'s box.")
OPERATIONS = {
    "+": ("{Name} finds {n} more {items}.", "Then {pron} buys {n} more.",
          "A friend gives {Name} another {n} {items}."),
    "-": ("{Name} gives away {n} {items}.", "Then {pron} loses {n} of them.",
          "Later, {pron} sells {n} {items}."),
    "*": ("Then the number of {items} grows {n} times.",
          "{Name} ends up with {n} times as many {items}."),
}
QUESTIONS = ("How many {items} does {Name} have now?", "How many {items} are left at the end?",
             "What is the number of {items} {Name} has in the end?")
MAX_DIGITS = 12                  # longest number a prompt or a step may state


@dataclass(frozen=True)
class Story:
    name: str
    pron: str
    items: str
    start: int
    ops: tuple
    operands: tuple

    def values(self) -> list[int]:
        """The running values: the start, then after each operation."""
        out = [self.start]
        for op, n in zip(self.ops, self.operands):
            out.append(apply(op, out[-1], n))
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def fields(self, **more) -> dict:
        return {"Name": self.name, "pron": self.pron, "items": self.items, **more}


def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def prompt_text(story: Story, start: int, operations: tuple, question: int) -> str:
    """The prompt of a story with the given template choices (indices into ``START``,
    each operation's ``OPERATIONS`` and ``QUESTIONS``)."""
    f = story.fields
    parts = [START[start].format(**f(n=story.start))]
    parts += [OPERATIONS[op][t].format(**f(n=n))
              for op, n, t in zip(story.ops, story.operands, operations)]
    parts.append(QUESTIONS[question].format(**f()))
    return QUESTION + " ".join(parts) + PROMPT_END


def _regex(template: str) -> re.Pattern:
    """A template as a regular expression: its text literally, ``{n}`` a number, the
    other fields one of their words (each field at most once a template)."""
    words = {"Name": "|".join(n for n, _ in PEOPLE), "pron": "he|she",
             "items": "|".join(ITEMS), "n": rf"\d{{1,{MAX_DIGITS}}}"}
    out = []
    for text, field, _, _ in string.Formatter().parse(template):
        out.append(re.escape(text))
        if field is not None:
            out.append(f"(?P<{field}>{words[field]})")
    return re.compile("".join(out))


_START = [_regex(t) for t in START]
_OPERATIONS = [(op, _regex(t)) for op in OPS for t in OPERATIONS[op]]
_QUESTIONS = [_regex(t) for t in QUESTIONS]
_SENTENCE_END = re.compile(r"(?<=[.?]) ")


def _match(regexes, sentence: str):
    return next((m for m in (r.fullmatch(sentence) for r in regexes) if m), None)


def parse_prompt(text: str) -> Story | None:
    """The story of a prompt written by ``prompt_text``, or None when the text is not
    one (another wording, one operation too many, a name and its pronoun or the
    counted things changing between sentences)."""
    if not (text.startswith(QUESTION) and text.endswith(PROMPT_END)):
        return None
    sentences = _SENTENCE_END.split(text[len(QUESTION):-len(PROMPT_END)])
    if not 3 <= len(sentences) <= 4:
        return None
    first, last = _match(_START, sentences[0]), _match(_QUESTIONS, sentences[-1])
    if first is None or last is None:
        return None
    found = [first, last]
    ops, operands = [], []
    for s in sentences[1:-1]:
        hit = next(((op, m) for op, m in ((op, r.fullmatch(s)) for op, r in _OPERATIONS) if m),
                   None)
        if hit is None:
            return None
        ops.append(hit[0])
        operands.append(int(hit[1].group("n")))
        found.append(hit[1])
    name, items = first.group("Name"), first.group("items")
    pron = dict(PEOPLE)[name]
    for m in found:
        got = m.groupdict()
        if got.get("Name", name) != name or got.get("items", items) != items \
                or got.get("pron", pron) != pron:
            return None
    return Story(name, pron, items, int(first.group("n")), tuple(ops), tuple(operands))
