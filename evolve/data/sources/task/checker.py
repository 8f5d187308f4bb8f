"""Answer checking: the final answer of a generated text, compared with a reference.

Three ways to find the final answer in a text:

- ``DelimiterChecker`` (GSM8K's ``#### 42``): the text after the LAST occurrence of
  the delimiter, up to the end of that line, blank space around it dropped;
- ``RegexChecker``: a group of a regular expression at its LAST match in the text
  (the group named ``answer`` if the pattern has one, else group 1 if it has
  groups, else the whole match; or the group given), blank space dropped;
- ``WordChecker``: for answers written inside a sentence ("The capital of France is
  Paris."), a vocabulary of the answers a task can have; the answer of a text is the
  vocabulary entry that occurs LAST in it as whole words (see the class).

No delimiter, no match or an empty answer: no answer, which is wrong.

A task may have stop strings (``cut_at_stop``): a generated text ends where the first
of them starts (the stop string and what follows are not read), as a base model's text
that runs on into a next question would otherwise be graded on its last answer.

``same_answer(answer, reference)`` compares the two, both with surrounding blank
space dropped. When both are numbers as ``NUMBER`` reads them, they are compared
as exact decimals: an optional sign (``+`` or ``-``), an integer part of ASCII
digits (``1234``, ``0042``) or of digits grouped by commas in threes (``1,234``,
``12,345,678``; ``12,34`` is not a number), then optionally a point and any digits
(``42.``, ``42.0``, ``42.50``). So ``1,234`` = ``1234`` = ``1234.0`` = ``+1234``,
``42`` = ``042`` = ``42.``, ``-0`` = ``0``, ``0.5`` = ``0.50``; ``0.1`` != ``0.10001``
(no tolerance). Anything else (``.5`` without its integer part, ``1e3``, ``$5``,
``50%``, ``5 apples``, other scripts' digits, a number of more than 100 characters)
is compared as text, exactly.
"""

from __future__ import annotations

import re
from decimal import Decimal

from evolve.errors import EvolveError, show

NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?", re.ASCII)
MAX_NUMBER_CHARS = 100      # longer digit strings are compared as text


MAX_STOPS = 16              # stop strings a task may have
MAX_STOP_CHARS = 200


def cut_at_stop(text: str, stops) -> str:
    """The text before the first place any stop string starts (all of it when none
    occurs): what the answer is read from."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if 0 <= i < cut:
            cut = i
    return text[:cut]


def stop_problem(stops) -> str:
    """Why ``stops`` cannot be a task's stop strings ("" when they can): a list of at
    most ``MAX_STOPS`` non-empty strings of at most ``MAX_STOP_CHARS`` characters."""
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        return "expected a list of strings"
    if len(stops) > MAX_STOPS:
        return f"expected at most {MAX_STOPS} stop strings"
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        return f"expected non-empty strings of at most {MAX_STOP_CHARS} characters"
    return ""


class CheckerError(EvolveError):
    """A checker's setting that cannot work (an empty delimiter, a pattern that does
    not compile or lacks the group): one line naming the parameter."""


def as_number(text: str) -> Decimal | None:
    """The exact decimal value of ``text`` if it is a number as ``NUMBER`` reads it
    (surrounding blank space dropped), else None."""
    t = text.strip()
    if len(t) > MAX_NUMBER_CHARS or NUMBER.fullmatch(t) is None:
        return None
    return Decimal(t.replace(",", ""))


def same_answer(answer: str, reference: str) -> bool:
    """Whether an extracted answer equals the reference: as exact decimals when both
    are numbers, else as text (surrounding blank space dropped)."""
    a, r = as_number(answer), as_number(reference)
    if a is not None and r is not None:
        return a == r
    return answer.strip() == reference.strip()


class Checker:
    """``extract(text)``: the final answer of a text, or None; ``check(text,
    reference)``: whether it is there and equals the reference."""

    def extract(self, text: str) -> str | None:
        raise NotImplementedError

    def check(self, text: str, reference: str) -> bool:
        answer = self.extract(text)
        return answer is not None and same_answer(answer, reference)


class DelimiterChecker(Checker):
    """The answer is the rest of the line after the last ``delimiter``."""

    def __init__(self, delimiter: str = "####"):
        if not isinstance(delimiter, str) or not delimiter.strip():
            raise CheckerError.of("delimiter", f"{show(delimiter)} is empty; expected a "
                                  "non-blank string such as '####'")
        self.delimiter = delimiter

    def extract(self, text: str) -> str | None:
        at = text.rfind(self.delimiter)
        if at < 0:
            return None
        answer = text[at + len(self.delimiter):].split("\n", 1)[0].strip()
        return answer or None


class RegexChecker(Checker):
    """The answer is a group of ``pattern`` at its last match."""

    def __init__(self, pattern: str, group: int | str | None = None):
        try:
            self.regex = re.compile(pattern)
        except (re.error, TypeError) as e:
            raise CheckerError.of("pattern", f"{show(pattern)} is not a regular expression "
                                  f"({e})") from None
        if group is None:
            group = ("answer" if "answer" in self.regex.groupindex
                     else 1 if self.regex.groups else 0)
        known = isinstance(group, str) and group in self.regex.groupindex or (
            isinstance(group, int) and not isinstance(group, bool)
            and 0 <= group <= self.regex.groups)
        if not known:
            raise CheckerError.of("group", f"{show(group)} is not a group of the pattern "
                                  f"{show(pattern)} ({self.regex.groups} groups)")
        self.group = group

    def extract(self, text: str) -> str | None:
        last = None
        for last in self.regex.finditer(text):
            pass
        if last is None or last.group(self.group) is None:
            return None
        return last.group(self.group).strip() or None


class WordChecker(Checker):
    """The answer is the entry of a vocabulary that a text names last, as whole words.

    The vocabulary is every alias of every reference given (a reference lists its
    aliases separated by ``|``: ``Kyiv|Kiev``). An entry occurs where the text holds it,
    compared case-insensitively (Python's ``re.IGNORECASE``), with no word character
    (``\\w``) just before or after it. The answer is the entry whose occurrence ends last;
    of two that end at the same place, the longer (``New Delhi`` before ``Delhi``). It is
    returned as the vocabulary writes it. ``check(text, reference)``: the answer is one of
    the reference's aliases (case-insensitively). No entry in the text: no answer."""

    def __init__(self, references):
        words: dict[str, str] = {}
        for ref in references:
            for alias in aliases(ref):
                words.setdefault(alias.casefold(), alias)
        if not words:
            raise CheckerError.of("references", "no answer to look for; expected at least "
                                  "one non-blank reference")
        self.words = words
        # every start position, the longest entry there (lookahead: overlapping matches)
        alts = "|".join(re.escape(w) for w in sorted(words.values(), key=len, reverse=True))
        self.regex = re.compile(rf"(?=(?<!\w)({alts})(?!\w))", re.IGNORECASE)

    def extract(self, text: str) -> str | None:
        best = None
        for m in self.regex.finditer(text):
            key = (m.end(1), m.end(1) - m.start(1))
            if best is None or key > best[0]:
                best = (key, m.group(1))
        if best is None:
            return None
        return self.words.get(best[1].casefold(), best[1])

    def check(self, text: str, reference: str) -> bool:
        answer = self.extract(text)
        return answer is not None and answer.casefold() in {
            a.casefold() for a in aliases(reference)}


def aliases(reference: str) -> list[str]:
    """The accepted answers of a reference: its ``|``-separated parts, blank space
    around each dropped, empty ones left out."""
    return [a.strip() for a in reference.split("|") if a.strip()]
