"""The class of each token of a vocabulary: a word, a number, punctuation, or other.

A token's class is read from its text alone (``token_class``): its text stripped of
white space is empty (white space, an end-of-text or other special token) or holds
the replacement character (a tokenizer's token that is part of a UTF-8 character):
OTHER; digits, with or without ``.`` and ``,``: NUMBER; every character
punctuation or a symbol (Unicode categories P and S): PUNCT; any letter: WORD;
anything else: OTHER. A vocabulary's classes are one table, a
token id's class at its index (``table``):

- a Hugging Face tokenizer: each id decoded alone, special tokens skipped
  (``tokenizer_table``); ids past the tokenizer's (a model's padded vocabulary) are
  OTHER;
- a byte-level pair (the n-gram pair, the task pair): each byte below 128 as its
  character, every other byte (part of a UTF-8 sequence) OTHER (``byte_table``).

A recording stores its pair's table in its meta (``meta["vocab_classes"]``: one digit
a token, ``to_text``), so the ``token_class`` input of a trace is exact without the
tokenizer. The functions ``token_class`` and ``tokenizer_table`` are self-contained:
an engine export carries their source (``SOURCE``) and builds the table from the
engine's tokenizer, the same table the search scored.
"""

from __future__ import annotations

import inspect

import numpy as np

WORD, NUMBER, PUNCT, OTHER = 0, 1, 2, 3
NAMES = ("word", "number", "punctuation", "other")
DIGITS = "".join(str(c) for c in range(len(NAMES)))     # a table as text: one digit a token
META_KEY = "vocab_classes"


def token_class(text):
    """0 word, 1 number, 2 punctuation, 3 other: the class of one token's text."""
    import unicodedata  # lazy: exports copy this function's source, self-contained
    s = text.strip()
    if not s or "\ufffd" in s:          # nothing, or part of a UTF-8 character
        return 3
    if any(c.isdigit() for c in s) and all(c.isdigit() or c in ".," for c in s):
        return 1
    if all(unicodedata.category(c)[0] in "PS" for c in s):
        return 2
    if any(c.isalpha() for c in s):
        return 0
    return 3


def tokenizer_table(tokenizer, vocab):
    """The classes (a list of ``vocab`` ints) of a Hugging Face tokenizer's ids, each
    decoded alone with special tokens skipped; ids past the tokenizer's are 3 (other)."""
    n = min(int(vocab), len(tokenizer))
    out = [token_class(tokenizer.decode([i], skip_special_tokens=True)) for i in range(n)]
    return out + [3] * (int(vocab) - n)


# The source an engine export carries (its glue builds the table from the tokenizer)
SOURCE = inspect.getsource(token_class) + "\n\n" + inspect.getsource(tokenizer_table)


def byte_table(vocab: int = 256) -> np.ndarray:
    """The classes of a byte-level vocabulary: a byte below 128 as its character,
    any other (a part of a UTF-8 sequence) other."""
    return np.array([token_class(chr(b)) if b < 128 else OTHER for b in range(vocab)],
                    dtype=np.int8)


def table(pair) -> np.ndarray | None:
    """A pair's classes (V,) int8: its tokenizer's where it has one, the byte table of a
    byte-level pair (no ``vocab``, or 256 and no tokenizer); None where neither. A pair
    that wraps one (its attribute ``pair``: a loaded pair with its prompts) has the
    inner one's."""
    inner = getattr(pair, "pair", None)
    if inner is not None and inner is not pair:
        return of_pair(inner)
    tok = getattr(pair, "tokenizer", None)
    V = getattr(pair, "vocab", None)
    if tok is not None:
        return np.asarray(tokenizer_table(tok, len(tok) if V is None else V), dtype=np.int8)
    if V is None or V == 256:
        return byte_table(256)
    return None


def of_pair(pair) -> np.ndarray | None:
    """``table(pair)``, computed once a pair (kept on it where it takes attributes)."""
    got = getattr(pair, "_vocab_classes", None)
    if got is None:
        got = table(pair)
        try:
            object.__setattr__(pair, "_vocab_classes", got)
        except (AttributeError, TypeError):
            pass
    return got


def to_text(classes) -> str:
    """A table as its meta text: one digit a token."""
    return "".join(DIGITS[int(c)] for c in np.asarray(classes))


def from_text(text: str) -> np.ndarray:
    """A meta text as its table (V,) int8 (``check_text`` it first)."""
    return (np.frombuffer(text.encode("ascii"), dtype=np.uint8) - ord("0")).astype(np.int8)


def check_text(value, vocab: int) -> str | None:
    """Why ``value`` is not the meta text of a vocabulary of ``vocab`` tokens, or None."""
    if not isinstance(value, str):
        return f"is {type(value).__name__}; expected a text of one digit 0-3 a token"
    if len(value) != vocab:
        return f"has {len(value)} classes; the vocabulary has {vocab} tokens"
    bad = next((i for i, c in enumerate(value) if c not in DIGITS), None)
    if bad is not None:
        return f"holds {value[bad]!r:.10} at token {bad}; expected a digit 0-3"
    return None
