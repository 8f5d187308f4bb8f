"""Critical-token labels, mined as AutoJudge mines them.

A drafted token the standard rule could reject (greedy decoding: it is not the
target's argmax; sampling: p(x) < q(x)) is *critical* when accepting it changes the
task's answer. For every such row of a standard-rule recording: the draft's token is
substituted at the row's context, the target continues to the end of the answer,
and the answer is extracted (``answer_of``); the same is done without the
substitution (greedy: the target's argmax there; sampling: the target's own draw, from
the same uniforms as the substituted continuation afterwards, so the two differ only
by the substitution). The label is 1 when the two answers differ, 0 when they agree.

The continuations of many rows are batched: one forward pass of the target per
generated position over the whole batch (the target's ``probs`` on (B, C) histories,
the interface of ``evolve.data.decode``). ``mine`` returns the labels and what mining
cost: the rows labelled, the target's forward passes (batched calls of the target)
and the rows they read (rows x positions), and seconds.
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import numpy as np

from evolve.data import tokens as D
from evolve.data.decode import sample_rows
from evolve.data.tokens import DataError
from evolve.errors import first_line
from evolve.io import jsonio
from evolve.io.atomic import sha256_file

UNLABELED = -1
BATCH = 2048
MODES = ("greedy", "sample")          # a task recording's decoding (meta "decoding")
LABELS_VERSION = 1
COLUMN = "critical"                   # the labels' column (int8: 1, 0, UNLABELED)


def could_reject(cols: dict, greedy: bool) -> np.ndarray:
    """The rows a label is needed for: the standard rule could reject their draft."""
    if greedy:
        return np.asarray(cols["token"]) != np.asarray(cols["target_top"])
    return np.asarray(cols["target_prob"]) < np.asarray(cols["draft_prob"])


def continue_text(pair, hist: np.ndarray, greedy: bool, uniforms, done_of, max_new,
                  pad: int = 0, keep=None) -> tuple[list, int, int]:
    """The texts after continuing every history (B, L) with the target until
    ``done_of(text)`` or ``max_new`` more tokens (a number, or one per row; greedy:
    argmax; else inverse-CDF with ``uniforms`` (B, max)); leading ``pad`` tokens are
    not text, nor, with ``keep`` (one number per row), any but the last ``keep``
    tokens of a history (the prompt). A text is a list of token ids (byte values for
    a byte-level pair). The target reads each whole history at every step, or, for a
    pair with a ``continuation_reader`` (a Hugging Face one: its KV cache), as that
    reader reads it. Returns the texts, the target rows read (rows x positions) and
    the target's forward passes (one batched call a position)."""
    C = pair.context_len
    B, L = hist.shape
    limit = np.broadcast_to(np.asarray(max_new, dtype=np.int64), (B,))
    texts = []
    for i, h in enumerate(hist):
        first = np.flatnonzero(h != pad)
        start = first[0] if first.size else L
        if keep is not None:
            start = max(start, L - int(keep[i]))
        texts.append(h[start:].tolist())
    done = np.array([bool(done_of(t)) for t in texts], dtype=bool) | (limit <= 0)
    steps = int(limit.max(initial=0))
    reader = getattr(pair, "continuation_reader", None)
    read = (reader(hist, steps) if reader is not None
            else (lambda live, h: pair.target.probs(h[live, -C:])))
    passes = calls = 0
    for step in range(steps):
        live = np.flatnonzero(~done)
        if live.size == 0:
            break
        P = read(live, hist)
        passes += live.size
        calls += 1
        nxt = (np.argmax(P, axis=1) if greedy else sample_rows(P, uniforms[live, step]))
        hist = np.concatenate([hist, np.full((B, 1), pad, dtype=hist.dtype)], axis=1)
        hist[live, -1] = nxt
        for i, b in zip(live, nxt):
            texts[i].append(int(b))
            if step + 1 >= limit[i] or done_of(texts[i]):
                done[i] = True
    return texts, passes, calls


