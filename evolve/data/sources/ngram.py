"""The n-gram draft/target pair and the traces it records.

The pair (``evolve.data.sources.ngram_lm``): a byte-level 5-gram target and a
weaker 3-gram draft trained on part of the target's training text, both
interpolated Kneser-Ney, trained on the standard library's top-level ``*.py``
files. Files are split by a seeded permutation: most train the models; the
held-out rest is divided into three disjoint prompt pools, one per split
(train / valid / test). Each prompt runs ``blocks_per_prompt`` blocks of the
decoder (``evolve.data.decode``) with the standard rule.

How the recorded trajectory is used offline (see ``evolve.objectives.spec``):
within a block the contexts depend only on the drafted bytes, which are
sampled from ``q`` whatever the acceptance rule, so for ANY rule ``a`` the
block's expected number of accepted drafts is estimated without bias by
``sum_k (prod_{j<k} a_j(x_j)) * alpha_k``, ``alpha_k = sum_x q_k(x) a_k(x)``,
with ``x_j`` the recorded drafts. The start context of each block comes from
the standard rule's own trajectory, so offline numbers for another rule are
conditional on those block starts.

Determinism: every prompt owns a child of ``SeedSequence(seed)`` and draws all
its uniforms up front, so traces depend only on the configuration (not on the
batch size used to decode prompts in lockstep), and the files are byte-identical
for the same configuration, Python version (the corpus) and numpy version.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from evolve.data import traces as T
from evolve.data import vocab_class as VC
from evolve.data.decode import decode
from evolve.errors import EvolveError
from evolve.data.sources import ngram_lm as LM
from evolve.data import shard_writer

SPLITS = T.SPLITS

# ------------------------------------------------------------------ config

class TraceConfigError(EvolveError):
    """A trace configuration value out of range: ``field``, and ``detail`` (the value
    and what is expected)."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"trace config: {field}={detail}")
        self.field = field
        self.detail = detail


# Bounds that keep a build within memory: rows per split are prompts x blocks x g.
MAX_PROMPTS = 1_000_000
MAX_BLOCKS_PER_PROMPT = 10_000
MAX_SPLIT_ROWS = 20_000_000
MAX_PROMPT_LEN = 100_000


class ConfigFields:
    """What every trace source's configuration dataclass shares: prompts per split,
    and the round trip through meta.json (unknown keys refused, values validated)."""

    def prompts(self, split: str) -> int:
        return int(getattr(self, f"{split}_prompts"))

    def to_dict(self) -> dict:
        return asdict(self)

    def need(self, cond, name: str, what: str) -> None:
        """TraceConfigError naming the field ``name`` (its value and ``what`` is
        expected) unless ``cond``."""
        if not cond:
            raise TraceConfigError(name, f"{getattr(self, name)!r} is invalid; {what}")

    def check_types(self, floats=(), optional=(), others=()) -> None:
        """Every field a whole number, those in ``floats`` finite numbers, those in
        ``optional`` whole numbers or None (a config read back from a file may hold
        anything); those in ``others`` are the caller's to check."""
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in others:
                continue
            if f.name in floats:
                self.need(isinstance(v, (int, float)) and not isinstance(v, bool)
                          and math.isfinite(v), f.name, "expected a finite number")
            else:
                self.need((v is None and f.name in optional) or
                          (isinstance(v, int) and not isinstance(v, bool)), f.name,
                          "expected a whole number")

    @classmethod
    def from_dict(cls, d: dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"trace config: unknown key {unknown[0]!r}")
        cfg = cls(**d)
        cfg.validate()
        return cfg


@dataclass(frozen=True)
class TraceConfig(ConfigFields):
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
        need = self.need
        self.check_types(floats=("draft_fraction", "temperature", "heldout_fraction"),
                         optional=("max_files", "max_bytes_per_file"))
        need(0 <= self.seed < 2 ** 63, "seed", "expected an integer >= 0")
        need(self.prompt_len <= MAX_PROMPT_LEN, "prompt_len", f"expected <= {MAX_PROMPT_LEN}")
        for name in ("max_files", "max_bytes_per_file"):
            need(getattr(self, name) is None or getattr(self, name) >= 1, name,
                 "expected >= 1 or none")
        need(2 <= self.target_order <= LM.MAX_ORDER, "target_order", f"expected 2..{LM.MAX_ORDER}")
        need(1 <= self.draft_order <= LM.MAX_ORDER, "draft_order", f"expected 1..{LM.MAX_ORDER}")
        need(0.0 < self.draft_fraction <= 1.0, "draft_fraction", "expected a fraction in (0, 1]")
        need(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
             and self.temperature > 0, "temperature", "expected > 0 and finite")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(1 <= self.top_k <= LM.VOCAB, "top_k", f"expected 1..{LM.VOCAB}")
        need(self.prompt_len >= max(self.target_order, self.draft_order) - 1, "prompt_len",
             "expected at least the longest model history")
        need(1 <= self.blocks_per_prompt <= MAX_BLOCKS_PER_PROMPT, "blocks_per_prompt",
             f"expected >= 1 (and <= {MAX_BLOCKS_PER_PROMPT:,})")
        for s in SPLITS:
            need(1 <= getattr(self, f"{s}_prompts") <= MAX_PROMPTS, f"{s}_prompts",
                 f"expected >= 1 (and <= {MAX_PROMPTS:,})")
            need(self.prompts(s) * self.blocks_per_prompt * self.block_size <= MAX_SPLIT_ROWS,
                 f"{s}_prompts", f"expected prompts x blocks per prompt x block size "
                 f"<= {MAX_SPLIT_ROWS:,} rows per split")
        need(0.0 < self.heldout_fraction < 1.0, "heldout_fraction", "expected a fraction in (0, 1)")

    @property
    def context_len(self) -> int:
        return max(self.target_order, self.draft_order) - 1


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

    source = "ngram"              # evolve.data.sources.registry

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


