"""Traces from a Hugging Face draft/target pair of causal language models.

``evolve data trace --backend hf --target PATH_OR_ID --draft PATH_OR_ID``: any
pair that ``transformers.AutoModelForCausalLM.from_pretrained`` loads (a local
directory, or a hub id the user's machine can fetch or has cached) and that
shares one vocabulary. The decoder (``evolve.data.sources.hf_decode``) runs
real speculative decoding with the standard rule and records every drafted
position in trace schema v2, exactly the fields the n-gram pair writes, so every
objective, ``evolve tradeoff`` and ``evolve run --objective speed|pareto`` read
these files unchanged.

Prompts come from ``--prompts FILE`` (JSON lines with a ``text`` field and an
optional ``split``; lines without one are divided 2 : 1 : 1 by a seeded
permutation), from ``--corpus DIR`` (every file under DIR; files divided into
prompt pools as the n-gram pair divides its corpus, windows of ``prompt_len``
tokens drawn uniformly from a split's pool), or by default from the n-gram
pair's corpus and held-out pools (the files ``neural_pair`` models never saw).

Determinism: every prompt owns a child of ``SeedSequence(seed)`` and draws all
its uniforms up front (draft samples, acceptance, resample), sampling is
inverse-CDF on float64 probabilities in numpy, so on one device, dtype and
batch size the files are byte-identical for the same configuration.

torch and transformers are imported inside functions: the core install does not
need them (``pip install -e '.[hf]'``). Nothing read from disk is executed:
weights load from safetensors only (never a pickled checkpoint) and no model or
tokenizer code is taken from the model directory (``trust_remote_code=False``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from evolve.data import traces as T
from evolve.data.sources import ngram

SPLITS = T.SPLITS
INSTALL_HINT = "pip install -e '.[hf]'"
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float16", "bfloat16", "auto")
PROBE_TEXT = "Speculative decoding:\n    def f(x):\n        return x ** 2  # caf\u00e9 \u20ac 42"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFTraceError(ValueError):
    """A model pair that cannot be used: one line naming the option, the model and why."""


def require_libs():
    """(torch, transformers), or HFTraceError with the exact install command."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise HFTraceError(f"--backend hf needs torch and transformers ({e}); install them "
                           f"with: {INSTALL_HINT}") from None
    return torch, transformers


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
        def need(cond, name, what):
            if not cond:
                raise ngram.TraceConfigError(name, f"{getattr(self, name)!r} is invalid; {what}")
        need(isinstance(self.seed, int) and self.seed >= 0, "seed", "expected an integer >= 0")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(self.top_k >= 1, "top_k", "expected >= 1")
        need(self.blocks_per_prompt >= 1, "blocks_per_prompt", "expected >= 1")
        need(self.prompt_len >= 1, "prompt_len", "expected >= 1")
        for s in SPLITS:
            need(getattr(self, f"{s}_prompts") >= 1, f"{s}_prompts", "expected >= 1")
        need(self.context_len >= 0, "context_len", "expected >= 0")
        need(self.device in DEVICES, "device", "expected one of " + ", ".join(DEVICES))
        need(self.dtype in DTYPES, "dtype", "expected one of " + ", ".join(DTYPES))
        need(self.batch_size >= 1, "batch_size", "expected >= 1")
        if self.prompts_file is not None and self.corpus_dir is not None:
            raise ngram.TraceConfigError("prompts", f"{self.prompts_file!r} is invalid; give "
                                         "--prompts or --corpus, not both")


# ------------------------------------------------------------------ models

@dataclass
class HFPair:
    """A loaded draft/target pair sharing one vocabulary of ``vocab`` ids."""
    target: object
    draft: object
    tokenizer: object
    vocab: int
    device: str
    config: HFTraceConfig
    info: dict


def resolve_device(device: str) -> str:
    torch, _ = require_libs()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise HFTraceError("--device cuda: no CUDA GPU is available to torch "
                           "(torch.cuda.is_available() is False); use --device cpu or auto")
    return device


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def _check_source(option: str, name: str) -> None:
    """A path that does not exist is refused here (transformers would try the hub)."""
    if Path(name).expanduser().exists():
        return
    if not HUB_ID.match(name):
        raise HFTraceError(f"{option} {name}: cannot load the model (no such directory, "
                           "and not a hub id of the form owner/name)")


def load_model(option: str, name: str, device: str, dtype: str):
    torch, transformers = require_libs()
    _check_source(option, name)
    want = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "auto": torch.bfloat16 if device == "cuda" else torch.float32}[dtype]
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(Path(name).expanduser()) if Path(name).expanduser().exists() else name,
            dtype=want, use_safetensors=True, trust_remote_code=False)
    except Exception as e:        # transformers raises many kinds; all mean "cannot load"
        raise HFTraceError(f"{option} {name}: cannot load the model "
                           f"({type(e).__name__}: {_first_line(e)})") from None
    return model.to(device).eval()


def load_tokenizer(option: str, name: str):
    _, transformers = require_libs()
    try:
        path = Path(name).expanduser()
        return transformers.AutoTokenizer.from_pretrained(str(path) if path.exists() else name,
                                                          trust_remote_code=False)
    except Exception as e:        # as above: any failure means the tokenizer is unusable
        raise HFTraceError(f"{option} {name}: cannot load its tokenizer "
                           f"({type(e).__name__}: {_first_line(e)})") from None


def logits_size(model) -> int:
    emb = model.get_output_embeddings()
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    return int(model.config.vocab_size)


