"""Traces from a Hugging Face draft/target pair of causal language models.

``evolve data trace --backend hf --target PATH_OR_ID --draft PATH_OR_ID``: any
pair that ``transformers.AutoModelForCausalLM.from_pretrained`` loads (a local
directory, or a hub id the user's machine can fetch or has cached) and that
shares one vocabulary. The decoder (``evolve.data.sources.hf.decode``) runs
real speculative decoding with the standard rule and records every drafted
position in trace schema v3 (v2 and the slot features), exactly the fields the
n-gram pair writes, so every objective, ``evolve tradeoff`` and
``evolve run --objective speed|pareto`` read these files unchanged.

Prompts come from ``--prompts FILE`` (JSON lines with a ``text`` field and an
optional ``split``; lines without one are divided 2 : 1 : 1 by a seeded
permutation), from ``--corpus DIR`` (every file under DIR; files divided into
prompt pools as the n-gram pair divides its corpus, windows of ``prompt_len``
tokens drawn uniformly from a split's pool), or by default from the n-gram
pair's corpus and held-out pools (the files ``neural_pair`` models never saw).

Determinism: every prompt owns a child of ``SeedSequence(seed)`` and draws all
its uniforms up front (draft samples, acceptance, resample), sampling is
inverse-CDF on float64 probabilities (on the models' device,
``evolve.data.sources.hf.device``), so on one device, dtype and batch size the
files are byte-identical for the same configuration.

torch and transformers are imported inside functions: the core install does not
need them (``pip install '.[hf]'``). Nothing read from disk is executed: the
models load through ``evolve.data.sources.hf.models`` (safetensors only, no code
from the model directory).

Everything that can be checked before the models load is: the configuration
(the n-gram source's bounds on prompts and rows, and the size of a split), the
prompts (read with ``evolve.io.jsonio``'s limits) and the weight files. Every
failure, out of memory on the device included, is ``HFTraceError``, one line.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, fields, replace

from evolve.data import traces as T
from evolve.data import vocab_class as VC
from evolve.data.sources import ngram
from evolve.data.tokens import MAX_SPLIT_BYTES

from evolve.data.sources.hf.models import (INSTALL_HINT, HFPair, HFTraceError,  # noqa: F401
                                          absolute,
                                          DEVICES, DTYPES, load_pair,
                                          out_of_memory, require_libs)
from evolve.errors import first_line
from evolve.data.sources.hf import prompts as HP
from evolve.data.sources.hf import decode as hf_decode

SPLITS = T.SPLITS
MAX_WIDTH = 1 << 20      # top_k and context_len: what a trace file may declare
ROW_BYTES = 160          # the per-row columns of a split, an upper estimate


# ------------------------------------------------------------------ config

@dataclass(frozen=True)
class HFTraceConfig(ngram.ConfigFields):
    """Everything an hf trace build depends on (stored in each file's meta.json)."""
    target: str
    draft: str
    seed: int = 0
    block_size: int = 4
    top_k: int = 16
    temperature: float = 1.0
    blocks_per_prompt: int = 16
    prompt_len: int = 64            # tokens per corpus prompt
    train_prompts: int = 512        # corpus prompts per split (a prompts file sets its own)
    valid_prompts: int = 256
    test_prompts: int = 256
    context_len: int = 0            # tokens before each drafted position stored (0: none)
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16
    prompts_file: str | None = None
    corpus_dir: str | None = None
    max_files: int | None = None
    max_bytes_per_file: int | None = None

    def validate(self) -> None:
        """Types and ranges, the n-gram source's bounds on prompts and rows included,
        and the memory of a split; everything that can be checked before a model loads."""
        def need(cond, name, what):
            if not cond:
                raise ngram.TraceConfigError(name, f"{getattr(self, name)!r:.60} is invalid; "
                                             f"{what}")
        for f in fields(self):          # a config read back from a file may hold anything
            v = getattr(self, f.name)
            if f.name == "temperature":
                need(isinstance(v, (int, float)) and not isinstance(v, bool)
                     and math.isfinite(v), f.name, "expected a finite number")
            elif f.name in ("target", "draft", "device", "dtype"):
                need(isinstance(v, str) and v != "", f.name, "expected a non-empty string")
            elif f.name in ("prompts_file", "corpus_dir"):
                need(v is None or (isinstance(v, str) and v != ""), f.name,
                     "expected a path or none")
            else:
                need((v is None and f.name.startswith("max_"))
                     or (isinstance(v, int) and not isinstance(v, bool)), f.name,
                     "expected a whole number")
        need(0 <= self.seed < 2 ** 63, "seed", "expected an integer >= 0")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(1 <= self.top_k <= MAX_WIDTH, "top_k", f"expected 1..{MAX_WIDTH:,}")
        need(1 <= self.blocks_per_prompt <= ngram.MAX_BLOCKS_PER_PROMPT, "blocks_per_prompt",
             f"expected >= 1 (and <= {ngram.MAX_BLOCKS_PER_PROMPT:,})")
        need(1 <= self.prompt_len <= ngram.MAX_PROMPT_LEN, "prompt_len",
             f"expected >= 1 (and <= {ngram.MAX_PROMPT_LEN:,})")
        need(0 <= self.context_len <= MAX_WIDTH, "context_len",
             f"expected 0..{MAX_WIDTH:,}")
        need(self.device in DEVICES, "device", "expected one of " + ", ".join(DEVICES))
        need(self.dtype in DTYPES, "dtype", "expected one of " + ", ".join(DTYPES))
        need(1 <= self.batch_size <= ngram.MAX_PROMPTS, "batch_size",
             f"expected >= 1 (and <= {ngram.MAX_PROMPTS:,})")
        for name in ("max_files", "max_bytes_per_file"):
            need(getattr(self, name) is None or getattr(self, name) >= 1, name,
                 "expected >= 1 or none")
        if self.prompts_file is not None and self.corpus_dir is not None:
            raise ngram.TraceConfigError("prompts", f"{self.prompts_file!r} is invalid; give "
                                         "--prompts or --corpus, not both")
        for s in SPLITS:
            need(1 <= self.prompts(s) <= ngram.MAX_PROMPTS, f"{s}_prompts",
                 f"expected >= 1 (and <= {ngram.MAX_PROMPTS:,})")
            if self.prompts_file is None:   # a prompts file sets its own counts (check_counts)
                self.check_counts(s, self.prompts(s), f"{s}_prompts")

    def check_counts(self, split: str, prompts: int, field: str | None = None) -> None:
        """TraceConfigError unless ``prompts`` prompts of ``split`` make at most
        ``ngram.MAX_SPLIT_ROWS`` rows and a split file that can be read back
        (``split_bytes``). It names ``field`` (default: the prompts file)."""
        field = field or "prompts"
        value = self.prompts_file if field == "prompts" else getattr(self, field)
        rows = prompts * self.blocks_per_prompt * self.block_size
        if rows > ngram.MAX_SPLIT_ROWS:
            raise ngram.TraceConfigError(field, f"{value!r} is invalid; expected prompts x "
                                         "blocks per prompt x block size <= "
                                         f"{ngram.MAX_SPLIT_ROWS:,} rows per split ({split}: "
                                         f"{prompts:,} prompts, {rows:,} rows)")
        size = split_bytes(rows, self.top_k, self.context_len)
        if size > MAX_SPLIT_BYTES:
            field = "context_len" if 4 * self.context_len > 24 * self.top_k else "top_k"
            raise ngram.TraceConfigError(field, f"{getattr(self, field)!r} is invalid; the "
                                         f"{split} split's {rows:,} rows would take about "
                                         f"{size / 2 ** 30:,.1f} GiB, more than a split file "
                                         f"holds ({MAX_SPLIT_BYTES / 2 ** 30:g} GiB)")


def split_bytes(rows: int, top_k: int, context_len: int) -> int:
    """An upper estimate of a split's size: per-row fields, k candidates (token id,
    two probabilities) and C context ids per row."""
    return rows * (ROW_BYTES + 24 * top_k + 4 * context_len)


# ------------------------------------------------------------------ builds

def meta(pair: HFPair, split: str, rows: int, prompt_source: dict) -> dict:
    cfg = pair.config
    return {"format_version": T.RANK_VERSION, "rows": rows, "name": split,
            "backend": "hf", "block_size": cfg.block_size, "top_k": cfg.top_k,
            "context_len": cfg.context_len, "vocab_size": pair.vocab,
            "config": cfg.to_dict(),
            "sampling": {"temperature": cfg.temperature, "top_k": None, "top_p": None,
                         "applied_to": "draft and target", "rule": "standard rejection"},
            "models": pair.info, "prompts": prompt_source,
            VC.META_KEY: VC.to_text(VC.of_pair(pair))}


def read_prompts(cfg: HFTraceConfig):
    """(texts, corpus, source) of a configuration, read and bounded before any model
    loads: a prompts file's counts per split are held to the same bounds as
    configured counts (``HFTraceConfig.check_counts``)."""
    texts = corpus = None
    if cfg.prompts_file is not None:
        texts = HP.read_prompts_file(cfg.prompts_file, cfg.seed)
        for s in SPLITS:
            if len(texts[s]) > ngram.MAX_PROMPTS:
                raise ngram.TraceConfigError("prompts", f"{cfg.prompts_file!r} is invalid; its "
                                             f"{s} split has {len(texts[s]):,} prompts, at "
                                             f"most {ngram.MAX_PROMPTS:,} are allowed")
            cfg.check_counts(s, len(texts[s]))
        source = {"kind": "file", "path": cfg.prompts_file,
                  "counts": {s: len(texts[s]) for s in SPLITS}}
    else:
        corpus = HP.load_corpus(cfg)
        source = {"kind": "corpus", "dir": cfg.corpus_dir or "python stdlib (n-gram corpus)",
                  "files": len(corpus), "crc32": corpus.fingerprint()}
    return texts, corpus, source


def build_splits(cfg: HFTraceConfig, progress=None, meter=None) -> dict:
    """Load the pair and record train/valid/test traces (not written; see the CLI).
    The configuration and the prompts are checked before the models load.
    ``progress(text)`` gets a line per split; ``meter(label, total, unit)``, if given,
    a context manager with ``advance(n)`` (``evolve.cli.render``), counts the drafted
    tokens of each split as they are recorded."""
    cfg.validate()
    cfg = replace(cfg, target=absolute(cfg.target, local_only=True),  # found from anywhere
                  draft=absolute(cfg.draft, local_only=True),
                  prompts_file=absolute(cfg.prompts_file),
                  corpus_dir=absolute(cfg.corpus_dir))
    texts, corpus, source = read_prompts(cfg)
    t0 = time.perf_counter()
    pair = load_pair(cfg)
    if cfg.top_k > pair.vocab:
        raise ngram.TraceConfigError("top_k", f"{cfg.top_k!r} is invalid; expected 1.."
                                     f"{pair.vocab} (the vocabulary)")
    prompts = {s: HP.split_prompts(pair, s, texts, corpus) for s in SPLITS}
    for s in SPLITS:
        hf_decode.check_lengths(pair, prompts[s][0], cfg.blocks_per_prompt)
    if progress:
        progress(f"loaded {cfg.target} ({pair.info['target']['parameters']:,} parameters) and "
                 f"{cfg.draft} ({pair.info['draft']['parameters']:,}) on {pair.device} in "
                 f"{time.perf_counter() - t0:.1f} s; recording (seed {cfg.seed}, g = "
                 f"{cfg.block_size}, k = {cfg.top_k}, temperature {cfg.temperature:g}) ...")
    out = {}
    for s in SPLITS:
        t1 = time.perf_counter()        # each split's own time and rate, not the run's so far
        ids, rngs = prompts[s]
        total = len(ids) * cfg.blocks_per_prompt * cfg.block_size
        try:
            with (meter(f"{s}", total, "drafted tokens") if meter
                  else contextlib.nullcontext()) as m:
                cols, _ = hf_decode.decode(pair, ids, rngs, cfg.blocks_per_prompt,
                                           progress=m.advance if m else None)
        except Exception as e:
            torch, _ = require_libs()
            if not out_of_memory(torch, e):
                raise
            raise HFTraceError(f"--batch-size {cfg.batch_size}: out of memory on "
                               f"{pair.device} recording the {s} split ({first_line(e, 300)}); "
                               "use a smaller --batch-size") from None
        ts = T.TraceSplit(cols, meta(pair, s, len(cols["draft_prob"]), source), name=s)
        T.validate(ts, f"<{s} traces>")
        out[s] = ts
        if progress:
            dt = time.perf_counter() - t1
            progress(f"{s}: {len(ts)} rows ({dt:.1f} s recording, {len(ts) / dt:.0f} drafted "
                     "tokens/s)")
    return out


def config_of(ts: T.TraceSplit) -> HFTraceConfig:
    return HFTraceConfig.from_dict(ts.meta["config"])
