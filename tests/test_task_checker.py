"""The answer checker (evolve/data/sources/task/checker.py) against hand-written
cases: the delimiter form, the regex form and the numeric comparison."""

import pytest

from evolve.data.sources.task.checker import (CheckerError, DelimiterChecker, RegexChecker,
                                              as_number, same_answer)

GSM = DelimiterChecker()


@pytest.mark.parametrize("text, answer", [
    ("3 + 4 = 7.\n#### 7\n", "7"),
    ("#### 7", "7"),
    ("####7", "7"),
    ("#### 1 is wrong\nso 2 + 1 = 3\n####   3  \nmore text", "3"),    # the last delimiter
    ("#### 12\n\nThe end.", "12"),                                  # up to the end of its line
    ("a #### b #### -5", "-5"),
    ("x\n#### The answer is eight\n", "The answer is eight"),
    ("no delimiter here: 42", None),
    ("ends with the delimiter ####", None),
    ("####   \n42", None),
    ("", None),
])
def test_the_delimiter_form_takes_the_rest_of_the_line_after_the_last_one(text, answer):
    assert GSM.extract(text) == answer


def test_another_delimiter():
    c = DelimiterChecker("The answer is")
    assert c.extract("The answer is 3. The answer is 4.\nok") == "4."
    assert c.check("The answer is 3. The answer is 4.\nok", "4")


@pytest.mark.parametrize("pattern, group, text, answer", [
    (r"answer is (\d+)", None, "the answer is 3, no, the answer is 41!", "41"),
    (r"(?P<answer>-?\d+) apples", None, "I had 3 apples, now -2 apples", "-2"),
    (r"(x)=(\d+)", 2, "x=1 x=22", "22"),
    (r"\d+", None, "1 then 22 then 333", "333"),                   # no group: the match
    (r"\\boxed\{([^}]*)\}", None, r"so \boxed{ 1,234 } done", "1,234"),
    (r"answer is (\d+)", None, "no answer", None),
    (r"answer is (\d*)", None, "the answer is ", None),           # an empty group
    (r"(a)|(b)", 2, "a", None),                                   # a group that did not take part
])
def test_the_regex_form_takes_a_group_of_the_last_match(pattern, group, text, answer):
    assert RegexChecker(pattern, group).extract(text) == answer


@pytest.mark.parametrize("kwargs, param", [
    ({"pattern": "(unclosed"}, "pattern"),
    ({"pattern": r"(\d+)", "group": 2}, "group"),
    ({"pattern": r"(\d+)", "group": "answer"}, "group"),
    ({"pattern": r"(\d+)", "group": True}, "group"),
    ({"pattern": 42}, "pattern"),
])
def test_a_regex_checker_that_cannot_work_is_refused_naming_the_parameter(kwargs, param):
    with pytest.raises(CheckerError) as e:
        RegexChecker(**kwargs)
    assert e.value.param == param and "\n" not in str(e.value)


@pytest.mark.parametrize("delimiter", ["", "   ", None])
def test_an_empty_delimiter_is_refused(delimiter):
    with pytest.raises(CheckerError, match="delimiter"):
        DelimiterChecker(delimiter)


@pytest.mark.parametrize("a, b", [
    ("42", "42"), ("42", "42.0"), ("42", "42."), ("42.50", "42.5"), ("1,234", "1234"),
    ("12,345,678", "12345678"), ("+7", "7"), ("-0", "0"), ("007", "7"), (" 42 ", "42"),
    ("1,234.0", "1234"), ("-1,000", "-1000"), ("apples", "apples"), ("1e3", "1e3"),
])
def test_equal_answers(a, b):
    assert same_answer(a, b) and same_answer(b, a)


@pytest.mark.parametrize("a, b", [
    ("42", "43"), ("0.1", "0.10001"), ("-42", "42"), ("12,34", "1234"), ("1,2345", "12345"),
    ("1e3", "1000"), ("$5", "5"), ("50%", "50"), (".5", "0.5"), ("42 apples", "42"),
    ("Apples", "apples"), ("4 2", "42"), ("", "0"),
])
def test_different_answers(a, b):
    assert not same_answer(a, b) and not same_answer(b, a)


