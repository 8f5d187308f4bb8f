"""Speculative-decoding traces, schema v2, v3 and v4: one row per drafted position.

A split holds the eight v1 fields of every drafted position (so a v1 reader
loads it as a token split) and the v2 fields below: where the position sits
(sequence, block, block position), the drafted byte and the target's argmax,
p_max and q_max, the draft's top-k candidates with both models' probabilities,
the tail masses outside them, and the context bytes. Rows come in whole blocks
of ``g`` drafted positions, blocks contiguous. Sources that write traces live
in ``evolve.data.sources`` (the n-gram pair); ``evolve.data.decode`` is the
decoder they share.

File format: an uncompressed .npz with fixed zip timestamps. The eight v1 fields
are ``<field>.npy`` members, exactly as ``evolve.data.tokens.save_npz`` writes
them; the v2 fields are NumPy ``.npy`` payloads stored under ``v2/<field>`` (no
``.npy`` suffix), and ``meta.json`` holds ``format_version: 2`` and the
generation settings. Loading validates every invariant and raises DataError
naming the file, the field and the first bad row.

Schema v3 = v2 + the four slot features of ``V3_FIELDS`` (stored under ``v3/``,
``format_version: 3``) of the full distributions p and q over the vocabulary
(``evolve.data.decode.slot_features``). Version 2 files still load, without them
(``TraceSplit.has_slot_features``; ``evolve.objectives.spec.TraceArrays.missing``).

Schema v4 = v3 + the target's ranks of ``V4_FIELDS`` (stored under ``v4/``,
``format_version: 4``): for the drafted token and for each of the draft's candidates,
how many tokens of the vocabulary the target finds more probable (0: its top token;
the condition of TensorRT-LLM's ``relaxed_topk``). Files of versions 2 and 3 still
load, without them (``TraceSplit.has_ranks``): the ``rank`` input group is then not
offered.

Vocabulary: ``meta.json`` may name ``vocab_size`` (token ids are 0 ..
vocab_size - 1); files without it are byte-level (256, the n-gram pair). It may carry
the class of every token of the vocabulary (``vocab_classes``: one digit a token, 0
word, 1 number, 2 punctuation, 3 other; ``evolve.data.vocab_class``): the
``token_class`` input is offered where it does.
``cand_token`` is uint8 (byte-level files), int32 or int64; ``context`` is
uint8 (bytes) or int32 token ids, left-padded with -1 where the sequence is
shorter than ``context_len`` (``context_len`` may be 0: no contexts stored).
``meta["backend"]`` names the source that recorded the file ("ngram" when
absent; "hf" for ``evolve.data.sources.hf``).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.data import tokens as D
from evolve.data import vocab_class as VC
from evolve.data.tokens import DataError
from evolve.errors import first_line, show
from evolve.io import jsonio

VOCAB = 256            # byte-level models: token ids are byte values (default vocab_size)

FORMAT_VERSION = 2     # the schema every split holds (ALL_FIELDS)
SLOT_VERSION = 3       # files with the slot features (V3_FIELDS) as well
RANK_VERSION = 4       # and with the target's ranks (V4_FIELDS)
FORMAT_VERSIONS = (FORMAT_VERSION, SLOT_VERSION, RANK_VERSION)
SPLITS = D.SPLITS
V2_PREFIX = "v2/"
V3_PREFIX = "v3/"
V4_PREFIX = "v4/"
MASS_TOL = 1e-9        # tolerance of probability sums in validation

# v2 fields beyond the v1 record. Kind: "row" (N,), "cand" (N, k), "ctx" (N, C).
V2_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "sequence": ("row", np.dtype(np.int64)),          # prompt index within the split
    "block_index": ("row", np.dtype(np.int64)),       # block number within the sequence
    "block_position": ("row", np.dtype(np.int64)),    # 0 .. g-1 within the block
    "token": ("row", np.dtype(np.int64)),             # the drafted byte
    "draft_cand": ("row", np.dtype(np.int64)),        # its column in cand_*, -1 if in the tail
    "target_top": ("row", np.dtype(np.int64)),        # argmax of p (lowest byte on ties)
    "p_max": ("row", np.dtype(np.float64)),           # max_x p(x)
    "q_max": ("row", np.dtype(np.float64)),           # max_x q(x)
    "tail_draft_prob": ("row", np.dtype(np.float64)),         # q(T), T = bytes not in cand
    "tail_target_prob": ("row", np.dtype(np.float64)),        # p(T)
    "tail_excess_draft_prob": ("row", np.dtype(np.float64)),  # q(T+), T+ = {x in T: p > q}
    "tail_excess_target_prob": ("row", np.dtype(np.float64)), # p(T+)
    "cand_token": ("cand", np.dtype(np.uint8)),       # top-k tokens by q, q descending
    "cand_draft_prob": ("cand", np.dtype(np.float64)),
    "cand_target_prob": ("cand", np.dtype(np.float64)),
    "context": ("ctx", np.dtype(np.uint8)),           # the C tokens before the drafted one
}
# Integer fields that may also be stored wider (token ids of large vocabularies).
WIDE_DTYPES = {"cand_token": (np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.int64)),
               "context": (np.dtype(np.uint8), np.dtype(np.int32))}
# v3 fields: per-slot features of the full distributions p (target), q (draft).
V3_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "slot_tv": ("row", np.dtype(np.float64)),         # sum_x max(0, q - p) = TV(p, q)
    "slot_kl_pq": ("row", np.dtype(np.float64)),      # KL(p || q)
    "slot_kl_qp": ("row", np.dtype(np.float64)),      # KL(q || p)
    "slot_n_q_gt_p": ("row", np.dtype(np.int64)),     # #{x: q(x) > p(x)}
}
KL_TOL = 1e-12         # a KL computed in float64 may round to a tiny negative
CONTEXT_PAD = -1       # left padding of int32 contexts shorter than context_len
ALL_FIELDS = tuple(D.FIELDS) + tuple(V2_FIELDS)    # the fields every split has
V3_ALL_FIELDS = ALL_FIELDS + tuple(V3_FIELDS)
# v4 fields: the target's rank of the drafted token and of each candidate,
# #{y: p(y) > p(x)} over the whole vocabulary (0: the target's top token); int32 (a
# rank is below the vocabulary size), a fifth of a row's bytes rather than two fifths.
V4_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "target_rank": ("row", np.dtype(np.int32)),
    "cand_target_rank": ("cand", np.dtype(np.int32)),
}
V4_ALL_FIELDS = V3_ALL_FIELDS + tuple(V4_FIELDS)


@dataclass(frozen=True)
class TraceSplit:
    """One split: per-row columns (v1 + v2 [+ v3]), (N, k) candidates, (N, C) contexts."""
    columns: dict
    meta: dict
    name: str = ""

    def __len__(self) -> int:
        return int(self.columns["draft_prob"].shape[0])

    def __getattr__(self, item):
        cols = self.__dict__.get("columns")
        if cols is not None and item in cols:
            return cols[item]
        raise AttributeError(item)

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])

    @property
    def top_k(self) -> int:
        return int(self.columns["cand_token"].shape[1])

    @property
    def n_blocks(self) -> int:
        return len(self) // self.block_size

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.meta)

    @property
    def has_slot_features(self) -> bool:
        """Whether the split carries the v3 slot features (``V3_FIELDS``)."""
        return all(f in self.columns for f in V3_FIELDS)

    @property
    def has_ranks(self) -> bool:
        """Whether the split carries the v4 target ranks (``V4_FIELDS``)."""
        return all(f in self.columns for f in V4_FIELDS)

    @property
    def fields(self) -> tuple:
        """The fields this split holds: ``V4_ALL_FIELDS``, ``V3_ALL_FIELDS`` or
        ``ALL_FIELDS``."""
        return fields_of(self.columns)

    @property
    def backend(self) -> str:
        return str(self.meta.get("backend", "ngram"))

    def dataset(self) -> D.Dataset:
        """The v1 view: one record per drafted position, the eight original fields."""
        return D.from_columns({f: self.columns[f] for f in D.FIELDS},
                              source=self.meta.get("source", "<traces>"), name=self.name)


def version_of(columns) -> int:
    """The schema version of a split holding the fields (names) ``columns``: 4 with the
    slot features and the ranks, 3 with the slot features, else 2."""
    if not all(f in columns for f in V3_FIELDS):
        return FORMAT_VERSION
    return RANK_VERSION if all(f in columns for f in V4_FIELDS) else SLOT_VERSION


def fields_for(version) -> tuple:
    """The fields of a split of schema ``version``."""
    return {RANK_VERSION: V4_ALL_FIELDS, SLOT_VERSION: V3_ALL_FIELDS}.get(version, ALL_FIELDS)


def fields_of(columns) -> tuple:
    """The fields of a split holding ``columns``: ``V4_ALL_FIELDS``, ``V3_ALL_FIELDS``
    (every slot feature) or ``ALL_FIELDS``."""
    return fields_for(version_of(columns))


def vocab_size(meta: dict) -> int:
    """Token ids of a split are 0 .. vocab_size - 1 (256 when meta.json does not say)."""
    return int(meta.get("vocab_size", VOCAB))


def scope_of(meta: dict) -> dict:
    """What the exact objectives assumed of decoding on traces with this meta: the
    scope a rule scored on them keeps when it is deployed (``evolve export``).

    - ``top_k``: the rule decides drafts among the draft's ``top_k`` most probable
      tokens (ties: lower id first), the standard rule min(1, p/q) the others; None
      when the candidates hold the whole vocabulary (the rule decides every draft);
    - ``block_size``: drafted tokens per target call (a constant draft length);
    - ``temperature``: applied to both models' logits, with no top-k or top-p
      truncation of either distribution;
    - ``vocab_size`` and the ``backend`` that recorded the traces;
    - on task traces, ``decoding``: "sample" as above, or "greedy" (the draft proposes
      its argmax, a draft that is the target's argmax is kept, the rule decides every
      other draft, and a rejection emits the target's argmax; ``top_k`` is None)."""
    V = vocab_size(meta)
    k = int(meta["top_k"])
    cfg = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    t = cfg.get("temperature")
    scope = {"top_k": None if k >= V else k, "vocab_size": V,
             "block_size": int(meta["block_size"]),
             "temperature": float(t) if isinstance(t, (int, float)) else None,
             "truncation": None, "backend": str(meta.get("backend", "ngram"))}
    if meta.get("decoding") in DECODINGS:
        scope["decoding"] = meta["decoding"]
        if meta["decoding"] == "greedy":
            scope["top_k"] = None
    return scope


DECODINGS = ("sample", "greedy")     # a scope's decoding (task traces record theirs)

# What a rule scored at one scope needs of the data it is evaluated on: the same
# decoding, draft length, candidates and temperature (the vocabulary and the source may
# differ: a rule over probabilities transfers between pairs, and a top-k scope means the
# draft's k most probable tokens whatever the vocabulary)
SCOPE_MATCH = ("decoding", "block_size", "top_k", "temperature")


def scope_text(scope: dict | None) -> str:
    """A scope in a few words: ``greedy at temperature 1, g = 4``, ``sampled at
    temperature 1, g = 4, top-k 16``; None (a rule scored on token splits): ``token
    splits (no decoding)``."""
    if scope is None:
        return "token splits (no decoding)"
    t = scope.get("temperature")
    text = (f"{'greedy' if scope.get('decoding', 'sample') == 'greedy' else 'sampled'} at "
            f"temperature {'?' if t is None else format(t, 'g')}, g = {scope.get('block_size')}")
    if scope.get("decoding", "sample") == "greedy":
        return text
    k = scope.get("top_k")
    return f"{text}, {'every token' if k is None else f'top-k {k}'}"


def scope_mismatch(rule_scope: dict | None, data_scope: dict) -> str | None:
    """Why a rule scored at ``rule_scope`` (None: on token splits) is not evaluated
    faithfully on traces of ``data_scope`` (both ``scope_of``), or None when it is: one
    phrase naming both scopes."""
    def value(sc, key):
        v = sc.get(key)
        return sc.get("decoding", "sample") if key == "decoding" else v

    same = rule_scope is not None and all(
        value(rule_scope, k) == value(data_scope, k) or (
            k == "temperature" and None not in (rule_scope.get(k), data_scope.get(k))
            and abs(rule_scope[k] - data_scope[k]) <= 1e-12 * max(1.0, abs(data_scope[k])))
        for k in SCOPE_MATCH)
    if same:
        return None
    return f"scored on {scope_text(rule_scope)}; the data is {scope_text(data_scope)}"


# ---------------------------------------------------------------- storage

def save(ts: TraceSplit, path: str | os.PathLike) -> None:
    """Write a split atomically as a deterministic, uncompressed .npz: schema v4 when
    its columns hold every slot feature and the ranks, v3 with the slot features only,
    v2 when they hold none."""
    src = ts.meta.get('source', '<traces>')
    some = [f for f in V3_FIELDS if f in ts.columns]
    if some and not ts.has_slot_features:
        missing = next(f for f in V3_FIELDS if f not in ts.columns)
        raise DataError(f"{src}: field '{missing}' is "
                        f"missing (a v3 split needs all of {', '.join(V3_FIELDS)})")
    ranks = [f for f in V4_FIELDS if f in ts.columns]
    if ranks and not (ts.has_ranks and ts.has_slot_features):
        missing = next(f for f in (*V4_FIELDS, *V3_FIELDS) if f not in ts.columns)
        raise DataError(f"{src}: field '{missing}' is missing (a v4 split needs all of "
                        f"{', '.join(V4_FIELDS)} and the slot features)")
    version = version_of(ts.columns)
    meta = {k: v for k, v in ts.meta.items() if k != "source"}
    meta["format_version"] = version
    D.write_npz(path, meta, {member: ts.columns[f]
                             for f, member in _members(version).items()})


def _members(version: int = FORMAT_VERSION) -> dict:
    """Field -> zip member: v1 as <field>.npy (v1 loaders read it), v2/..., v3/..."""
    m = {f: (f + ".npy" if f in D.FIELDS else V2_PREFIX + f) for f in ALL_FIELDS}
    if version >= SLOT_VERSION:
        m.update({f: V3_PREFIX + f for f in V3_FIELDS})
    if version >= RANK_VERSION:
        m.update({f: V4_PREFIX + f for f in V4_FIELDS})
    return m


def load(path: str | os.PathLike, name: str = "") -> TraceSplit:
    """Load and validate a v2, v3 or v4 split; a v1 file raises DataError saying so."""
    path = Path(path)
    src = str(path)
    if not os.path.lexists(path):
        raise DataError(f"{src}: file not found")
    jsonio.check_regular(path, "trace file", DataError)
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if "meta.json" not in names:
                raise DataError(f"{src}: meta.json is missing (not a trace file)")
            meta = D.read_meta(zf, src)
            v = meta.get("format_version") if isinstance(meta, dict) else None
            if not _is_version(v):
                raise DataError(f"{src}: format_version {show(v)} is not supported; a trace "
                                "file has 2, 3 or 4 (token splits, version 1, load with "
                                "evolve.data)")
            members = _members(v)
            cols = D.read_members(zf, src, members)
            known = set(members.values())
            extra = sorted(n for n in names if n not in known and n != "meta.json")
            if extra:
                raise DataError(f"{src}: member '{extra[0]}' is not part of schema v{v}")
    except DataError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error,
            NotImplementedError) as e:
        raise DataError(f"{src}: not a readable trace file ({first_line(e)})") from None
    meta["source"] = src
    ts = TraceSplit(cols, meta, name=name or path.stem)
    validate(ts, src)
    return ts


