"""Byte-level n-gram language models with interpolated Kneser-Ney smoothing.

The draft/target pair of the trace generator (``evolve.data.sources.ngram``) is trained
offline, without network, on a code corpus that every Python installation
carries: the standard library's own top-level ``*.py`` files
(``sysconfig.get_paths()["stdlib"]``, non-recursive, sorted by name, without
the build-specific ``_sysconfigdata*.py``). The corpus depends on the Python
version, which is recorded with every artefact.

Model (vocabulary: the 256 byte values). For order ``n`` and a history ``h`` of
``k - 1`` bytes, with ``h'`` the history without its oldest byte:

    P_k(w | h) = [max(c_k(h w) - D_k, 0) + D_k N_k(h) P_{k-1}(w | h')] / c_k(h)
                 if the history h was seen at order k, else P_{k-1}(w | h')
    P_1(w)     = [max(c_1(w) - D_1, 0) + D_1 N_1 / 256] / c_1

where ``c_n`` are raw counts at the highest order and, below it, continuation
counts (the number of distinct bytes seen to the left of the k-gram);
``c_k(h) = sum_w c_k(h w)``, ``N_k(h)`` the number of distinct ``w`` with
``c_k(h w) > 0`` and ``D_k = n1 / (n1 + 2 n2)`` from the count-of-counts of
order ``k``. Every byte has probability > 0 (the uniform floor of order 1).
n-grams never cross file boundaries. A temperature ``T`` turns a distribution
into ``p^(1/T) / sum p^(1/T)``.

Everything is numpy and vectorised over a batch of histories: ``probs(H)``
gives the full next-byte distribution for each row of a ``(B, L)`` uint8
history matrix in one call. Training is deterministic (sorting and counting
only).
"""

from __future__ import annotations

import sys
import sysconfig
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evolve.data.decode import VOCAB

MAX_ORDER = 7          # k-gram codes must fit an int64: 8 * k bits <= 63 -> k <= 7


# ------------------------------------------------------------------ corpus

def corpus_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


# Build-specific files (their content depends on how Python was configured).
EXCLUDE_PREFIXES = ("_sysconfigdata",)


def corpus_files(directory: str | Path | None = None) -> list[Path]:
    """The corpus: top-level ``*.py`` files of the stdlib directory, sorted by name,
    without the build-specific ``_sysconfigdata*.py``."""
    d = Path(directory) if directory is not None else corpus_dir()
    return sorted((p for p in d.glob("*.py")
                   if p.is_file() and not p.name.startswith(EXCLUDE_PREFIXES)),
                  key=lambda p: p.name)


def python_version() -> str:
    return "%d.%d.%d" % sys.version_info[:3]


@dataclass(frozen=True)
class Corpus:
    """A list of documents (bytes) with their names."""
    names: tuple[str, ...]
    docs: tuple[bytes, ...]

    @classmethod
    def load(cls, directory: str | Path | None = None, max_files: int | None = None,
             max_bytes_per_file: int | None = None) -> "Corpus":
        files = corpus_files(directory)
        if max_files is not None:
            files = files[:max_files]
        docs = []
        for f in files:
            b = f.read_bytes()
            if max_bytes_per_file is not None:
                b = b[:max_bytes_per_file]
            docs.append(b)
        return cls(tuple(f.name for f in files), tuple(docs))

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def total_bytes(self) -> int:
        return sum(len(d) for d in self.docs)

    def subset(self, indices) -> "Corpus":
        idx = list(indices)
        return Corpus(tuple(self.names[i] for i in idx), tuple(self.docs[i] for i in idx))

    def fingerprint(self) -> str:
        """crc32 over names and contents, as 8 hex digits (provenance only)."""
        c = 0
        for n, d in zip(self.names, self.docs):
            c = zlib.crc32(n.encode() + b"\0", c)
            c = zlib.crc32(d, c)
        return f"{c:08x}"


