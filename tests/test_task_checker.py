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