def trace_dir(directory: str | os.PathLike) -> Path:
    """``directory`` as a Path; DataError naming the command that records traces when it
    is not a directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: trace directory not found (record traces there "
                        "with `evolve data trace`, or point to yours with --data)")
    return directory


def load_splits(directory: str | os.PathLike, splits=SPLITS) -> dict:
    directory = trace_dir(directory)
    return {s: load(directory / f"{s}.npz", name=s) for s in splits}


def read_file_meta(path: str | os.PathLike):
    """The ``meta.json`` of a split file (regular files only; capped; one reader)."""
    jsonio.check_regular(path, "split file", DataError)
    try:
        with zipfile.ZipFile(path) as zf:
            return D.read_meta(zf, str(path))
    except DataError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError, zlib.error,
            NotImplementedError) as e:
        raise DataError(f"{path}: cannot read meta.json ({first_line(e)})") from None


def is_trace_file(path: str | os.PathLike) -> bool:
    try:
        meta = read_file_meta(path)
    except DataError:
        return False
    return isinstance(meta, dict) and _is_version(meta.get("format_version"))


def is_token_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a token split file (``meta.json`` format_version 1, the
    whole number), which a trace objective cannot use."""
    try:
        meta = read_file_meta(path)
    except DataError:
        return False
    v = meta.get("format_version") if isinstance(meta, dict) else None
    return type(v) is int and v == D.FORMAT_VERSION