def test_as_number_reads_exactly_what_the_docs_say():
    assert as_number("1,234.50") == as_number("1234.5")
    assert as_number("1" * 101) is None               # too long: compared as text
    assert as_number("١٢") is None                      # other digits: text
    assert as_number("--1") is None and as_number("1.2.3") is None


def test_check_needs_an_answer_that_equals_the_reference():
    assert GSM.check("23 + 19 = 42.\n#### 42\n", "42")
    assert GSM.check("#### 1,000", "1000")
    assert not GSM.check("23 + 19 = 42.\n#### 41\n", "42")
    assert not GSM.check("23 + 19 = 42.", "42")                  # no final answer
    assert RegexChecker(r"is (\S+)\.").check("So it is 42.0.", "42")


# ------------------------------------------------------------------ answers inside sentences

from hypothesis import example, given, settings, strategies as st    # noqa: E402

from evolve.data.sources.task.checker import WordChecker, aliases    # noqa: E402

WORDS = WordChecker(["Paris", "New Delhi", "Kyiv|Kiev", "cold", "7", "19", "San Jose|San José"])


@pytest.mark.parametrize("text, answer", [
    ("The capital of France is Paris.", "Paris"),
    ("the capital of france is PARIS", "Paris"),            # case-insensitive, as written
    ("Parisian food", None),                                 # whole words only
    ("New Delhi", "New Delhi"),                              # the longer of two ending there
    ("The capital is Kiev (Kyiv).", "Kyiv"),                 # the one that ends last
    ('The opposite of "hot" is "cold".', "cold"),
    ("12 + 7 = 19.", "19"),
    ("7.5 is not 7", "7"),
    ("170 and 197", None),                                   # digits inside a number
    ("San José", "San José"),
    ("", None),
])
def test_the_word_form_takes_the_vocabulary_entry_named_last(text, answer):
    assert WORDS.extract(text) == answer


def test_the_word_form_checks_against_every_alias_of_the_reference():
    assert WORDS.check("It is Kiev.", "Kyiv|Kiev") and WORDS.check("It is kyiv.", "Kyiv|Kiev")
    assert not WORDS.check("It is Paris.", "Kyiv|Kiev")
    assert not WORDS.check("no answer here", "Paris")
    assert aliases(" a | b ||c ") == ["a", "b", "c"]


def test_a_word_checker_without_words_is_refused_naming_the_parameter():
    with pytest.raises(CheckerError, match="^references: "):
        WordChecker(["", " | "])


def brute_word(vocab, text):
    """The definition, position by position: every entry at every place it occurs as
    whole words (case-insensitively), the one ending last, then the longest."""
    def word_char(c):
        return c.isalnum() or c == "_"
    best = None
    for w in vocab:
        n = len(w)
        for i in range(len(text) - n + 1):
            if text[i:i + n].lower() != w.lower():
                continue
            if i > 0 and word_char(text[i - 1]) or i + n < len(text) and word_char(text[i + n]):
                continue
            key = (i + n, n)
            if best is None or key > best[0]:
                best = (key, w)
    return None if best is None else best[1]


VOCAB = ["a", "ab", "b a", "a b", "ba", "7", "17", "x-y", "y"]


# texts of short pieces (entries' words) joined by separators, so entries overlap, touch
# and nest ("a b a" holds "a b" and "b a", which ends last)
PIECES = ["a", "b", "7", "17", "1", "x", "y", "ab", "A", "B"]
TEXTS = st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from([" ", " ", "", "-", "."])),
                 max_size=7).map(lambda parts: "".join(p + sep for p, sep in parts))


@settings(max_examples=300, deadline=None)
@given(TEXTS)
@example("a b a").via("an overlap ending last")
@example("b a b").via("an overlap ending last")
def test_the_word_form_equals_its_definition_on_every_text(text):
    assert WordChecker(VOCAB).extract(text) == brute_word(VOCAB, text)
