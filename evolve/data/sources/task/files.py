"""Task files: JSON lines, one problem a line.

Each non-blank line is a JSON object with ``prompt`` (a non-empty string: the text
a model continues), ``answer`` (the reference answer: a non-empty string, or an
integer, kept as its decimal text) and optionally ``split`` (``train``, ``valid``
or ``test``); no other field, and no field twice. Read with the project's one reader
of untrusted files (``evolve.io.jsonio``): a regular file of at most
``MAX_TASK_FILE_BYTES``, UTF-8, each line within jsonio's limits.

The text of both fields must be text a tokenizer can take: a lone surrogate
(``"\ud800"``, which JSON can spell but UTF-8 cannot encode) and NUL (the end of a C
string, and "no text" to the built-in byte-level pair) are refused. A reference
answer is the final answer alone, one line: a worked solution (GSM8K's own
``answer`` field, whose last line is ``#### 72``) would never equal the answer read
from a generated text, so a reference of several lines, or one holding the checker's
delimiter (``read_tasks(path, delimiter)``), is refused with what to keep. Anything
else is one ``DataError`` line naming the file, the line (the row) and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from evolve.data.tokens import SPLITS, DataError
from evolve.errors import show
from evolve.io import jsonio
from evolve.io.atomic import atomic_write_text

FIELDS = ("prompt", "answer", "split")
MAX_TASK_FILE_BYTES = 256 * 1024 * 1024
MAX_PROBLEMS = 1_000_000
MAX_PROMPT_CHARS = 100_000
MAX_ANSWER_CHARS = 1_000


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt, its reference answer and (optionally) its split."""
    prompt: str
    answer: str
    split: str | None = None

    def to_dict(self) -> dict:
        row = {"prompt": self.prompt, "answer": self.answer}
        if self.split is not None:
            row["split"] = self.split
        return row


def read_tasks(path: str | os.PathLike, delimiter: str | None = None) -> list[Problem]:
    """The problems of a task file, in file order (DataError naming file, line, field).
    ``delimiter``: the answer checker's (None for a regular expression's), which a
    reference answer must not hold."""
    text = jsonio.read_text(path, "task file", MAX_TASK_FILE_BYTES, DataError)
    problems = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(problems) == MAX_PROBLEMS:
            raise DataError(f"{path}: line {number}: more than {MAX_PROBLEMS:,} problems")
        row = jsonio.loads(line, f"{path}: line {number}", "a task", DataError)
        problems.append(_problem(row, f"{path}: line {number}", delimiter))
    if not problems:
        raise DataError(f"{path}: the task file holds no problem")
    return problems


def _text(value: str, field: str, where: str) -> None:
    """DataError unless ``value`` is text a tokenizer can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: field '{field}' holds a lone surrogate "
                        f"(U+{ord(value[e.start]):04X} at character {e.start}), which is not "
                        "text; write the character itself or drop it") from None
    at = value.find("\0")
    if at >= 0:
        raise DataError(f"{where}: field '{field}' holds a NUL character (at character "
                        f"{at}), which is not text a tokenizer takes; drop it")


def _reference(answer: str, where: str, delimiter: str | None) -> None:
    """DataError unless ``answer`` is a final answer alone (not a worked solution)."""
    lines = answer.strip().splitlines()
    if len(lines) > 1:
        raise DataError(f"{where}: field 'answer' holds {len(lines)} lines; a reference is "
                        "the final answer alone, not a worked solution: keep only the final "
                        "answer (for GSM8K, the text after '####')")
    if delimiter and delimiter in answer:
        raise DataError(f"{where}: field 'answer' holds the delimiter {delimiter!r:.40}, so "
                        f"it can never equal an answer read after it: keep only the text after "
                        f"{delimiter!r:.40}")


def _problem(row, where: str, delimiter: str | None = None) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with fields prompt and answer, "
                        f"got {type(row).__name__}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise DataError(f"{where}: unknown field {show(unknown[0])}; expected "
                        f"{', '.join(FIELDS)}")
    for field in ("prompt", "answer"):
        if field not in row:
            raise DataError(f"{where}: field '{field}' is missing")
    prompt, answer, split = row["prompt"], row["answer"], row.get("split")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise DataError(f"{where}: field 'prompt' is {show(prompt)}; expected a non-blank "
                        f"string of at most {MAX_PROMPT_CHARS:,} characters")
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
        raise DataError(f"{where}: field 'answer' is {show(answer)}; expected a non-blank "
                        f"string (or an integer) of at most {MAX_ANSWER_CHARS:,} characters")
    _text(prompt, "prompt", where)
    _text(answer, "answer", where)
    _reference(answer, where, delimiter)
    if split is not None and split not in SPLITS:
        raise DataError(f"{where}: field 'split' is {show(split)}; expected one of "
                        f"{', '.join(SPLITS)}")
    return Problem(prompt, answer, split)


def write_tasks(path: str | os.PathLike, problems) -> None:
    """Write problems as a task file (atomically); ``read_tasks`` reads it back."""
    text = "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in problems)
    atomic_write_text(path, text)


def by_split(problems) -> dict[str, list[Problem]]:
    """The problems of each split (every split present, possibly empty)."""
    out: dict[str, list[Problem]] = {s: [] for s in SPLITS}
    for p in problems:
        if p.split is not None:
            out[p.split].append(p)
    return out