def _is_version(v) -> bool:
    return type(v) is int and v in FORMAT_VERSIONS


# ------------------------------------------------------------- validation

def _bad(src, field, mask, arr, what):
    i = int(np.flatnonzero(mask)[0])
    v = arr[i]
    v = v.tolist() if hasattr(v, "tolist") else v
    raise DataError(f"{src}: field '{field}' row {i}: {what} (value {v!r}; "
                    f"{int(mask.sum())} bad rows in all)")


def validate(ts: TraceSplit, src: str) -> None:
    """Check every schema-v2 invariant (and v3 when the split has slot features);
    raise DataError naming file, field and row."""
    cols = ts.columns
    meta = ts.meta
    for f in ALL_FIELDS:
        if f not in cols:
            raise DataError(f"{src}: field '{f}' is missing")
    ds = D.from_columns({f: cols[f] for f in D.FIELDS}, source=src, name=ts.name)
    n = len(ds)
    g, k, C = (meta.get(key) for key in ("block_size", "top_k", "context_len"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1 << 20
               for v in (g, k, C)):
        raise DataError(f"{src}: meta.json: block_size, top_k and context_len must be "
                        f"whole numbers 0..{1 << 20}, got {g!r:.40}, {k!r:.40}, {C!r:.40}")
    try:
        V = vocab_size(meta)
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{src}: meta.json has a vocab_size that is not an integer") from None
    if V < 2:
        raise DataError(f"{src}: meta.json vocab_size is {V}, expected at least 2")
    if VC.META_KEY in meta:
        why = VC.check_text(meta[VC.META_KEY], V)
        if why:
            raise DataError(f"{src}: meta.json field '{VC.META_KEY}' {why}")
    if g < 1 or n % g:
        raise DataError(f"{src}: {n} rows is not a whole number of blocks of {g}")
    for f, (kind, dtype) in V2_FIELDS.items():
        a = cols[f]
        want = {"row": (n,), "cand": (n, k), "ctx": (n, C)}[kind]
        if a.shape != want:
            raise DataError(f"{src}: field '{f}' has shape {a.shape}, expected {want}")
        if dtype.kind == "f":
            if a.dtype.kind != "f":
                raise DataError(f"{src}: field '{f}' must be a float array, got {a.dtype}")
            bad = ~np.isfinite(a)
            if bad.any():
                _bad(src, f, bad.reshape(n, -1).any(axis=1), a, "not finite")
        elif a.dtype not in WIDE_DTYPES.get(f, (dtype,)):
            want_t = " or ".join(str(d) for d in WIDE_DTYPES.get(f, (dtype,)))
            raise DataError(f"{src}: field '{f}' must be {want_t}, got {a.dtype}")
    c = {f: cols[f] for f in V2_FIELDS}
    r = np.arange(n)
    if (c["block_position"] != r % g).any():
        _bad(src, "block_position", c["block_position"] != r % g, c["block_position"],
             f"rows must come in blocks of {g} with block_position 0..{g - 1}")
    for f in ("sequence", "block_index"):
        a = c[f].reshape(-1, g)
        bad = np.repeat((a != a[:, :1]).any(axis=1), g)
        if bad.any():
            _bad(src, f, bad, c[f], "differs within one block")
    for f in ("token", "target_top", "cand_token"):
        bad = ((c[f] < 0) | (c[f] >= V)).reshape(n, -1).any(axis=1)
        if bad.any():
            _bad(src, f, bad, c[f], f"not a token id of the vocabulary (0..{V - 1})")
    ctx = c["context"]
    if ctx.dtype.kind == "i" and C:
        pad = ctx == CONTEXT_PAD
        bad = ((ctx < CONTEXT_PAD) | (ctx >= V)).any(axis=1) | (pad[:, 1:] & ~pad[:, :-1]).any(axis=1)
        if bad.any():
            _bad(src, "context", bad, ctx, f"expected token ids 0..{V - 1}, left-padded "
                 f"with {CONTEXT_PAD}")
    cq, cp = c["cand_draft_prob"], c["cand_target_prob"]
    for f, a in (("cand_draft_prob", cq), ("cand_target_prob", cp), ("p_max", c["p_max"]),
                 ("q_max", c["q_max"])):
        bad = ~((a > 0.0) & (a <= 1.0))
        if bad.any():
            _bad(src, f, bad.reshape(n, -1).any(axis=1), a, "outside (0, 1]")
    if k > 1:
        bad = (np.diff(cq, axis=1) > 0).any(axis=1)
        if bad.any():
            _bad(src, "cand_draft_prob", bad, cq, "candidates must be sorted by q, descending")
        st = np.sort(c["cand_token"], axis=1)
        bad = (np.diff(st.astype(np.int64), axis=1) == 0).any(axis=1)
        if bad.any():
            _bad(src, "cand_token", bad, c["cand_token"], "a token appears twice")
    tq, tp = c["tail_draft_prob"], c["tail_target_prob"]
    eq, ep = c["tail_excess_draft_prob"], c["tail_excess_target_prob"]
    for f, a in (("tail_draft_prob", tq), ("tail_target_prob", tp),
                 ("tail_excess_draft_prob", eq), ("tail_excess_target_prob", ep)):
        bad = (a < 0.0) | (a > 1.0 + MASS_TOL)
        if bad.any():
            _bad(src, f, bad, a, "outside [0, 1]")
    bad = np.abs(cq.sum(axis=1) + tq - 1.0) > MASS_TOL
    if bad.any():
        _bad(src, "tail_draft_prob", bad, tq, "candidates + tail of q do not sum to 1")
    bad = np.abs(cp.sum(axis=1) + tp - 1.0) > MASS_TOL
    if bad.any():
        _bad(src, "tail_target_prob", bad, tp, "candidates + tail of p do not sum to 1")
    bad = (eq > tq + MASS_TOL) | (eq > ep + MASS_TOL)
    if bad.any():
        _bad(src, "tail_excess_draft_prob", bad, eq, "must be <= tail_draft_prob and "
             "<= tail_excess_target_prob")
    bad = ep > tp + MASS_TOL
    if bad.any():
        _bad(src, "tail_excess_target_prob", bad, ep, "must be <= tail_target_prob")
    dc = c["draft_cand"]
    bad = (dc < -1) | (dc >= k)
    if bad.any():
        _bad(src, "draft_cand", bad, dc, f"expected -1..{k - 1}")
    j = np.maximum(dc, 0)
    inside = dc >= 0
    ct = c["cand_token"][r, j].astype(np.int64)
    bad = inside & ((ct != c["token"]) | (cq[r, j] != ds.draft_prob)
                    | (cp[r, j] != ds.target_prob))
    if bad.any():
        _bad(src, "draft_cand", bad, dc, "the candidate there is not the drafted token")
    bad = ~inside & ((c["cand_token"].astype(np.int64) == c["token"][:, None]).any(axis=1)
                     | (ds.draft_prob > cq[:, -1]))
    if bad.any():
        _bad(src, "draft_cand", bad, dc, "the drafted token is among the candidates")
    bad = (c["q_max"] != cq[:, 0])
    if bad.any():
        _bad(src, "q_max", bad, c["q_max"], "differs from the first candidate's q")
    bad = (c["p_max"] < cp.max(axis=1)) | (c["p_max"] < ds.target_prob)
    if bad.any():
        _bad(src, "p_max", bad, c["p_max"], "smaller than a known target probability")
    bad = ds.top_token_match != (c["token"] == c["target_top"])
    if bad.any():
        _bad(src, "top_token_match", bad, ds.top_token_match,
             "must be token == target_top (the drafted byte is the target's argmax)")
    if ts.has_slot_features:
        _validate_v3(cols, n, V, src)
    if ts.has_ranks:
        _validate_v4(cols, n, k, V, src)


def _validate_v4(cols: dict, n: int, k: int, V: int, src: str) -> None:
    """The target's ranks: whole numbers 0..V-1; 0 exactly where the probability is the
    target's top one; the drafted token's rank is its candidate's; among a row's
    candidates a higher target probability has a smaller rank, an equal one the same."""
    for f, (kind, dtype) in V4_FIELDS.items():
        a = cols[f]
        want = (n,) if kind == "row" else (n, k)
        if a.shape != want:
            raise DataError(f"{src}: field '{f}' has shape {a.shape}, expected {want}")
        if a.dtype != dtype:
            raise DataError(f"{src}: field '{f}' must be {dtype}, got {a.dtype}")
        bad = ((a < 0) | (a >= V)).reshape(n, -1).any(axis=1)
        if bad.any():
            _bad(src, f, bad, a, f"a rank must be 0..{V - 1}")
    rk, crk = cols["target_rank"], cols["cand_target_rank"]
    cp, tp, pm = cols["cand_target_prob"], cols["target_prob"], cols["p_max"]
    bad = (rk == 0) != (tp == pm)
    if bad.any():
        _bad(src, "target_rank", bad, rk, "rank 0 is the target's top token, and only it")
    bad = ((crk == 0) != (cp == pm[:, None])).any(axis=1)
    if bad.any():
        _bad(src, "cand_target_rank", bad, crk, "rank 0 is the target's top token, and "
             "only it")
    dc = cols["draft_cand"]
    inside = dc >= 0
    bad = inside & (crk[np.arange(n), np.maximum(dc, 0)] != rk)
    if bad.any():
        _bad(src, "target_rank", bad, rk, "differs from its candidate's rank")
    if k > 1:
        order = np.argsort(-cp, axis=1, kind="stable")
        ps = np.take_along_axis(cp, order, axis=1)
        rs = np.take_along_axis(crk, order, axis=1)
        dp, dr = np.diff(ps, axis=1), np.diff(rs, axis=1)
        bad = ((dp < 0) & (dr <= 0) | (dp == 0) & (dr != 0)).any(axis=1)
        if bad.any():
            _bad(src, "cand_target_rank", bad, crk, "a candidate the target finds more "
                 "probable must have a smaller rank, an equally probable one the same")


def _validate_v3(cols: dict, n: int, V: int, src: str) -> None:
    """The slot features: finite, slot_tv in [0, 1], KLs >= 0, count in [0, V]; and
    where the candidates hold all of both distributions' mass (zero tails), slot_tv
    is their TV, sum max(0, q - p), within MASS_TOL (the only rows where a reader can
    tell: elsewhere the TV of the tokens outside the candidates is unknown)."""
    for f, (_, dtype) in V3_FIELDS.items():
        a = cols[f]
        if a.shape != (n,):
            raise DataError(f"{src}: field '{f}' has shape {a.shape}, expected {(n,)}")
        if a.dtype != dtype:
            raise DataError(f"{src}: field '{f}' must be {dtype}, got {a.dtype}")
        if dtype.kind == "f":
            bad = ~np.isfinite(a)
            if bad.any():
                _bad(src, f, bad, a, "not finite")
    a = cols["slot_tv"]
    bad = (a < 0.0) | (a > 1.0 + MASS_TOL)
    if bad.any():
        _bad(src, "slot_tv", bad, a, "outside [0, 1]")
    whole = (cols["tail_draft_prob"] == 0.0) & (cols["tail_target_prob"] == 0.0)
    if whole.any():
        cq, cp = cols["cand_draft_prob"][whole], cols["cand_target_prob"][whole]
        bad = np.zeros(n, dtype=bool)
        bad[whole] = np.abs(np.maximum(cq - cp, 0.0).sum(axis=1) - a[whole]) > MASS_TOL
        if bad.any():
            _bad(src, "slot_tv", bad, a, "differs from the TV of the candidates, which "
                 "hold all of both distributions' mass (sum of max(0, q - p))")
    for f in ("slot_kl_pq", "slot_kl_qp"):
        bad = cols[f] < -KL_TOL
        if bad.any():
            _bad(src, f, bad, cols[f], "a KL divergence must be >= 0")
    a = cols["slot_n_q_gt_p"]
    bad = (a < 0) | (a > V)
    if bad.any():
        _bad(src, "slot_n_q_gt_p", bad, a, f"outside 0..{V} (the vocabulary size)")