def mine(pair, cols: dict, answer_of, done_of, greedy: bool, max_new: int, seed: int = 0,
         pad: int = 0, batch: int = BATCH, max_tokens: int | None = None,
         tick=None) -> tuple[np.ndarray, dict]:
    """(labels (N,) int8: 1 critical, 0 harmless, -1 where no label is needed; cost) of
    a recording's columns ``cols`` (``context`` (N, C) the tokens before each drafted
    row, in the histories' dtype, ``token``, ``target_top``, ``target_prob``,
    ``draft_prob``, ``position``). ``answer_of`` and ``done_of`` see the generated text
    alone: the ``position`` tokens before the row, the row's token and what follows
    (never the prompt). Each continuation runs ``max_new`` tokens at most,
    and with ``max_tokens`` (the decoder's budget of generated tokens) no further than
    that budget: the substituted token and its continuation end where the text would.
    ``tick(n)``, when given, is called after each batch of ``n`` labelled rows."""
    t0 = time.perf_counter()
    rows = np.flatnonzero(could_reject(cols, greedy))
    labels = np.full(len(cols["token"]), UNLABELED, dtype=np.int8)
    passes = calls = 0
    for s in range(0, rows.size, batch):
        r = rows[s:s + batch]
        ctx = np.asarray(cols["context"][r])
        u = np.random.default_rng((seed, s)).random((r.size, max_new + 1))
        limit = max_new
        if max_tokens is not None:
            limit = np.minimum(max_new, max_tokens - 1 - np.asarray(cols["position"])[r])
        sub = np.concatenate([ctx, np.asarray(cols["token"][r], ctx.dtype)[:, None]], axis=1)
        if greedy:
            own = np.concatenate([ctx, np.asarray(cols["target_top"][r], ctx.dtype)[:, None]],
                                 axis=1)
        else:           # the target's own draw at the row, then the same uniforms
            P = pair.target.probs(ctx[:, -pair.context_len:])
            passes += r.size
            calls += 1
            own = np.concatenate([ctx, sample_rows(P, u[:, 0]).astype(ctx.dtype)[:, None]],
                                 axis=1)
        keep = np.asarray(cols["position"])[r] + 1       # the generated text and the row
        a, pa, ca = continue_text(pair, sub, greedy, u[:, 1:], done_of, limit, pad, keep)
        b, pb, cb = continue_text(pair, own, greedy, u[:, 1:], done_of, limit, pad, keep)
        passes += pa + pb
        calls += ca + cb
        labels[r] = [int(answer_of(x) != answer_of(y)) for x, y in zip(a, b)]
        if tick is not None:
            tick(r.size)
    seconds = time.perf_counter() - t0
    cost = {"rows": int(rows.size), "critical": int((labels == 1).sum()),
            "target_forward_rows": int(passes), "target_forward_passes": int(calls),
            "seconds": round(seconds, 3),
            "continuation": "greedy" if greedy else "seeded sampling", "max_new": max_new}
    return labels, cost


# ------------------------------------------------------------------ the labels' file

def labels_path(directory, split: str) -> Path:
    """Where a split's labels are: ``<split>.labels.npz`` beside its traces."""
    return Path(directory) / f"{split}.labels.npz"


def read_labels(path: Path):
    """(meta, critical) of a labels file, read as split files are (never unpickled,
    capped, one DataError line naming the file)."""
    jsonio.check_regular(path, "labels file", DataError)
    try:
        with zipfile.ZipFile(path) as zf:
            if "meta.json" not in set(zf.namelist()):
                raise DataError(f"{path}: meta.json is missing (not a labels file)")
            meta = D.read_meta(zf, str(path))
            if not isinstance(meta, dict):
                raise DataError(f"{path}: meta.json must be an object")
            crit = D.read_members(zf, str(path), {COLUMN: f"{COLUMN}.npy"})[COLUMN]
    except DataError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the labels ({first_line(e)})") from None
    return meta, crit


def check_version(meta, where: str, decoding, field: str = "") -> None:
    """DataError unless a labels meta is an object of this ``LABELS_VERSION`` whose
    decoding is the traces' ``decoding`` (``field``: the prefix of the fields' names in
    the message, e.g. a manifest's ``meta.labels.``)."""
    version = meta.get("labels_version") if isinstance(meta, dict) else None
    if type(version) is not int or version != LABELS_VERSION:    # True == 1: not a version
        got = version if isinstance(meta, dict) else meta
        raise DataError(f"{where}: field '{field}labels_version' is {got!r:.40}; expected "
                        f"{LABELS_VERSION}")
    if meta.get("decoding") not in MODES or meta["decoding"] != decoding:
        raise DataError(f"{where}: field '{field}decoding' is {meta.get('decoding')!r:.40}, "
                        f"the traces' decoding {decoding!r:.40}")


def check_critical(columns: dict, crit, greedy: bool, where: str) -> None:
    """The labels of traces' rows (``columns``): int8, one per row, each 1, 0 or
    UNLABELED, a label on every row the standard rule could reject and on no other (a
    label there would still teach the learned judge, which fits every label); DataError
    naming ``where``, the field and the first bad row otherwise."""
    n = len(columns["token"])
    if crit.dtype != np.int8 or crit.shape != (n,):
        raise DataError(f"{where}: field '{COLUMN}' must be int8 of shape ({n},)")
    bad = np.flatnonzero(~np.isin(crit, (UNLABELED, 0, 1)))
    if bad.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(bad[0])}: "
                        f"{int(crit[bad[0]])} is not -1, 0 or 1")
    needed = could_reject(columns, greedy)
    missing = np.flatnonzero(needed & (crit == UNLABELED))
    if missing.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(missing[0])}: no label for a "
                        "draft the standard rule could reject")
    extra = np.flatnonzero(~needed & (crit != UNLABELED))
    if extra.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(extra[0])}: a label for a "
                        f"draft the standard rule never rejects (expected {UNLABELED}; "
                        f"{extra.size} such rows)")


def load_labels(path: Path, traces_path: Path, ts):
    """(meta, critical) of the labels file ``path`` of the traces ``ts`` read from
    ``traces_path``, checked: the version and decoding (a meta without one takes the
    traces'), the traces' checksum, and every label (``check_critical``)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: the labels of {Path(traces_path).name} are missing "
                        "(`evolve data task` writes both)")
    meta, crit = read_labels(path)
    meta.setdefault("decoding", ts.meta.get("decoding"))
    check_version(meta, str(path), ts.meta.get("decoding"))
    if meta.get("traces_sha256") != sha256_file(traces_path):
        raise DataError(f"{path}: field 'traces_sha256' does not match "
                        f"{Path(traces_path).name}: the labels are of other traces (record "
                        "both again)")
    check_critical(ts.columns, crit, ts.meta["decoding"] == "greedy", str(path))
    return meta, crit
