"""Speculative-decoding traces from a real draft/target pair (trace schema v2).

The pair (``evolve.lm``): a byte-level 5-gram target and a weaker 3-gram draft
trained on part of the target's training text, both interpolated Kneser-Ney,
trained on the standard library's top-level ``*.py`` files. Files are split by a
seeded permutation: most train the models; the held-out rest is divided into
three disjoint prompt pools, one per split (train / valid / test).

Decoding (one block, block size ``g``, exactly as real speculative decoding):
the draft samples ``x_1 .. x_g`` autoregressively from ``q``; the target scores
the ``g + 1`` contexts; position ``j`` is accepted iff
``rand_value_j < min(1, p_j(x_j) / q_j(x_j))`` (the standard rule, so
``baseline_accepts`` keeps its v1 meaning); the longest accepted prefix is kept,
then one more byte is drawn from ``norm(max(0, p - q))`` at the first rejection,
or from ``p_{g+1}`` (the bonus byte) when all ``g`` were accepted. Each prompt
runs ``blocks_per_prompt`` blocks. Every drafted position is recorded, also
those after the first rejection (they were drafted; another rule might have
reached them), so a split has ``g`` rows per block, blocks contiguous.

How the recorded trajectory is used offline (see ``evolve.spec``): within a
block the contexts depend only on the drafted bytes, which are sampled from
``q`` whatever the acceptance rule, so for ANY rule ``a`` the block's expected
number of accepted drafts is estimated without bias by

    sum_k (prod_{j<k} a_j(x_j)) * alpha_k,   alpha_k = sum_x q_k(x) a_k(x),

with ``x_j`` the recorded drafts (Rao-Blackwellised over ``x_k``). The start
context of each block comes from the standard rule's own trajectory, so offline
numbers for another rule are conditional on those block starts.

Determinism: every prompt owns a child of ``SeedSequence(seed)`` and draws all
its uniforms up front, so traces depend only on the configuration (not on the
batch size used to decode prompts in lockstep), and the files are byte-identical
for the same configuration, Python version (the corpus) and numpy version.

File format: an uncompressed .npz with fixed zip timestamps. The eight v1 fields
are ``<field>.npy`` members, exactly as ``evolve.data.save_npz`` writes them;
the v2 fields are NumPy ``.npy`` payloads stored under ``v2/<field>`` (no
``.npy`` suffix), and ``meta.json`` holds ``format_version: 2`` and the
generation settings. A v1 reader therefore loads a v2 file as a plain v1 split
(``evolve.data.load_npz`` / ``evolve benchmark --data DIR``).
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from evolve import data as D
from evolve import lm as LM
from evolve.data import DataError

FORMAT_VERSION = 2
SPLITS = D.SPLITS
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "datasets" / "traces"
V2_PREFIX = "v2/"
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
    "cand_token": ("cand", np.dtype(np.uint8)),       # top-k bytes by q, q descending
    "cand_draft_prob": ("cand", np.dtype(np.float64)),
    "cand_target_prob": ("cand", np.dtype(np.float64)),
    "context": ("ctx", np.dtype(np.uint8)),           # the C bytes before the drafted byte
}
ALL_FIELDS = tuple(D.FIELDS) + tuple(V2_FIELDS)


# ------------------------------------------------------------------ config

@dataclass(frozen=True)
class TraceConfig:
    """Everything a trace build depends on (stored in each file's meta.json)."""
    seed: int = 0
    target_order: int = 5
    draft_order: int = 3
    draft_fraction: float = 0.25     # share of the LM training files the draft sees
    temperature: float = 1.0         # applied to both models
    block_size: int = 4              # g
    top_k: int = 16                  # draft candidates stored per drafted position
    prompt_len: int = 64
    blocks_per_prompt: int = 16
    train_prompts: int = 512
    valid_prompts: int = 256
    test_prompts: int = 256
    heldout_fraction: float = 0.2    # files held out from LM training (prompt pools)
    max_files: int | None = None     # corpus slice (tests); None: every file
    max_bytes_per_file: int | None = None

    def validate(self) -> None:
        def need(cond, name, what):
            if not cond:
                raise ValueError(f"trace config: {name}={getattr(self, name)!r} is invalid; {what}")
        need(isinstance(self.seed, int) and self.seed >= 0, "seed", "expected an integer >= 0")
        need(2 <= self.target_order <= LM.MAX_ORDER, "target_order", f"expected 2..{LM.MAX_ORDER}")
        need(1 <= self.draft_order <= LM.MAX_ORDER, "draft_order", f"expected 1..{LM.MAX_ORDER}")
        need(0.0 < self.draft_fraction <= 1.0, "draft_fraction", "expected a fraction in (0, 1]")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(1 <= self.top_k <= LM.VOCAB, "top_k", f"expected 1..{LM.VOCAB}")
        need(self.prompt_len >= max(self.target_order, self.draft_order) - 1, "prompt_len",
             "expected at least the longest model history")
        need(self.blocks_per_prompt >= 1, "blocks_per_prompt", "expected >= 1")
        for s in SPLITS:
            need(getattr(self, f"{s}_prompts") >= 1, f"{s}_prompts", "expected >= 1")
        need(0.0 < self.heldout_fraction < 1.0, "heldout_fraction", "expected a fraction in (0, 1)")

    @property
    def context_len(self) -> int:
        return max(self.target_order, self.draft_order) - 1

    def prompts(self, split: str) -> int:
        return int(getattr(self, f"{split}_prompts"))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TraceConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"trace config: unknown key {unknown[0]!r}")
        cfg = cls(**d)
        cfg.validate()
        return cfg