def max_positions(model) -> int | None:
    c = model.config
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(c, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def shared_vocab(cfg: HFTraceConfig, tok_t, tok_d, vt: int, vd: int) -> int:
    """The vocabulary both models use, or HFTraceError naming both models.

    Tokenizers must agree in size and on a probe text's ids; output layers may be
    padded past the tokenizer (then both are cut to the smaller one)."""
    names = f"--target {cfg.target} and --draft {cfg.draft}"
    nt, nd = len(tok_t), len(tok_d)
    if nt != nd:
        raise HFTraceError(f"{names} have different vocabularies: tokenizers of {nt} and "
                           f"{nd} tokens")
    it, idr = tok_t(PROBE_TEXT)["input_ids"], tok_d(PROBE_TEXT)["input_ids"]
    if list(it) != list(idr):
        raise HFTraceError(f"{names} have different vocabularies: a probe text becomes "
                           f"token ids {list(it)[:8]}... and {list(idr)[:8]}...")
    v = min(vt, vd)
    if vt != vd and v < nt:
        raise HFTraceError(f"{names} have different vocabularies: output layers of {vt} and "
                           f"{vd} ids")
    return v


def describe_model(name: str, model) -> dict:
    return {"name_or_path": name, "class": type(model).__name__,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "logits": logits_size(model), "max_positions": max_positions(model)}


def load_pair(cfg: HFTraceConfig) -> HFPair:
    """Load both models and the tokenizer; refuse pairs of different vocabularies."""
    torch, transformers = require_libs()
    cfg.validate()
    transformers.logging.disable_progress_bar()
    device = resolve_device(cfg.device)
    target = load_model("--target", cfg.target, device, cfg.dtype)
    draft = load_model("--draft", cfg.draft, device, cfg.dtype)
    tok_t = load_tokenizer("--target", cfg.target)
    tok_d = load_tokenizer("--draft", cfg.draft)
    vocab = shared_vocab(cfg, tok_t, tok_d, logits_size(target), logits_size(draft))
    info = {"target": describe_model(cfg.target, target),
            "draft": describe_model(cfg.draft, draft),
            "device": device, "dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
            "tokenizer_size": len(tok_t), "torch": torch.__version__,
            "transformers": transformers.__version__}
    return HFPair(target, draft, tok_t, vocab, device, cfg, info)


# ------------------------------------------------------------------ builds

def meta(pair: HFPair, split: str, rows: int, prompt_source: dict) -> dict:
    cfg = pair.config
    return {"format_version": T.FORMAT_VERSION, "rows": rows, "name": split,
            "backend": "hf", "block_size": cfg.block_size, "top_k": cfg.top_k,
            "context_len": cfg.context_len, "vocab_size": pair.vocab,
            "config": cfg.to_dict(),
            "sampling": {"temperature": cfg.temperature, "top_k": None, "top_p": None,
                         "applied_to": "draft and target", "rule": "standard rejection"},
            "models": pair.info, "prompts": prompt_source}


def build_splits(cfg: HFTraceConfig, progress=None) -> dict:
    """Load the pair and record train/valid/test traces (not written; see the CLI)."""
    from evolve.data.sources import hf_decode
    from evolve.data.sources import hf_prompts as P
    cfg.validate()
    t0 = time.perf_counter()
    pair = load_pair(cfg)
    if cfg.top_k > pair.vocab:
        raise ngram.TraceConfigError("top_k", f"{cfg.top_k!r} is invalid; expected 1.."
                                     f"{pair.vocab} (the vocabulary)")
    texts = corpus = None
    if cfg.prompts_file is not None:
        texts = P.read_prompts_file(cfg.prompts_file, cfg.seed)
        source = {"kind": "file", "path": cfg.prompts_file,
                  "counts": {s: len(texts[s]) for s in SPLITS}}
    else:
        corpus = P.load_corpus(cfg)
        source = {"kind": "corpus", "dir": cfg.corpus_dir or "python stdlib (n-gram corpus)",
                  "files": len(corpus), "crc32": corpus.fingerprint()}
    prompts = {s: P.split_prompts(pair, s, texts, corpus) for s in SPLITS}
    for s in SPLITS:
        hf_decode.check_lengths(pair, prompts[s][0], cfg.blocks_per_prompt)
    if progress:
        progress(f"loaded {cfg.target} ({pair.info['target']['parameters']:,} parameters) and "
                 f"{cfg.draft} ({pair.info['draft']['parameters']:,}) on {pair.device} in "
                 f"{time.perf_counter() - t0:.1f} s; recording (seed {cfg.seed}, g = "
                 f"{cfg.block_size}, k = {cfg.top_k}, temperature {cfg.temperature:g}) ...")
    out, drafted, t1 = {}, 0, time.perf_counter()
    for s in SPLITS:
        ids, rngs = prompts[s]
        cols, _ = hf_decode.decode(pair, ids, rngs, cfg.blocks_per_prompt)
        ts = T.TraceSplit(cols, meta(pair, s, len(cols["draft_prob"]), source), name=s)
        T.validate(ts, f"<{s} traces>")
        out[s] = ts
        drafted += len(ts)
        if progress:
            dt = time.perf_counter() - t1
            progress(f"{s}: {len(ts)} rows ({dt:.1f} s recording, {drafted / dt:.0f} drafted "
                     "tokens/s)")
    return out


def config_of(ts: T.TraceSplit) -> HFTraceConfig:
    return HFTraceConfig.from_dict(ts.meta["config"])