def file_split(n: int, config: TraceConfig):
    """(LM training files, the draft's subset, split -> prompt pool) of a corpus of n
    files; every model trained on this corpus (also ``neural_pair``) uses it."""
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
    return lm_files, draft_files, pools


def build_pair(config: TraceConfig, corpus: LM.Corpus | None = None) -> LMPair:
    """Train the target and the draft (deterministic; well under a second at full size)."""
    config.validate()
    if corpus is None:
        corpus = LM.Corpus.load(max_files=config.max_files,
                                max_bytes_per_file=config.max_bytes_per_file)
    n = len(corpus)
    if n < 4:
        raise ValueError(f"the corpus has {n} files; at least 4 are needed")
    lm_files, draft_files, pools = file_split(n, config)
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


def _meta(cfg: TraceConfig, split: str, rows: int, pair: LMPair | None) -> dict:
    m = {"format_version": T.RANK_VERSION, "rows": rows, "name": split,
         "block_size": cfg.block_size, "top_k": cfg.top_k, "context_len": cfg.context_len,
         "config": cfg.to_dict(), VC.META_KEY: VC.to_text(VC.byte_table())}
    if pair is not None:
        m["models"] = pair.describe()
    return m


def build_split(pair: LMPair, split: str, n_prompts: int | None = None,
                blocks: int | None = None, batch: int = 256) -> T.TraceSplit:
    cfg = pair.config
    blocks = cfg.blocks_per_prompt if blocks is None else blocks
    prompts, rngs = prompt_starts(pair, split, n_prompts)
    cols, _ = decode(pair, prompts, rngs, blocks, batch=batch)
    ts = T.TraceSplit(cols, _meta(cfg, split, len(cols["draft_prob"]), pair), name=split)
    T.validate(ts, f"<{split} traces>")
    return ts


def build_splits(config: TraceConfig | None = None, out_dir: str | os.PathLike | None = None,
                 progress=None) -> dict:
    """Build train/valid/test traces (and write them to ``out_dir`` if given)."""
    config = config or TraceConfig()
    t0 = time.perf_counter()
    pair = build_pair(config)
    if progress:
        progress(f"n-gram pair built ({time.perf_counter() - t0:.1f} s)")
    out = {}
    for s in SPLITS:
        t0 = time.perf_counter()        # each split's own time, not the time so far
        out[s] = build_split(pair, s)
        if progress:
            progress(f"{s}: {len(out[s])} rows ({time.perf_counter() - t0:.1f} s)")
        if out_dir is not None:
            T.save(out[s], Path(out_dir) / f"{s}.npz")
    return out




def build_splits_sharded(config: TraceConfig, out_dir: str | os.PathLike, rows_per_shard: int,
                         chunk_prompts: int = 256, progress=None) -> dict:
    """Build train/valid/test traces straight into shards (``evolve.data.shards``),
    ``chunk_prompts`` prompts in memory at a time; the rows are those
    ``build_splits`` makes (decoding does not depend on how prompts are batched).
    Returns split -> rows."""
    t0 = time.perf_counter()
    pair = build_pair(config)
    if progress:
        progress(f"n-gram pair built ({time.perf_counter() - t0:.1f} s)")
    done = {}
    for s in SPLITS:
        t0 = time.perf_counter()        # each split's own time, not the time so far
        prompts, rngs = prompt_starts(pair, s)
        n = prompts.shape[0]
        rows = n * config.blocks_per_prompt * config.block_size
        w = shard_writer.SplitWriter(Path(out_dir) / s, _meta(config, s, rows, pair), rows_per_shard)
        try:
            for a in range(0, n, chunk_prompts):
                cols, _ = decode(pair, prompts[a:a + chunk_prompts], rngs[a:a + chunk_prompts],
                                 config.blocks_per_prompt)
                cols["sequence"] = cols["sequence"] + a
                T.validate(T.TraceSplit(cols, w.meta, name=s), f"<{s} traces>")
                w.add(cols)
            w.commit()
        except BaseException:
            w.abort()
            raise
        done[s] = rows
        if progress:
            progress(f"{s}: {rows} rows in shards ({time.perf_counter() - t0:.1f} s)")
    return done


def config_of(ts: T.TraceSplit) -> TraceConfig:
    """The configuration a split of this source was recorded with."""
    return TraceConfig.from_dict(ts.meta["config"])