# ------------------------------------------------------------------- pair

@dataclass
class LMPair:
    target: LM.NGramLM
    draft: LM.NGramLM
    corpus: LM.Corpus
    lm_files: np.ndarray                   # indices into corpus of the target's training files
    draft_files: np.ndarray                # subset of lm_files the draft was trained on
    pools: dict                            # split -> indices of its prompt files
    config: TraceConfig

    @property
    def context_len(self) -> int:
        return self.config.context_len

    def describe(self) -> dict:
        c = self.corpus
        return {
            "python_version": LM.python_version(),
            "corpus": "top-level *.py files of sysconfig.get_paths()['stdlib'], sorted by name",
            "corpus_files": len(c), "corpus_bytes": c.total_bytes,
            "corpus_crc32": c.fingerprint(),
            "target": self.target.describe(), "draft": self.draft.describe(),
            "lm_files": len(self.lm_files), "draft_files": len(self.draft_files),
            "prompt_files": {s: [c.names[i] for i in self.pools[s]] for s in SPLITS},
        }


def _seeds(seed: int):
    """Independent streams: file split, draft subset, one per split's prompts."""
    ss = np.random.SeedSequence(seed)
    files, draft, *per_split = ss.spawn(2 + len(SPLITS))
    return files, draft, dict(zip(SPLITS, per_split))


