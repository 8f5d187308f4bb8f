"""Task files (evolve/data/sources/task/files.py): a round trip, and every refusal
one DataError line naming the file, the line and the field.

Guarantee 38 of docs/reliability.md, Task files hold problems a tokenizer and a checker
can use: text no tokenizer takes (a lone surrogate, which used to reach the tokenizer
and fail there after both models loaded, and NUL), a key given twice, and a reference
answer that is a worked solution (several lines; or, given the checker's delimiter,
one holding it) are refused at the line
(`test_a_bad_row_is_one_line_naming_file_line_and_field`,
`test_a_whole_solution_as_the_reference_says_how_to_fix_the_file`); from the command
line, before any model loads (tests/test_task_hf.py, `test_refusals_are_one_line`)."""

import os

import pytest

from evolve.data.sources.task import files as F
from evolve.data.tokens import DataError


def _file(tmp_path, text, name="tasks.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


GOOD = '{"prompt": "2 + 2?", "answer": "4"}\n{"prompt": "7 * 6?", "answer": 42, "split": "test"}\n'


def test_a_task_file_reads_and_round_trips(tmp_path):
    problems = F.read_tasks(_file(tmp_path, GOOD))
    assert problems == [F.Problem("2 + 2?", "4"), F.Problem("7 * 6?", "42", "test")]
    F.write_tasks(tmp_path / "again.jsonl", problems)
    assert F.read_tasks(tmp_path / "again.jsonl") == problems
    assert [len(v) for v in F.by_split(problems).values()] == [0, 0, 1]


def test_blank_lines_are_skipped_and_lines_keep_their_numbers(tmp_path):
    path = _file(tmp_path, '\n{"prompt": "a", "answer": "1"}\n\n   \n{"prompt": 3, "answer": "1"}\n')
    with pytest.raises(DataError, match=r"line 5: field 'prompt' is 3"):
        F.read_tasks(path)


@pytest.mark.parametrize("line, says", [
    ('{"answer": "4"}', "line 2: field 'prompt' is missing"),
    ('{"prompt": "x"}', "line 2: field 'answer' is missing"),
    ('{"prompt": "", "answer": "4"}', "line 2: field 'prompt' is ''"),
    ('{"prompt": "x", "answer": "  "}', "line 2: field 'answer' is '  '"),
    ('{"prompt": "x", "answer": true}', "line 2: field 'answer' is True"),
    ('{"prompt": "x", "answer": 4.5}', "line 2: field 'answer' is 4.5"),
    ('{"prompt": "x", "answer": ["4"]}', "line 2: field 'answer' is ['4']"),
    ('{"prompt": "x", "answer": "4", "split": "dev"}', "line 2: field 'split' is 'dev'"),
    ('{"prompt": "x", "answer": "4", "question": "y"}', "line 2: unknown field 'question'"),
    ('["x", "4"]', "line 2: expected a JSON object"),
    ('{"prompt": "x", "answer": "4"', "line 2: a task is not valid JSON"),
    ('{"prompt": "x", "answer": NaN}', "line 2: a task is not valid JSON"),
    ('{"prompt": "x", "answer": ' + "9" * 50 + '}', "line 2: a task is not valid JSON"),
    ('{"prompt": "' + "x" * (F.MAX_PROMPT_CHARS + 1) + '", "answer": "1"}',
     "line 2: field 'prompt' is 'xxx"),
    # text no tokenizer can take: a lone surrogate (not encodable as UTF-8), a NUL
    ('{"prompt": "Q\\ud800", "answer": 1}', "line 2: field 'prompt' holds a lone surrogate"),
    ('{"prompt": "Q", "answer": "4\\udfff"}', "line 2: field 'answer' holds a lone surrogate"),
    ('{"prompt": "a\\u0000b", "answer": 1}', "line 2: field 'prompt' holds a NUL"),
    # a key given twice: which one counts would be the parser's choice
    ('{"prompt": "x", "answer": "4", "answer": "5"}', "line 2: a task is not valid JSON (key "
                                                      "'answer' appears twice)"),
    # GSM8K's own answer field is a worked solution: the reference is its last line's end
    ('{"prompt": "x", "answer": "She sold 48/2 = 24 clips.\\n#### 72"}',
     "line 2: field 'answer' holds 2 lines"),
])
def test_a_bad_row_is_one_line_naming_file_line_and_field(tmp_path, line, says):
    path = _file(tmp_path, '{"prompt": "a", "answer": "1"}\n' + line + "\n")
    with pytest.raises(DataError) as e:
        F.read_tasks(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ") and says in msg, msg


def test_a_whole_solution_as_the_reference_says_how_to_fix_the_file(tmp_path):
    """A reference holding the checker's delimiter can never equal an answer read after
    it; the line says what to keep."""
    gsm = '{"prompt": "x", "answer": "She sold 48/2 = 24 clips.\\n#### 72"}\n'
    with pytest.raises(DataError) as e:
        F.read_tasks(_file(tmp_path, gsm))
    assert "keep only the final answer" in str(e.value) and "\n" not in str(e.value)
    one = _file(tmp_path, '{"prompt": "x", "answer": "#### 72"}\n', "one.jsonl")
    with pytest.raises(DataError) as e:
        F.read_tasks(one, delimiter="####")
    msg = str(e.value)
    assert msg.startswith(f"{one}: line 1: field 'answer' holds the delimiter '####'"), msg
    assert "keep only the text after '####'" in msg and "\n" not in msg
    assert F.read_tasks(one)[0].answer == "#### 72"      # an answer regex may want it
    assert F.read_tasks(one, delimiter="@@")[0].answer == "#### 72"


def test_unreadable_files_are_refused_naming_the_file(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="task file not found"):
        F.read_tasks(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="not a regular file"):
        F.read_tasks(tmp_path)
    with pytest.raises(DataError, match=r"holds no problem"):
        F.read_tasks(_file(tmp_path, "\n\n"))
    with pytest.raises(DataError, match=r"line 2: not UTF-8"):
        F.read_tasks(_file(tmp_path, b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff"}\n'))
    monkeypatch.setattr(F, "MAX_TASK_FILE_BYTES", 10)
    with pytest.raises(DataError, match="larger than 10"):
        F.read_tasks(_file(tmp_path, GOOD))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataError, match="not a regular file"):
        F.read_tasks(tmp_path / "pipe")


def test_too_many_problems_are_refused_at_the_row(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "MAX_PROBLEMS", 1)
    with pytest.raises(DataError, match=r"line 2: more than 1 problems"):
        F.read_tasks(_file(tmp_path, GOOD))
