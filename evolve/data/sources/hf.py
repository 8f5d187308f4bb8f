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
weights load from safetensors only (never a pickled checkpoint: every weight file
a model directory names is checked before loading, and ``torch.load`` refuses
while a model loads) and no model or tokenizer code is taken from the model
directory (``trust_remote_code=False``).

Everything that can be checked before the models load is: the configuration
(the n-gram source's bounds on prompts and rows, and the size of a split), the
prompts (read with ``evolve.runs.jsonio``'s limits) and the weight files. Every
failure, out of memory on the device included, is ``HFTraceError``, one line.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import dataclass, fields
from pathlib import Path

from evolve.data import traces as T
from evolve.data.sources import ngram
from evolve.data.tokens import MAX_SPLIT_BYTES

SPLITS = T.SPLITS
INSTALL_HINT = "pip install -e '.[hf]'"
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float16", "bfloat16", "auto")
PROBE_TEXT = "Speculative decoding:\n    def f(x):\n        return x ** 2  # caf\u00e9 \u20ac 42"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MAX_WIDTH = 1 << 20      # top_k and context_len: what a trace file may declare
ROW_BYTES = 160          # the per-row columns of a split, an upper estimate


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
            raise ngram.TraceConfigError(field, f"{value!r:.60} is invalid; expected prompts x "
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


PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SAFE = (".safetensors", ".safetensors.index.json")
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def check_weights(option: str, name: str) -> None:
    """Refuse, before anything is loaded, a model directory whose weights
    transformers would read from a pickled file: a weight file named in config.json
    (``transformers_weights``), a shard named in an index file's ``weight_map``, or a
    pickled checkpoint where no safetensors weights are (HFTraceError, one line
    naming the file). A hub id is checked while it loads (``_no_unpickling``)."""
    from evolve.runs import jsonio
    d = Path(name).expanduser()
    if not d.is_dir():
        return

    def refuse(f, why):
        raise HFTraceError(f"{option} {name}: cannot load the model: {f} is {why}; weights "
                           "load from safetensors only (unpickling a file can run code)")

    def read(f: Path):
        try:
            return jsonio.read_json(f, "model file", HFTraceError, MAX_CONFIG_BYTES)
        except HFTraceError as e:
            raise HFTraceError(f"{option} {name}: cannot load the model ({e})") from None

    config = d / "config.json"
    if config.exists():
        doc = read(config)
        explicit = doc.get("transformers_weights") if isinstance(doc, dict) else None
        if explicit is not None:
            if not isinstance(explicit, str) or not explicit.endswith(SAFE):
                refuse(d / str(explicit), "named by transformers_weights in config.json")
    for index in sorted(d.glob("*.safetensors.index.json")):
        doc = read(index)
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict):
            raise HFTraceError(f"{option} {name}: cannot load the model ({index}: no "
                               "weight_map object)")
        for shard in sorted(set(map(str, wm.values()))):
            if not shard.endswith(".safetensors"):
                refuse(d / shard, f"named in the weight_map of {index.name}")
    have_safe = (any(d.glob("*.safetensors")) or any(d.glob("*.safetensors.index.json")))
    for f in sorted(d.iterdir()):
        if f.name.endswith(PICKLED) and not have_safe:
            refuse(f, "a pickled checkpoint, with no safetensors weights beside it")


class _Unpickling(Exception):
    """torch.load was called while a model loaded (see ``_no_unpickling``)."""


@contextlib.contextmanager
def _no_unpickling(torch):
    """While a model loads, ``torch.load`` (unpickling) raises instead of reading: the
    last guard for what ``check_weights`` cannot see (hub ids, future file names)."""
    real = torch.load

    def refuse(f, *args, **kwargs):
        raise _Unpickling(str(f))

    torch.load = refuse
    try:
        yield
    finally:
        torch.load = real


@contextlib.contextmanager
def quiet_transformers(transformers):
    """transformers' and huggingface_hub's logging and progress bars silenced (restored
    afterwards): a failure is one line, and what a load would report is checked here."""
    log = transformers.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


def _out_of_memory(torch, e: BaseException) -> bool:
    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None),
                              getattr(torch, "AcceleratorError", None)) if k is not None)
    return isinstance(e, kinds) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def load_model(option: str, name: str, device: str, dtype: str):
    """A model in eval mode on ``device``; HFTraceError (one line) for every failure,
    out of memory on the device included."""
    torch, transformers = require_libs()
    _check_source(option, name)
    check_weights(option, name)
    want = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "auto": torch.bfloat16 if device == "cuda" else torch.float32}[dtype]
    path = Path(name).expanduser()
    try:
        with quiet_transformers(transformers), _no_unpickling(torch):
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path) if path.exists() else name, dtype=want, use_safetensors=True,
                trust_remote_code=False, output_loading_info=True)
    except _Unpickling as e:
        raise HFTraceError(f"{option} {name}: cannot load the model: transformers would "
                           f"unpickle {e}; weights load from safetensors only (unpickling a "
                           "file can run code)") from None
    except Exception as e:        # transformers raises many kinds; all mean "cannot load"
        if _out_of_memory(torch, e):
            raise HFTraceError(f"{option} {name}: out of memory loading the model "
                               f"({_first_line(e)})") from None
        raise HFTraceError(f"{option} {name}: cannot load the model "
                           f"({type(e).__name__}: {_first_line(e)})") from None
    missing = sorted((info or {}).get("missing_keys") or ())
    if missing:
        raise HFTraceError(f"{option} {name}: cannot load the model ({len(missing)} weights "
                           f"are missing from its checkpoint, e.g. {missing[0]}; they would be "
                           "random)")
    try:
        return model.to(device).eval()
    except Exception as e:        # out of memory on the device, or a device error
        what = "out of memory" if _out_of_memory(torch, e) else "cannot move the model"
        raise HFTraceError(f"{option} {name}: {what} on {device} "
                           f"({type(e).__name__}: {_first_line(e)}); free the device, or use "
                           "a smaller --dtype or --device cpu") from None