def build_pair(config: TraceConfig, corpus: LM.Corpus | None = None) -> LMPair:
    """Train the target and the draft (deterministic; well under a second at full size)."""
    config.validate()
    if corpus is None:
        corpus = LM.Corpus.load(max_files=config.max_files,
                                max_bytes_per_file=config.max_bytes_per_file)
    n = len(corpus)
    if n < 4:
        raise ValueError(f"the corpus has {n} files; at least 4 are needed")
    s_files, s_draft, _ = _seeds(config.seed)
    perm = np.random.default_rng(s_files).permutation(n)
    n_held = min(n - 1, max(3, int(round(config.heldout_fraction * n))))
    held, lm_files = perm[:n_held], np.sort(perm[n_held:])
    # prompt pools: held-out files in proportion 2 : 1 : 1 (each at least one file)
    n_valid = max(1, n_held // 4)
    n_test = max(1, n_held // 4)
    pools = {"train": np.sort(held[:n_held - n_valid - n_test]),
             "valid": np.sort(held[n_held - n_valid - n_test:n_held - n_test]),
             "test": np.sort(held[n_held - n_test:])}
    k = max(1, int(round(config.draft_fraction * lm_files.size)))
    draft_files = np.sort(np.random.default_rng(s_draft).permutation(lm_files)[:k])
    target = LM.NGramLM.train([corpus.docs[i] for i in lm_files], config.target_order,
                              config.temperature)
    draft = LM.NGramLM.train([corpus.docs[i] for i in draft_files], config.draft_order,
                             config.temperature)
    return LMPair(target, draft, corpus, lm_files, draft_files, pools, config)


def prompt_starts(pair: LMPair, split: str, n: int | None = None):
    """(prompt bytes (n, prompt_len) uint8, per-prompt SeedSequences) for a split.

    Each prompt draws its start uniformly over all positions of its pool's files
    that leave ``prompt_len`` bytes; its generator then draws the decode uniforms.
    """
    cfg = pair.config
    n = cfg.prompts(split) if n is None else n
    _, _, per_split = _seeds(cfg.seed)
    children = per_split[split].spawn(n)
    docs = [pair.corpus.docs[i] for i in pair.pools[split]]
    room = np.array([max(0, len(d) - cfg.prompt_len + 1) for d in docs], dtype=np.int64)
    if room.sum() == 0:
        raise ValueError(f"the {split} prompt files are shorter than prompt_len={cfg.prompt_len}")
    cum = np.cumsum(room)
    prompts = np.empty((n, cfg.prompt_len), dtype=np.uint8)
    rngs = []
    for i, ch in enumerate(children):
        rng = np.random.default_rng(ch)
        u = int(rng.integers(0, cum[-1]))
        f = int(np.searchsorted(cum, u, side="right"))
        off = u - (int(cum[f - 1]) if f else 0)
        prompts[i] = np.frombuffer(docs[f], dtype=np.uint8)[off:off + cfg.prompt_len]
        rngs.append(rng)
    return prompts, rngs


# --------------------------------------------------------------- sampling

def sample_rows(P: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw of one index per row of a non-negative matrix (need not sum to 1)."""
    cdf = np.cumsum(P, axis=1)
    x = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)
    last = P.shape[1] - 1 - np.argmax(P[:, ::-1] > 0, axis=1)
    return np.minimum(x, last)


RESIDUAL_EPS = 1e-12


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Unnormalised residual max(0, p - q); rows of mass < RESIDUAL_EPS fall back to p.

    (Those rows have p == q up to rounding; any rejection there resamples from p.)
    """
    r = np.maximum(p - q, 0.0)
    small = r.sum(axis=1) < RESIDUAL_EPS
    if small.any():
        r[small] = p[small]
    return r


def candidate_summary(p: np.ndarray, q: np.ndarray, k: int) -> dict:
    """Top-k candidates of q (stable: lower byte first on ties) and the tail masses."""
    B, V = q.shape
    order = np.argsort(-q, axis=1, kind="stable")[:, :k]
    in_top = np.zeros((B, V), dtype=bool)
    np.put_along_axis(in_top, order, True, axis=1)
    tail = ~in_top
    plus = tail & (p > q)
    return {
        "cand_token": order.astype(np.uint8),
        "cand_draft_prob": np.take_along_axis(q, order, axis=1),
        "cand_target_prob": np.take_along_axis(p, order, axis=1),
        "tail_draft_prob": np.where(tail, q, 0.0).sum(axis=1),
        "tail_target_prob": np.where(tail, p, 0.0).sum(axis=1),
        "tail_excess_draft_prob": np.where(plus, q, 0.0).sum(axis=1),
        "tail_excess_target_prob": np.where(plus, p, 0.0).sum(axis=1),
    }


# --------------------------------------------------------------- decoding

def decode(pair: LMPair, prompts: np.ndarray, rngs, blocks: int, batch: int = 256,
           rule=None, record: bool = True, pos0=None):
    """Speculative decoding of every prompt for ``blocks`` blocks.

    ``rule=None`` is the standard rule (the trace generator); otherwise ``rule``
    has a ``many(features) -> thresholds`` method (``evolve.simulate.as_rule``) and
    is applied to drafts among the draft's top-k bytes, the standard rule to the
    others. ``pos0`` (per prompt) offsets the ``position`` feature.

    Returns ``(columns, accepted)``: the v1 + v2 columns of every drafted
    position (rows ordered by sequence, block, position; None unless ``record``)
    and the accepted draft count of every block, int64 (n, blocks).
    """
    cfg = pair.config
    g, k, C = cfg.block_size, cfg.top_k, cfg.context_len
    n = prompts.shape[0]
    if prompts.shape[1] < C:
        raise ValueError(f"prompts have {prompts.shape[1]} bytes, the models need {C}")
    # All uniforms of a prompt are drawn up front: draft (blocks, g), accept (blocks, g),
    # resample/bonus (blocks,), so results do not depend on ``batch``.
    U = (np.stack([r.random((blocks, 2 * g + 1)) for r in rngs]) if n
         else np.zeros((0, blocks, 2 * g + 1)))
    pos0 = np.zeros(n, dtype=np.int64) if pos0 is None else np.asarray(pos0, dtype=np.int64)
    parts, accepted = [], []
    for s0 in range(0, n, batch):
        cols, n_acc = _decode_batch(pair, prompts[s0:s0 + batch], U[s0:s0 + batch], blocks,
                                    g, k, C, s0, rule, record, pos0[s0:s0 + batch])
        parts.append(cols)
        accepted.append(n_acc)
    cols = ({f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
            if record and parts else None)
    acc = np.concatenate(accepted) if accepted else np.zeros((0, blocks), dtype=np.int64)
    return cols, acc


def _decode_batch(pair, prompts, U, blocks, g, k, C, seq0, rule, record, pos0):
    B = prompts.shape[0]
    L0 = prompts.shape[1]
    hist = np.zeros((B, L0 + blocks * (g + 1)), dtype=np.uint8)
    hist[:, :L0] = prompts
    lens = np.full(B, L0, dtype=np.int64)
    rows = np.arange(B)
    rec: dict[str, list] = {}
    accepted = np.zeros((B, blocks), dtype=np.int64)

    def put(name, arr):
        rec.setdefault(name, []).append(arr)

    for t in range(blocks):
        gen_before = lens - L0 + pos0
        ext = np.zeros((B, C + g), dtype=np.uint8)
        ext[:, :C] = hist[rows[:, None], lens[:, None] - C + np.arange(C)[None, :]]
        Q = np.empty((B, g, LM.VOCAB))
        for j in range(g):
            Q[:, j] = pair.draft.probs(ext[:, j:j + C])
            ext[:, C + j] = sample_rows(Q[:, j], U[:, t, j])
        ctxs = np.stack([ext[:, j:j + C] for j in range(g + 1)], axis=1)      # (B, g+1, C)
        P = pair.target.probs(ctxs.reshape(B * (g + 1), C)).reshape(B, g + 1, LM.VOCAB)
        X = ext[:, C:].astype(np.int64)                                       # (B, g)
        qx = np.take_along_axis(Q, X[:, :, None], axis=2)[:, :, 0]
        px = np.take_along_axis(P[:, :g], X[:, :, None], axis=2)[:, :, 0]
        rand = U[:, t, g:2 * g]
        Pg = P[:, :g].reshape(B * g, LM.VOCAB)
        Qg = Q.reshape(B * g, LM.VOCAB)
        x = X.reshape(-1)
        top = np.argmax(Pg, axis=1)
        std = np.minimum(1.0, px / qx)
        need_cands = record or rule is not None
        if need_cands:
            cs = candidate_summary(Pg, Qg, k)
            hit = cs["cand_token"].astype(np.int64) == x[:, None]
            in_top = hit.any(axis=1)
        if rule is None:
            a_x = std
        else:
            feats = {"draft_prob": qx.reshape(-1), "target_prob": px.reshape(-1),
                     "position": (gen_before[:, None] + np.arange(g)[None, :]).reshape(-1),
                     "draft_entropy": LM.entropy(Qg), "target_entropy": LM.entropy(Pg),
                     "top_token_match": x == top,
                     "block_position": np.tile(np.arange(g), B),
                     "p_max": Pg.max(axis=1), "q_max": Qg.max(axis=1)}
            h = np.asarray(rule.many(feats), dtype=np.float64)
            a = np.where(h > 0.0, np.where(h > 1.0, 1.0, h), 0.0)
            a_x = np.where(in_top, a, std.reshape(-1)).reshape(B, g)
        acc = rand < a_x
        n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
        accepted[:, t] = n_acc
        # the byte after the accepted prefix: residual at the first rejection, else bonus
        Pn = P[rows, n_acc]
        Qn = np.where((n_acc < g)[:, None], Q[rows, np.minimum(n_acc, g - 1)], 0.0)
        new = sample_rows(np.where((n_acc < g)[:, None], residual(Pn, Qn), Pn), U[:, t, 2 * g])
        out = np.concatenate([X, new[:, None]], axis=1)
        out[rows, n_acc] = new
        for j in range(g + 1):
            m = j <= n_acc
            hist[m, lens[m] + j] = out[m, j]
        lens = lens + n_acc + 1
        if not record:
            continue
        # records for the g drafted positions
        put("draft_prob", qx.reshape(-1))
        put("target_prob", px.reshape(-1))
        put("position", (gen_before[:, None] + np.arange(g)[None, :]).reshape(-1))
        put("draft_entropy", LM.entropy(Qg))
        put("target_entropy", LM.entropy(Pg))
        put("top_token_match", x == top)
        put("rand_value", rand.reshape(-1))
        put("baseline_accepts", acc.reshape(-1))
        put("sequence", np.repeat(seq0 + rows, g))
        put("block_index", np.full(B * g, t, dtype=np.int64))
        put("block_position", np.tile(np.arange(g), B))
        put("token", x)
        put("draft_cand", np.where(in_top, np.argmax(hit, axis=1), -1))
        put("target_top", top)
        put("p_max", Pg.max(axis=1))
        put("q_max", Qg.max(axis=1))
        for f, v in cs.items():
            put(f, v)
        put("context", ctxs[:, :g].reshape(B * g, C))
    if not record:
        return None, accepted
    # (blocks, B*g, ...) -> sequence-major rows
    out_cols = {}
    for f, parts in rec.items():
        a = np.stack(parts)                       # (blocks, B*g, ...)
        a = a.reshape((blocks, B, g) + a.shape[2:]).swapaxes(0, 1)
        out_cols[f] = np.ascontiguousarray(a.reshape((blocks * B * g,) + a.shape[3:]))
    for f in ("position", "sequence", "block_index", "block_position", "token", "draft_cand",
              "target_top"):
        out_cols[f] = out_cols[f].astype(np.int64)
    return out_cols, accepted


# ------------------------------------------------------------------ split

@dataclass(frozen=True)
class TraceSplit:
    """One v2 split: per-row columns (v1 + v2), (N, k) candidates, (N, C) contexts."""
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

    def dataset(self) -> D.Dataset:
        """The v1 view: one record per drafted position, the eight original fields."""
        return D.from_columns({f: self.columns[f] for f in D.FIELDS},
                              source=self.meta.get("source", "<traces>"), name=self.name)

    def config(self) -> TraceConfig:
        return TraceConfig.from_dict(self.meta["config"])


def _meta(cfg: TraceConfig, split: str, rows: int, pair: LMPair | None) -> dict:
    m = {"format_version": FORMAT_VERSION, "rows": rows, "name": split,
         "block_size": cfg.block_size, "top_k": cfg.top_k, "context_len": cfg.context_len,
         "config": cfg.to_dict()}
    if pair is not None:
        m["models"] = pair.describe()
    return m


def build_split(pair: LMPair, split: str, n_prompts: int | None = None,
                blocks: int | None = None, batch: int = 256) -> TraceSplit:
    cfg = pair.config
    blocks = cfg.blocks_per_prompt if blocks is None else blocks
    prompts, rngs = prompt_starts(pair, split, n_prompts)
    cols, _ = decode(pair, prompts, rngs, blocks, batch=batch)
    ts = TraceSplit(cols, _meta(cfg, split, len(cols["draft_prob"]), pair), name=split)
    validate(ts, f"<{split} traces>")
    return ts


def build_splits(config: TraceConfig | None = None, out_dir: str | os.PathLike | None = None,
                 progress=None) -> dict:
    """Build train/valid/test traces (and write them to ``out_dir`` if given)."""
    config = config or TraceConfig()
    t0 = time.perf_counter()
    pair = build_pair(config)
    out = {}
    for s in SPLITS:
        out[s] = build_split(pair, s)
        if progress:
            progress(f"{s}: {len(out[s])} rows ({time.perf_counter() - t0:.1f} s)")
        if out_dir is not None:
            save(out[s], Path(out_dir) / f"{s}.npz")
    return out


# ---------------------------------------------------------------- storage

def save(ts: TraceSplit, path: str | os.PathLike) -> None:
    """Write a v2 split atomically as a deterministic, uncompressed .npz."""
    meta = {k: v for k, v in ts.meta.items() if k != "source"}
    D.write_npz(path, meta, {member: ts.columns[f] for f, member in _members().items()})


def _members() -> dict:
    """Field -> zip member: v1 fields as <field>.npy (so v1 loaders read the file),
    the v2 ones under v2/."""
    return {f: (f + ".npy" if f in D.FIELDS else V2_PREFIX + f) for f in ALL_FIELDS}


def load(path: str | os.PathLike, name: str = "") -> TraceSplit:
    """Load and validate a v2 split; a v1 file raises DataError saying so."""
    path = Path(path)
    src = str(path)
    if not path.exists():
        raise DataError(f"{src}: file not found")
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if "meta.json" not in names:
                raise DataError(f"{src}: meta.json is missing (not a trace file)")
            meta = json.loads(zf.read("meta.json").decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
                v = meta.get("format_version") if isinstance(meta, dict) else None
                raise DataError(f"{src}: format_version is {v!r}, a trace file has "
                                f"{FORMAT_VERSION} (v1 splits load with evolve.data)")
            cols = D.read_members(zf, src, _members())
            known = {f + ".npy" for f in D.FIELDS} | {V2_PREFIX + f for f in V2_FIELDS}
            extra = sorted(n for n in names if n not in known and n != "meta.json")
            if extra:
                raise DataError(f"{src}: member '{extra[0]}' is not part of schema v2")
    except DataError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{src}: not a readable trace file ({D._short(e)})") from None
    meta["source"] = src
    ts = TraceSplit(cols, meta, name=name or path.stem)
    validate(ts, src)
    return ts


def load_splits(directory: str | os.PathLike = DEFAULT_DIR, splits=SPLITS) -> dict:
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: trace directory not found")
    return {s: load(directory / f"{s}.npz", name=s) for s in splits}


def is_trace_file(path: str | os.PathLike) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("meta.json").decode("utf-8"))
        return isinstance(meta, dict) and meta.get("format_version") == FORMAT_VERSION
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False


# ------------------------------------------------------------- validation

def _bad(src, field, mask, arr, what):
    i = int(np.flatnonzero(mask)[0])
    v = arr[i]
    v = v.tolist() if hasattr(v, "tolist") else v
    raise DataError(f"{src}: field '{field}' row {i}: {what} (value {v!r}; "
                    f"{int(mask.sum())} bad rows in all)")


def validate(ts: TraceSplit, src: str) -> None:
    """Check every schema-v2 invariant; raise DataError naming file, field and row."""
    cols = ts.columns
    meta = ts.meta
    for f in ALL_FIELDS:
        if f not in cols:
            raise DataError(f"{src}: field '{f}' is missing")
    ds = D.from_columns({f: cols[f] for f in D.FIELDS}, source=src, name=ts.name)
    n = len(ds)
    try:
        g = int(meta["block_size"])
        k = int(meta["top_k"])
        C = int(meta["context_len"])
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{src}: meta.json lacks block_size, top_k or context_len") from None
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
        elif a.dtype != dtype:
            raise DataError(f"{src}: field '{f}' must be {dtype}, got {a.dtype}")
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
    for f in ("token", "target_top"):
        bad = (c[f] < 0) | (c[f] >= LM.VOCAB)
        if bad.any():
            _bad(src, f, bad, c[f], "not a byte value")
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
        bad = (np.diff(st.astype(np.int16), axis=1) == 0).any(axis=1)
        if bad.any():
            _bad(src, "cand_token", bad, c["cand_token"], "a byte appears twice")
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


# ------------------------------------------------------------------ script

def main(argv=None) -> int:
    """``python -m evolve.traces [--out DIR] [--seed N] [--check]``: build the default splits."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m evolve.traces", description=main.__doc__)
    ap.add_argument("--out", default=str(DEFAULT_DIR), help="output directory")
    ap.add_argument("--seed", type=int, default=TraceConfig.seed)
    ap.add_argument("--block-size", type=int, default=TraceConfig.block_size)
    ap.add_argument("--top-k", type=int, default=TraceConfig.top_k)
    ap.add_argument("--temperature", type=float, default=TraceConfig.temperature)
    args = ap.parse_args(argv)
    cfg = TraceConfig(seed=args.seed, block_size=args.block_size, top_k=args.top_k,
                      temperature=args.temperature)
    t0 = time.perf_counter()
    out = build_splits(cfg, args.out, progress=print)
    for s, ts in out.items():
        path = Path(args.out) / f"{s}.npz"
        print(f"{path}: {len(ts)} rows, {path.stat().st_size / 1e6:.1f} MB")
    print(f"built in {time.perf_counter() - t0:.1f} s (Python {LM.python_version()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
