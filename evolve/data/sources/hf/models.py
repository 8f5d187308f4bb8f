"""Loading a Hugging Face draft/target pair safely (``evolve.data.sources.hf``
records traces with it; ``hf_free`` decodes free-running with it).

Nothing read from disk is executed: weights load from safetensors only (every
weight file a model directory names is checked before loading, and
``torch.load`` refuses while a model loads), no model or tokenizer code is taken
from the model directory (``trust_remote_code=False``), and transformers' load
report is silenced (a checkpoint with missing weights is refused instead). Out
of memory on the device while loading is ``HFTraceError``, one line. torch and
transformers are imported inside functions: the core install does not need them.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from evolve.errors import EvolveError, first_line
from evolve.io import jsonio

INSTALL_HINT = "pip install -e '.[hf]'"
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float16", "bfloat16", "auto")
PROBE_TEXT = "Speculative decoding:\n    def f(x):\n        return x ** 2  # caf\u00e9 \u20ac 42"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFTraceError(EvolveError):
    """A model pair that cannot be used: one line naming the option, the model and why."""


def require_libs():
    """(torch, transformers), or HFTraceError with the exact install command."""
    try:
        import torch    # lazy: start-up (torch loads only where it is used)
        import transformers    # lazy: start-up (transformers loads only where it is used)
    except ImportError as e:
        raise HFTraceError(f"--backend hf needs torch and transformers ({e}); install them "
                           f"with: {INSTALL_HINT}") from None
    return torch, transformers


@dataclass
class HFPair:
    """A loaded draft/target pair sharing one vocabulary of ``vocab`` ids."""
    target: object
    draft: object
    tokenizer: object
    vocab: int
    device: str
    config: "HFTraceConfig"          # evolve.data.sources.hf (which builds on this module)
    info: dict


def absolute(path: str | None, local_only: bool = False) -> str | None:
    """An absolute form of a local path (symbolic links kept, so errors name the path
    given), so that what a recording names is found again from any directory; with
    ``local_only`` a name that is no local path (a hub id) is kept as it is."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if local_only and not p.exists():
        return path
    return os.path.abspath(p)


def resolve_device(device: str) -> str:
    torch, _ = require_libs()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise HFTraceError("--device cuda: no CUDA GPU is available to torch "
                           "(torch.cuda.is_available() is False); use --device cpu or auto")
    return device


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


def out_of_memory(torch, e: BaseException) -> bool:
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
        if out_of_memory(torch, e):
            raise HFTraceError(f"{option} {name}: out of memory loading the model "
                               f"({first_line(e, 300)})") from None
        raise HFTraceError(f"{option} {name}: cannot load the model "
                           f"({type(e).__name__}: {first_line(e, 300)})") from None
    missing = sorted((info or {}).get("missing_keys") or ())
    if missing:
        raise HFTraceError(f"{option} {name}: cannot load the model ({len(missing)} weights "
                           f"are missing from its checkpoint, e.g. {missing[0]}; they would be "
                           "random)")
    try:
        return model.to(device).eval()
    except Exception as e:        # out of memory on the device, or a device error
        what = "out of memory" if out_of_memory(torch, e) else "cannot move the model"
        raise HFTraceError(f"{option} {name}: {what} on {device} "
                           f"({type(e).__name__}: {first_line(e, 300)}); free the device, or use "
                           "a smaller --dtype or --device cpu") from None


def load_tokenizer(option: str, name: str):
    return _pretrained(option, name, "AutoTokenizer", "load its tokenizer")


def _pretrained(option: str, name: str, auto: str, what: str):
    """``transformers.<auto>.from_pretrained`` of a folder or hub name, quietly, no
    remote code; HFTraceError (one line: the option, the name, ``what`` failed) on any
    failure (as load_model: any failure means the model's files are unusable)."""
    _, transformers = require_libs()
    try:
        path = Path(name).expanduser()
        with quiet_transformers(transformers):
            return getattr(transformers, auto).from_pretrained(
                str(path) if path.exists() else name, trust_remote_code=False)
    except Exception as e:
        raise HFTraceError(f"{option} {name}: cannot {what} "
                           f"({type(e).__name__}: {first_line(e, 300)})") from None


def logits_size(model) -> int:
    emb = model.get_output_embeddings()
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    return int(model.config.vocab_size)


def load_config(option: str, name: str):
    """A model's configuration alone (its config.json; no weight is read), to check
    what it can hold before the model loads; HFTraceError (one line) if unreadable."""
    require_libs()
    _check_source(option, name)
    return _pretrained(option, name, "AutoConfig", "read its configuration")


def max_positions(model) -> int | None:
    """The positions a model (or its configuration) holds; None when it does not say."""
    c = getattr(model, "config", model)
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(c, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def shared_vocab(cfg: "HFTraceConfig", tok_t, tok_d, vt: int, vd: int) -> int:
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


def load_pair(cfg: "HFTraceConfig") -> HFPair:
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
