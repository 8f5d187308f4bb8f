"""A Llama-architecture GGUF file converted into a plain Hugging Face model folder.

``convert(gguf_path, out)`` reads the file once with the ``gguf`` package's own reader
(``gguf.GGUFReader``), dequantises every tensor with its numpy code
(``gguf.quants.dequantize``) and writes a folder that plain
``transformers.AutoModelForCausalLM.from_pretrained(out)`` and
``AutoTokenizer.from_pretrained(out)`` load: ``config.json`` (a ``LlamaConfig`` from the
file's metadata), ``model.safetensors`` (float32) and the tokenizer (byte-level BPE from
the file's tokens and merges, its special tokens, and its chat template).

The GGUF layout of a Llama model is the one llama.cpp's converter writes: tensors named
``blk.N.attn_q`` ... (``TENSOR_NAMES``), each stored as [out, in] rows, and the query and
key projections with the rows of each head reordered for llama.cpp's rotary embedding;
``unpermute`` puts them back (the reverse of that converter's ``permute``). The result
equals, tensor for tensor, what transformers' own GGUF loader
(``from_pretrained(dir, gguf_file=...)``) builds, in a fraction of its time: the file is
read once for weights, configuration and tokenizer.

Nothing is executed from the file: GGUF holds arrays and metadata only. The caller checks
the file's digest first (``evolve.data.sources.pairs.smollm2``). Folders are written to a
temporary sibling and renamed into place, so a crash leaves no half-written model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from evolve.errors import EvolveError
from evolve.io.atomic import atomic_write_text

# GGUF tensor name (per block, after "blk.N.") -> the transformers Llama parameter
TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                "output": "lm_head"}
# gguf's token types (gguf.TokenType): CONTROL tokens are the special ones
CONTROL, USER_DEFINED = 3, 4
# tokenizer.ggml.pre values whose pre-tokenizer is the byte-level one with each digit
# split off first (llama.cpp's "\p{N}" before the GPT-2 pattern)
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact")
BYTE_LEVEL_PRE = ("gpt2", "default")


class GGUFError(EvolveError):
    """A GGUF file this converter cannot turn into a model: one line naming the file."""


def read(path: str | os.PathLike):
    """The file's reader (``gguf.GGUFReader``; the gguf package imported here)."""
    import gguf    # lazy: an optional extra, loaded only to convert
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from None


def _field(reader, key: str, path, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise GGUFError(f"{path}: the GGUF file has no {key!r} field")
    return f.contents()


def config_of(reader, path) -> dict:
    """The LlamaConfig arguments of the file's metadata."""
    arch = _field(reader, "general.architecture", path)
    if arch != "llama":
        raise GGUFError(f"{path}: architecture {arch!r}; this converter reads 'llama' only")
    a = f"{arch}."
    heads = int(_field(reader, a + "attention.head_count", path))
    hidden = int(_field(reader, a + "embedding_length", path))
    tokens = _field(reader, "tokenizer.ggml.tokens", path)
    names = {t.name for t in reader.tensors}
    return {
        "vocab_size": int(_field(reader, a + "vocab_size", path, len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, a + "feed_forward_length", path)),
        "num_hidden_layers": int(_field(reader, a + "block_count", path)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, a + "attention.head_count_kv", path, heads)),
        "head_dim": int(_field(reader, a + "rope.dimension_count", path, hidden // heads)),
        "max_position_embeddings": int(_field(reader, a + "context_length", path)),
        "rms_norm_eps": float(_field(reader, a + "attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(_field(reader, a + "rope.freq_base", path, 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", path)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", path)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", path,
                                   _field(reader, "tokenizer.ggml.eos_token_id", path))),
    }


def unpermute(w, heads: int):
    """The rows of a query or key projection back in Hugging Face order: llama.cpp's
    converter stores each head's rows as (half, pair) -> (pair, half)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str, path) -> str:
    """The transformers parameter name of a GGUF tensor name."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in TENSOR_NAMES and layer.isdigit():
            return f"model.layers.{int(layer)}.{TENSOR_NAMES[part]}.{kind}"
    elif stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{kind}"
    raise GGUFError(f"{path}: tensor {gguf_name!r} has no place in a Llama model")


def state_dict(reader, config: dict, path) -> dict:
    """name -> float32 torch tensor of every tensor of the file, dequantised."""
    import torch    # lazy: start-up (torch loads only where it is used)
    from gguf.quants import dequantize    # lazy: an optional extra
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name, path)
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)    # a copy
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        out[name] = torch.from_numpy(np.ascontiguousarray(w))    # (unpermute: a view)
    return out


def tokenizer_of(reader, path, max_length: int):
    """A fast tokenizer (transformers' ``PreTrainedTokenizerFast``) of the file's
    byte-level BPE vocabulary, merges, special tokens and chat template."""
    # lazy: an optional extra (transformers brings tokenizers), loaded only to convert
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast    # lazy: an optional extra
    kind = _field(reader, "tokenizer.ggml.model", path)
    pre = _field(reader, "tokenizer.ggml.pre", path, "default")
    if kind != "gpt2" or pre not in DIGIT_SPLIT_PRE + BYTE_LEVEL_PRE:
        raise GGUFError(f"{path}: tokenizer {kind!r} with pre-tokenizer {pre!r}; this "
                        "converter reads byte-level BPE ('gpt2') tokenizers only")
    tokens = list(_field(reader, "tokenizer.ggml.tokens", path))
    types = list(_field(reader, "tokenizer.ggml.token_type", path))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", path)]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                              fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 byte_level])
                        if pre in DIGIT_SPLIT_PRE else byte_level)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED)])

    def token(key):
        i = reader.fields.get(key)
        return tokens[int(i.contents())] if i is not None else None
    eos = token("tokenizer.ggml.eos_token_id")
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=token("tokenizer.ggml.bos_token_id"), eos_token=eos,
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id") or eos,
        chat_template=_field(reader, "tokenizer.chat_template", path, ""),
        model_max_length=max_length)


def convert(path: str | os.PathLike, out: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write the model folder ``out`` from the GGUF file ``path`` (replacing it whole);
    ``meta``: extra keys for the folder's ``conversion.json``."""
    from transformers import LlamaConfig    # lazy: an optional extra, loaded only to convert
    out = Path(out)
    reader = read(path)
    args = config_of(reader, path)
    tensors = state_dict(reader, args, path)
    tokenizer = tokenizer_of(reader, path, args["max_position_embeddings"])
    config = LlamaConfig(architectures=["LlamaForCausalLM"], **args)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_folder(tmp, config, tensors, tokenizer)
        atomic_write_text(tmp / "conversion.json", json.dumps(
            {"from": str(path), "tensors": len(tensors), **(meta or {})}, indent=2,
            sort_keys=True))
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_folder(folder: Path, config, tensors: dict, tokenizer) -> None:
    """config.json, model.safetensors (a tied head is not stored) and the tokenizer."""
    from safetensors.torch import save_file    # lazy: an optional extra (with transformers)
    keep = {k: v.contiguous() for k, v in tensors.items()
            if not (config.tie_word_embeddings and k == "lm_head.weight")}
    config.save_pretrained(folder)
    save_file(keep, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def replace_folder(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out`` (an older ``out`` removed after)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