def split_files(n_files: int, seed: int, fractions) -> list[np.ndarray]:
    """Partition file indices 0..n-1 into groups of the given fractions (seeded).

    The first group gets what rounding leaves; every other group at least one file.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or fr.size < 1 or (fr < 0).any() or fr.sum() <= 0:
        raise ValueError(f"fractions must be non-negative with a positive sum, got {fractions!r}")
    if n_files < fr.size:
        raise ValueError(f"need at least {fr.size} files to split, got {n_files}")
    perm = np.random.default_rng(seed).permutation(n_files)
    sizes = [max(1, int(round(f / fr.sum() * n_files))) for f in fr[1:]]
    first = n_files - sum(sizes)
    if first < 1:
        raise ValueError(f"cannot split {n_files} files as {fractions!r}")
    bounds = np.cumsum([0, first] + sizes)
    return [np.sort(perm[bounds[i]:bounds[i + 1]]) for i in range(fr.size)]


# ------------------------------------------------------------------- model

def _kgram_codes(docs, k: int) -> np.ndarray:
    """int64 codes of every k-gram inside each document (none across documents).

    Code of bytes b_0 .. b_{k-1} (oldest first): sum_i b_i * 256^(k-1-i), so the
    last byte is ``code & 255`` and the history is ``code >> 8``.
    """
    parts = []
    for d in docs:
        a = np.frombuffer(d, dtype=np.uint8).astype(np.int64)
        if a.size < k:
            continue
        m = a.size - k + 1
        code = np.zeros(m, dtype=np.int64)
        for i in range(k):
            code = (code << 8) | a[i:i + m]
        parts.append(code)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)


def _discount(counts: np.ndarray) -> float:
    n1 = int((counts == 1).sum())
    n2 = int((counts == 2).sum())
    if n1 == 0:
        return 0.5
    d = n1 / (n1 + 2.0 * n2)
    return float(min(max(d, 0.05), 0.95))


@dataclass
class _Order:
    keys: np.ndarray        # sorted unique k-gram codes (int64)
    counts: np.ndarray      # raw (top order) or continuation counts, float64
    ctx: np.ndarray         # sorted unique history codes (int64)
    ctx_start: np.ndarray   # first index into keys of each history (len(ctx) + 1)
    ctx_total: np.ndarray   # c_k(h)
    ctx_types: np.ndarray   # N_k(h)
    discount: float


@dataclass
class NGramLM:
    """An interpolated Kneser-Ney byte model; build with ``NGramLM.train``."""
    order: int
    orders: list = field(repr=False)
    temperature: float = 1.0
    train_bytes: int = 0

    @classmethod
    def train(cls, docs, order: int, temperature: float = 1.0) -> "NGramLM":
        if not (isinstance(order, int) and 1 <= order <= MAX_ORDER):
            raise ValueError(f"order must be an integer in 1..{MAX_ORDER}, got {order!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        docs = [bytes(d) for d in docs]
        total = sum(len(d) for d in docs)
        if total < order:
            raise ValueError(f"training text has {total} bytes, fewer than the order {order}")
        orders: list[_Order] = []
        higher_keys = None
        for k in range(order, 0, -1):
            if k == order:
                keys, counts = np.unique(_kgram_codes(docs, k), return_counts=True)
            else:
                # continuation counts: distinct left extensions of each k-gram
                mask = (1 << (8 * k)) - 1
                suffix = higher_keys & mask          # drop the oldest byte
                keys, counts = np.unique(suffix, return_counts=True)
            higher_keys = keys
            counts = counts.astype(np.float64)
            hist = keys >> 8
            ctx, first, types = np.unique(hist, return_index=True, return_counts=True)
            start = np.append(first, keys.size).astype(np.int64)
            total_c = np.add.reduceat(counts, first) if keys.size else np.zeros(0)
            orders.append(_Order(keys, counts, ctx, start, total_c, types.astype(np.float64),
                                 _discount(counts)))
        orders.reverse()     # orders[k-1] is order k
        return cls(order, orders, float(temperature), total)

    def with_temperature(self, temperature: float) -> "NGramLM":
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        return NGramLM(self.order, self.orders, float(temperature), self.train_bytes)

    def probs(self, history) -> np.ndarray:
        """Next-byte distributions, float64 (B, 256), for a (B, L) uint8 history matrix.

        Only the last ``order - 1`` bytes of each row matter; rows shorter than
        that back off to the orders their length allows (L is the same for all
        rows, so this only happens when L < order - 1).
        """
        H = np.asarray(history)
        if H.ndim == 1:
            return self.probs(H[None, :])[0]
        if H.ndim != 2:
            raise ValueError(f"history must be (B, L), got shape {H.shape}")
        B, L = H.shape
        H = H.astype(np.int64, copy=False)
        o1 = self.orders[0]
        uni = np.zeros(VOCAB)
        uni[o1.keys & 255] = np.maximum(o1.counts - o1.discount, 0.0)
        tot = o1.ctx_total[0] if o1.ctx_total.size else 1.0
        typ = o1.ctx_types[0] if o1.ctx_types.size else 0.0
        uni = (uni + o1.discount * typ / VOCAB) / tot
        P = np.broadcast_to(uni, (B, VOCAB)).copy()
        hcode = np.zeros(B, dtype=np.int64)
        for k in range(2, min(self.order, L + 1) + 1):
            hcode = hcode | (H[:, L - (k - 1)] << (8 * (k - 2)))
            P = self._interpolate(self.orders[k - 1], hcode, P)
        return _temper(P, self.temperature)

    @staticmethod
    def _interpolate(o: _Order, hcode: np.ndarray, lower: np.ndarray) -> np.ndarray:
        if o.ctx.size == 0:
            return lower
        idx = np.searchsorted(o.ctx, hcode)
        idx_c = np.minimum(idx, o.ctx.size - 1)
        found = o.ctx[idx_c] == hcode
        if not found.any():
            return lower
        rows = np.flatnonzero(found)
        ci = idx_c[rows]
        lo = o.ctx_start[ci]
        n = o.ctx_start[ci + 1] - lo
        tot = int(n.sum())
        rr = np.repeat(np.arange(rows.size), n)
        offs = np.arange(tot) - np.repeat(np.cumsum(n) - n, n)
        pos = np.repeat(lo, n) + offs
        C = np.zeros((rows.size, VOCAB))
        C[rr, o.keys[pos] & 255] = np.maximum(o.counts[pos] - o.discount, 0.0)
        out = lower.copy()
        out[rows] = (C + (o.discount * o.ctx_types[ci])[:, None] * lower[rows]) \
            / o.ctx_total[ci][:, None]
        return out

    def describe(self) -> dict:
        return {"order": self.order, "temperature": self.temperature,
                "train_bytes": self.train_bytes,
                "ngrams": [int(o.keys.size) for o in self.orders],
                "discounts": [round(o.discount, 6) for o in self.orders]}


def _temper(P: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 1.0:
        return P / P.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", under="ignore"):
        L = np.log(P) / temperature
    L -= L.max(axis=1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(axis=1, keepdims=True)


def cross_entropy(lm: NGramLM, doc: bytes, limit: int | None = None, batch: int = 4096) -> float:
    """Mean -log P(byte | history) in nats over a document (the first order-1 bytes skipped)."""
    a = np.frombuffer(doc, dtype=np.uint8)
    if limit is not None:
        a = a[:limit]
    c = lm.order - 1
    if a.size <= c:
        raise ValueError("document shorter than the model's history")
    idx = np.arange(c, a.size)
    tot = 0.0
    for s in range(0, idx.size, batch):
        j = idx[s:s + batch]
        H = a[j[:, None] + np.arange(-c, 0)[None, :]] if c else np.zeros((j.size, 0), np.uint8)
        P = lm.probs(H)
        tot += float(-np.log(P[np.arange(j.size), a[j]]).sum())
    return tot / idx.size
