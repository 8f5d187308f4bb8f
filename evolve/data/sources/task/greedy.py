"""Greedy generation with one model of a pair, and task accuracy (evaluation only).

``generate`` decodes prompts greedily with one model (the target alone, or the
draft alone): the argmax byte (the lowest on ties), byte by byte, until the model
emits ``end`` (``grammar.PAD``: the end of a solution) or ``max_new`` bytes;
``accuracy`` checks the texts against the reference answers.
"""

from __future__ import annotations

import numpy as np

from evolve.data.sources.task.grammar import PAD


def generate(model, prompts: np.ndarray, max_new: int, end: int = PAD):
    """(texts, lengths) of greedy decoding from (n, C) uint8 prompts, C the model's
    context (``pair.pad_prompts``): each text the bytes before the first ``end``,
    each length the bytes generated, the ``end`` byte included."""
    n, C = prompts.shape
    hist = np.zeros((n, C + max_new), dtype=np.uint8)
    hist[:, :C] = prompts
    length = np.full(n, max_new, dtype=np.int64)
    live = np.arange(n)
    for t in range(max_new):
        if live.size == 0:
            break
        x = np.argmax(model.probs(hist[live, t:t + C]), axis=1).astype(np.uint8)
        hist[live, C + t] = x
        done = x == end
        length[live[done]] = t + 1
        live = live[~done]
    texts = []
    for i in range(n):
        out = hist[i, C:C + length[i]].tobytes()
        texts.append(out.split(bytes([end]), 1)[0])
    return texts, length


def accuracy(model, prompts: np.ndarray, answers, checker, max_new: int) -> dict:
    """Greedy task accuracy of one model: ``correct`` (a bool per problem),
    ``accuracy``, ``mean_tokens`` (bytes generated per problem, the end byte
    included), ``unfinished`` (problems that hit ``max_new``) and the ``texts``."""
    texts, length = generate(model, prompts, max_new)
    correct = np.array([checker.check(t.decode("utf-8", errors="replace"), a)
                        for t, a in zip(texts, answers)], dtype=bool)
    ended = np.array([len(t) < n for t, n in zip(texts, length)], dtype=bool)
    return {"accuracy": float(correct.mean()) if correct.size else 0.0,
            "correct": correct, "mean_tokens": float(length.mean()) if length.size else 0.0,
            "unfinished": int((~ended).sum()), "texts": texts}
