"""Prompts of hf traces: a JSON-lines file, or windows of a corpus's held-out files.

``--prompts FILE``: one JSON object per line with a ``text`` string and an
optional ``split`` (train/valid/test); lines without one are dealt out in turn
train, valid, train, test after a seeded shuffle (2 : 1 : 1); each text is one
prompt, whole. ``--corpus DIR`` (or, by default, the n-gram pair's corpus):
files are divided into prompt pools exactly as the n-gram pair divides its
corpus (``ngram.file_split``), and each prompt is a window of ``prompt_len``
tokens drawn uniformly from its split's pool. Every prompt owns a generator
(a child of ``SeedSequence(seed)``), which then draws its decoding uniforms.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from evolve.data import traces as T
from evolve.data.sources import ngram
from evolve.data.sources import ngram_lm as LM
from evolve.data.tokens import DataError
from evolve.io import jsonio

SPLITS = T.SPLITS
MAX_PROMPTS_BYTES = jsonio.MAX_JSON_BYTES      # a prompts file, read with this cap
MAX_LINE_CHARS = 1024 * 1024                   # characters of one line (one prompt)
MAX_CORPUS_FILE_BYTES = 64 * 1024 * 1024       # a --corpus file without --max-bytes-per-file


def _split_streams(seed: int, draw: int | None = None) -> dict:
    """One SeedSequence per split (assignment of unlabelled prompt lines is another);
    ``draw`` gives other streams of the same configuration (free-running prompts)."""
    entropy = seed if draw is None else (seed, 7, draw)
    assign, *per_split = np.random.SeedSequence(entropy).spawn(1 + len(SPLITS))
    return assign, dict(zip(SPLITS, per_split))


def read_prompts_file(path: str | os.PathLike, seed: int) -> dict:
    """split -> list of texts from a JSON-lines file (``text``, optional ``split``).

    Read as every untrusted file is (``evolve.io.jsonio``): a regular file only (a
    FIFO or a device is refused before it is opened), at most ``MAX_PROMPTS_BYTES``
    read with that cap, each line at most ``MAX_LINE_CHARS`` and parsed within the
    one JSON reader's limits; texts must be Unicode (a lone surrogate such as
    ``"\\ud800"`` is refused). Every refusal is a DataError naming the file and line."""
    src = str(path)
    text = jsonio.read_text(path, "prompts file", MAX_PROMPTS_BYTES, DataError)
    out = {s: [] for s in SPLITS}
    free = []
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise DataError(f"{src}: line {i}: {len(line):,} characters, more than "
                            f"{MAX_LINE_CHARS:,} (one prompt per line)")
        obj = jsonio.loads(line, f"{src}: line {i}", "a JSON object", DataError)
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"]:
            raise DataError(f"{src}: line {i}: field 'text' must be a non-empty string")
        try:
            obj["text"].encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(f"{src}: line {i}: field 'text' holds a lone surrogate "
                            f"({obj['text'][e.start]!a} at character {e.start}); expected "
                            "Unicode text") from None
        s = obj.get("split")
        if s is None:
            free.append(obj["text"])
        elif isinstance(s, str) and s in SPLITS:
            out[s].append(obj["text"])
        else:
            raise DataError(f"{src}: line {i}: field 'split' is {s!a:.60}; expected one of "
                            + ", ".join(SPLITS))
    assign, _ = _split_streams(seed)
    perm = np.random.default_rng(assign).permutation(len(free))
    for j, i in enumerate(perm):
        out[_quarter(j)].append(free[i])
    for s in SPLITS:
        if not out[s]:
            raise DataError(f"{src}: the {s} split has no prompts (give more lines, or "
                            f"label some with \"split\": \"{s}\")")
    return out


def _quarter(j: int) -> str:
    """Unlabelled lines in turn: train, valid, train, test (2 : 1 : 1)."""
    return ("train", "valid", "train", "test")[j % 4]


def load_corpus(cfg) -> LM.Corpus:
    """--corpus DIR (every file below it not hidden, sorted by path) or the n-gram corpus.
    Only regular files are read, each with a cap: ``max_bytes_per_file`` bytes of it,
    and a file larger than ``MAX_CORPUS_FILE_BYTES`` without that option is refused."""
    if cfg.corpus_dir is None:
        return LM.Corpus.load(max_files=cfg.max_files, max_bytes_per_file=cfg.max_bytes_per_file)
    d = Path(cfg.corpus_dir)
    if not d.is_dir():
        raise DataError(f"{d}: corpus directory not found")
    files = sorted(p for p in d.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(d).parts))
    files = files[:cfg.max_files] if cfg.max_files is not None else files
    docs = [_read_head(p, cfg.max_bytes_per_file) for p in files]
    if len(docs) < 4:
        raise DataError(f"{d}: the corpus has {len(docs)} files; at least 4 are needed")
    return LM.Corpus(tuple(str(p.relative_to(d)) for p in files), tuple(docs))


def _read_head(path: Path, head: int | None) -> bytes:
    """The first ``head`` bytes of a regular file, read with that cap (all of it when
    ``head`` is None, if it holds at most MAX_CORPUS_FILE_BYTES)."""
    if head is None:
        return jsonio.read_capped(path, "corpus file", MAX_CORPUS_FILE_BYTES, DataError)
    return jsonio.read_capped(path, "corpus file", head, DataError, head=True)


def corpus_pools(cfg, corpus: LM.Corpus) -> dict:
    """split -> file indices: the n-gram pair's held-out pools for this seed."""
    _, _, pools = ngram.file_split(len(corpus), ngram.TraceConfig(seed=cfg.seed))
    return pools


def encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)


def split_prompts(pair, split: str, texts: dict | None = None,
                  corpus: LM.Corpus | None = None, n: int | None = None,
                  draw: int | None = None):
    """(token id arrays, per-prompt Generators) of a split: whole texts of a prompts file
    (the first ``n``), else ``n`` windows of ``prompt_len`` tokens from the split's
    corpus pool (default: the configured count). ``draw=None`` gives the recorded
    traces' prompts and uniforms; an integer, another seeded draw from the same pool."""
    cfg = pair.config
    _, per_split = _split_streams(cfg.seed, draw)
    if texts is not None:
        items = texts[split]
        if n is not None:
            if n > len(items):
                raise DataError(f"{cfg.prompts_file}: {n} prompts asked for; the {split} "
                                f"split has {len(items)}")
            items = items[:n]
        rngs = [np.random.default_rng(c) for c in per_split[split].spawn(len(items))]
        ids = [encode(pair.tokenizer, t) for t in items]
        for i, a in enumerate(ids):
            if a.size == 0:
                raise DataError(f"{cfg.prompts_file}: {split} prompt {i} has no tokens")
        return ids, rngs
    n = cfg.prompts(split) if n is None else n
    docs = [encode(pair.tokenizer, corpus.docs[i].decode("utf-8", errors="replace"))
            for i in corpus_pools(cfg, corpus)[split]]
    room = np.array([max(0, d.size - cfg.prompt_len + 1) for d in docs], dtype=np.int64)
    if room.sum() == 0:
        raise DataError(f"the {split} prompt files are shorter than --prompt-len "
                        f"{cfg.prompt_len} tokens")
    cum = np.cumsum(room)
    ids, rngs = [], []
    for ch in per_split[split].spawn(n):
        rng = np.random.default_rng(ch)
        u = int(rng.integers(0, cum[-1]))
        f = int(np.searchsorted(cum, u, side="right"))
        off = u - (int(cum[f - 1]) if f else 0)
        ids.append(docs[f][off:off + cfg.prompt_len].copy())
        rngs.append(rng)
    return ids, rngs