def load_tokenizer(option: str, name: str):
    _, transformers = require_libs()
    try:
        path = Path(name).expanduser()
        with quiet_transformers(transformers):
            return transformers.AutoTokenizer.from_pretrained(
                str(path) if path.exists() else name, trust_remote_code=False)
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
    padded past the tokenizer (then both are cut to the smaller one), never shorter."""
    names = f"--target {cfg.target} and --draft {cfg.draft}"
    nt, nd = len(tok_t), len(tok_d)
    if nt != nd:
        raise HFTraceError(f"{names} have different vocabularies: tokenizers of {nt} and "
                           f"{nd} tokens")
    it, idr = tok_t(PROBE_TEXT)["input_ids"], tok_d(PROBE_TEXT)["input_ids"]
    if list(it) != list(idr):
        raise HFTraceError(f"{names} have different vocabularies: a probe text becomes "
                           f"token ids {list(it)[:8]}... and {list(idr)[:8]}...")
    for option, name, size in (("--target", cfg.target, vt), ("--draft", cfg.draft, vd)):
        if nt > size:
            raise HFTraceError(f"{option} {name}: its tokenizer has {nt} tokens, more than the "
                               f"model's output layer ({size} ids); a prompt holding one of "
                               "the extra tokens cannot be scored")
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
    device = resolve_device(cfg.device)
    for option, name in (("--target", cfg.target), ("--draft", cfg.draft)):
        _check_source(option, name)
        check_weights(option, name)
    tok_t = load_tokenizer("--target", cfg.target)
    tok_d = load_tokenizer("--draft", cfg.draft)
    target = load_model("--target", cfg.target, device, cfg.dtype)
    draft = load_model("--draft", cfg.draft, device, cfg.dtype)
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


def read_prompts(cfg: HFTraceConfig):
    """(texts, corpus, source) of a configuration, read and bounded before any model
    loads: a prompts file's counts per split are held to the same bounds as
    configured counts (``HFTraceConfig.check_counts``)."""
    from evolve.data.sources import hf_prompts as P
    texts = corpus = None
    if cfg.prompts_file is not None:
        texts = P.read_prompts_file(cfg.prompts_file, cfg.seed)
        for s in SPLITS:
            if len(texts[s]) > ngram.MAX_PROMPTS:
                raise ngram.TraceConfigError("prompts", f"{cfg.prompts_file!r} is invalid; its "
                                             f"{s} split has {len(texts[s]):,} prompts, at "
                                             f"most {ngram.MAX_PROMPTS:,} are allowed")
            cfg.check_counts(s, len(texts[s]))
        source = {"kind": "file", "path": cfg.prompts_file,
                  "counts": {s: len(texts[s]) for s in SPLITS}}
    else:
        corpus = P.load_corpus(cfg)
        source = {"kind": "corpus", "dir": cfg.corpus_dir or "python stdlib (n-gram corpus)",
                  "files": len(corpus), "crc32": corpus.fingerprint()}
    return texts, corpus, source


def build_splits(cfg: HFTraceConfig, progress=None) -> dict:
    """Load the pair and record train/valid/test traces (not written; see the CLI).
    The configuration and the prompts are checked before the models load."""
    from evolve.data.sources import hf_decode
    from evolve.data.sources import hf_prompts as P
    cfg.validate()
    texts, corpus, source = read_prompts(cfg)
    t0 = time.perf_counter()
    pair = load_pair(cfg)
    if cfg.top_k > pair.vocab:
        raise ngram.TraceConfigError("top_k", f"{cfg.top_k!r} is invalid; expected 1.."
                                     f"{pair.vocab} (the vocabulary)")
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
        try:
            cols, _ = hf_decode.decode(pair, ids, rngs, cfg.blocks_per_prompt)
        except Exception as e:
            torch, _ = require_libs()
            if not _out_of_memory(torch, e):
                raise
            raise HFTraceError(f"--batch-size {cfg.batch_size}: out of memory on "
                               f"{pair.device} recording the {s} split ({_first_line(e)}); "
                               "use a smaller --batch-size") from None
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
